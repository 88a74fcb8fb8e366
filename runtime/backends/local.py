"""The local backend: the N partitions of an SPMD program as N threads of this process.

`run_local(module, per_partition_args)` evaluates the module once per partition, each in its own
thread with its own `LocalBackend` endpoint. The endpoints meet at every collective on an
`ExchangeBoard`: each partition posts its operands under the collective instruction, one barrier
later everybody reads everybody's posts and computes its own result with the shared group semantics
of `runtime/collectives.py` (reductions folded left to right in group order with the instruction's
reducer, so every member of a group computes the identical, deterministic result). Values are
immutable, so posts are shared by reference, never copied.

Every partition meets every other one at each collective, whatever the groups; the board checks
that all partitions post the *same* instruction (and that nobody has finished while others still
wait), so a program that is not SPMD fails with a clear error instead of hanging. When a partition
fails, the barrier is aborted: partitions waiting at a collective stop at once, the others at their
next collective, and `run_local` raises the first failure naming the partition (the interpreter's
message names the computation and instruction). Numpy releases the GIL in large kernels, so
partitions compute in parallel; for the run, the BLAS numpy loaded runs the threads
`cores.chosen_blas_threads` gives each partition (one on a busy machine), whenever numpy was
loaded.
"""
from __future__ import annotations

import copy
import threading
from time import monotonic, perf_counter, time
from typing import Any, Sequence

import numpy as np

from gspmdc.errors import GspmdcError, RuntimeFailure
from gspmdc.ir.module import Instruction, Module

from ..collectives import (
    CollectiveBackend, fold, gather_concat, group_of, participant_groups, permute_pairs,
    permute_source, scatter_block, split_blocks,
)
from ..blas import blas_threads_set_to
from ..cores import chosen_blas_threads
from ..interpreter import Executable, ValueHook
from ..options import DEFAULT_ROUNDING
from ..profile import ProfileRecorder

#: how long `run_local` waits for the other partitions to stop after a failure
_STOP_GRACE_SECONDS = 1.0


class _Finished:
    """The post of a partition whose evaluation has completed."""

    def __repr__(self) -> str:
        return "finished"


FINISHED = _Finished()


class _RunDone:
    """The post of a partition that finished one run of several (`run_local_timed`)."""

    def __repr__(self) -> str:
        return "run done"


RUN_DONE = _RunDone()


class PartitionAborted(Exception):
    """Raised in a partition waiting at a collective when another partition failed."""


class ExchangeBoard:
    """The rendezvous of `n` partition threads.

    `exchange(p, key, value)` posts `value` of partition `p` under `key` (the collective
    instruction, or `FINISHED`), waits until every partition has posted, and returns all posts in
    partition order. One barrier per exchange suffices because posts alternate between two
    buffers: a partition can reuse a buffer only after everybody passed the next barrier, i.e. after
    everybody has read it.
    """

    def __init__(self, n: int):
        self.n = n
        self._barrier = threading.Barrier(n)
        self._posts: list[list] = [[None] * n, [None] * n]
        self._generation = [0] * n

    def exchange(self, partition: int, key: Any, value: Any) -> list:
        generation = self._generation[partition]
        self._generation[partition] = generation + 1
        posts = self._posts[generation & 1]
        posts[partition] = (key, value)
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise PartitionAborted() from None
        mine = posts[partition][0]
        if any(k is not mine for k, _ in posts):
            raise RuntimeFailure(_divergence([k for k, _ in posts]))
        return [v for _, v in posts]

    def abort(self) -> None:
        """Break the barrier: every partition waiting or arriving raises PartitionAborted."""
        self._barrier.abort()


def _divergence(keys: list) -> str:
    def where(key) -> str:
        if key is FINISHED or key is RUN_DONE:
            return "has finished" if key is FINISHED else "has finished a run"
        return f"is at {key.opcode} {key.name}"
    return ("the partitions diverged (the program is not SPMD): "
            + "; ".join(f"partition {q} {where(k)}" for q, k in enumerate(keys)))


class LocalBackend(CollectiveBackend):
    """The endpoint of partition `partition` on an `ExchangeBoard` of `board.n` partitions."""

    def __init__(self, board: ExchangeBoard, partition: int):
        self._board = board
        self._partition = partition
        self._groups: dict[int, tuple[list[int], int]] = {}

    @property
    def num_partitions(self) -> int:
        return self._board.n

    def partition_id(self) -> int:
        return self._partition

    def _group(self, inst: Instruction) -> tuple[list[int], int]:
        group = self._groups.get(id(inst))
        if group is None:
            n = self._board.n
            group = self._groups[id(inst)] = group_of(inst, participant_groups(inst, n),
                                                      self._partition)
        return group

    def _members(self, inst: Instruction, operands: Sequence[np.ndarray]):
        """(each group member's operand list in group order, my position in the group)."""
        posts = self._board.exchange(self._partition, inst, operands)
        group, position = self._group(inst)
        return [posts[m] for m in group], position

    def all_reduce(self, inst, operands, reduction):
        members, _ = self._members(inst, operands)
        return [fold([m[i] for m in members], reduction) for i in range(len(operands))]

    def all_gather(self, inst, operands, dim):
        members, _ = self._members(inst, operands)
        return [gather_concat([m[i] for m in members], dim) for i in range(len(operands))]

    def reduce_scatter(self, inst, operands, dim, reduction):
        members, k = self._members(inst, operands)
        return [scatter_block(fold([m[i] for m in members], reduction), dim, k, len(members))
                for i in range(len(operands))]

    def all_to_all(self, inst, operands, dim):
        members, k = self._members(inst, operands)
        g = len(members)
        if dim is None:
            if len(operands) != g:
                raise GspmdcError(f"all-to-all {inst.name}: the tuple form needs one operand per "
                                  f"group member ({g}), got {len(operands)}")
            return [m[k] for m in members]
        return [gather_concat([split_blocks(m[i], dim, g)[k] for m in members], dim)
                for i in range(len(operands))]

    def collective_permute(self, inst, operand):
        posts = self._board.exchange(self._partition, inst, operand)
        source = permute_source(permute_pairs(inst, self._board.n), self._partition)
        return np.zeros_like(operand) if source is None else posts[source]


def run_local(module: Module, per_partition_args: Sequence[Sequence[Any]],
              num_partitions: int | None = None, *,
              recorders: Sequence[ProfileRecorder] | None = None,
              timeout: float | None = None, started_at: float | None = None,
              rounding: str = DEFAULT_ROUNDING,
              on_value: Sequence[ValueHook] | None = None) -> list[Any]:
    """Run the SPMD `module` on `num_partitions` partitions (default: one per argument list) and
    return each partition's root value, in partition order.

    `per_partition_args[p]` are partition p's entry arguments. `recorders`, one per partition,
    profile the run. `on_value`, one per partition, see every value (`evaluate`'s hook).
    `timeout` (seconds) bounds the whole run, counted from `started_at` (a `time.time()`;
    default: this call). `rounding` is the interpreter's
    (`runtime/rounding.py`). Raises the first failure of any
    partition with its message prefixed by `partition p:` (same error class; RuntimeFailure for
    kernel failures, divergence and timeouts).
    """
    return run_local_timed(module, per_partition_args, num_partitions, recorders=recorders,
                           timeout=timeout, started_at=started_at, rounding=rounding,
                           on_value=on_value)[0]


def run_local_timed(module: Module, per_partition_args: Sequence[Sequence[Any]],
                    num_partitions: int | None = None, *, repeat: int = 0,
                    recorders: Sequence[ProfileRecorder] | None = None,
                    timeout: float | None = None, started_at: float | None = None,
                    rounding: str = DEFAULT_ROUNDING,
                    on_value: Sequence[ValueHook] | None = None,
                    blas_threads: int | None = None) -> tuple[list[Any], list[float]]:
    """`run_local`, executing the program `1 + repeat` times (each partition reuses its
    `Executable`): the root values of the last run, and the time of each run after the first
    (from all partitions starting it to all finishing it). The recorders profile the runs after
    the first when there are some. `timeout` bounds all runs together, from `started_at`.
    `blas_threads`: the BLAS threads of each partition (default `cores.chosen_blas_threads`)."""
    n = len(per_partition_args) if num_partitions is None else num_partitions
    if len(per_partition_args) != n:
        raise GspmdcError(f"run_local: {len(per_partition_args)} argument lists for {n} "
                          "partitions")
    if recorders is not None and len(recorders) != n:
        raise GspmdcError(f"run_local: {len(recorders)} profile recorders for {n} partitions")
    board = ExchangeBoard(n)
    results: list[Any] = [None] * n
    failures: list[tuple[int, BaseException]] = []
    done = threading.Condition()
    finished = [0]
    marks: list[float] = []         # when every partition had finished each run (partition 0)

    def partition_main(p: int) -> None:
        recorder = recorders[p] if recorders is not None else None
        executable = Executable(module, LocalBackend(board, p),
                                on_step=recorder.on_step if recorder is not None else None,
                                on_value=on_value[p] if on_value is not None else None,
                                live_arrays=recorder.live_arrays if recorder is not None else None,
                                rounding=rounding)
        args = per_partition_args[p]

        def run():
            return executable(args) if recorder is None else \
                recorder.timed(lambda: executable(args))
        try:
            value = run()
            for r in range(repeat):
                if recorder is not None and r == 0:
                    recorder.reset()
                board.exchange(p, RUN_DONE, None)
                if p == 0:
                    marks.append(perf_counter())
                value = run()
            board.exchange(p, FINISHED, None)
            if p == 0 and repeat:
                marks.append(perf_counter())
            results[p] = value
        except PartitionAborted:
            pass
        except BaseException as e:  # noqa: BLE001 - every failure is reported by run_local
            with done:
                failures.append((p, e))
            board.abort()
        finally:
            with done:
                finished[0] += 1
                done.notify_all()

    threads = [threading.Thread(target=partition_main, args=(p,), daemon=True,
                                name=f"gspmdc-partition-{p}") for p in range(n)]
    with blas_threads_set_to(chosen_blas_threads(n) if blas_threads is None else blas_threads):
        for p, t in enumerate(threads):
            try:
                t.start()
            except RuntimeError as e:              # the system's limit on threads
                board.abort()
                for started in threads[:p]:
                    started.join(_STOP_GRACE_SECONDS)
                raise RuntimeFailure(f"cannot start the thread of partition {p} ({e}): the local "
                                     f"backend runs one thread per partition, and {n} are too "
                                     "many for this system; use --backend mpi") from None
        deadline = None if timeout is None else \
            monotonic() + timeout - (0.0 if started_at is None else time() - started_at)
        with done:
            while finished[0] < n and not failures:
                remaining = None if deadline is None else deadline - monotonic()
                if remaining is not None and remaining <= 0:
                    break
                done.wait(remaining)
            timed_out = finished[0] < n and not failures
        if timed_out or failures:
            board.abort()
            stop = monotonic() + _STOP_GRACE_SECONDS
            for t in threads:
                t.join(max(stop - monotonic(), 0.0))
        if timed_out:
            raise RuntimeFailure(f"the run timed out after {timeout:g} s")
        if failures:
            p, error = failures[0]
            raise _on_partition(error, p) from error
        return results, [b - a for a, b in zip(marks, marks[1:])]


def _on_partition(error: BaseException, partition: int) -> GspmdcError:
    """`error` as a GspmdcError whose message starts with `partition p:`."""
    if isinstance(error, GspmdcError):
        tagged = copy.copy(error)
        tagged.args = (f"partition {partition}: {error}",)
        return tagged
    return RuntimeFailure(f"partition {partition}: {type(error).__name__}: {error}")
