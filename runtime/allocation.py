"""How a process that executes programs allocates: the memory of freed arrays stays in the
process for the next ones, and large arrays start on a cache line.

numpy takes an array's memory from the C library's `malloc`. glibc serves a request of at least
its mmap threshold with a fresh mapping, returned to the system when the array is freed, and
returns the free memory at the top of a heap beyond its trim threshold to the system: either way
the next array of that size faults in every page of it (about a microsecond per 4 KiB page).
Both thresholds start low (128 KiB) and rise as the process frees mapped blocks (to the largest
freed, up to 32 MiB; trimming at twice that), so whether an execution re-faults its results
depends on the process's history: `gspmdc run --backend local` of a 4-layer MLP (results of 2
and 4 MiB) faulted 1,506 pages per execution, 2.7 ms of its 23 ms, where a process that had once
freed a 16 MiB array faulted none.

`keep_freed_memory()` sets the thresholds where glibc's own rule takes them at most: mappings
only for blocks above 32 MiB (the largest threshold it accepts on 64-bit), trimming beyond twice
that. Results repeat in size from one execution to the next, so their memory is reused without
faults. The processes that execute a job call it (`job.execute_local`, `rank.execute_on_mpi`);
a program that calls the runtime as a library keeps its own allocator settings. Elsewhere than
glibc it does nothing.

`aligned_empty(shape, dtype)` and `aligned_zeros` give arrays of more than `ALIGNED_BYTES` whose
data starts at a multiple of `ALIGNMENT` (64) bytes: numpy takes them from `malloc`, which aligns
to 16 bytes, so which of an operand's or a result's rows start on a cache line was chance. BLAS
kernels with AVX-512 load and store 64-byte vectors, and a vector across two cache lines costs
both: a `[512, 1024] x [1024, 2048]` f32 product with its right operand and its result 16 bytes
off a cache line took 3-4% longer than with all three aligned (OpenBLAS's SkylakeX kernels, one
or two threads; its values are the same). XLA's buffers are 64-byte aligned. The runtime takes
from here the arrays products read and write: the results of dots (`kernels/contraction.py`),
the arrays of `spill.zeros` (random inputs, shard padding) and the partitions' shards of the
inputs (`sharded_io.shard_leaf`). Arrays of up to 1 MiB come from numpy as they are: aligning
costs a few microseconds, more than it saves on a product that small, and an aligned array holds
64 bytes more than its own (the interpreter folds constants of up to 1 MiB held).
"""
from __future__ import annotations

import ctypes
import math
import os

import numpy as np

#: glibc's `mallopt` parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2), and twice it: the
#: values its dynamic thresholds reach
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES


def keep_freed_memory() -> bool:
    """Keep freed blocks of up to `MMAP_THRESHOLD_BYTES` in this process's heaps (see the module
    docstring); whether the C library took the setting (False where it is not glibc)."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
    except (ValueError, OSError):          # no such name here: not glibc
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


#: the byte boundary the data of large arrays starts on (`aligned_empty`): a cache line, the
#: width of an AVX-512 vector, the alignment of XLA's buffers
ALIGNMENT = 64
#: arrays of more than this many bytes are aligned; smaller ones are numpy's own
ALIGNED_BYTES = 1 << 20


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-ordered array of `shape` and `dtype` whose data starts at a multiple
    of `ALIGNMENT` bytes when it holds more than `ALIGNED_BYTES` (a view of a slightly larger
    byte buffer), else `np.empty`'s."""
    return _aligned(np.empty, shape, dtype)


def aligned_zeros(shape, dtype) -> np.ndarray:
    """`aligned_empty` filled with zeros: fresh pages from the system for large arrays, so the
    zeros cost nothing until written, as `np.zeros`'s."""
    return _aligned(np.zeros, shape, dtype)


def _aligned(allocate, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes <= ALIGNED_BYTES:
        return allocate(shape, dtype)
    buffer = allocate(nbytes + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start:start + nbytes].view(dtype).reshape(shape)
