"""Arrays too large for memory live in files (memory-mapped), so programs bigger than RAM run.

`zeros(shape, dtype)` returns a plain, writable, C-ordered `np.ndarray` of zeros: in memory when it
is smaller than `SPILL_BYTES` (a large one aligned to a cache line, `allocation.aligned_zeros`),
otherwise backed by a file in the temporary directory
(`tempfile.gettempdir()`), its disk space reserved up front (a full disk raises MemoryError here,
not a bus error later), mapped shared and unlinked at once, so the operating system pages it to and
from disk as needed and its space is freed when the last array viewing it goes, even when the
process is killed. Either way the zeros cost nothing until written (fresh pages, unwritten extents).
`full(shape, value, dtype)` is the same, filled.

The runtime allocates through here where values of any size are made: the random inputs, shard
padding, `pad` and windows of padded values. Other kernel results are ordinary numpy arrays.
"""
from __future__ import annotations

import math
import mmap
import os

import numpy as np

from .allocation import aligned_zeros

#: arrays of at least this many bytes are file-backed: an eighth of the physical memory
SPILL_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8


def zeros(shape, dtype) -> np.ndarray:
    """A C-ordered array of zeros (see the module docstring)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < SPILL_BYTES:
        return aligned_zeros(shape, dtype)
    import tempfile         # here: most runs never spill, and tempfile imports a dozen modules
    with tempfile.TemporaryFile(prefix="gspmdc-spill-") as backing:
        try:
            os.posix_fallocate(backing.fileno(), 0, nbytes)
        except OSError as e:
            raise MemoryError(f"no room for a {nbytes / 2**30:.1f} GiB array in memory or in "
                              f"{tempfile.gettempdir()} ({e.strerror})") from None
        mapped = mmap.mmap(backing.fileno(), nbytes)
    return np.frombuffer(mapped, dtype).reshape(shape)


def full(shape, value, dtype) -> np.ndarray:
    """`zeros` filled with `value`."""
    out = zeros(shape, dtype)
    if value != 0:
        out.fill(value)
    return out


__all__ = ["SPILL_BYTES", "zeros", "full"]
