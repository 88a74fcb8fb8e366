"""Score `gspmdc cost` against measurement on the team's corpora: how closely the figures
modelled before running agree with what `gspmdc run --profile-json` counts on MPI ranks.

    python -m gspmdc.conformance cost [--shared DIR] [--verbose]     (make cost-agreement)

Every program is modelled in-process (the partitioned program of `gspmdc cost`, on the default
machine) and run as a user would run it,

    gspmdc run PROGRAM -n N -q --profile-json MEASURED.json [--inputs inputs.npz]

on N MPI ranks. The programs: the JAX programs (`jax-programs/*/program.hlo` on their inputs) and
XLA's partitioner test cases (`conformance/xla-partitioner.json`) that `agreement_cases` keeps:
those without host I/O whose values and dots fit a quick run (`MAX_VALUE_BYTES`,
`MAX_MULTIPLY_ADDS`; many of XLA's cases hold tensors of GiBs, meant for compilation only).

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

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gspmdc import api
from gspmdc.conformance import largest_value_bytes, multiply_adds
from gspmdc.errors import GspmdcError
from gspmdc.ir.ops import HOST_IO

#: the largest value and the most multiply-adds of a conformance case compared (a quick run)
MAX_VALUE_BYTES = 1 << 20
MAX_MULTIPLY_ADDS = 1e6
#: how far the measured peak of live arrays may lie from the modelled peak
MEMORY_TOLERANCE = 0.10
RUN_TIMEOUT_SECONDS = 300


def agreement_cases(shared: Path) -> list[dict]:
    """The cases of `xla-partitioner.json` compared (see the module docstring), in file order."""
    path = shared / "conformance" / "xla-partitioner.json"
    if not path.is_file():
        return []
    cases = []
    for case in json.loads(path.read_text())["cases"]:
        if HOST_IO & set(case["opcodes"]):
            continue
        try:
            module = api.parse(case["hlo"])
        except GspmdcError:
            continue
        if largest_value_bytes(module) <= MAX_VALUE_BYTES and \
                multiply_adds(module) <= MAX_MULTIPLY_ADDS:
            cases.append(case)
    return cases


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
               "--profile-json", str(measured_path)]
    if inputs is not None:
        command += ["--inputs", str(inputs)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS)
    if run.returncode == 2:
        return f"run: {run.stderr.strip().splitlines()[-1][:160]}"
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


@dataclass
class CorpusScore:
    """The agreements of one corpus and the programs refused, by name."""

    name: str
    agreements: dict[str, Agreement] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def row(self) -> str:
        a = list(self.agreements.values())
        exact = [x for x in a if not x.bounded_only]
        bounded = [x for x in a if x.bounded_only]
        deviations = [abs(d) for x in exact for d in x.peak_deviations]
        within = sum(all(abs(d) <= MEMORY_TOLERANCE for d in x.peak_deviations) for x in exact)
        xla = [x.xla_memory_equal for x in a if x.xla_memory_equal is not None]
        return " | ".join([
            self.name, str(len(a)), str(len(self.refused)),
            f"{sum(x.collectives_equal for x in exact)} / {sum(x.collectives for x in exact)}",
            f"{sum(x.flops_equal for x in exact)} / {len(exact)}",
            f"{within} / {len(exact)}",
            f"{max(deviations, default=0):.1%}", f"{statistics.median(deviations or [0]):.1%}",
            f"{sum(x.within_bounds for x in bounded)} / {len(bounded)}",
            f"{sum(xla)} / {len(xla)}" if xla else "—"])


HEADER = ("| corpus | programs compared | refused by gspmdc | collectives: bytes and calls equal "
          "| operations equal | peak memory within 10% on every rank | largest peak deviation "
          "| median | with a conditional: measured within the model's bound | parameter and "
          "output bytes = XLA's |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def score(shared: Path, verbose: bool) -> int:
    """Compare every program, print the table (Markdown) and the disagreements; exit 1 when a
    figure disagrees."""
    scores = [CorpusScore("JAX programs"), CorpusScore("XLA partitioner cases")]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for folder in sorted(p for p in (shared / "jax-programs").iterdir() if p.is_dir()):
            reference = json.loads((folder / "reference.json").read_text())
            memory = reference["memory_per_device"]
            result = compare_program(folder / "program.hlo", reference["num_partitions"], workdir,
                                     folder / "inputs.npz",
                                     (memory["parameter_bytes"], memory["output_bytes"]))
            _record(scores[0], folder.name, result, verbose)
        for case in agreement_cases(shared):
            program = workdir / "case.hlo"
            program.write_text(case["hlo"])
            result = compare_program(program, case["num_devices"], workdir)
            _record(scores[1], case["name"], result, verbose)
    print(HEADER)
    for s in scores:
        print(f"| {s.row()} |")
    disagreements = [(s.name, name, a) for s in scores for name, a in s.agreements.items()
                     if not _agrees(a)]
    for corpus, name, a in disagreements:
        print(f"disagrees: {corpus} {name}: {a}")
    if verbose:
        for s in scores:
            for name, why in s.refused.items():
                print(f"refused: {s.name} {name}: {why}")
    return 1 if disagreements else 0


def _record(score: CorpusScore, name: str, result: Agreement | str, verbose: bool) -> None:
    if isinstance(result, str):
        score.refused[name] = result
    else:
        score.agreements[name] = result
    if verbose:
        print(f"{score.name} {name}: {result}", file=sys.stderr)


def _agrees(a: Agreement) -> bool:
    if a.bounded_only:
        return a.within_bounds
    return a.collectives_equal == a.collectives and a.flops_equal and \
        all(abs(d) <= MEMORY_TOLERANCE for d in a.peak_deviations) and \
        a.xla_memory_equal is not False


__all__ = ["agreement_cases", "compare", "compare_program", "score", "Agreement",
           "MAX_VALUE_BYTES", "MAX_MULTIPLY_ADDS", "MEMORY_TOLERANCE"]
