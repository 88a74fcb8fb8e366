"""The reaper of a `gspmdc run` job: a small process that cleans up if the launcher dies.

`start_reaper(run_dir, started_at)` starts `reaper.sh` (a shell, in a session of its own, so
that a signal to the launcher's process group does not reach it, with nothing open but a pipe
from the launcher and /dev/null): a new program rather than a fork of the launcher, whose every
page a fork would leave copy-on-write for the length of the job (1,500 page faults of the
example's run, on the launcher's critical path). The launcher writes to the returned `Reaper`,
one line each:

- `mpiexec N START`: the job's `mpiexec`; `pid N START`: another process of the job on this
  machine (the rank server, each local rank); each with its start time (`tell_process`), so
  that a later process reusing the pid is spared;
- `done`: the launcher cleaned up itself; the reaper exits.

The shell keeps the lines; when the pipe closes without `done` (the launcher was killed, even
with SIGKILL, or crashed), it starts `python -m gspmdc.runtime.reaper RUN_DIR STARTED_AT` (`main`)
with the lines on its standard input, which stops the job as the launcher would
(`mpi_processes.stop_job`: those processes and their descendants killed, `mpiexec` and its
proxies left to end cleanly; when the launcher died before it named `mpiexec`, the processes
whose command line names the run directory, `mpiexec` and the rank stubs on one machine, are
killed with their descendants), removes MPICH's shared-memory segments the job left
(`mpi_processes.sweep_orphan_segments`) and the run directory (`reap`), and exits.

Start it before the launcher starts any thread or forks (nothing of the launcher's is inherited
but the pipe, and `subprocess` starts the shell without a fork of this process's memory).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable

from .mpi_processes import processes_naming, start_time, stop_job, sweep_orphan_segments

#: the shell that waits for the launcher's lines
_SCRIPT = Path(__file__).with_name("reaper.sh")


class Reaper:
    """The launcher's end of the pipe to its reaper (`proc`, the shell)."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    def tell(self, line: str) -> None:
        """Send one line (e.g. `done`); a reaper already gone is ignored."""
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def tell_process(self, word: str, pid: int) -> None:
        """Send `mpiexec PID START` or `pid PID START`, with the process's start time (none
        when it is gone already: nothing to stop)."""
        started = start_time(pid)
        if started is not None:
            self.tell(f"{word} {pid} {started}")

    def close(self) -> None:
        """Close the pipe (the shell exits by itself after `done`: it is not waited for)."""
        try:
            self._proc.stdin.close()
        except BrokenPipeError:
            pass


def start_reaper(run_dir: Path, started_at: float) -> Reaper:
    """Start the reaper of the job whose run directory is `run_dir` and which started at
    `started_at` (a `time.time()`; MPICH segments created since then are the job's)."""
    return Reaper(subprocess.Popen(["/bin/sh", str(_SCRIPT), str(run_dir), repr(started_at),
                                    sys.executable], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   text=True, start_new_session=True))


def reap(lines: Iterable[str], run_dir: Path, started_at: float) -> None:
    """Follow the launcher's `lines` (see the module docstring) until `done`, or clean up after
    the job when they end without it."""
    started: dict[int, int] = {}            # pid -> its start time, when it was announced
    mpiexec: int | None = None
    for line in lines:
        word, _, value = line.strip().partition(" ")
        if word == "done":
            return
        if word in ("pid", "mpiexec"):
            pid, at = (int(number) for number in value.split())
            started[pid] = at
            if word == "mpiexec":
                mpiexec = pid
    same = {pid for pid, at in started.items() if start_time(pid) == at}
    if mpiexec is None:             # the launcher died before it could say: `mpiexec` and
        # the stubs name the run directory (so do this reaper and its shell)
        same |= set(processes_naming(str(run_dir))) - {os.getpid(), os.getppid()}
    stop_job(mpiexec if mpiexec in same else None, same - {mpiexec})
    sweep_orphan_segments(started_at)
    shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m gspmdc.runtime.reaper RUN_DIR STARTED_AT`, the launcher's lines on standard
    input (started by `reaper.sh` once the launcher died): clean up after the job (`reap`)."""
    run_dir, started_at = sys.argv[1:] if argv is None else argv
    reap(sys.stdin, Path(run_dir), float(started_at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
