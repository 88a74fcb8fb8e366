"""How many cores a run can count on, and the BLAS threads that follows.

`free_cores()` is the number of cores this process may run on (its affinity) less those other
work keeps busy: the 1-minute load average, rounded (a stray process is not a core), at least 0.
The MPI launcher gives each rank's BLAS `blas_threads(ranks)` threads, and so does `gspmdc run
--backend local` for its own process; `run_local` sets the count in the loaded library itself
(`chosen_blas_threads`, `blas.py`), for the processes that loaded numpy before they knew their
partitions (the API, the scorers, the tests). A multithreaded BLAS spins its threads while it
waits for them, which on a machine already busy with other work makes a matrix product several
times slower than one thread (16 partition threads of a loop of convolutions, each calling a
two-thread OpenBLAS: 3.5 times the CPU time of one thread each). The MPI backend's `auto`
waiting starts from the same count.
"""
from __future__ import annotations

import os

#: the variables that set the number of threads of the BLAS libraries numpy may use
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def machine_cores() -> int:
    """The cores this process may run on (its affinity)."""
    return len(os.sched_getaffinity(0))


def free_cores() -> int:
    """The cores this process may run on that other work leaves free (see the module
    docstring)."""
    return max(machine_cores() - round(os.getloadavg()[0]), 0)


def blas_threads(workers: int) -> int:
    """BLAS threads for each of `workers` processes or threads sharing the free cores (at
    least 1)."""
    return max(1, free_cores() // max(workers, 1))


def chosen_blas_threads(workers: int) -> int:
    """The BLAS threads of each of `workers` threads of this process: the value of the first BLAS
    thread variable set (the user's choice, or `gspmdc run`'s, which the library read when it
    loaded), else `blas_threads(workers)`."""
    for name in BLAS_THREAD_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return blas_threads(workers)


def with_blas_threads(environment: dict[str, str], workers: int) -> dict[str, str]:
    """`environment` with `blas_threads(workers)` for every BLAS thread variable the user did not
    set."""
    threads = str(blas_threads(workers))
    return {**{name: threads for name in BLAS_THREAD_VARIABLES}, **environment}
