"""A kernel's independent products shared among threads, each product on one BLAS thread.

A kernel whose work is a list of independent tiles (a convolution's tiles of output positions, a
batched dot's runs of batch items) hands them out with `share_tiles(tiles, work)`: `work(queue)`
runs on the caller and on as many threads in all as the BLAS ran (`blas.one_blas_thread`: the
count is one for the length of the call, and the threads run the products side by side instead),
each taking the next tile left from `queue` until none is. A thread kept off its core (by other
work, or by a BLAS thread still spinning after a product) leaves its tiles to the others, where
a multithreaded BLAS waits for it; and every tile's product is the one a single BLAS thread
computes, whatever the count. One tile, or a count of one, runs `work` on the caller alone (one
tile with the BLAS's own threads).

The helper threads start on first use and stay (starting them per call costs a third of a
millisecond); a forked child starts its own.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Sequence

from ..blas import one_blas_thread


class TileQueue:
    """The tiles of one `share_tiles` call, each handed out once to whichever thread asks."""

    def __init__(self, tiles: Sequence):
        self._tiles = iter(tiles)
        self._lock = threading.Lock()

    def take(self):
        """The next tile, or None when all are taken."""
        with self._lock:
            return next(self._tiles, None)


def share_tiles(tiles: Sequence, work: Callable[[TileQueue], None]) -> None:
    """Run `work` on the tiles shared among the caller and helper threads (module docstring).
    Returns, or raises the caller's failure, else a helper's, once no helper runs `work` any
    more."""
    queue = TileQueue(tiles)
    if len(tiles) == 1:
        work(queue)
        return
    with one_blas_thread() as threads:
        if threads == 1:
            work(queue)
            return
        pool = _helpers(threads - 1)
        shares = [pool.submit(work, queue) for _ in range(1, threads)]
        try:
            work(queue)
        finally:
            wait(shares)
        for share in shares:
            share.result()


#: the threads that run tiles beside the caller, by their count, kept between calls; none in a
#: forked child
_HELPERS: dict[int, ThreadPoolExecutor] = {}
_HELPERS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_HELPERS.clear)


def _helpers(count: int) -> ThreadPoolExecutor:
    """The pool of `count` helper threads (started on first use)."""
    with _HELPERS_LOCK:
        if count not in _HELPERS:
            _HELPERS[count] = ThreadPoolExecutor(count, thread_name_prefix="gspmdc-tiles")
        return _HELPERS[count]
