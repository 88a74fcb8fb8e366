"""Running inputs through gspmdc and sorting what happens into outcome classes.

The CLI runs in-process (`gspmdc.cli.main`, output captured) for speed; a per-input alarm turns
a hang into the `hang` outcome. `run_subprocess` runs the installed `gspmdc` instead (a sample of
inputs takes that path, as a user's shell would).

Outcome classes:
- `ok`: exit 0 (for a valid program: every command succeeded and values matched);
- `error`: exit 2 with one clean message (for a broken text: with `file:line:col` where the
  message is about a place in the text; `unlocated` when it is not) — for a generated valid
  program this is a failure, `rejected`;
- `mismatch`: exit 1, or values differing from the reference program;
- `internal`: exit 3, an `internal error`, a traceback, an exit 2 without a clean message or
  a syntax message without its location;
- `hang`: the input did not finish within its time limit.
"""
from __future__ import annotations

import contextlib
import io
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

#: outcome classes of valid generated programs, and of broken texts
PROGRAM_OUTCOMES = ("ok", "rejected", "mismatch", "internal", "hang")
TEXT_OUTCOMES = ("ok", "error", "unlocated", "internal", "hang")
#: a location `file:line:col:` at the start of a message
LOCATION = re.compile(r"gspmdc: error: [^\n]*?:(\d+):(\d+): ")


class Hang(BaseException):
    """Raised by the alarm in the main thread (a BaseException: the CLI must not catch it)."""


@dataclass(frozen=True)
class Result:
    """One command's exit code and captured output."""

    argv: tuple[str, ...]
    code: int | None          # None: hang
    stdout: str
    stderr: str

    @property
    def outcome(self) -> str:
        return classify(self.code, self.stderr)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one input and, when not ok, what happened."""

    outcome: str
    detail: str = ""


def classify(code: int | None, stderr: str) -> str:
    if code is None:
        return "hang"
    if code == 0:
        return "ok"
    if code == 1:
        return "mismatch"
    if code == 2 and stderr.startswith("gspmdc: error: ") and "internal error" not in stderr \
            and "Traceback" not in stderr:
        return "error"
    return "internal"


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise `Hang` in the main thread after `seconds` of CPU time (a loop that never ends
    burns CPU; a busy machine merely slows it down), or after ten times as long on the clock
    (a wait that never ends). No limit off the main thread."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise Hang()
    previous = {sig: signal.signal(sig, expire) for sig in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, 10 * seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_cli(argv: Sequence[str], timeout: float = 20.0) -> Result:
    """`gspmdc ARGV` in this process; a Result (code None when it ran out of time)."""
    from gspmdc.cli import main
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                time_limit(timeout):
            try:
                code = main(list(argv))
            except SystemExit as e:       # argparse
                code = e.code if isinstance(e.code, int) else 2
    except Hang:
        code = None
    except RecursionError as e:         # escaped the CLI's own handling: an internal error
        code, err = 3, io.StringIO(f"Traceback (escaped the CLI): RecursionError: {e}")
    return Result(tuple(argv), code, out.getvalue(), err.getvalue())


def run_subprocess(argv: Sequence[str], timeout: float = 60.0) -> Result:
    """The installed `gspmdc ARGV` in a child process."""
    gspmdc = Path(sys.executable).with_name("gspmdc")
    try:
        proc = subprocess.run([str(gspmdc), *argv], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return Result(tuple(argv), None, "", "")
    return Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def check_case(case, workdir: str | Path, *, backend: str = "local", garbage: bool = False,
               seed: int = 0, timeout: float = 60.0, subprocess_cli: bool = False) -> Verdict:
    """Every command on a generated valid program: parse, propagate (with the case's options),
    explain, compile, explain a collective of the compiled program, and run the propagated
    program with `--check` (when the case has a separate reference program, its outputs are
    also compared with the reference's evaluation). `ok` when all exit 0 and the values
    match."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    source = work / "case.hlo"
    source.write_text(case.text)
    propagated, compiled = work / "propagated.hlo", work / "compiled.hlo"
    run = run_subprocess if subprocess_cli else run_cli
    n = str(case.num_partitions)
    steps = [
        ["parse", str(source), "-o", str(work / "parsed.hlo")],
        ["propagate", str(source), "-o", str(propagated),
         "--propagate-to-output", _flag(case.propagate_to_output),
         "--propagate-to-parameters", _flag(case.propagate_to_parameters)],
        ["compile", str(propagated), "-n", n, "-o", str(compiled)],
    ]
    for argv in steps:
        result = run(argv, timeout)
        if result.code != 0:
            return _verdict(result)
    for argv in _explain_commands(source, compiled):
        result = run(argv, timeout)
        if result.code != 0:
            return _verdict(result)
    run_argv = ["run", str(propagated), "-n", n, "--backend", backend, "-q", "--seed", str(seed),
                "--timeout", str(timeout)]
    # MPI runs start from a fresh process: `--timeout` counts from the process start
    if backend == "mpi":
        run = run_subprocess
    if garbage:
        run_argv.append("--garbage-padding")
    if case.reference_text is None:
        return _verdict(run(run_argv + ["--check"], timeout * 2))
    outputs, expected = work / "out.npz", work / "want.npz"
    reference = work / "reference.hlo"
    reference.write_text(case.reference_text)
    result = run(run_argv + ["--check", "--outputs", str(outputs)], timeout * 2)
    if result.code != 0:
        return _verdict(result)
    result = run(["eval", str(reference), "-q", "--seed", str(seed), "--outputs", str(expected)],
                 timeout)
    if result.code != 0:
        return _verdict(result)
    return compare_files(outputs, expected, case.reference_text)


def _explain_commands(source: Path, compiled: Path) -> list[list[str]]:
    """`explain` of the root of the source, and of the first collective of the compiled program
    (when it has one)."""
    text = source.read_text()
    root = re.search(r"ROOT ([\w.\-]+) =", text.split("ENTRY", 1)[1])
    commands = [["explain", str(source), root.group(1)]] if root else []
    spmd = compiled.read_text()
    match = re.search(r"^\s*(?:ROOT )?([\w.\-]+) = \S+ (all-reduce|all-gather|all-to-all|"
                      r"collective-permute|reduce-scatter)\(", spmd, re.M)
    if match:
        commands.append(["explain", str(compiled), match.group(1)])
    return commands


def compare_files(got_path: Path, want_path: Path, reference_text: str) -> Verdict:
    from gspmdc import api
    from gspmdc.runtime.compare import check_tolerance, compare_output_arrays
    with np.load(got_path) as g, np.load(want_path) as w:
        got, want = _typed(dict(g)), _typed(dict(w))
    tolerance = check_tolerance(api.parse(reference_text))
    bad = [r.line() for r in compare_output_arrays(got, want, tolerance) if not r.ok]
    return Verdict("mismatch", "; ".join(bad)) if bad else Verdict("ok")


def _typed(arrays: dict) -> dict:
    """bf16 arrays read back from an npz file (raw 2-byte voids) as bf16."""
    import ml_dtypes
    return {k: v.view(ml_dtypes.bfloat16) if v.dtype.kind == "V" and v.dtype.itemsize == 2 else v
            for k, v in arrays.items()}


def _verdict(result: Result) -> Verdict:
    outcome = result.outcome
    if outcome == "ok":
        return Verdict("ok")
    detail = f"gspmdc {' '.join(result.argv)} -> exit {result.code}\n{result.stderr.strip()}"
    if outcome == "mismatch":
        detail += "\n" + "\n".join(line for line in result.stdout.splitlines() if "MISMATCH" in line)
    # a generated program is valid: a clean refusal is a failure of its own class
    return Verdict("rejected" if outcome == "error" else outcome, detail)


#: clean errors that are about no one place in the text (so they have no file:line:col)
PLACELESS = (
    re.compile(r"gspmdc: error: [^\n]*: cannot read: "),              # not UTF-8, unreadable
    re.compile(r"gspmdc: error: computation \S+: recursive call chain "),
    re.compile(r"gspmdc: error: module \S+: entry computation "),
)


def check_text(text: str | bytes, *, timeout: float = 10.0, filename: str = "input.hlo",
               workdir: str | Path | None = None, subprocess_cli: bool = False) -> Verdict:
    """One (possibly broken) text through `gspmdc parse`: `ok`; `error` (exit 2 with one clean
    message starting with file:line:col, or one of the PLACELESS kinds); else a failure:
    `unlocated` (a clean message that should say where), `internal`, `hang`."""
    if workdir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_text(text, timeout=timeout, filename=filename, workdir=tmp,
                              subprocess_cli=subprocess_cli)
    path = Path(workdir) / filename
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    run = run_subprocess if subprocess_cli else run_cli
    result = run(["parse", str(path), "-o", str(Path(workdir) / "out.hlo")], timeout)
    outcome = result.outcome
    if outcome == "error" and not result.stderr.startswith(f"gspmdc: error: {path}:") \
            or outcome == "error" and not LOCATION.match(result.stderr):
        if not any(p.match(result.stderr) for p in PLACELESS):
            return Verdict("unlocated", result.stderr.strip())
    if outcome in ("ok", "error"):
        return Verdict(outcome)
    return Verdict(outcome, f"exit {result.code}: {result.stderr.strip()}")
