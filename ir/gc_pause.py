"""Pausing Python's cyclic garbage collector while a module is read, compiled or printed
(`parse_module`, `run_pipeline`, `print_module`).

Reading and compiling a module makes millions of objects that all live until the end (the
instructions, their shapes and shardings, the memo tables of the sharding algebra, the rules'
plans) and hardly any reference cycles. With the collector running, every few hundred new objects
it scans the young ones, and from time to time everything alive: about an eighth of the time of a
10,000-instruction compile, for nothing to free. `paused_collection()` turns it off for the
duration and back on afterwards if it was on (uses nest); objects are still freed as their last
reference goes, and the few cycles made meanwhile are collected by the next collection after it.
The collector is process-wide: other threads run without it while a compile is under way.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

__all__ = ["paused_collection"]


@contextmanager
def paused_collection():
    """`with paused_collection(): ...` runs the block with the cyclic collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
