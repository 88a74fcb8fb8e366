"""Collectives overlapped with computation: a backend that gives `Pending` results has each
collective issued as early as its operands, the previous collective, the previous barrier and
the computation's peak memory allow (`gspmdc.ir.schedule`), and finished right before its first
use (or at the end of its computation); the order is
a function of the program alone. Also the MPI backend's waiting policy (`SpinBudget`) and the
count of free cores it and the BLAS threads start from, which need no MPI."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime import cores
from gspmdc.runtime.backends import mpi as mpi_backend
from gspmdc.runtime.backends.mpi import _MAX_SPIN_SECONDS, _MIN_SPIN_SECONDS, SpinBudget
from gspmdc.runtime.collectives import Pending, SinglePartitionBackend
from gspmdc.runtime.interpreter import Executable
from gspmdc.runtime.kernels import KERNELS
from gspmdc.runtime.profile import ProfileRecorder

from hlo_text import reducer

ADD = reducer("add")

PROGRAM = "HloModule overlap\n" + ADD + """
ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  n = f32[4] negate(x)
  s = f32[4] sine(y)
  r1 = f32[4] all-reduce(x), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=add
  c = f32[4] cosine(s)
  r2 = f32[4] all-reduce(s), channel_id=2, replica_groups={}, use_global_device_ids=true, to_apply=add
  e = f32[4] exponential(n)
  u = f32[4] add(r1, e)
  ROOT t = (f32[4], f32[4], f32[4]) tuple(u, r2, c)
}
"""


class Recording(SinglePartitionBackend):
    """One partition whose all-reduces come back pending, logging starts and finishes."""

    def __init__(self, log):
        self.log = log

    def all_reduce(self, inst, operands, reduction):
        self.log.append(f"start {inst.name}")
        values = super().all_reduce(inst, operands, reduction)

        def finish():
            self.log.append(f"finish {inst.name}")
            return values
        return Pending(finish)


@pytest.fixture
def logged(monkeypatch):
    log = []
    for opcode in ("negate", "sine", "cosine", "exponential", "add"):
        kernel = KERNELS[opcode]

        def spy(inst, args, ctx, kernel=kernel):
            if inst.name != "r":                    # not the reducer's own add
                log.append(inst.name)
            return kernel(inst, args, ctx)
        monkeypatch.setitem(KERNELS.rules, opcode, spy)
    return log


def test_collectives_start_early_and_finish_at_first_use(logged):
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    exe = Executable(parse_module(PROGRAM), Recording(logged))
    u, r2, c = exe([x, y])
    np.testing.assert_allclose(u, x + np.exp(-x))
    np.testing.assert_allclose(r2, np.sin(y))
    np.testing.assert_allclose(c, np.cos(np.sin(y)))
    # The memory-aware order (`gspmdc.ir.schedule`; 16 bytes a value): free first, s (needed
    # soonest, by c), n, then e (frees n), r1, u (frees r1 and e), c, r2 (frees s), a peak of 4
    # values against program order's 5. Then r1 reads only a parameter: issued first; r2
    # frees s as it holds its result, so it is issued right after s (not before r1); r1 is
    # finished right before its first user u, r2 at the end (only the root reads it)
    assert logged == ["start r1", "s", "start r2", "n", "e", "finish r1", "u", "c",
                      "finish r2"]
    logged.clear()
    exe([x, y])
    assert logged[:4] == ["start r1", "s", "start r2", "n"]


def test_barriers_keep_their_place(logged):
    """A custom-call (it may have effects) and a call of a computation with a collective are
    never overtaken by a collective."""
    text = "HloModule barriers\n" + ADD + """
inner {
  p = f32[4] parameter(0)
  ROOT q = f32[4] all-reduce(p), channel_id=3, replica_groups={}, use_global_device_ids=true, to_apply=add
}

ENTRY main {
  x = f32[4] parameter(0)
  n = f32[4] negate(x)
  k = f32[4] call(n), to_apply=inner
  r1 = f32[4] all-reduce(x), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=add
  m = f32[4] custom-call(x), custom_call_target="gspmdc_test.identity"
  r2 = f32[4] all-reduce(x), channel_id=2, replica_groups={}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4], f32[4]) tuple(k, r1, m, r2)
}
"""
    from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS

    def identity(inst, args, ctx):
        logged.append(inst.name)
        return args[0]
    CUSTOM_CALL_TARGETS["gspmdc_test.identity"] = identity
    try:
        Executable(parse_module(text), Recording(logged))([np.ones(4, np.float32)])
    finally:
        del CUSTOM_CALL_TARGETS["gspmdc_test.identity"]
    assert logged == ["n", "start q", "finish q", "start r1", "m", "start r2", "finish r1",
                      "finish r2"]


def test_a_profile_charges_a_pending_collective_once():
    recorder = ProfileRecorder(0, 1)
    exe = Executable(parse_module(PROGRAM), Recording([]), on_step=recorder.on_step)
    exe([np.zeros(4, np.float32), np.zeros(4, np.float32)])
    exe([np.zeros(4, np.float32), np.zeros(4, np.float32)])
    profile = recorder.profile()
    assert {name: s.calls for name, s in profile.collectives.items()} == {"r1": 2, "r2": 2}


def test_the_spin_budget_shrinks_when_waits_outlast_it_and_regrows_with_short_waits():
    budget = SpinBudget(oversubscribed=False)
    assert budget.spin == _MAX_SPIN_SECONDS
    for _ in range(40):
        budget.outlasted()
    assert budget.spin == _MIN_SPIN_SECONDS
    for _ in range(100):                    # waits of 30 us, ending while spinning
        budget.ended_spinning(30e-6)
    assert budget.spin == pytest.approx(60e-6, rel=0.05)
    for _ in range(100):
        budget.ended_spinning(1.0)
    assert budget.spin == _MAX_SPIN_SECONDS
    assert SpinBudget(oversubscribed=True).spin == _MIN_SPIN_SECONDS


def test_past_the_spin_budget_a_wait_sleeps_in_short_steps_then_backs_off(monkeypatch):
    """Waiting past the spin budget (the job's ranks fit the machine's cores): sleeps of 20 us
    (no yields) while the wait is young, then sleeps doubling up to 0.2 ms; the requests are
    tested after every sleep."""
    clock = [0.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        clock[0] += seconds
    monkeypatch.setattr(mpi_backend.time, "sleep", sleep)
    monkeypatch.setattr(mpi_backend.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(mpi_backend.os, "sched_yield", lambda: sleeps.append("yield"))
    tests = []

    def done():
        tests.append(len(sleeps))
        return len(sleeps) == 300
    mpi_backend._sleep_in_steps(done, stepping_until=1e-3)
    stepping = [s for s in sleeps if s == mpi_backend._STEP_SECONDS]
    assert len(stepping) == 51                  # 1 ms of 20 us steps, then the backoff's first
    assert sleeps[:51] == stepping
    assert sleeps[51:55] == [40e-6, 80e-6, 160e-6, 200e-6]
    assert set(sleeps[55:]) == {mpi_backend._MAX_SLEEP_SECONDS}
    assert tests == list(range(301))            # one test before and after every sleep
    # crowded (more ranks than cores): yields first, then the backoff at once
    sleeps.clear()
    tests.clear()

    def done_after_eight():
        tests.append(len(sleeps))
        return len(sleeps) == 8
    mpi_backend._yield_then_back_off(done_after_eight)
    assert sleeps == ["yield"] * 4 + [20e-6, 40e-6, 80e-6, 160e-6]


def test_precise_sleeps_sets_the_timer_slack_of_the_thread():
    """The `auto` waiter's 20 us steps last 20 us: the thread's timer slack is 1 us (Linux)."""
    import ctypes
    import threading
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "prctl"):
        pytest.skip("no prctl here")
    seen = []

    def thread():                               # a fresh thread: the test's own keeps its slack
        before = libc.prctl(30, 0, 0, 0, 0)     # PR_GET_TIMERSLACK
        mpi_backend.precise_sleeps()
        seen.extend([before, libc.prctl(30, 0, 0, 0, 0)])
    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    assert seen[0] != 1000 and seen[1] == 1000


@pytest.mark.parametrize("affinity, online, runnable, ours, free", [
    (2, 2, 1, 1, 2),            # an idle machine: only the caller runs
    (2, 2, 2, 1, 1),            # one other runnable task leaves one core
    (2, 2, 16, 1, 0),           # the cores are busy with other work
    (2, 2, 3, 2, 1),            # two ranks of the job and one other task
    (2, 2, 0, 1, 2),            # a count read while the caller was not running
    (2, 64, 10, 1, 2),          # a wide machine: the affinity bounds the cores
    (8, 8, 5, 1, 4),
])
def test_free_cores_follow_the_tasks_runnable_now(affinity, online, runnable, ours, free):
    assert cores.free_cores_of(affinity, online, runnable, ours) == free


@pytest.mark.parametrize("free, workers, threads", [
    (2, 1, 2), (2, 2, 1), (0, 1, 1), (1, 8, 1), (8, 2, 4), (8, 3, 2), (4, 0, 4),
])
def test_blas_threads_share_the_free_cores_among_the_workers(free, workers, threads):
    assert cores.threads_per_worker(free, workers) == threads


@pytest.mark.parametrize("counts, threads_for_one, threads_for_two", [
    ([1, 1, 1], 2, 1),          # idle now, whatever the load average says
    ([1, 9, 1], 2, 1),          # a task runnable for an instant is not a core
    ([2, 3, 2], 1, 1),          # one other task: one free core
    ([9, 8, 9], 1, 1),
])
def test_the_machine_is_read_as_it_is_now(monkeypatch, counts, threads_for_one, threads_for_two):
    reads = iter(counts)

    class LoadavgFile:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return f"3.80 2.10 1.00 {next(reads)}/300 4242\n"

    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cores.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(cores, "open", lambda path: LoadavgFile(), raising=False)
    assert cores.blas_threads(1) == threads_for_one
    reads = iter(counts)
    assert cores.blas_threads(2) == threads_for_two
    reads = iter(counts)
    environment = cores.with_blas_threads({"PATH": "/bin"}, 1)
    assert environment == {"OMP_NUM_THREADS": str(threads_for_one),
                           "OPENBLAS_NUM_THREADS": str(threads_for_one),
                           "MKL_NUM_THREADS": str(threads_for_one), "PATH": "/bin"}


def test_an_unreadable_count_leaves_every_core_free(monkeypatch):
    def unreadable(path):
        raise OSError("no /proc here")
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(cores, "open", unreadable, raising=False)
    assert cores.free_cores() == 3
