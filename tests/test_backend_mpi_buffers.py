"""The MPI backend's recycled receive buffers: a buffer comes back only when no result (array or
view) refers to it any more; sizes, per-size counts and the byte limit bound what is kept."""
from __future__ import annotations

import numpy as np

from gspmdc.runtime.backends.recycled_buffers import RecycledBuffers


def test_a_buffer_is_reused_once_its_results_are_gone():
    pool = RecycledBuffers(1 << 20)
    first = pool.take(64)
    address = first.ctypes.data
    result = first.view(np.float32).reshape(4, 4)[:, 1:]       # a view, as results are
    del first
    second = pool.take(64)
    assert not np.shares_memory(second, result)                # the view keeps the first alive
    result[...] = 7
    second[...] = 0
    assert (result == 7).all()
    del result
    third = pool.take(64)                                      # free again: the first buffer
    assert third.ctypes.data == address and pool.kept_bytes == 128
    del second, third
    assert pool.take(32).size == 32 and pool.kept_bytes == 160


def test_at_most_per_size_buffers_and_limit_bytes_are_kept():
    pool = RecycledBuffers(300, per_size=2)
    held = [pool.take(100) for _ in range(3)]                  # all in use: three buffers
    assert len({b.ctypes.data for b in held}) == 3 and pool.kept_bytes == 200
    del held
    pool.take(100)
    pool.take(150)                                             # 350 > 300: the 100s are dropped
    assert pool.kept_bytes == 150
    big = pool.take(1000)                                      # larger than the limit: not kept
    assert big.size == 1000 and pool.kept_bytes == 150
