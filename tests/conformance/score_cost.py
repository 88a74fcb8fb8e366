"""Score `gspmdc cost` against measurement on the team's corpora: how closely the figures
modelled before running agree with what `gspmdc run --profile-json` counts on MPI ranks.

    cd tests && python -m conformance.score cost [--shared DIR] [--verbose]   (make cost-agreement)

Every program is modelled in-process (the partitioned program of `gspmdc cost`, on the default
machine) and run as a user would run it,

    gspmdc run PROGRAM -n N -q --profile-json MEASURED.json [--inputs inputs.npz]

on N MPI ranks. The programs: the JAX programs (`jax-programs/*/program.hlo` on their inputs),
XLA's partitioner test cases (`conformance/xla-partitioner.json`, on their `num_devices`) that
`agreement_cases` keeps, and XLA's propagation test cases (`conformance/xla-propagation.json`,
annotated global modules, on the partitions their shardings name) that
`propagation_agreement_cases` keeps: those without host I/O whose values and dots fit a run on
this machine (`MAX_VALUE_BYTES`, `MAX_MULTIPLY_ADDS`; several of XLA's cases hold tensors of tens
of GiB, meant for compilation only). `unmeasured_cases` lists the others with the reason, and a
run that outlasts `RUN_TIMEOUT_SECONDS` is reported as not measured.

For each corpus the table counts the programs compared and those gspmdc refuses (exit 2), and for
the compared ones: collectives whose bytes sent and received by every partition and calls equal
the model's, programs whose operations per partition equal the model's, programs whose every
rank's peak of live arrays is within 10% of the liveness analysis's peak, the largest and the
median deviation of the peaks, and (JAX programs) parameter and output bytes per device equal to
XLA's memory analysis (`memory_per_device` in `reference.json`). A program with a conditional runs
one branch where the model counts the costlier: it is counted apart, as within the model's bound
when no measured figure exceeds the model's (the peak of live arrays by at most 10%).
"""
from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gspmdc import api
from .score import largest_value_bytes, multiply_adds
from gspmdc.errors import GspmdcError
from gspmdc.ir.ops import HOST_IO

#: the largest value and the most multiply-adds of a conformance case compared: every rank of a
#: run draws the global inputs, so a case of N partitions holds some N times its values, and the
#: runtime's convolutions and dots run at a few GFLOP/s on a shared 2-core machine
MAX_VALUE_BYTES = 64 << 20
MAX_MULTIPLY_ADDS = 1e10
#: the quick cases, of which the normal test suite compares a sample
QUICK_VALUE_BYTES = 1 << 20
QUICK_MULTIPLY_ADDS = 1e6
#: how far the measured peak of live arrays may lie from the modelled peak
MEMORY_TOLERANCE = 0.10
RUN_TIMEOUT_SECONDS = 300


def agreement_cases(shared: Path, quick: bool = False) -> list[dict]:
    """The cases of `xla-partitioner.json` compared (see the module docstring), in file order;
    `quick`: only those within `QUICK_VALUE_BYTES` and `QUICK_MULTIPLY_ADDS`."""
    return [case for case, why in _classified(shared, "xla-partitioner.json", quick)
            if why is None]


def propagation_agreement_cases(shared: Path, quick: bool = False) -> list[dict]:
    """The cases of `xla-propagation.json` compared, in file order, each with the fields of a
    partitioner case that `compare_program` reads: `name` (the test's name and line: several
    tests share a name), `hlo`, `opcodes` and `num_devices` (the module's `num_partitions`, else
    the devices its shardings name, as `gspmdc run` takes them)."""
    return [case for case, why in _classified(shared, "xla-propagation.json", quick)
            if why is None]


def unmeasured_cases(shared: Path) -> dict[str, list[tuple[str, str]]]:
    """The cases of each XLA corpus file not compared, by file: (name, why) for host I/O, a
    module gspmdc cannot parse, a value over `MAX_VALUE_BYTES` or dots over
    `MAX_MULTIPLY_ADDS`."""
    return {corpus: [(case["name"], why) for case, why in _classified(shared, corpus, False)
                     if why is not None]
            for corpus in ("xla-partitioner.json", "xla-propagation.json")}


def _classified(shared: Path, corpus: str, quick: bool) -> list[tuple[dict, str | None]]:
    """Every case of one corpus file with why it is not compared (None: it is)."""
    max_bytes, max_work = (QUICK_VALUE_BYTES, QUICK_MULTIPLY_ADDS) if quick else \
        (MAX_VALUE_BYTES, MAX_MULTIPLY_ADDS)
    classified = []
    for case, why, largest, work in _sized_cases(shared, corpus):
        if why is None and largest > max_bytes:
            why = f"a value of {largest / 2**20:,.1f} MiB"
        elif why is None and work > max_work:
            why = f"{work:.3g} multiply-adds"
        classified.append((case, why))
    return classified


@functools.lru_cache(maxsize=None)
def _sized_cases(shared: Path, corpus: str) -> tuple[tuple[dict, str | None, int, float], ...]:
    """Every case of one corpus file (a propagation case with the fields of a partitioner case,
    see `propagation_agreement_cases`), why it cannot be compared at all (host I/O, not
    parsed; else None), its largest value's bytes and its multiply-adds."""
    from gspmdc.prepare import devices_named_by_shardings
    path = shared / "conformance" / corpus
    if not path.is_file():
        return ()
    sized = []
    for case in json.loads(path.read_text())["cases"]:
        if "num_devices" not in case:
            case = {"name": f"{case['name']}:{case['line']}", "hlo": case["hlo"],
                    "opcodes": case["opcodes"]}
        io = HOST_IO & set(case["opcodes"])
        if io:
            sized.append((case, f"host I/O ({', '.join(sorted(io))})", 0, 0.0))
            continue
        try:
            module = api.parse(case["hlo"])
        except GspmdcError as e:
            sized.append((case, f"not parsed: {str(e).splitlines()[0][:120]}", 0, 0.0))
            continue
        if "num_devices" not in case:
            case["num_devices"] = module.num_partitions or devices_named_by_shardings(module)
        sized.append((case, None, largest_value_bytes(module), multiply_adds(module)))
    return tuple(sized)


@dataclass
class Agreement:
    """One program compared: collectives compared and equal, operations equal, each rank's peak
    deviation (measured / modelled - 1), XLA's memory figures equal (None: not known), whether
    the model only bounds the run (a conditional), and whether no measured figure exceeds the
    model's (bytes, operations; the peak by at most `MEMORY_TOLERANCE`)."""

    collectives: int = 0
    collectives_equal: int = 0
    flops_equal: bool = False
    peak_deviations: list[float] = field(default_factory=list)
    xla_memory_equal: bool | None = None
    bounded_only: bool = False
    within_bounds: bool = True


def compare(model: dict, measured: dict) -> Agreement:
    """The agreement of `gspmdc cost --json` figures with `run --profile-json` figures."""
    result = Agreement()
    ran = {c["name"]: c for c in measured["collectives"]}
    for collective in model["collectives"]:
        result.collectives += 1
        counted = ran.get(collective["name"])
        if counted is None:
            continue
        if all(counted[k] == collective[k] for k in ("bytes_sent_per_device",
                                                     "bytes_received_per_device", "calls")):
            result.collectives_equal += 1
        elif any(r > m for r, m in zip(counted["bytes_sent_per_device"],
                                       collective["bytes_sent_per_device"])):
            result.within_bounds = False
    result.flops_equal = model["flops_per_device"] == measured["flops_per_device"]
    if any(r > m for r, m in zip(measured["flops_per_device"], model["flops_per_device"])):
        result.within_bounds = False
    result.peak_deviations = [r / m - 1 if m else float(r > 0) for m, r in
                              zip(model["peak_memory_bytes_per_device"],
                                  measured["peak_memory_bytes_per_device"])]
    if any(d > MEMORY_TOLERANCE for d in result.peak_deviations):
        result.within_bounds = False
    return result


def compare_program(path: Path, n: int, workdir: Path, inputs: Path | None = None,
                    xla_memory: tuple[int, int] | None = None) -> Agreement | str:
    """Model and run `path` on `n` partitions (on `inputs`, else random ones); the agreement, or
    why gspmdc refused it. `xla_memory`: XLA's parameter and output bytes per device."""
    from gspmdc.partitioned import load_partitioned
    from gspmdc.passes.analysis.cost import program_cost
    from gspmdc.passes.analysis.machine import PRESETS
    try:
        module, n = load_partitioned(str(path), n)
        model = program_cost(module, n, PRESETS["tpu-v3"]).figures.to_json()
    except GspmdcError as e:
        return f"cost: {str(e).splitlines()[0][:160]}"
    measured_path = workdir / "measured.json"
    command = [sys.executable, "-m", "gspmdc", "run", str(path), "-n", str(n), "-q",
               "--profile-json", str(measured_path), "--timeout", str(RUN_TIMEOUT_SECONDS)]
    if inputs is not None:
        command += ["--inputs", str(inputs)]
    run = subprocess.run(command, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_SECONDS + 120)
    if run.returncode == 2:
        return f"run: {run.stderr.strip().splitlines()[-1][:160]}"
    if run.returncode == 3 and "the run timed out" in run.stderr:
        raise RunTimedOut(f"the run took over {RUN_TIMEOUT_SECONDS} s")
    if run.returncode != 0:
        raise RuntimeError(f"gspmdc run {path} exited {run.returncode}: {run.stderr[-2000:]}")
    measured = json.loads(measured_path.read_text())
    result = compare(model, measured)
    result.bounded_only = "conditional" in {inst.opcode for _, inst in module.all_instructions()}
    if xla_memory is not None:
        result.xla_memory_equal = (model["parameter_bytes_per_device"],
                                   model["output_bytes_per_device"]) == \
            ([xla_memory[0]] * n, [xla_memory[1]] * n)
    return result


class RunTimedOut(Exception):
    """The run outlasted `RUN_TIMEOUT_SECONDS`: the program is not measured."""


@dataclass
class CorpusScore:
    """The agreements of one corpus, the programs refused and those whose run timed out, by
    name, and how many of the corpus's cases were not attempted (see `unmeasured_cases`)."""

    name: str
    agreements: dict[str, Agreement] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    timed_out: dict[str, str] = field(default_factory=dict)
    not_attempted: int | None = None

    def row(self) -> str:
        a = list(self.agreements.values())
        exact = [x for x in a if not x.bounded_only]
        bounded = [x for x in a if x.bounded_only]
        deviations = [abs(d) for x in exact for d in x.peak_deviations]
        within = sum(all(abs(d) <= MEMORY_TOLERANCE for d in x.peak_deviations) for x in exact)
        xla = [x.xla_memory_equal for x in a if x.xla_memory_equal is not None]
        return " | ".join([
            self.name, str(len(a)), str(len(self.refused)),
            "—" if self.not_attempted is None else str(self.not_attempted + len(self.timed_out)),
            f"{sum(x.collectives_equal for x in exact)} / {sum(x.collectives for x in exact)}",
            f"{sum(x.flops_equal for x in exact)} / {len(exact)}",
            f"{within} / {len(exact)}",
            f"{max(deviations, default=0):.1%}", f"{statistics.median(deviations or [0]):.1%}",
            f"{sum(x.within_bounds for x in bounded)} / {len(bounded)}",
            f"{sum(xla)} / {len(xla)}" if xla else "—"])


HEADER = ("| corpus | programs compared | refused by gspmdc | not measured (too large, host I/O) "
          "| collectives: bytes and calls equal "
          "| operations equal | peak memory within 10% on every rank | largest peak deviation "
          "| median | with a conditional: measured within the model's bound | parameter and "
          "output bytes = XLA's |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def score(shared: Path, verbose: bool) -> int:
    """Compare every program, print the table (Markdown), the cases not measured and the
    disagreements; exit 1 when a figure disagrees."""
    scores = [CorpusScore("JAX programs"), CorpusScore("XLA partitioner cases"),
              CorpusScore("XLA propagation cases")]
    unmeasured = unmeasured_cases(shared)
    scores[1].not_attempted = len(unmeasured["xla-partitioner.json"])
    scores[2].not_attempted = len(unmeasured["xla-propagation.json"])
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        programs = shared / "jax-programs"
        for folder in sorted(p for p in programs.iterdir() if p.is_dir()) \
                if programs.is_dir() else ():
            reference = json.loads((folder / "reference.json").read_text())
            memory = reference["memory_per_device"]
            _record(scores[0], folder.name, lambda: compare_program(
                folder / "program.hlo", reference["num_partitions"], workdir,
                folder / "inputs.npz", (memory["parameter_bytes"], memory["output_bytes"])),
                verbose)
        for corpus, cases in ((scores[1], agreement_cases(shared)),
                              (scores[2], propagation_agreement_cases(shared))):
            for case in cases:
                program = workdir / "case.hlo"
                program.write_text(case["hlo"])
                _record(corpus, case["name"],
                        lambda: compare_program(program, case["num_devices"], workdir), verbose)
    print(HEADER)
    for s in scores:
        print(f"| {s.row()} |")
    for corpus, listed in unmeasured.items():
        for name, why in listed:
            print(f"not measured: {corpus} {name}: {why}")
    for s in scores:
        for name, why in s.timed_out.items():
            print(f"not measured: {s.name} {name}: {why}")
    disagreements = [(s.name, name, a) for s in scores for name, a in s.agreements.items()
                     if not _agrees(a)]
    for corpus, name, a in disagreements:
        print(f"disagrees: {corpus} {name}: {a}")
    for s in scores:
        for name, why in s.refused.items():
            print(f"refused: {s.name} {name}: {why}")
    return 1 if disagreements else 0


def _record(score: CorpusScore, name: str, compare_one, verbose: bool) -> None:
    """Run `compare_one()` and file its outcome under `name`."""
    try:
        result = compare_one()
    except RunTimedOut as e:
        score.timed_out[name] = str(e)
        result = str(e)
    else:
        if isinstance(result, str):
            score.refused[name] = result
        else:
            score.agreements[name] = result
    if verbose:
        print(f"{score.name} {name}: {result}", file=sys.stderr, flush=True)


def _agrees(a: Agreement) -> bool:
    if a.bounded_only:
        return a.within_bounds
    return a.collectives_equal == a.collectives and a.flops_equal and \
        all(abs(d) <= MEMORY_TOLERANCE for d in a.peak_deviations) and \
        a.xla_memory_equal is not False


__all__ = ["agreement_cases", "propagation_agreement_cases", "unmeasured_cases", "compare",
           "compare_program", "score", "Agreement", "RunTimedOut", "MAX_VALUE_BYTES",
           "MAX_MULTIPLY_ADDS", "QUICK_VALUE_BYTES", "QUICK_MULTIPLY_ADDS", "MEMORY_TOLERANCE"]
