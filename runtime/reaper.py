"""The reaper of a `gspmdc run` job: a small process that cleans up if the launcher dies.

`start_reaper(run_dir, started_at)` forks the launcher (twice: the reaper is no child of the
launcher) into a reaper in a session of its own (so a signal to the launcher's process group does
not reach it), with nothing open but /dev/null and a pipe from the launcher: a fork, not a new
Python, so that it costs no interpreter start-up and no imports while the job starts. The launcher writes to the returned `Reaper`, one line each:

- `mpiexec N`: the job's `mpiexec`; `pid N`: another process of the job on this machine (the
  rank server, each local rank); each recorded with its start time, so that a later process
  reusing the pid is spared;
- `file PATH`: a file to remove (the output being received);
- `done`: the launcher cleaned up itself; the reaper exits.

When the pipe closes without `done` (the launcher was killed, even with SIGKILL, or crashed), the
reaper stops the job as the launcher would (`mpi_processes.stop_job`: those processes and their
descendants killed, `mpiexec` and its proxies left to end cleanly), removes MPICH's
shared-memory segments the job left (`mpi_processes.sweep_orphan_segments`), the files and the
run directory, and exits. It holds nothing else, so it costs a sleeping process per running job.

Fork it before the launcher starts any thread (the child runs only this module's loop, but a lock
another thread held at the fork would stay held in it).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

from .mpi_processes import start_time, stop_job, sweep_orphan_segments, unlink_segments


class Reaper:
    """The launcher's end of the pipe to its reaper."""

    def __init__(self, fd: int):
        self._pipe = os.fdopen(fd, "w")

    def tell(self, line: str) -> None:
        """Send one line (`pid N`, `file PATH`, `done`); a reaper already gone is ignored."""
        try:
            self._pipe.write(line + "\n")
            self._pipe.flush()
        except (BrokenPipeError, ValueError):
            pass

    def close(self) -> None:
        try:
            self._pipe.close()
        except BrokenPipeError:
            pass


def start_reaper(run_dir: Path, started_at: float) -> Reaper:
    """Fork the reaper of the job whose run directory is `run_dir` and which started at
    `started_at` (a `time.time()`; MPICH segments created since then are the job's)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                    # a child that forks the reaper and exits, so that the
        code = 0                    # launcher has no child to wait for
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(read, 0)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.closerange(3, _max_fd())                 # the launcher's files, sockets, pipes
            with open(0, closefd=False) as lines:
                reap(lines, run_dir, started_at)
        except BaseException:  # noqa: BLE001 - the child never returns into the launcher
            code = 1
        finally:
            os._exit(code)
    os.close(read)
    os.waitpid(pid, 0)
    return Reaper(write)


def reap(lines: Iterable[str], run_dir: Path, started_at: float) -> None:
    """Follow the launcher's `lines` (see the module docstring) until `done`, or clean up after
    the job when they end without it."""
    started: dict[int, int | None] = {}     # pid -> its start time, when it was announced
    mpiexec: int | None = None
    files: list[str] = []
    for line in lines:
        word, _, value = line.strip().partition(" ")
        if word == "done":
            return
        if word in ("pid", "mpiexec"):
            started[int(value)] = start_time(int(value))
            if word == "mpiexec":
                mpiexec = int(value)
        elif word == "file":
            files.append(value)
    same = {pid for pid, at in started.items() if at is not None and start_time(pid) == at}
    stop_job(mpiexec if mpiexec in same else None, same - {mpiexec})
    sweep_orphan_segments(started_at)
    unlink_segments(files)
    shutil.rmtree(run_dir, ignore_errors=True)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 1024
