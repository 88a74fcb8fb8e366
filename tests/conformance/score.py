"""Score gspmdc on the team's corpora (XLA's conformance cases and the JAX programs).

    cd tests && python -m conformance.score parse|propagate|partition|cost [--shared DIR]
                                            [--verbose] [--cases NAME ...] [--timeout SECONDS]
                                            [--journal FILE]

`parse` reports, for both XLA corpora (`conformance/xla-propagation.json`, `xla-partitioner.json`):
modules parsed, round-tripped (`parse(print(parse(t)))` identical to `parse(t)`), verified, and
evaluated by the reference interpreter on random inputs (of those without I/O opcodes); and for every
JAX program: its .hlo files parse and `program.hlo` on `inputs.npz` reproduces `outputs.npz`.
`propagate` scores sharding propagation on `xla-propagation.json` (see
`score_propagation.py`); `partition` runs every case of `xla-partitioner.json` through
the partitioner and the local backend and checks it against the reference (see
`score_partition.py`); `cost` compares `gspmdc cost` with `run --profile-json` on MPI
ranks (see `score_cost.py`). The corpora live in `../shared` beside the repository
(override with `--shared`); they are the team's measuring stick, not part of the package.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir.ops import HOST_IO
from gspmdc.runtime.compare import compare_outputs

CASE_TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class MachineLimits:
    """What one case may use on this machine. Each evaluated case runs in a child process whose
    memory is capped at `memory_bytes` (RLIMIT_DATA: the heap and private mappings, so an
    oversized case fails alone with a MemoryError instead of waking the kernel's OOM killer;
    the file-backed arrays of `runtime/spill.py` do not count) and which is killed after
    `timeout_seconds`. Cases are not attempted when their largest value exceeds half of
    `storage_bytes` (the memory cap plus the free space of the temporary directory, where the
    runtime spills large arrays; the input and a partition's padded copy of it are both held) or
    when their dots and convolutions need more than `max_multiply_adds`: several XLA test modules
    hold tensors of tens of GiB, or do 1e17 multiply-adds, meant only for compilation."""

    memory_bytes: int
    storage_bytes: int
    timeout_seconds: int = CASE_TIMEOUT_SECONDS
    max_multiply_adds: float = 3e12

    @classmethod
    def of_this_machine(cls) -> "MachineLimits":
        """Three quarters of the physical memory; that plus the temporary directory's free
        space."""
        import os
        import shutil
        import tempfile
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4
        return cls(memory, memory + shutil.disk_usage(tempfile.gettempdir()).free)

    def too_large(self, module) -> str | None:
        """Why `module` is not attempted here, or None."""
        return self.too_large_for(largest_value_bytes(module), multiply_adds(module))

    def too_large_for(self, largest: int, work: float) -> str | None:
        """Why a module whose largest value has `largest` bytes and whose dots and convolutions
        do `work` multiply-adds is not attempted here, or None."""
        if largest > self.storage_bytes // 2:
            return (f"too large for this machine: a value of {largest / 2**30:.1f} GiB "
                    f"(limit {self.storage_bytes / 2 / 2**30:.1f} GiB)")
        if work > self.max_multiply_adds:
            return (f"too large for this machine: {work:.2g} multiply-adds "
                    f"(limit {self.max_multiply_adds:.2g})")
        return None


def run_isolated(limits: MachineLimits, fn, *args):
    """`fn(*args)` in a forked child under `limits`; returns its (picklable) result. Raises
    CaseTimeout when it runs too long and ChildDied when it ends without a result (killed, out
    of memory in a way Python could not report). Exceptions `fn` raises come back as
    `ChildFailed` (with `clean` set for a GspmdcError); MemoryError as `CaseOutOfMemory`."""
    import multiprocessing
    import resource

    def child(connection):
        resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_bytes, limits.memory_bytes))
        try:
            connection.send(("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            if _caused_by_memory(e):
                connection.send(("memory", None))
            else:
                connection.send(("error", (type(e).__name__, str(e),
                                           isinstance(e, GspmdcError))))
        finally:
            connection.close()

    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(sender,), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(limits.timeout_seconds):
            raise CaseTimeout(f"timed out after {limits.timeout_seconds} s")
        try:
            status, value = receiver.recv()
        except EOFError:
            process.join()
            raise ChildDied(f"the case's process died (exit code {process.exitcode})") from None
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()
    if status == "memory":
        raise CaseOutOfMemory(f"out of memory under the {limits.memory_bytes / 2**30:.1f} GiB "
                              "limit of this machine")
    if status == "error":
        raise ChildFailed(*value)
    return value


def _caused_by_memory(error: BaseException | None) -> bool:
    """Whether `error` or an exception it was raised from is a MemoryError (kernels' failures
    reach the caller wrapped, e.g. as a partition's RuntimeFailure)."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, MemoryError):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class CaseTimeout(Exception):
    pass


class CaseOutOfMemory(Exception):
    pass


class ChildDied(Exception):
    pass


class ChildFailed(Exception):
    """An exception raised in the child: its type name, message, and whether it was a
    GspmdcError (a clean rejection rather than a crash)."""

    def __init__(self, type_name: str, message: str, clean: bool):
        super().__init__(f"{type_name}: {message}")
        self.clean = clean


def default_shared_dir() -> Path:
    """`../shared` beside the repository (or beside the current directory)."""
    here = Path(__file__).resolve().parents[3] / "shared"
    return here if here.is_dir() else Path.cwd().parent / "shared"


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raise CaseTimeout in the main thread after `seconds` (SIGALRM; Unix only)."""
    def on_alarm(signum, frame):
        raise CaseTimeout(f"timed out after {seconds} s")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Tally:
    """Counts of one stage and the failures with one-line reasons."""

    name: str
    counts_only: bool = False  # a list of cases set aside, not a pass rate
    attempted: int = 0
    passed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    def record(self, case: str, error: str | None) -> None:
        self.attempted += 1
        if error is None:
            self.passed += 1
        else:
            self.failures.append((case, error))

    def line(self) -> str:
        if self.counts_only:
            return f"  {self.name:<28} {self.attempted:>4}"
        pct = 100.0 * self.passed / self.attempted if self.attempted else 100.0
        return f"  {self.name:<28} {self.passed:>4} / {self.attempted:<4} ({pct:5.1f}%)"


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return (first if isinstance(e, ChildFailed) else f"{type(e).__name__}: {first}")[:200]


def score_parse_corpus(path: Path, limits: MachineLimits) -> list[Tally]:
    """Parse, round-trip, verify and evaluate every module of one XLA corpus file."""
    from gspmdc import api
    from gspmdc.ir.verifier import verify_module

    cases = json.loads(path.read_text())["cases"]
    parsed, rt, verified, evaluated = (Tally("parsed"), Tally("round-tripped"),
                                       Tally("verified"), Tally("evaluated (no I/O ops)"))
    too_large = Tally("skipped: too large to run", counts_only=True)
    invalid = Tally("rejected, as XLA's test expects", counts_only=True)
    for case in cases:
        name = f"{case['name']}:{case['line']}"
        try:
            module = api.parse(case["hlo"], name, verify=False)
        except GspmdcError as e:
            parsed.record(name, _one_line(e))
            continue
        except Exception as e:  # noqa: BLE001 - a crash is a finding to report
            parsed.record(name, "CRASH " + _one_line(e))
            continue
        parsed.record(name, None)
        if "num_devices" in case and module.num_partitions is None:
            module.attrs["num_partitions"] = case["num_devices"]  # as XLA's test helper parses it
        try:
            again = api.parse(api.to_text(module), name, verify=False)
            rt.record(name, module.difference(again))
        except Exception as e:  # noqa: BLE001
            rt.record(name, _one_line(e))
        try:
            problems = verify_module(module, collect=True)
            verified.record(name, problems[0] if problems else None)
        except Exception as e:  # noqa: BLE001
            verified.record(name, "CRASH " + _one_line(e))
        if HOST_IO & set(case.get("opcodes", ())):
            continue
        reason = limits.too_large(module)
        if reason is not None:
            too_large.record(name, reason)
            continue
        try:
            run_isolated(limits, _evaluate, module)
            evaluated.record(name, None)
        except ChildFailed as e:
            expected = case.get("expects_error") or any(r.get("expect_error")
                                                        for r in case.get("runs", ()))
            (invalid if e.clean and expected else evaluated).record(name, _one_line(e))
        except (CaseTimeout, CaseOutOfMemory) as e:
            too_large.record(name, str(e))
        except ChildDied as e:
            evaluated.record(name, str(e))
    return [parsed, rt, verified, evaluated, too_large, invalid]


def _evaluate(module) -> None:
    from gspmdc import api
    from gspmdc.runtime import io
    api.evaluate(module, io.random_inputs(module, seed=0))


def multiply_adds(module) -> float:
    """Multiply-adds of one pass over every dot and convolution (loops counted once)."""
    total = 0.0
    for _, inst in module.all_instructions():
        if inst.opcode == "dot":
            lhs = inst.operands[0].shape.dims
            k = np.prod([lhs[d] for d in inst.attr("lhs_contracting_dims", ())], dtype=float)
            total += inst.shape.num_elements * k
        elif inst.opcode == "convolution":
            labels, window = inst.attrs["dim_labels"], inst.attr("window")
            features = inst.operands[0].shape.dims[labels.lhs_feature]
            taps = np.prod([d.size for d in window.dims], dtype=float) if window else 1.0
            total += (inst.shape.num_elements * taps * features
                      / inst.attr("feature_group_count", 1))
    return total


def largest_value_bytes(module) -> int:
    """The byte size of the largest array value any instruction of the module produces."""
    return max((leaf.byte_size for _, inst in module.all_instructions()
                for leaf in inst.shape.leaves()), default=0)


def score_jax_programs(root: Path) -> list[Tally]:
    """Every program's .hlo files parse; program.hlo reproduces outputs.npz from inputs.npz."""
    from gspmdc import api
    from gspmdc.runtime import io

    parsed, reproduced = Tally("hlo files parsed"), Tally("program.hlo reproduces outputs")
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for hlo in sorted(folder.glob("*.hlo")):
            try:
                api.load(hlo, verify=False)
                parsed.record(f"{folder.name}/{hlo.name}", None)
            except Exception as e:  # noqa: BLE001
                parsed.record(f"{folder.name}/{hlo.name}", _one_line(e))
        try:
            module = api.load(folder / "program.hlo")
            got = io.output_arrays(module, api.evaluate(module,
                                                        io.read_inputs(folder / "inputs.npz", module)))
            want = np.load(folder / "outputs.npz")
            reproduced.record(folder.name, compare_outputs(got, dict(want)))
        except Exception as e:  # noqa: BLE001
            reproduced.record(folder.name, _one_line(e))
    return [parsed, reproduced]


def _report(title: str, tallies: list[Tally], verbose: bool) -> None:
    print(title)
    for t in tallies:
        print(t.line())
    for t in tallies:
        if t.failures:
            shown = t.failures if verbose else t.failures[:10]
            print(f"  {t.name} failures:")
            for case, reason in shown:
                print(f"    {case}: {reason}")
            if len(shown) < len(t.failures):
                print(f"    ... {len(t.failures) - len(shown)} more (--verbose lists all)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.score",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["parse", "propagate", "partition", "cost"],
                        help="what to score")
    parser.add_argument("--shared", type=Path, default=None,
                        help="the shared corpora folder (default: ../shared beside the repo)")
    parser.add_argument("--verbose", action="store_true", help="list every failure")
    parser.add_argument("--cases", metavar="NAME", nargs="+", default=None,
                        help="partition, cost: score only the cases (cost: and JAX programs) "
                             "with these names (a re-check; the figure then covers those only)")
    parser.add_argument("--timeout", type=int, default=None, metavar="SECONDS",
                        help="partition, cost: the time a case may run in its child process "
                             f"(default {CASE_TIMEOUT_SECONDS})")
    parser.add_argument("--journal", type=Path, default=None, metavar="FILE",
                        help="cost: append each program's outcome to FILE and take those "
                             "already there instead of running them again (resumable)")
    args = parser.parse_args(argv)
    shared = args.shared or default_shared_dir()
    if not shared.is_dir():
        print(f"conformance: corpora folder {shared} not found (use --shared)", file=sys.stderr)
        return 2
    if args.stage == "propagate":
        from .score_propagation import score
        return score(shared, args.verbose)
    limits = MachineLimits.of_this_machine()
    if args.timeout is not None:
        limits = dataclasses.replace(limits, timeout_seconds=args.timeout)
    if args.stage == "cost":
        from .score_cost import score
        return score(shared, args.verbose, args.cases, args.journal, limits)
    if args.stage == "partition":
        from .score_partition import score
        return score(shared, limits, args.verbose, args.cases)
    for corpus in ("xla-propagation.json", "xla-partitioner.json"):
        _report(f"{corpus}:", score_parse_corpus(shared / "conformance" / corpus, limits),
                args.verbose)
    _report("jax-programs:", score_jax_programs(shared / "jax-programs"), args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
