"""Pausing Python's cyclic garbage collector while a module is read, compiled or printed
(`parse_module`, `run_pipeline`, `print_module`).

Reading and compiling a module makes millions of objects that all live until the end (the
instructions, their shapes and shardings, the memo tables of the sharding algebra, the rules'
plans) and hardly any reference cycles. With the collector running, every few hundred new objects
it scans the young ones, and from time to time everything alive: about an eighth of the time of a
10,000-instruction compile, for nothing to free. `paused_collection()` turns it off for the
duration and back on afterwards if it was on (uses nest); objects are still freed as their last
reference goes.

Turning the collector back on is not free by itself: the objects made while it was off all still
count as young, so the first allocation afterwards would scan every one of them (about 0.13 s
after reading and compiling a 10,000-instruction module, finding little to free). When the
outermost pause ends and nothing is frozen, they are moved to the oldest generation instead
(`gc.freeze()` then `gc.unfreeze()`: two list splices, no scan). Reference cycles made meanwhile
then wait for a full collection, which Python's own rule would rarely start (it counts the objects
that reach the oldest generation by surviving younger scans, and these skipped them). So the
pause keeps the bound itself: when the objects pauses made since the last full collection (Python's
young count, which goes on while the collector is off) pass `max(FULL_COLLECTION_GROWTH` x those
alive after it, `FULL_COLLECTION_FLOOR)`, the end of the pause runs a full collection instead (a
compile of 10,000 instructions makes about 210,000 tracked objects; a loop of compiles collects
every few of them, and its garbage stays bounded).
The collector is process-wide: other threads run without it while a compile is under way.

Start-up (`gspmdc run` importing the partitioner, each rank importing numpy, mpi4py and the
runtime and unpickling its job) is the same story, plus the objects made live as long as the
process: `paused_collection(freeze=True)` also freezes every object that exists at the end
(`gc.freeze`: moved to the permanent generation), so that the collections of the run never scan
them either (about 7% of a rank's start-up CPU and of the launcher's before the job is sent,
2026-11-26, 12 alternating runs).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

__all__ = ["paused_collection", "FULL_COLLECTION_FLOOR", "FULL_COLLECTION_GROWTH"]

#: objects made in pauses since the last full collection below which the end of a pause never
#: starts one
FULL_COLLECTION_FLOOR = 1_000_000
#: the end of a pause starts a full collection when the objects made in pauses since the last
#: one exceed this many times those alive after it (and the floor)
FULL_COLLECTION_GROWTH = 4


class _Tally:
    """Since the last full collection: the objects pauses made (net of those freed, as Python
    counts young objects) and the objects alive after it, when a pause started it (else 0)."""

    made = 0
    alive = 0


def _after_collection(phase: str, info: dict) -> None:
    # any full collection (a pause's, the program's own `gc.collect()`, Python's) starts the
    # tally again; the survivors are counted only when a pause starts one
    if phase == "stop" and info["generation"] == 2:
        _Tally.made = _Tally.alive = 0


gc.callbacks.append(_after_collection)


def _tracked() -> int:
    """The objects the collector tracks (nothing may be frozen: they are frozen to be counted)."""
    gc.freeze()
    count = gc.get_freeze_count()
    gc.unfreeze()
    return count


@contextmanager
def paused_collection(*, freeze: bool = False):
    """`with paused_collection(): ...` runs the block with the cyclic collector off; with
    `freeze`, every object alive at the end is frozen before the collector is turned back on.
    Without, when the outermost pause ends and nothing is frozen, the objects made meanwhile join
    the oldest generation without a scan, or a full collection runs when the objects pauses made
    since the last one passed the bound (see the module docstring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        elif enabled and gc.get_freeze_count() == 0:
            # the young count goes on while the collector is off: what the pause made
            _Tally.made += gc.get_count()[0]
            if _Tally.made > max(FULL_COLLECTION_GROWTH * _Tally.alive, FULL_COLLECTION_FLOOR):
                gc.collect()
                _Tally.alive = _tracked()
            else:
                gc.freeze()                # to the oldest generation, the young count reset
                gc.unfreeze()
        if enabled:
            gc.enable()
