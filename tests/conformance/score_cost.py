"""Score `gspmdc cost` against measurement on the team's corpora: how closely the figures
modelled before running agree with what `gspmdc run --profile-json` counts.

    cd tests && python -m conformance.score cost [--shared DIR] [--verbose] [--cases NAME ...]
                                       [--timeout SECONDS] [--journal FILE]  (make cost-agreement)

Every program is modelled in-process (the partitioned program of `gspmdc cost`, on the default
machine) and run as a user would run it. The programs: the JAX programs (`jax-programs/*/
program.hlo` on their inputs), XLA's partitioner test cases (`conformance/xla-partitioner.json`,
on their `num_devices`) and XLA's propagation test cases (`conformance/xla-propagation.json`,
annotated global modules, on the partitions their shardings name). Where a program runs:

- on N MPI ranks, `gspmdc run PROGRAM -n N -q --profile-json MEASURED.json [--inputs ...]`, when
  its values and dots are small (`MPI_VALUE_BYTES`, `MPI_MULTIPLY_ADDS`: the JAX programs and the
  cases of `agreement_cases` and `propagation_agreement_cases`): every rank draws the global
  inputs, so a case of N partitions holds some N times its values;
- on the local backend otherwise (`gspmdc run PROGRAM -n N --backend local -q --profile-json`,
  in-process: `measure_on_local_backend`), the partition scorer's way for the cases it runs
  (`conformance.score`): one process draws the global inputs once, arrays over an eighth of the
  memory live in files (`runtime/spill.py`), and the run is a child process under this
  machine's limits (`MachineLimits`, `run_isolated`: memory capped, killed after its timeout,
  `--timeout`);
  the cases of `large_cases`;
- not at all when the case has host I/O, does not parse, or is too large for this machine
  (`MachineLimits.too_large`, as the partition scorer decides): `unmeasured_cases` lists them with
  the reason, and a run that runs out of time or memory is reported as not measured with why.

Both backends record the profile with the same code (`runtime/profile.py`, each partition its own
recorder), so the measured figures do not depend on where a program runs.

For each corpus the table counts the programs compared and those gspmdc refuses (exit 2), and for
the compared ones: collectives whose bytes sent and received by every partition and calls equal
the model's, programs whose operations per partition equal the model's, programs whose every
rank's peak of live arrays is within 10% of the liveness analysis's peak, the largest and the
median deviation of the peaks, and (JAX programs) parameter and output bytes per device equal to
XLA's memory analysis (`memory_per_device` in `reference.json`). A program with a conditional runs
one branch where the model counts the costlier: it is counted apart, as within the model's bound
when no measured figure exceeds the model's (the peak of live arrays by at most 10%).

`--journal FILE` appends each program's outcome to FILE (one JSON line, with the seconds it
took) as it finishes and takes the outcomes already there instead of running those programs
again, so a scoring run cut off resumes where it stopped; `--cases` scores only the named
programs (the table then covers those).
"""
from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gspmdc import api
from .score import (CaseOutOfMemory, CaseTimeout, ChildFailed, MachineLimits,
                    largest_value_bytes, multiply_adds, run_isolated)
from gspmdc.errors import GspmdcError
from gspmdc.ir.ops import HOST_IO

#: the largest value and the most multiply-adds of a case run on MPI ranks: every rank of a run
#: draws the global inputs, so a case of N partitions holds some N times its values, and the
#: runtime's convolutions and dots run at a few GFLOP/s on a shared 2-core machine; larger cases
#: run on the local backend under `MachineLimits`
MPI_VALUE_BYTES = 64 << 20
MPI_MULTIPLY_ADDS = 1e10
#: the quick cases, of which the normal test suite compares a sample
QUICK_VALUE_BYTES = 1 << 20
QUICK_MULTIPLY_ADDS = 1e6
#: how far the measured peak of live arrays may lie from the modelled peak
MEMORY_TOLERANCE = 0.10
RUN_TIMEOUT_SECONDS = 300
#: where a case runs (see the module docstring)
ON_MPI, ON_LOCAL = "mpi", "local"
CORPORA = ("xla-partitioner.json", "xla-propagation.json")


def agreement_cases(shared: Path, quick: bool = False) -> list[dict]:
    """The cases of `xla-partitioner.json` compared on MPI ranks (see the module docstring), in
    file order; `quick`: only those within `QUICK_VALUE_BYTES` and `QUICK_MULTIPLY_ADDS`."""
    return _runs_on_mpi(shared, "xla-partitioner.json", quick)


def propagation_agreement_cases(shared: Path, quick: bool = False) -> list[dict]:
    """The cases of `xla-propagation.json` compared on MPI ranks, in file order, each with the
    fields of a partitioner case that `compare_program` reads: `name` (the test's name and line:
    several tests share a name), `hlo`, `opcodes` and `num_devices` (the module's
    `num_partitions`, else the devices its shardings name, as `gspmdc run` takes them)."""
    return _runs_on_mpi(shared, "xla-propagation.json", quick)


def large_cases(shared: Path, limits: MachineLimits) -> dict[str, list[dict]]:
    """The cases of each XLA corpus file over the MPI limits that this machine can run on the
    local backend under `limits`, by file, in file order."""
    return {corpus: [case for case, where in _classified(shared, corpus, limits)
                     if where == ON_LOCAL] for corpus in CORPORA}


def unmeasured_cases(shared: Path, limits: MachineLimits) -> dict[str, list[tuple[str, str]]]:
    """The cases of each XLA corpus file not compared, by file: (name, why) for host I/O, a
    module gspmdc cannot parse, or one too large for this machine (`limits.too_large`)."""
    return {corpus: [(case["name"], where) for case, where in _classified(shared, corpus, limits)
                     if where not in (ON_MPI, ON_LOCAL)] for corpus in CORPORA}


def _runs_on_mpi(shared: Path, corpus: str, quick: bool) -> list[dict]:
    """The cases of one corpus file run on MPI ranks; `quick`: only the quick ones."""
    return [case for case, why, largest, work in _sized_cases(shared, corpus)
            if why is None and _fits_mpi(largest, work, quick)]


def _fits_mpi(largest: int, work: float, quick: bool = False) -> bool:
    """Whether a case whose largest value has `largest` bytes and whose dots and convolutions
    do `work` multiply-adds runs on MPI ranks (`quick`: is one of the quick cases)."""
    if quick:
        return largest <= QUICK_VALUE_BYTES and work <= QUICK_MULTIPLY_ADDS
    return largest <= MPI_VALUE_BYTES and work <= MPI_MULTIPLY_ADDS


def _classified(shared: Path, corpus: str, limits: MachineLimits) -> list[tuple[dict, str]]:
    """Every case of one corpus file with where it runs (`ON_MPI`, `ON_LOCAL`) or why it is not
    compared."""
    classified = []
    for case, why, largest, work in _sized_cases(shared, corpus):
        if why is None and _fits_mpi(largest, work):
            why = ON_MPI
        elif why is None:
            why = limits.too_large_for(largest, work) or ON_LOCAL
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
                    xla_memory: tuple[int, int] | None = None,
                    limits: MachineLimits | None = None) -> Agreement | str:
    """Model and run `path` on `n` partitions (on `inputs`, else random ones): on MPI ranks, or
    with `limits` on the local backend in a child process under them (see the module
    docstring); the agreement, or why gspmdc refused it. `xla_memory`: XLA's parameter and
    output bytes per device. Raises NotMeasured when the run outlasts its time or memory."""
    from gspmdc.partitioned import load_partitioned
    from gspmdc.passes.analysis.cost import program_cost
    from gspmdc.passes.analysis.machine import PRESETS
    try:
        module, n = load_partitioned(str(path), n)
        model = program_cost(module, n, PRESETS["tpu-v3"]).figures.to_json()
    except GspmdcError as e:
        return f"cost: {str(e).splitlines()[0][:160]}"
    if limits is None:
        measured = _measure_on_mpi(path, n, workdir, inputs)
    else:
        try:
            measured = run_isolated(limits, measure_on_local_backend, str(path), n,
                                    limits.timeout_seconds)
        except ChildFailed as e:
            if not e.clean:
                raise RuntimeError(f"gspmdc run --backend local {path}: {e}") from None
            measured = f"run: {str(e).splitlines()[0][:160]}"
        except (CaseTimeout, CaseOutOfMemory) as e:
            raise NotMeasured(str(e)) from None
    if isinstance(measured, str):
        return measured
    result = compare(model, measured)
    result.bounded_only = "conditional" in {inst.opcode for _, inst in module.all_instructions()}
    if xla_memory is not None:
        result.xla_memory_equal = (model["parameter_bytes_per_device"],
                                   model["output_bytes_per_device"]) == \
            ([xla_memory[0]] * n, [xla_memory[1]] * n)
    return result


def _measure_on_mpi(path: Path, n: int, workdir: Path, inputs: Path | None) -> dict | str:
    """`gspmdc run PATH -n N -q --profile-json` on MPI ranks: the measured figures, or why
    gspmdc refused to run it."""
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
        raise NotMeasured(f"the run took over {RUN_TIMEOUT_SECONDS} s")
    if run.returncode != 0:
        raise RuntimeError(f"gspmdc run {path} exited {run.returncode}: {run.stderr[-2000:]}")
    return json.loads(measured_path.read_text())


def measure_on_local_backend(path: str, n: int, timeout: float) -> dict:
    """`gspmdc run PATH -n N --backend local -q --profile-json` on random inputs (seed 0), in
    this process: the measured figures (`runtime/profile.measured_figures`). GspmdcError
    propagates (gspmdc refuses the program)."""
    from gspmdc.prepare import prepare_job
    from gspmdc.runtime.job import execute_local
    from gspmdc.runtime.options import RunOptions
    with tempfile.TemporaryDirectory() as folder:
        measured_path = Path(folder) / "measured.json"
        options = RunOptions(num_partitions=n, seed=0, timeout=timeout, quiet=True,
                             profile_json=str(measured_path))
        execute_local(prepare_job(path, options))
        return json.loads(measured_path.read_text())


class NotMeasured(Exception):
    """The run outlasted its time (`RUN_TIMEOUT_SECONDS` on MPI ranks, the machine's limit on
    the local backend) or ran out of memory: the program is not measured."""


@dataclass
class CorpusScore:
    """The agreements of one corpus, the programs refused and those whose run ran out of time
    or memory, by name, and how many of the corpus's cases were not attempted (see
    `unmeasured_cases`)."""

    name: str
    agreements: dict[str, Agreement] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    not_measured: dict[str, str] = field(default_factory=dict)
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
            "—" if self.not_attempted is None else str(self.not_attempted + len(self.not_measured)),
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


def score(shared: Path, verbose: bool, names: list[str] | None = None,
          journal: Path | None = None, limits: MachineLimits | None = None) -> int:
    """Compare every program (or those named in `names`), print the table (Markdown), the
    cases not measured and the disagreements; exit 1 when a figure disagrees. `journal`: see
    the module docstring; `limits`: this machine's (default `MachineLimits.of_this_machine`)."""
    limits = limits or MachineLimits.of_this_machine()
    wanted = (lambda name: True) if names is None else set(names).__contains__
    scores = [CorpusScore("JAX programs"), CorpusScore("XLA partitioner cases"),
              CorpusScore("XLA partitioner cases over 64 MiB (local backend)"),
              CorpusScore("XLA propagation cases"),
              CorpusScore("XLA propagation cases over 64 MiB (local backend)")]
    unmeasured = {corpus: [(name, why) for name, why in listed if wanted(name)]
                  for corpus, listed in unmeasured_cases(shared, limits).items()}
    large = large_cases(shared, limits)
    for corpus, small, big in (("xla-partitioner.json", scores[1], scores[2]),
                               ("xla-propagation.json", scores[3], scores[4])):
        small.not_attempted = sum(not why.startswith("too large") for _, why in unmeasured[corpus])
        big.not_attempted = len(unmeasured[corpus]) - small.not_attempted
    done = _read_journal(journal)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        programs = shared / "jax-programs"
        for folder in sorted(p for p in programs.iterdir() if p.is_dir()) \
                if programs.is_dir() else ():
            if not wanted(folder.name):
                continue
            reference = json.loads((folder / "reference.json").read_text())
            memory = reference["memory_per_device"]
            _record(scores[0], folder.name, lambda: compare_program(
                folder / "program.hlo", reference["num_partitions"], workdir,
                folder / "inputs.npz", (memory["parameter_bytes"], memory["output_bytes"])),
                verbose, done, journal)
        for corpus, cases, on in ((scores[1], agreement_cases(shared), None),
                                  (scores[2], large["xla-partitioner.json"], limits),
                                  (scores[3], propagation_agreement_cases(shared), None),
                                  (scores[4], large["xla-propagation.json"], limits)):
            for case in cases:
                if not wanted(case["name"]):
                    continue
                program = workdir / "case.hlo"
                _record(corpus, case["name"], lambda: compare_program(
                    _written(program, case["hlo"]), case["num_devices"], workdir,
                    limits=on), verbose, done, journal)
    print(HEADER)
    for s in scores:
        print(f"| {s.row()} |")
    for corpus, listed in unmeasured.items():
        for name, why in listed:
            print(f"not measured: {corpus} {name}: {why}")
    for s in scores:
        for name, why in s.not_measured.items():
            print(f"not measured: {s.name} {name}: {why}")
    disagreements = [(s.name, name, a) for s in scores for name, a in s.agreements.items()
                     if not _agrees(a)]
    for corpus, name, a in disagreements:
        print(f"disagrees: {corpus} {name}: {a}")
    for s in scores:
        for name, why in s.refused.items():
            print(f"refused: {s.name} {name}: {why}")
    return 1 if disagreements else 0


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _record(score: CorpusScore, name: str, compare_one, verbose: bool,
            done: dict[tuple[str, str], dict], journal: Path | None) -> None:
    """File the outcome of `compare_one()` under `name` (the journal's, when it has one)."""
    outcome = done.get((score.name, name))
    if outcome is None:
        start = time.perf_counter()
        try:
            result = compare_one()
        except NotMeasured as e:
            outcome = {"not_measured": str(e)}
        else:
            outcome = {"refused": result} if isinstance(result, str) else \
                {"agreement": asdict(result)}
        if journal is not None:
            with journal.open("a") as f:
                f.write(json.dumps({"corpus": score.name, "name": name, **outcome,
                                    "seconds": round(time.perf_counter() - start, 1)}) + "\n")
    if "agreement" in outcome:
        score.agreements[name] = Agreement(**outcome["agreement"])
    elif "refused" in outcome:
        score.refused[name] = outcome["refused"]
    else:
        score.not_measured[name] = outcome["not_measured"]
    if verbose:
        print(f"{score.name} {name}: {next(iter(outcome.values()))}", file=sys.stderr,
              flush=True)


def _read_journal(journal: Path | None) -> dict[tuple[str, str], dict]:
    """The outcomes a journal holds, by corpus and name (the last line of each wins)."""
    if journal is None or not journal.is_file():
        return {}
    done = {}
    for line in journal.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            entry.pop("seconds", None)
            done[entry.pop("corpus"), entry.pop("name")] = entry
    return done


def _agrees(a: Agreement) -> bool:
    if a.bounded_only:
        return a.within_bounds
    return a.collectives_equal == a.collectives and a.flops_equal and \
        all(abs(d) <= MEMORY_TOLERANCE for d in a.peak_deviations) and \
        a.xla_memory_equal is not False


__all__ = ["agreement_cases", "propagation_agreement_cases", "large_cases", "unmeasured_cases",
           "compare", "compare_program", "measure_on_local_backend", "score", "Agreement",
           "NotMeasured", "MPI_VALUE_BYTES", "MPI_MULTIPLY_ADDS", "QUICK_VALUE_BYTES",
           "QUICK_MULTIPLY_ADDS", "MEMORY_TOLERANCE"]
