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

Start-up (`gspmdc run` importing the partitioner, each rank importing numpy, mpi4py and the
runtime and unpickling its job) is the same story, plus the objects made live as long as the
process: `paused_collection(freeze=True)` also freezes every object that exists at the end
(`gc.freeze`: moved to the permanent generation), so that the collections of the run never scan
them either (about 7% of a rank's start-up CPU and of the launcher's before the job is sent,
2026-11-26, 12 alternating runs).

The commands that compile a file and exit (`gspmdc compile`, `opt`, `propagate`) pause it once
for the whole command, reading to writing, with `freeze`: between separate pauses of the parser,
the pipeline and the printer, the first allocation after each one set off a scan of everything
made meanwhile (the whole module), and so did the first after the command (at 10,000
instructions about 27 ms of collections in a `gspmdc compile`, 1 ms with the one pause, all of it
importing before the command). A library call pauses only around its own work: freezing would keep
a long-lived caller's cyclic garbage from ever being collected.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

__all__ = ["paused_collection"]


@contextmanager
def paused_collection(*, freeze: bool = False):
    """`with paused_collection(): ...` runs the block with the cyclic collector off; with
    `freeze`, every object alive at the end is frozen before the collector is turned back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()
