"""Atomic output files: write to a temporary file beside the target, rename into place when done.

A failed or interrupted writer leaves no partial file behind (the temporary file is removed).
A target that exists and is not a regular file (`/dev/null`, `/dev/stdout`, a named pipe) is
written directly: renaming over it would replace the device or pipe with a regular file.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb"):
    """`with atomic_output("out.npz") as f: ...` — `f` is a file opened with `mode`."""
    target = Path(path)
    try:
        special = not stat.S_ISREG(target.stat().st_mode)
    except FileNotFoundError:
        special = False
    if special:
        with open(target, mode) as f:
            yield f
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
