"""A process that executes programs keeps the memory of freed arrays for the next ones
(runtime/allocation.py): an array of the size of one freed before reuses its memory instead of
faulting in fresh pages. Counted with the kernel's minor page faults of a fresh process, whose
allocator settings are glibc's defaults, in the main thread and in a thread (the local
backend's partitions run in threads, which glibc gives heaps of their own)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gspmdc.runtime.allocation import keep_freed_memory

#: executions of a program whose results are arrays of 4, 2 and 4 MiB (2,560 pages)
PROBE = """
import resource, sys, threading
import numpy as np
from gspmdc.runtime.allocation import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
faults = []

def executions():
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.ones((1024, 1024), np.float32)
        b = np.ones((512, 1024), np.float32)
        c = np.tanh(a)
        del a, b, c
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
if sys.argv[2] == "thread":
    thread = threading.Thread(target=executions)
    thread.start()
    thread.join()
else:
    executions()
print(*faults[1:])
"""


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


def _faults_after_the_first(setting: str, where: str) -> list[int]:
    proc = subprocess.run([sys.executable, "-c", PROBE, setting, where], capture_output=True,
                          text=True, timeout=120, check=True)
    return [int(count) for count in proc.stdout.split()]


@pytest.mark.skipif(not _glibc(), reason="the setting is glibc's (elsewhere it does nothing)")
@pytest.mark.parametrize("where", ["main", "thread"])
def test_arrays_of_a_freed_size_reuse_its_memory(where):
    default = _faults_after_the_first("default", where)
    if min(default) < 512:
        pytest.skip(f"this glibc reuses these blocks by itself (faults {default})")
    kept = _faults_after_the_first("keep", where)
    assert max(kept) < 64, (kept, default)


def test_elsewhere_than_glibc_nothing_is_set(monkeypatch):
    monkeypatch.setattr(os, "confstr", lambda name: None)
    assert keep_freed_memory() is False
