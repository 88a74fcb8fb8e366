"""The reaper of a `gspmdc run` job: a small process that cleans up if the launcher dies.

`gspmdc run` starts `python -m gspmdc.runtime.reaper RUN_DIR STARTED_AT` in a session of its own
(so a signal to the launcher's process group does not reach it) and writes to its standard input,
one line each:

- `pid N`: a process of the job on this machine (`mpiexec`, each local rank; recorded with its
  start time, so that a later process reusing the pid is spared);
- `file PATH`: a file to remove (the output being received);
- `done`: the launcher cleaned up itself; the reaper exits.

When its standard input closes without `done` (the launcher was killed, even with SIGKILL, or
crashed), the reaper kills those processes and their descendants, removes MPICH's shared-memory
segments the job left (`mpi_processes.sweep_orphan_segments`), the files and the run directory,
and exits. It holds nothing else, so it costs a sleeping process per running job.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .mpi_processes import kill_tree, start_time, sweep_orphan_segments, unlink_segments


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m gspmdc.runtime.reaper RUN_DIR STARTED_AT (started by gspmdc run)",
              file=sys.stderr)
        return 2
    run_dir, started_at = Path(args[0]), float(args[1])
    started: dict[int, int | None] = {}     # pid -> its start time, when it was announced
    files: list[str] = []
    for line in sys.stdin:
        word, _, value = line.strip().partition(" ")
        if word == "done":
            return 0
        if word == "pid":
            started[int(value)] = start_time(int(value))
        elif word == "file":
            files.append(value)
    kill_tree([pid for pid, at in started.items() if at is not None and start_time(pid) == at])
    sweep_orphan_segments(started_at)
    unlink_segments(files)
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
