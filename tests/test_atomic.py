"""Atomic outputs: all or nothing for regular files; pipes (like devices) are written in place.
(A regression here must not be tested on /dev/null: it would replace the machine's device.)"""
from __future__ import annotations

import os
import stat
import threading

import pytest

from gspmdc.atomic import atomic_output


def test_complete_write_replaces_the_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic_output(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_output(target, "w") as f:
            f.write("partial")
            raise RuntimeError("writer failed")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_named_pipes_are_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    with atomic_output(fifo, "w") as f:
        f.write("through the pipe")
    reader.join(timeout=10)
    assert received == ["through the pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def _with_umask(mask: int, fn):
    old = os.umask(mask)
    try:
        return fn()
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664),
                                        (0o027, 0o640)])
def test_a_new_file_honours_the_umask(tmp_path, mask, want):
    target = tmp_path / "out.txt"

    def write():
        with atomic_output(target, "w") as f:
            f.write("new")
    _with_umask(mask, write)
    assert _mode(target) == want and target.read_text() == "new"


@pytest.mark.parametrize("mode", [0o640, 0o755, 0o600, 0o664])
def test_an_existing_file_keeps_its_mode(tmp_path, mode):
    target = tmp_path / "out.txt"
    target.write_text("old")
    os.chmod(target, mode)

    def write():
        with atomic_output(target, "w") as f:
            f.write("new")
    _with_umask(0o077, write)
    assert _mode(target) == mode and target.read_text() == "new"


def test_a_symbolic_link_is_followed_and_kept(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with atomic_output(link, "w") as f:
        f.write("new")
    assert link.is_symlink() and real.read_text() == "new" and _mode(real) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_a_directory_target_is_a_clear_error(tmp_path):
    from gspmdc.errors import GspmdcError
    with pytest.raises(GspmdcError, match="it is a directory"):
        with atomic_output(tmp_path, "w") as f:
            f.write("x")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_while_writing_is_a_runtime_failure_and_leaves_nothing(tmp_path):
    import errno
    from gspmdc.errors import RuntimeFailure
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeFailure, match="cannot write .*out.txt: No space left on device"):
        with atomic_output(target, "w") as f:
            f.write("partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
