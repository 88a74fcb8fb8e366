"""How many cores a run can count on, and the BLAS threads that follows.

`free_cores()` is the number of cores this process may run on (its affinity) less those other
work keeps busy: the 1-minute load average, rounded (a stray process is not a core), at least 0.
The MPI launcher gives each rank's BLAS `blas_threads(ranks)` threads, and so does `gspmdc run
--backend local` for its own process: a multithreaded BLAS spins its threads while it waits for
them, which on a machine already busy with other work makes a matrix product several times slower
than one thread. The MPI backend's `auto` waiting starts from the same count.
"""
from __future__ import annotations

import os

#: the variables that set the number of threads of the BLAS libraries numpy may use
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def free_cores() -> int:
    """The cores this process may run on that other work leaves free (see the module
    docstring)."""
    return max(len(os.sched_getaffinity(0)) - round(os.getloadavg()[0]), 0)


def blas_threads(workers: int) -> int:
    """BLAS threads for each of `workers` processes or threads sharing the free cores (at
    least 1)."""
    return max(1, free_cores() // max(workers, 1))


def with_blas_threads(environment: dict[str, str], workers: int) -> dict[str, str]:
    """`environment` with `blas_threads(workers)` for every BLAS thread variable the user did not
    set."""
    threads = str(blas_threads(workers))
    return {**{name: threads for name in BLAS_THREAD_VARIABLES}, **environment}
