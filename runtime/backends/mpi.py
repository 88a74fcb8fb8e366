"""The MPI backend: each partition of an SPMD program is one MPI rank (mpi4py).

`MpiBackend(module, comm)` is one rank's endpoint. Partition ids map to ranks through the module's
device assignment (`rank_of_partition`: the gspmdc header attribute `device_assignment={r0,r1,...}`,
rank of partition i at position i; the identity when absent).

Communicators (docs/design/collectives.md#on-mpi): at construction the backend walks every
collective of the
module in program order (computations in text order) and creates, once per distinct list of groups,
a sub-communicator with `Split(color = index of my group, key = my position)`, so that its rank order
is the group order. All ranks walk the same module, so they create the same communicators in the
same order (Split is collective). Groups of one member need none. `close()` frees them.

Data path: buffer (capitalised) methods on contiguous numpy arrays, never pickling. Data movement
travels as raw bytes (`[array, MPI.BYTE]`, so `pred`, `bf16`, `f16`, `f8*` and complex types all
move bit-exactly). Operands are sent as they are when C-contiguous with the collective dimension
leading (or preceded only by dimensions of size 1); otherwise that dimension is moved to axis 0 and
the operand copied once. Every collective receives straight into its result, a buffer of
`RecycledBuffers` (memory received into before, once the results it held are gone; no copy out),
and the result is a view of it with the collective dimension moved back into place.

Every collective is started with MPI's nonblocking call (`Iallreduce`, `Iallgather`,
`Ireduce_scatter_block`, `Ialltoall`, `Isend`/`Irecv`) and returned as a `Pending` (collectives.py):
the interpreter finishes it at the first use of its value, so instructions that do not depend on
it run while it travels (and it issues collectives as early as their operands allow; see
interpreter.py). Per call, the backend does little besides the MPI call (a few µs of Python): each
group's calls are bound to its communicator once, at construction (`_Group`); a call looks its
group up by instruction, takes a receive buffer, starts the call.

- all-reduce: `Iallreduce` with the MPI op when the reducer is exactly add, multiply, maximum,
  minimum, and, or, xor and the type reduces natively the way HLO does (integers: all of them;
  `f32`/`f64`/complex: add and multiply, since MPI's MAX/MIN do not propagate NaN as HLO does;
  `pred` as `uint8`: and, or, xor, maximum, minimum). Otherwise `Iallgather` and a fold with the
  reducer in group order (identical on every member). Several operands of one type and
  reduction travel in one call (concatenated).
- reduce-scatter: `Ireduce_scatter_block` with the MPI op under the same rule, else `Ialltoall` of
  the blocks and a fold in group order.
- all-gather: `Iallgather` into a `[G, ...]` buffer merged into the gather dim (a view).
- all-to-all: the blocks as a `[G, ...]` buffer, `Ialltoall`, merged back along the dim; the tuple
  form sends operand k to member k.
- collective-permute: `Isend` to my target, `Irecv` from my source, finished together (no ordering
  between pairs is needed, so no pattern deadlocks); tags count permute executions, so messages
  of different loop iterations never mix; zeros when no pair targets me; a `(p, p)` pair copies.

`deterministic=True` folds every reduction in group order (bit-identical to the local backend and
from run to run); by default native float sums are used, whose association order is MPI's.

Waiting (`wait=` of `MpiBackend`, `gspmdc run --mpi-wait`, `Waiter`): `blocking` completes
requests with MPI's own `Waitall` (it busy-polls: the lowest latency when every rank has a core to
itself); `polite` tests the requests for ~100 µs, then sleeps with backoff up to 0.2 ms, leaving the
CPU to other processes; `auto` (the default) adapts. It starts from the machine: the cores this
rank may run on, less those other work keeps busy now (the tasks runnable on the machine besides
the job's ranks there, `cores.free_cores`), against the ranks of the job on this machine. With a
core per rank it spins before sleeping, otherwise it sleeps almost at once. Then every wait adjusts the spin budget: waits that end while spinning keep
it (it grows towards twice their typical length, at most 0.2 ms), waits that outlast it halve it, so
that on a machine that turns out to be oversubscribed (the ranks' waits are long: the peer is not
running) the ranks stop burning the CPU the others need, and on an idle one they keep spinning.
Past the budget, when the job's ranks on this machine are no more than its cores, it sleeps in
short steps (`_STEP_SECONDS`, 20 µs) and tests the requests after each: a rank that slept briefly
is run again as soon as its step ends (it has used little CPU), whereas one that yields the CPU
(`sched_yield`) or sleeps longer waits behind the other runnable processes for a time slice,
milliseconds on a machine loaded by other work. Waits that last beyond `_STEPPING_SECONDS` (the
peer is far behind) back off to sleeps of up to 0.2 ms. For these steps the backend asks Linux
for sleeps as short as requested (`precise_sleeps`: the thread's timer slack set to 1 µs, from
the default 50 µs, which would make every 20 µs step last 70 µs). When the job's own ranks
outnumber the cores (e.g. 8 ranks on 2 cores) the rank waited for needs the waiting rank's core:
each step's wake-up would take it away (a sleep and wake-up costs about 25 µs of CPU in a VM), so
past the budget the rank yields the CPU a few times, then sleeps with backoff up to 0.2 ms.
"""
from __future__ import annotations

import functools
import math
import os
import time

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir.attributes import RawAttr
from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.ops import opcodes

from ..collectives import (
    CollectiveBackend, Pending, Reduction, fold, group_of, participant_groups, permute_pairs,
    permute_source,
)
from ..cores import free_cores, machine_cores
from ..mpi_processes import prctl
from ..options import WAIT_MODES
from .recycled_buffers import RecycledBuffers

GROUP_OPCODES = opcodes("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                        "collective-broadcast")
#: how long `polite` waiting (and `wait`) spins before sleeping
_SPIN_SECONDS = 1e-4
#: at most this much memory in recycled receive buffers per backend
_RECYCLED_BYTES = 256 << 20
_MAX_SLEEP_SECONDS = 2e-4
#: `auto` waiting: the spin budget's bounds; past it, sleeps of `_STEP_SECONDS` until the wait has
#: lasted `_STEPPING_SECONDS`, then sleeps growing to `_MAX_SLEEP_SECONDS` (on a crowded machine:
#: `_YIELDS` yields of the CPU, then the growing sleeps)
_MIN_SPIN_SECONDS = 2e-6
_MAX_SPIN_SECONDS = 2e-4
_STEP_SECONDS = 2e-5
_STEPPING_SECONDS = 5e-3
_YIELDS = 4
#: PR_SET_TIMERSLACK of prctl(2), and the slack `precise_sleeps` asks for (nanoseconds)
_PR_SET_TIMERSLACK = 29
_TIMER_SLACK_NS = 1000


def rank_of_partition(module: Module, size: int) -> list[int]:
    """The MPI rank of each partition: the module's `device_assignment={...}` header attribute
    (a permutation of the ranks, indexed by partition id), else the identity."""
    attr = module.attrs.get("device_assignment")
    if attr is None:
        return list(range(size))
    text = (attr.text if isinstance(attr, RawAttr) else str(attr)).strip().strip("{}")
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GspmdcError(f"device_assignment={attr.text if isinstance(attr, RawAttr) else attr}: "
                          "expected a list of ranks {r0,r1,...}") from None
    if sorted(ranks) != list(range(size)):
        raise GspmdcError(f"device_assignment {ranks} is not a permutation of the {size} ranks")
    return ranks


def wait(request) -> None:
    """Complete an MPI request (or a list of them) politely: spin briefly, then sleep with
    backoff up to 0.2 ms, leaving the CPU to other processes."""
    from mpi4py import MPI
    if isinstance(request, list):
        def done():
            return MPI.Request.Testall(request)
    else:
        done = request.Test
    start = time.perf_counter()
    while time.perf_counter() - start < _SPIN_SECONDS:
        if done():
            return
    _backoff(done)


class SpinBudget:
    """How long `auto` waiting spins before sleeping (see the module docstring): the seconds in
    `spin`, between `_MIN_SPIN_SECONDS` and `_MAX_SPIN_SECONDS`."""

    __slots__ = ("spin", "_typical")

    def __init__(self, oversubscribed: bool):
        self.spin = _MIN_SPIN_SECONDS if oversubscribed else _MAX_SPIN_SECONDS
        self._typical = 0.0

    def ended_spinning(self, seconds: float) -> None:
        """A wait ended while spinning, after `seconds`: the budget follows twice the typical
        short wait (it never shrinks here)."""
        self._typical += (seconds - self._typical) / 8
        self.spin = min(max(self.spin, 2 * self._typical), _MAX_SPIN_SECONDS)

    def outlasted(self) -> None:
        """A wait outlasted the budget: halve it."""
        self.spin = max(self.spin / 2, _MIN_SPIN_SECONDS)


class Waiter:
    """How this rank completes the requests of its collectives, under one of `WAIT_MODES` (see
    the module docstring). `oversubscribed`: whether the ranks of the job on this machine
    outnumber its free cores (`auto` starts from it); `crowded`: whether they outnumber its
    cores (`auto` then yields and backs off past its spin instead of sleeping in steps)."""

    __slots__ = ("mode", "budget", "crowded")

    def __init__(self, mode: str, oversubscribed: bool, crowded: bool = False):
        if mode not in WAIT_MODES:
            raise GspmdcError(f"the MPI waiting policy must be one of {', '.join(WAIT_MODES)}, "
                              f"got {mode!r}")
        self.mode = mode
        self.budget = SpinBudget(oversubscribed)
        self.crowded = crowded

    def wait(self, requests: list) -> None:
        """Complete every request of `requests`."""
        from mpi4py import MPI
        if self.mode == "blocking":
            MPI.Request.Waitall(requests)
            return
        if self.mode == "polite":
            wait(requests)
            return
        testall = MPI.Request.Testall
        start = time.perf_counter()
        deadline = start + self.budget.spin
        while not testall(requests):
            now = time.perf_counter()
            if now > deadline:
                self.budget.outlasted()
                if self.crowded:
                    _yield_then_back_off(lambda: testall(requests))
                else:
                    _sleep_in_steps(lambda: testall(requests), now + _STEPPING_SECONDS)
                return
        self.budget.ended_spinning(time.perf_counter() - start)


def _sleep_in_steps(done, stepping_until: float) -> None:
    """Sleep in `_STEP_SECONDS` steps until `done()` (called after each sleep) is true; past
    `stepping_until` (a `perf_counter` time), `_backoff`."""
    sleep = time.sleep
    while not done():
        sleep(_STEP_SECONDS)
        if time.perf_counter() > stepping_until:
            _backoff(done)
            return


def _yield_then_back_off(done) -> None:
    """Yield the CPU (`sched_yield`) `_YIELDS` times, then `_backoff`, until `done()`."""
    for _ in range(_YIELDS):
        os.sched_yield()
        if done():
            return
    _backoff(done)


def _backoff(done) -> None:
    """Sleep until `done()` (called before each sleep) is true, sleeps doubling from
    `_STEP_SECONDS` up to `_MAX_SLEEP_SECONDS`."""
    pause = _STEP_SECONDS
    while not done():
        time.sleep(pause)
        pause = min(pause * 2, _MAX_SLEEP_SECONDS)


def precise_sleeps() -> None:
    """Ask Linux to end this thread's sleeps when they are due (a timer slack of 1 µs instead of
    50 µs): `auto` waiting sleeps in 20 µs steps. Nothing happens where prctl is unavailable."""
    prctl(_PR_SET_TIMERSLACK, _TIMER_SLACK_NS)


def _duplicate(comm):
    """A duplicate of `comm` (collective), waited for politely: the other ranks may still be
    starting, and MPI's blocking `Comm.Dup` would keep this one spinning meanwhile."""
    duplicate, request = comm.Idup()
    wait(request)
    return duplicate


def ranks_on_this_machine(comm) -> int:
    """How many ranks of `comm` run on this machine (collective over `comm`)."""
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_here = local.Get_size()
    local.Free()
    return ranks_here


def _native_op(reduction: Reduction, dtype: np.dtype):
    """The MPI op reducing `dtype` exactly as the reducer does, or None (fold instead)."""
    if reduction.ufunc is None:
        return None
    return _native_ops(dtype).get(reduction.ufunc)


@functools.cache
def _native_ops(dtype: np.dtype) -> dict:
    """{ufunc: MPI op} of the reductions MPI performs on `dtype` exactly as HLO does."""
    from mpi4py import MPI
    if dtype == np.bool_:
        return {np.bitwise_and: MPI.BAND, np.bitwise_or: MPI.BOR, np.bitwise_xor: MPI.BXOR,
                np.maximum: MPI.MAX, np.minimum: MPI.MIN}
    if dtype.kind in "iu":
        return {np.add: MPI.SUM, np.multiply: MPI.PROD, np.maximum: MPI.MAX, np.minimum: MPI.MIN,
                np.bitwise_and: MPI.BAND, np.bitwise_or: MPI.BOR, np.bitwise_xor: MPI.BXOR}
    if dtype in (np.float32, np.float64, np.complex64, np.complex128):
        return {np.add: MPI.SUM, np.multiply: MPI.PROD}
    return {}


def _contiguous(x: np.ndarray) -> np.ndarray:
    """`x` in C order, same shape (`np.ascontiguousarray` would turn a 0-d array into 1-d)."""
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def _typed(x: np.ndarray) -> np.ndarray:
    """A contiguous buffer MPI can reduce, same shape: bools as uint8."""
    x = _contiguous(x)
    return x.view(np.uint8) if x.dtype.kind == "b" else x


def _moveaxis(x: np.ndarray, source: int, destination: int) -> np.ndarray:
    """`np.moveaxis` of one (non-negative) axis as a plain transpose, several times cheaper; `x`
    itself when nothing moves."""
    if source == destination:
        return x
    order = list(range(x.ndim))
    order.insert(destination, order.pop(source))
    return x.transpose(order)


class _Group:
    """A collective's group as seen by this rank: the communicator (None for a group of one),
    the group size, this partition's position and, with a communicator, its nonblocking buffer
    methods bound to it: `allreduce`, `allgather`, `reduce_scatter_block`, `alltoall`."""

    __slots__ = ("comm", "size", "position", "allreduce", "allgather", "reduce_scatter_block",
                 "alltoall")

    def __init__(self, comm, size: int, position: int):
        self.comm, self.size, self.position = comm, size, position
        if comm is not None:
            self.allreduce = comm.Iallreduce
            self.allgather = comm.Iallgather
            self.reduce_scatter_block = comm.Ireduce_scatter_block
            self.alltoall = comm.Ialltoall


class MpiBackend(CollectiveBackend):
    """One rank's endpoint (see the module docstring). Construct it on every rank of `comm`
    (collective), with the same module and options; `wait` is one of `WAIT_MODES`."""

    def __init__(self, module: Module, comm=None, *, deterministic: bool = False,
                 wait: str = "auto"):
        from mpi4py import MPI
        world = MPI.COMM_WORLD if comm is None else comm
        n = world.Get_size()
        if module.num_partitions not in (None, n):
            raise GspmdcError(f"module {module.name} has {module.num_partitions} partitions but "
                              f"the MPI job has {n} ranks")
        if wait not in WAIT_MODES:
            raise GspmdcError(f"the MPI waiting policy must be one of {', '.join(WAIT_MODES)}, "
                              f"got {wait!r}")
        self._n = n
        self._deterministic = deterministic
        self._comm = _duplicate(world)
        ranks = rank_of_partition(module, n)
        self._rank_of = ranks
        self._partition = ranks.index(self._comm.Get_rank())
        self._tag_limit = int(self._comm.Get_attr(MPI.TAG_UB) or 32767) + 1
        self._permutes = 0
        self._split_cache: dict[tuple, object] = {}
        self._groups: dict[int, _Group] = {}
        self._pairs: dict[int, tuple[int | None, int | None, bool]] = {}
        if wait == "auto":
            here = ranks_on_this_machine(self._comm)
            crowded = here > machine_cores()        # then more than the free cores, too
            self.waiter = Waiter(wait, crowded or here > free_cores(ours=here), crowded=crowded)
            if not self.waiter.crowded:
                precise_sleeps()
        else:
            self.waiter = Waiter(wait, False)
        self._byte = MPI.BYTE
        self._buffers = RecycledBuffers(_RECYCLED_BYTES)
        for _, inst in module.all_instructions():
            if inst.opcode in GROUP_OPCODES:
                self._groups[id(inst)] = self._make_group(inst)
            elif inst.opcode == "collective-permute":
                self._pairs[id(inst)] = self._make_pairs(inst)

    # ---- set-up -------------------------------------------------------------------------------

    def _make_group(self, inst: Instruction) -> _Group:
        from mpi4py import MPI
        groups = participant_groups(inst, self._n)
        if all(len(g) == 1 for g in groups):
            return _Group(None, 1, 0)
        key = tuple(tuple(g) for g in groups)
        comm = self._split_cache.get(key)
        mine = next((i for i, g in enumerate(groups) if self._partition in g), None)
        if key not in self._split_cache:
            color = MPI.UNDEFINED if mine is None else mine
            position = 0 if mine is None else groups[mine].index(self._partition)
            comm = self._split_cache[key] = self._comm.Split(color, position)
        if mine is None:        # reported if this partition ever executes the collective
            return _Group(None, 0, -1)
        group = groups[mine]
        return _Group(comm, len(group), group.index(self._partition))

    def _make_pairs(self, inst: Instruction) -> tuple[int | None, int | None, bool]:
        """(rank I send to, rank I receive from, self copy) of a collective-permute."""
        pairs = permute_pairs(inst, self._n)
        me = self._partition
        source = permute_source(pairs, me)
        target = next((t for s, t in pairs if s == me), None)
        if source == me:
            return None, None, True
        return (None if target is None else self._rank_of[target],
                None if source is None else self._rank_of[source], False)

    def close(self) -> None:
        """Free the communicators (collective over the job)."""
        from mpi4py import MPI
        for comm in self._split_cache.values():
            if comm != MPI.COMM_NULL:
                comm.Free()
        self._split_cache.clear()
        self._comm.Free()

    # ---- CollectiveBackend --------------------------------------------------------------------

    @property
    def num_partitions(self) -> int:
        return self._n

    def group_communicator(self, inst: Instruction):
        """The communicator `inst` (an all-reduce, all-gather, reduce-scatter or all-to-all of the
        module) runs on for this partition, None for a group of one (for measurements)."""
        return self._group(inst).comm

    def partition_id(self) -> int:
        return self._partition

    def _group(self, inst: Instruction) -> _Group:
        group = self._groups.get(id(inst))
        if group is None:
            raise GspmdcError(f"{inst.opcode} {inst.name} is not an instruction of the module "
                              "the MPI backend was built for")
        if group.size == 0:
            group_of(inst, participant_groups(inst, self._n), self._partition)   # raises
        return group

    def _pending(self, requests: list, finish) -> Pending:
        """The collective whose `requests` were started: waiting the backend's way, then
        `finish()` gives its value. The buffers the requests use stay referenced until then."""
        def complete():
            self.waiter.wait(requests)
            return finish()
        return Pending(complete)

    def all_reduce(self, inst, operands, reduction):
        group = self._group(inst)
        if group.comm is None:
            return list(operands)
        op = None if self._deterministic else _native_op(reduction, operands[0].dtype)
        if op is None or any(x.dtype != operands[0].dtype for x in operands):
            parts = [self._start_gather(x, group, (group.size,) + x.shape) for x in operands]
            return self._pending([r for r, _ in parts],
                                 lambda: [fold(list(v), reduction) for _, v in parts])
        send = _typed(operands[0]) if len(operands) == 1 else \
            np.concatenate([_typed(x).reshape(-1) for x in operands])
        recv = self._receive(send.shape, send.dtype)
        request = group.allreduce(send, recv, op)
        dtype = operands[0].dtype

        def finish():
            result = recv if recv.dtype == dtype else recv.view(dtype)
            if len(operands) == 1:
                return [result]
            sizes = np.cumsum([0] + [x.size for x in operands])
            return [result[a:b].reshape(x.shape) for a, b, x in zip(sizes, sizes[1:], operands)]
        return self._pending([request], finish)

    def all_gather(self, inst, operands, dim):
        group = self._group(inst)
        if group.comm is None:
            return list(operands)
        parts = [self._start_all_gather(x, dim, group) for x in operands]
        return self._pending([r for r, _ in parts], lambda: [v for _, v in parts])

    def _start_all_gather(self, x: np.ndarray, dim: int, group: _Group):
        """When only dimensions of size 1 precede `dim`, the members' operands in group order
        are the result's bytes: gather them in place. Otherwise gather the operands with `dim`
        moved to the front, and the result is a view moving it back."""
        shape = x.shape
        gathered = group.size * shape[dim]
        if dim == 0 or math.prod(shape[:dim]) == 1:
            return self._start_gather(x, group, shape[:dim] + (gathered,) + shape[dim + 1:])
        moved = _moveaxis(x, dim, 0)
        request, merged = self._start_gather(moved, group, (gathered,) + moved.shape[1:])
        return request, _moveaxis(merged, 0, dim)

    def _receive(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A C-ordered `dtype` (an `np.dtype`) array of `shape` to receive into, which becomes the
        result (`RecycledBuffers`: memory received into before, once the results it held are
        gone)."""
        return np.ndarray(shape, dtype, self._buffers.take(math.prod(shape) * dtype.itemsize))

    def _start_gather(self, x: np.ndarray, group: _Group, shape: tuple):
        """(request, buffer): every member's `x` (same shape and dtype) in group order, one after
        the other in C order, arriving in an array of `shape` (of G times `x`'s size)."""
        recv = self._receive(shape, x.dtype)
        send = _contiguous(x)
        return group.allgather([send, self._byte], [recv, self._byte]), recv

    def reduce_scatter(self, inst, operands, dim, reduction):
        group = self._group(inst)
        g = group.size
        for x in operands:
            if x.shape[dim] % max(g, 1):
                raise GspmdcError(f"reduce-scatter: dimension {dim} of size {x.shape[dim]} does "
                                  f"not split into {g} equal blocks")
        if group.comm is None:
            return list(operands)
        parts = [self._start_reduce_scatter(x, dim, group, reduction) for x in operands]
        return self._pending([r for r, _ in parts], lambda: [f() for _, f in parts])

    def _start_reduce_scatter(self, x: np.ndarray, dim: int, group: _Group,
                              reduction: Reduction):
        g = group.size
        moved = _moveaxis(x, dim, 0)
        block = (moved.shape[0] // g,) + moved.shape[1:]
        op = None if self._deterministic else _native_op(reduction, x.dtype)
        if op is not None:
            send = _typed(moved)
            recv = self._receive(block, send.dtype)
            request = group.reduce_scatter_block(send, recv, op)
            return request, lambda: _moveaxis(recv.view(x.dtype), 0, dim)
        request, received = self._start_exchange(moved.reshape((g,) + block), group)
        return request, lambda: _moveaxis(fold(list(received), reduction), 0, dim)

    def _start_exchange(self, blocks: np.ndarray, group: _Group):
        """(request, buffer): `blocks[k]` goes to member k; the buffer gets `[G, ...]` with row j
        from member j."""
        recv = self._receive(blocks.shape, blocks.dtype)
        send = _contiguous(blocks)
        return group.alltoall([send, self._byte], [recv, self._byte]), recv

    def all_to_all(self, inst, operands, dim):
        group = self._group(inst)
        g = group.size
        if dim is None:
            if len(operands) != g:
                raise GspmdcError(f"all-to-all {inst.name}: the tuple form needs one operand per "
                                  f"group member ({g}), got {len(operands)}")
            if len({(x.shape, x.dtype) for x in operands}) != 1:
                raise GspmdcError(f"all-to-all {inst.name}: tuple-form operands differ in shape")
            if group.comm is None:
                return list(operands)
            request, received = self._start_exchange(np.stack(operands), group)
            return self._pending([request], lambda: list(received))
        for x in operands:
            if x.shape[dim] % g:
                raise GspmdcError(f"all-to-all {inst.name}: dimension {dim} of size "
                                  f"{x.shape[dim]} does not split into {g} equal blocks")
        if group.comm is None:
            return list(operands)
        parts = []
        for x in operands:
            split = x.reshape(x.shape[:dim] + (g, x.shape[dim] // g) + x.shape[dim + 1:])
            parts.append((self._start_exchange(_moveaxis(split, dim, 0), group), x.shape))
        return self._pending(
            [r for (r, _), _ in parts],
            lambda: [_moveaxis(received, 0, dim).reshape(shape)
                     for (_, received), shape in parts])

    def collective_permute(self, inst, operand):
        pairs = self._pairs.get(id(inst))
        if pairs is None:
            raise GspmdcError(f"collective-permute {inst.name} is not an instruction of the "
                              "module the MPI backend was built for")
        target, source, self_copy = pairs
        tag = self._permutes % self._tag_limit
        self._permutes += 1
        if self_copy:
            return operand
        requests = []
        result = None
        if source is not None:
            result = self._receive(operand.shape, operand.dtype)
            requests.append(self._comm.Irecv([result, self._byte], source, tag))
        if target is not None:
            send = _contiguous(operand)
            requests.append(self._comm.Isend([send, self._byte], target, tag))
        if not requests:
            return np.zeros_like(operand)
        return self._pending(requests,
                             lambda: np.zeros_like(operand) if result is None else result)
