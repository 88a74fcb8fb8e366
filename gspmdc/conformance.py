"""Score gspmdc on the team's corpora (XLA's conformance cases and the JAX programs).

    python -m gspmdc.conformance parse|propagate|partition [--shared DIR] [--verbose]

`parse` reports, for both XLA corpora (`conformance/xla-propagation.json`, `xla-partitioner.json`):
modules parsed, round-tripped (`parse(print(parse(t)))` identical to `parse(t)`), verified, and
evaluated by the reference interpreter on random inputs (of those without I/O opcodes); and for every
JAX program: its .hlo files parse and `program.hlo` on `inputs.npz` reproduces `outputs.npz`.
`propagate` scores sharding propagation on `xla-propagation.json` (see
`gspmdc/conformance_propagation.py`); `partition` runs every case of `xla-partitioner.json` through
the partitioner and the local backend and checks it against the reference (see
`gspmdc/conformance_partition.py`). The corpora live in `../shared` beside the repository (override with `--shared`); they are the team's
measuring stick, not part of the package.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.runtime.compare import compare_outputs

IO_OPCODES = frozenset({"infeed", "outfeed", "send", "send-done", "recv", "recv-done"})
CASE_TIMEOUT_SECONDS = 20
#: a module with a value larger than this is not evaluated (this machine has 24 GiB; several XLA
#: test modules hold tensors of tens of GiB, meant only for compilation)
MAX_VALUE_BYTES = 1 << 30
#: a module whose dots and convolutions need more multiply-adds than this (about a minute of this
#: machine's two cores) is not evaluated either
MAX_MULTIPLY_ADDS = 1e11


def default_shared_dir() -> Path:
    """`../shared` beside the repository (or beside the current directory)."""
    here = Path(__file__).resolve().parents[2] / "shared"
    return here if here.is_dir() else Path.cwd().parent / "shared"


class CaseTimeout(Exception):
    pass


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
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def score_parse_corpus(path: Path) -> list[Tally]:
    """Parse, round-trip, verify and evaluate every module of one XLA corpus file."""
    from gspmdc import api
    from gspmdc.ir.verifier import verify_module
    from gspmdc.runtime import io

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
        if IO_OPCODES & set(case.get("opcodes", ())):
            continue
        largest, work = largest_value_bytes(module), multiply_adds(module)
        if largest > MAX_VALUE_BYTES:
            too_large.record(name, f"a value of {largest / 2**30:.1f} GiB")
            continue
        if work > MAX_MULTIPLY_ADDS:
            too_large.record(name, f"{work:.2g} multiply-adds in dots and convolutions")
            continue
        try:
            with time_limit(CASE_TIMEOUT_SECONDS):
                api.evaluate(module, io.random_inputs(module, seed=0))
            evaluated.record(name, None)
        except GspmdcError as e:
            if case.get("expects_error") or any(r.get("expect_error") for r in case.get("runs", ())):
                invalid.record(name, _one_line(e))
            else:
                evaluated.record(name, _one_line(e))
        except Exception as e:  # noqa: BLE001
            evaluated.record(name, _one_line(e))
    return [parsed, rt, verified, evaluated, too_large, invalid]


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
    parser = argparse.ArgumentParser(prog="python -m gspmdc.conformance",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["parse", "propagate", "partition"], help="what to score")
    parser.add_argument("--shared", type=Path, default=None,
                        help="the shared corpora folder (default: ../shared beside the repo)")
    parser.add_argument("--verbose", action="store_true", help="list every failure")
    args = parser.parse_args(argv)
    shared = args.shared or default_shared_dir()
    if not shared.is_dir():
        print(f"conformance: corpora folder {shared} not found (use --shared)", file=sys.stderr)
        return 2
    if args.stage == "propagate":
        from gspmdc.conformance_propagation import score
        return score(shared, args.verbose)
    if args.stage == "partition":
        from gspmdc.conformance_partition import score
        return score(shared, args.verbose)
    for corpus in ("xla-propagation.json", "xla-partitioner.json"):
        _report(f"{corpus}:", score_parse_corpus(shared / "conformance" / corpus), args.verbose)
    _report("jax-programs:", score_jax_programs(shared / "jax-programs"), args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
