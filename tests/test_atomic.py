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
