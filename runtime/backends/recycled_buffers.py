"""Receive buffers recycled once the results living in them are dropped.

MPI receives into memory it received into before several times faster than into fresh memory (a
fresh large array is mapped page by page on first touch, inside the MPI call), and handing the
receive buffer out as the result saves copying the result out of a scratch buffer.
`RecycledBuffers.take(nbytes)` returns a flat `uint8` buffer of `nbytes` bytes: one it handed out
before whose results are all gone, or a new one. Every array viewing a buffer keeps it alive, so a
buffer is free exactly when the pool holds the only reference to it (CPython reference counts).

At most `per_size` buffers are kept per size and at most `limit` bytes in all; the sizes taken
least recently are forgotten first (a forgotten buffer lives on as long as its results do), and
buffers larger than `limit` are never kept.
"""
from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np

#: `sys.getrefcount(buffers[i])` of a buffer only the pool's list refers to (the list + the call)
_FREE_REFCOUNT = 2


class RecycledBuffers:
    """A pool of receive buffers keyed by size (see the module docstring)."""

    def __init__(self, limit: int, per_size: int = 2):
        self._limit = limit
        self._per_size = per_size
        self._by_size: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._total = 0

    def take(self, nbytes: int) -> np.ndarray:
        """A `uint8[nbytes]` buffer nothing else refers to (contents undefined)."""
        buffers = self._by_size.get(nbytes)
        if buffers is not None:
            self._by_size.move_to_end(nbytes)
            for i in range(len(buffers)):
                if sys.getrefcount(buffers[i]) == _FREE_REFCOUNT:
                    return buffers[i]
        fresh = np.empty(nbytes, np.uint8)
        if nbytes > self._limit:
            return fresh
        if buffers is None:
            buffers = self._by_size[nbytes] = []
        if len(buffers) == self._per_size:
            buffers.pop(0)
            self._total -= nbytes
        buffers.append(fresh)
        self._total += nbytes
        while self._total > self._limit:
            size, dropped = self._by_size.popitem(last=False)
            self._total -= size * len(dropped)
        return fresh

    @property
    def kept_bytes(self) -> int:
        """The bytes of all buffers the pool keeps (free or in use)."""
        return self._total
