"""The operating-system side of MPI jobs (`runtime/mpi_processes.py`): which MPICH shared-memory
segments are orphans, killing a process tree, the launcher's death signal."""
from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gspmdc.runtime import mpi_processes

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir() or not Path("/proc").is_dir(),
                                reason="needs Linux /proc and /dev/shm")


def _segment(tmp_name: str) -> Path:
    path = Path("/dev/shm") / f"mpich_shm_{tmp_name}_0"
    path.write_bytes(b"\0" * 4096)
    return path


def test_the_sweep_removes_only_new_unmapped_segments_of_this_user():
    since = time.time()
    orphan = _segment(f"gspmdctest{uuid.uuid4().hex[:8]}")
    mapped = _segment(f"gspmdctest{uuid.uuid4().hex[:8]}")
    other = Path("/dev/shm") / f"gspmdctest_{uuid.uuid4().hex[:8]}"   # not MPICH's
    other.write_bytes(b"x")
    try:
        with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):
            assert str(mapped) in mpi_processes.mapped_mpich_segments()
            removed = mpi_processes.sweep_orphan_segments(since)
            assert str(orphan) in removed and not orphan.exists()
            assert mapped.exists() and other.exists()
        old = _segment(f"gspmdctest{uuid.uuid4().hex[:8]}")
        assert mpi_processes.sweep_orphan_segments(time.time() + 60) == []   # older than "since"
        assert old.exists()
        old.unlink()
    finally:
        for path in (orphan, mapped, other):
            path.unlink(missing_ok=True)


def test_kill_tree_kills_descendants_and_spares_the_rest():
    tree = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time\n"
                             "child = subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(60)'])\n"
                             "print(child.pid, flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        grandchild = int(tree.stdout.readline())
        assert mpi_processes.descendants([tree.pid]) == {tree.pid, grandchild}
        mpi_processes.kill_tree([tree.pid])
        assert tree.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while mpi_processes.alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not mpi_processes.alive(grandchild)
        assert bystander.poll() is None
    finally:
        for proc in (tree, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_child_that_asks_dies_with_its_parent():
    """The launcher starts mpiexec with `die_with_parent`: killing the parent kills the child."""
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "from gspmdc.runtime.mpi_processes import die_with_parent\n"
                               "child = subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(60)'], preexec_fn=die_with_parent)\n"
                               "print(child.pid, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert mpi_processes.alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while mpi_processes.alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not mpi_processes.alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_process_start_times():
    assert mpi_processes.start_time(os.getpid()) is not None
    child = subprocess.run([sys.executable, "-c", "import time; from gspmdc.runtime."
                            "mpi_processes import process_started_at; "
                            "print(time.time() - process_started_at())"],
                           capture_output=True, text=True, timeout=60)
    assert 0 <= float(child.stdout) < 60      # the child's age when it asked


def test_the_exit_descriptor_becomes_readable_when_the_process_exits():
    import select
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fd = mpi_processes.exit_descriptor(child.pid)
        if fd is None:
            pytest.skip("no pidfd on this system")
        try:
            assert select.select([fd], [], [], 0.2)[0] == []        # running
            child.kill()
            assert select.select([fd], [], [], 10)[0] == [fd]       # exited (not yet reaped)
        finally:
            os.close(fd)
    finally:
        child.kill()
        child.wait()
