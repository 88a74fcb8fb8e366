"""Start-up without the cyclic garbage collector.

Importing numpy, mpi4py, the runtime or the partitioner, and unpickling a job, allocate tens of
thousands of objects that live as long as the process. Each 700 allocations set off a collection
that frees nothing: about 7% of a rank's start-up CPU and of `gspmdc run`'s before the job is sent
(2026-11-26, 12 alternating runs each). `paused_collector()` pauses the collector around such work
and then freezes what exists (`gc.freeze`: moved to the permanent generation), so that the
collections of the run itself never scan those objects either.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_collector() -> Iterator[None]:
    """No cyclic collection inside the block; afterwards every object is frozen and the
    collector is as it was (on, unless the caller had turned it off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
