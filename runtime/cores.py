"""How many cores a run can count on now, and the BLAS threads that follows.

The free cores are those this process may run on (its affinity) that the work runnable on the
machine *now* leaves free: the kernel's count of runnable tasks (`/proc/loadavg`'s fourth field,
`running/total`; the median of a few reads a millisecond apart, so that a task that is runnable
for an instant is not a core), less the caller's own processes (which it counts as its own
work, not as other work). A load average would read work that has already ended as busy cores (a
minute after a benchmark's eight ranks ended it still reads 3.8 on two idle cores), and the
present count does not. `free_cores_of` and `threads_per_worker` are the policy as pure
functions of those counts; `free_cores` and `blas_threads` read the machine.

The MPI launcher gives each rank's BLAS `blas_threads(ranks)` threads, and so does `gspmdc run
--backend local` for its own process (its N partitions are N threads sharing the free cores);
`run_local` sets the count in the loaded library itself (`chosen_blas_threads`, `blas.py`), for
the processes that loaded numpy before they knew their partitions (the API, the scorers, the
tests). A count the user set in one of the BLAS thread variables is the count: it fills the
variables the user left unset, so every library and every reader sees the one OpenBLAS itself
reads at load (its own variable first, then `OMP_NUM_THREADS`). A multithreaded BLAS spins its
threads while it waits for them, which on a machine already busy with other work makes a
matrix product several times slower than one thread (16 partition threads of a loop of
convolutions, each calling a two-thread OpenBLAS: 3.5 times the CPU time of one thread each).
The MPI backend's `auto` waiting starts from the same count.
"""
from __future__ import annotations

import os
import statistics
import time

#: the variables that set the number of threads of the BLAS libraries numpy may use, in the
#: order OpenBLAS reads them at load (the first one set with a positive count wins)
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: reads of the runnable count, and the seconds between two
_READS = 3
_READ_INTERVAL_SECONDS = 1e-3


def free_cores_of(affinity: int, online: int, runnable: int, ours: int) -> int:
    """The cores a process may use that other work leaves free: it may run on `affinity` of the
    machine's `online` cores; `runnable` tasks are runnable on the machine now, `ours` of them the
    caller's own (at least 0)."""
    others = max(runnable - ours, 0)
    return max(min(affinity, online - others), 0)


def threads_per_worker(free: int, workers: int) -> int:
    """BLAS threads for each of `workers` processes or threads sharing `free` cores (at least
    1)."""
    return max(1, free // max(workers, 1))


def machine_cores() -> int:
    """The cores this process may run on (its affinity)."""
    return len(os.sched_getaffinity(0))


def runnable_tasks() -> int | None:
    """The tasks runnable on the machine now, this one included (the median of `_READS` reads of
    `/proc/loadavg`), or None where it cannot be read."""
    counts = []
    for k in range(_READS):
        if k:
            time.sleep(_READ_INTERVAL_SECONDS)
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
    return round(statistics.median(counts))


def free_cores(ours: int = 1) -> int:
    """The cores this process may run on that other work leaves free now, `ours` runnable tasks
    being the caller's own (see the module docstring; all of them where the runnable count cannot
    be read)."""
    affinity = machine_cores()
    runnable = runnable_tasks()
    if runnable is None:
        return affinity
    return free_cores_of(affinity, os.cpu_count() or affinity, runnable, ours)


def blas_threads(workers: int) -> int:
    """BLAS threads for each of `workers` processes or threads of this job sharing the free
    cores (at least 1)."""
    return threads_per_worker(free_cores(), workers)


def blas_threads_set_in(environment: dict[str, str]) -> int | None:
    """The count of the first BLAS thread variable of `environment` set to a positive count (in
    `BLAS_THREAD_VARIABLES` order: the one OpenBLAS reads), or None."""
    for name in BLAS_THREAD_VARIABLES:
        value = environment.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def chosen_blas_threads(workers: int) -> int:
    """The BLAS threads of each of `workers` threads of this process: the count its environment
    sets (the user's choice, or `gspmdc run`'s, which the library read when it loaded), else
    `blas_threads(workers)`."""
    threads = blas_threads_set_in(dict(os.environ))
    return blas_threads(workers) if threads is None else threads


def with_blas_threads(environment: dict[str, str], workers: int) -> dict[str, str]:
    """`environment` with every BLAS thread variable the user did not set set to the count the
    user set in another (`blas_threads_set_in`), else to `blas_threads(workers)`."""
    threads = blas_threads_set_in(environment)
    count = str(blas_threads(workers) if threads is None else threads)
    return {**{name: count for name in BLAS_THREAD_VARIABLES}, **environment}
