"""A process that executes programs keeps the memory of freed arrays for the next ones
(runtime/allocation.py): an array of the size of one freed before reuses its memory instead of
faulting in fresh pages. Counted with the kernel's minor page faults of a fresh process, whose
allocator settings are glibc's defaults, in the main thread and in a thread (the local
backend's partitions run in threads, which glibc gives heaps of their own).

Large arrays start on a cache line (`aligned_empty`, `aligned_zeros`): their data address,
read from numpy, is a multiple of 64 for every size, type and allocation history tried
(numpy's own large arrays, from `malloc`, sit 16 bytes past a page or at any multiple of 16),
and so are the arrays of the runtime that products read: the random inputs, the shard copies of
a partition's inputs."""
from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from gspmdc.runtime.allocation import (
    ALIGNED_BYTES, ALIGNMENT, aligned_empty, aligned_zeros, keep_freed_memory,
)

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


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize("allocate", [aligned_empty, aligned_zeros])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, ml_dtypes.bfloat16,
                                   np.int8, np.bool_])
def test_large_arrays_start_on_a_cache_line(allocate, dtype):
    itemsize = np.dtype(dtype).itemsize
    kept = [np.empty(k * 4099, np.uint8) for k in range(1, 4)]   # another allocation history
    fewest = ALIGNED_BYTES // (1000 * itemsize) + 1       # rows of 1000 elements
    for rows in (fewest, fewest + 1, fewest + 2, 2 * fewest + 5, 3 * fewest + 1):
        shape = (rows, 1000 + rows % 7)
        array = allocate(shape, dtype)
        assert _address(array) % ALIGNMENT == 0, (shape, _address(array) % ALIGNMENT)
        assert array.shape == shape and array.dtype == np.dtype(dtype)
        assert type(array) is np.ndarray and array.flags.c_contiguous and array.flags.writeable
        if allocate is aligned_zeros:
            assert not array.any()
        array[...] = 1                  # the whole extent is the array's own
        assert np.count_nonzero(array) == array.size
    del kept


def test_small_arrays_are_numpys_own():
    """Up to `ALIGNED_BYTES`: an array of exactly 1 MiB holds no more memory than its own (the
    interpreter folds constants of up to 1 MiB held)."""
    small = aligned_empty((ALIGNED_BYTES // 8,), np.float64)
    assert small.base is None and small.shape == (ALIGNED_BYTES // 8,)
    zeros = aligned_zeros((3, 5), np.int32)
    assert zeros.base is None and not zeros.any() and zeros.dtype == np.int32


def test_random_inputs_start_on_a_cache_line():
    from gspmdc.ir.parser import parse_module
    from gspmdc.runtime import io
    shapes = ["f32[512,1024]", "f32[1024,2049]", "s32[700,513]", "f32[4,1024,129]"]
    params = "\n".join(f"  p{i} = {s} parameter({i})" for i, s in enumerate(shapes))
    module = parse_module(f"HloModule m\nENTRY e {{\n{params}\n  ROOT r = {shapes[0]} "
                          "copy(p0)\n}")
    inputs = io.random_inputs(module, 5)
    assert [_address(a) % ALIGNMENT for a in inputs] == [0] * len(shapes)


@pytest.mark.parametrize("offset", [16, 64, 80])
def test_shard_copies_start_on_a_cache_line(tmp_path, offset):
    """A partition's copy of its shard of a global input, here a memory map of a file at
    `offset` bytes (an npz member's data starts anywhere), whole and in row halves."""
    from gspmdc.ir.parser import parse_shape, parse_sharding
    from gspmdc.runtime.sharded_io import ShardedLeaf, shard_leaf
    g = parse_shape("f32[1024,1025]")
    values = np.arange(1024 * 1025, dtype=np.float32).reshape(1024, 1025)
    path = tmp_path / "input.bin"
    path.write_bytes(b"\0" * offset + values.tobytes())
    source = np.memmap(path, np.float32, "r", offset=offset, shape=values.shape)
    for text, pieces in (("{replicated}", [values, values]),
                         ("{devices=[2,1]<=[2]}", [values[:512], values[512:]])):
        s = parse_sharding(text)
        leaf = ShardedLeaf(g, s.shard_shape(g), s)
        for p, want in enumerate(pieces):
            shard = shard_leaf(source, leaf, p, 2)
            assert type(shard) is np.ndarray and shard.flags.c_contiguous
            np.testing.assert_array_equal(shard, want)
            assert _address(shard) % ALIGNMENT == 0, (text, p)
