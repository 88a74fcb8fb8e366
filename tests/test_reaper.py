"""The reaper of a `gspmdc run` job (`runtime/reaper.py`, `reaper.sh`): when the launcher's pipe
closes without `done` it stops the processes the launcher named (those still the same
processes), and, when the launcher died before it named `mpiexec`, the processes whose command
line names the run directory; it removes the run directory. After `done` it leaves everything.
Real processes stand in for the job's (`sleep` under a shell)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gspmdc.runtime.mpi_processes import alive, start_time
from gspmdc.runtime.reaper import start_reaper

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")


def _sleeper(*arguments: str) -> subprocess.Popen:
    """A shell sleeping, with `arguments` on its command line, in a session of its own."""
    return subprocess.Popen(["/bin/sh", "-c", "sleep 60", "sleeper", *arguments],
                            start_new_session=True)


def _gone(proc: subprocess.Popen, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.02)
    return False


def _reaper_ended(run_dir: Path, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while run_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not run_dir.exists()


def test_a_launcher_that_dies_has_the_processes_it_named_stopped(tmp_path):
    run_dir = tmp_path / "gspmdc-run-x"
    run_dir.mkdir()
    named, stranger = _sleeper(), _sleeper()
    try:
        reaper = start_reaper(run_dir, time.time())
        reaper.tell_process("mpiexec", named.pid)
        reaper.close()                              # the launcher died: no `done`
        assert _gone(named)
        assert _reaper_ended(run_dir)
        assert stranger.poll() is None              # not the job's
    finally:
        for proc in (named, stranger):
            proc.kill()
            proc.wait()


def test_a_launcher_that_dies_before_naming_mpiexec_has_the_run_directorys_processes_stopped(
        tmp_path):
    run_dir = tmp_path / "gspmdc-run-y"
    run_dir.mkdir()
    stub, stranger = _sleeper(str(run_dir), "8"), _sleeper(str(tmp_path / "gspmdc-run-z"))
    try:
        reaper = start_reaper(run_dir, time.time())
        reaper.close()
        assert _gone(stub)
        assert _reaper_ended(run_dir)
        assert stranger.poll() is None
    finally:
        for proc in (stub, stranger):
            proc.kill()
            proc.wait()


def test_after_done_or_for_a_reused_pid_nothing_is_stopped(tmp_path):
    run_dir = tmp_path / "gspmdc-run-w"
    run_dir.mkdir()
    proc = _sleeper(str(run_dir))
    try:
        reaper = start_reaper(run_dir, time.time())
        reaper.tell_process("mpiexec", proc.pid)
        reaper.tell("done")
        reaper.close()
        time.sleep(0.5)
        assert proc.poll() is None and run_dir.exists()
        reaper = start_reaper(run_dir, time.time())     # a pid now someone else's
        reaper.tell(f"mpiexec {proc.pid} {start_time(proc.pid) - 1}")
        reaper.close()
        assert _reaper_ended(run_dir)
        assert proc.poll() is None and alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
