"""Long fuzzing campaigns (`make fuzz`): generated valid programs through every command, and
mutated texts through the parser; counts per outcome class, each failing input saved.

Inputs are numbered: program `i` is `case(seed + i)`, text `i` is `mutant(corpus, seed, i)`,
so a campaign split over worker processes checks the same inputs as one run, and any failure
is reproduced from its number alone (the saved files also hold it)."""
from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import case
from .checks import PROGRAM_OUTCOMES, TEXT_OUTCOMES, check_case, check_text, run_cli
from .known import known_defect
from .mutate import corpus_texts, mutant


@dataclass
class Tally:
    """Counts per outcome class, and the failing inputs' numbers per class."""

    kind: str
    planned: int = 0                                 # inputs the campaign was asked to check
    seconds: float = 0.0
    counts: Counter = field(default_factory=Counter)
    failures: dict = field(default_factory=dict)     # outcome -> [index]
    known: Counter = field(default_factory=Counter)  # (outcome, known defect) -> count

    def add(self, index: int, outcome: str, defect: str | None = None) -> None:
        self.counts[outcome] += 1
        if outcome not in ("ok", "error"):
            self.failures.setdefault(outcome, []).append(index)
            if defect is not None:
                self.known[outcome, defect] += 1

    @property
    def failed(self) -> int:
        return sum(len(v) for v in self.failures.values())

    def report(self, outcomes) -> str:
        total = sum(self.counts.values())
        cells = ", ".join(f"{o} {self.counts[o]}" for o in outcomes)
        budget = f" (of {self.planned}: the time budget ran out)" if total < self.planned else ""
        line = f"{self.kind}: {total} inputs{budget} in {self.seconds / 60:.1f} min: {cells}"
        for outcome, indices in sorted(self.failures.items()):
            shown = ", ".join(map(str, indices[:10])) + (" ..." if len(indices) > 10 else "")
            line += f"\n  {outcome}: inputs {shown}"
            for (o, defect), count in sorted(self.known.items()):
                if o == outcome:
                    line += f"\n    {count} of them: known defect: {defect}"
        return line


# ---- one input ---------------------------------------------------------------------------------

def _save(out: Path, outcome: str, name: str, files: dict[str, str | bytes]) -> None:
    directory = out / outcome
    directory.mkdir(parents=True, exist_ok=True)
    for suffix, content in files.items():
        path = directory / f"{name}{suffix}"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def check_program(index: int, seed: int, out: Path, backend: str,
                  timeout: float) -> tuple[str, str | None]:
    c = case(seed + index)
    garbage = index % 2 == 1
    with tempfile.TemporaryDirectory(prefix="gspmdc-fuzz-") as tmp:
        verdict = check_case(c, tmp, backend=backend, garbage=garbage, seed=index,
                             timeout=timeout)
    if verdict.outcome != "ok":
        options = (f"--propagate-to-output {str(c.propagate_to_output).lower()} "
                   f"--propagate-to-parameters {str(c.propagate_to_parameters).lower()}")
        note = (f"program {index}: case({seed + index}), {c.num_partitions} partitions, "
                f"backend {backend}{', garbage padding' if garbage else ''}, run seed {index}\n"
                f"options: {options}\n\n{verdict.detail}\n")
        files = {".hlo": c.text, ".txt": note}
        if c.reference_text is not None:
            files[".reference.hlo"] = c.reference_text
        _save(out, verdict.outcome, f"program-{seed + index}", files)
    return verdict.outcome, known_defect(verdict.detail) if verdict.outcome != "ok" else None


#: the corpus of the worker process (built once per process)
_CORPUS: list[str] = []


def check_mutant(index: int, seed: int, out: Path, timeout: float,
                 deep: bool) -> tuple[str, str | None]:
    text, names = mutant(_CORPUS, seed, index)
    with tempfile.TemporaryDirectory(prefix="gspmdc-fuzz-") as tmp:
        verdict = check_text(text, timeout=timeout, workdir=tmp)
        if verdict.outcome == "ok" and deep:
            verdict = _deeper(Path(tmp) / "input.hlo", timeout)
    if verdict.outcome not in ("ok", "error"):
        _save(out, verdict.outcome, f"text-{seed}-{index}",
              {".hlo": text, ".txt": f"text {index} of seed {seed}: mutations "
                                     f"{', '.join(names)}\n\n{verdict.detail}\n"})
        return verdict.outcome, known_defect(verdict.detail)
    return verdict.outcome, None


def _deeper(path: Path, timeout: float):
    """A mutant that parses: propagate and compile it too (a clean refusal is fine)."""
    from .checks import Verdict
    for argv in (["propagate", str(path), "-o", os.devnull],
                 ["compile", str(path), "-n", "2", "-o", os.devnull]):
        result = run_cli(argv, timeout)
        if result.outcome not in ("ok", "error"):
            return Verdict(result.outcome, f"gspmdc {' '.join(argv)} -> exit {result.code}\n"
                                           f"{result.stderr.strip()}")
    return Verdict("ok")


# ---- campaigns ---------------------------------------------------------------------------------

def _init_worker(shared: str | None, generated: int) -> None:
    global _CORPUS
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    _CORPUS = corpus_texts(generated=generated,
                           shared=Path(shared) if shared and Path(shared).is_dir() else None)


def _program_job(args):
    index, seed, out, backend, timeout = args
    return (index, *check_program(index, seed, Path(out), backend, timeout))


def _text_job(args):
    index, seed, out, timeout, deep = args
    return (index, *check_mutant(index, seed, Path(out), timeout, deep))


def _preload() -> None:
    """Import all of gspmdc (and build the parser) before forking the workers: they then run
    the code as it was when the campaign started, even while the tree is being edited."""
    import importlib
    import pkgutil
    from gspmdc import api
    for package in ("gspmdc", "gspmdc.ir", "gspmdc.passes", "gspmdc.runtime"):
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    api.parse("HloModule m\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n")


#: inputs handed to the workers between two looks at the clock
BATCH = 200


def run(kind: str, jobs_args: list, job, jobs: int, init_args: tuple, outcomes,
        minutes: float = 0.0, progress_every: float = 30.0) -> Tally:
    """Check every input of `jobs_args` on `jobs` workers, or, with a budget of `minutes`
    (0: none), the batches of `BATCH` inputs (in input order) started before it ran out, at
    least one; the tally says how many of how many."""
    _preload()
    tally = Tally(kind, planned=len(jobs_args))
    started = last = time.time()
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs, initializer=_init_worker, initargs=init_args,
                      maxtasksperchild=2000) as pool:
        for first in range(0, len(jobs_args), BATCH):
            if first and minutes and time.time() - started >= 60 * minutes:
                break
            batch = jobs_args[first:first + BATCH]
            for index, outcome, defect in pool.imap_unordered(job, batch, chunksize=4):
                tally.add(index, outcome, defect)
                now = time.time()
                if now - last >= progress_every:
                    last = now
                    done = sum(tally.counts.values())
                    print(f"  {kind}: {done}/{len(jobs_args)} in {now - started:.0f} s "
                          f"({dict(tally.counts)})", file=sys.stderr, flush=True)
    tally.seconds = time.time() - started
    for v in tally.failures.values():
        v.sort()
    return tally


def programs(count: int, seed: int, out: Path, *, jobs: int, timeout: float,
             mpi_every: int, minutes: float = 0.0) -> Tally:
    args = [(i, seed, str(out), "mpi" if mpi_every and i % mpi_every == mpi_every - 1
             else "local", timeout) for i in range(count)]
    on_mpi = sum(a[3] == "mpi" for a in args)
    kind = f"programs ({count - on_mpi} local backend, {on_mpi} MPI)"
    return run(kind, args, _program_job, jobs, (None, 0), PROGRAM_OUTCOMES, minutes)


def texts(count: int, seed: int, out: Path, *, jobs: int, timeout: float, shared: str | None,
          deep: bool, minutes: float = 0.0) -> Tally:
    args = [(i, seed, str(out), timeout, deep) for i in range(count)]
    return run("texts", args, _text_job, jobs, (shared, 200), TEXT_OUTCOMES, minutes)
