"""The reference interpreter: evaluates an HLO module with the per-opcode kernel table.

`evaluate(module, args)` runs the entry computation on numpy values (arrays, tuples of values,
`TOKEN`) and returns the root's value. `Executable(module, backend)` is the same prepared for
repeated execution (`run --repeat`, XLA's compile once, run many): its plans and folded constants
are kept from one execution to the next.

Each computation is compiled once per executable into a plan (kernel, instruction, operand slots,
slots to release) that calls, while loops and conditionals reuse. Instructions run in program
order; a value is released right after its last use, so memory holds only live values. One fusion:
a `pad` read only by a `dynamic-slice` is not evaluated, the slice reads its window from the pad's
operand (`fused_pads`; the hooks see the dynamic-slice only). Identity instructions (a `copy`, a
`reshape` or `broadcast` to the operand's own dimensions, an identity `transpose`) are not executed
when no value hook or live-array count watches: their readers read the operand (`on_step` reports
them with no time, as folded ones); neither is a `get-tuple-element` of a parameter, whose slot is
set with the arguments. Values are immutable: kernels
never write into their operands, and a result may alias an operand (a view). Kernels run under
`np.errstate(all="ignore")`: HLO arithmetic has no traps.

Constant folding: an instruction that depends on nothing but constants, `iota`, `partition-id` and
`replica-id` (through pure instructions that call no computation) gives the same array every time
its computation runs on this partition. The first complete run of a plan keeps such arrays (each
at most `FOLD_BYTES` of memory, `FOLD_PLAN_BYTES` per plan); later runs, and later iterations of
a loop body, start from them and skip their instructions and those only they read.

Loop-invariant values: in a `while` body whose root tuple passes state element k through
unchanged (operand k is `get-tuple-element(parameter), index=k`), an instruction that depends on
nothing but such elements and foldable values, through instructions that could be folded, gives
the same array in every iteration of one execution of the loop. When no value hook or live-array
count watches, the first iteration keeps such arrays (those read by instructions that are not
invariant themselves, within the folding limits) and the later iterations of that loop start from
them and skip their instructions and those only they read, as folding does (`on_step` reports
them with no time).

The same interpreter runs the unpartitioned program on one device and each partition of an SPMD
program; collectives go through `ctx.backend` (a `CollectiveBackend`), `partition-id` reads
`ctx.partition_id`. `rounding` chooses where bf16 results are rounded (`rounding.py`): `"xla"`,
the default, as XLA's CPU backend with its default flags, or `"per-op"`, every result rounded to
its type. A backend may return a collective's result as a `Pending` (started, not
finished: the MPI backend's nonblocking calls). Then the plan overlaps communication with
computation, deterministically, the same way on every partition: instructions run in the
memory-aware order of `gspmdc.ir.schedule` (the order the liveness analysis counts memory in;
every backend runs it), where each collective is issued early where memory allows, but never
before an earlier collective or an instruction that calls a computation with collectives or may
have effects (a custom-call, host I/O), so every partition issues the same collectives in the
same order; it is finished (and its result checked) right
before the first instruction that reads it, or at the end of its computation's run. Profiles
charge a collective its start and its finish; a rank waiting for one is recorded at it.
"""
from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from gspmdc.errors import GspmdcError, RuntimeFailure, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.ops import COLLECTIVES, SIDE_EFFECTING, Trait, opcodes, with_trait
from gspmdc.ir.schedule import BARRIER_OPCODES, fused_pads, issue_order, result_bytes
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from .buffer_donation import donations
from .collectives import CollectiveBackend, Pending, SinglePartitionBackend
from .kernels import KERNELS, TOKEN, Token
from .kernels.indexing import dynamic_slice_of_pad_for
from .kernels.specialising import in_place_kernel_for, kernel_for
from .live_arrays import LiveArrays
from .options import DEFAULT_ROUNDING
from .rounding import check_rounding, round_to_bf16, unrounded, unrounded_readers


#: the largest array (bytes of memory it holds) a plan keeps as a folded constant
FOLD_BYTES = 1 << 20
#: the most memory a plan keeps in folded constants
FOLD_PLAN_BYTES = 16 << 20
#: instructions never folded: their value is not a function of their operands alone, or they
#: communicate, read the entry's arguments, have effects or order them
_NOT_FOLDABLE = SIDE_EFFECTING | COLLECTIVES | with_trait(Trait.TOKEN, Trait.ASYNC) | \
    opcodes("parameter", "custom-call", "rng-bit-generator", "opt-barrier")


@dataclass(frozen=True)
class Position:
    """Where an evaluation records the instruction it is about to execute (how MPI ranks tell
    where they are): right before each instruction, `slots[slot] = numbers[id(instruction)]`, a
    store rather than a call."""

    slots: Any                  #: a writable sequence of ints (e.g. a shared memoryview)
    slot: int
    numbers: Mapping[int, int]  #: id(instruction) -> the number recorded for it


def evaluate(module: Module, args: Sequence[Any], *, backend: CollectiveBackend | None = None,
             partition_id: int | None = None, on_step: StepHook | None = None,
             position: Position | None = None, on_value: ValueHook | None = None,
             live_arrays: LiveArrays | None = None, rounding: str = DEFAULT_ROUNDING) -> Any:
    """Evaluate the entry computation of `module` on `args` (one value per entry parameter, in
    parameter-number order) and return the root's value. An array argument may be an ndarray
    subclass (a memory map of an input file): it is taken as a plain ndarray view, the only kind
    of array value kernels see and must return.

    `backend` performs collectives (default: a `SinglePartitionBackend`); `partition_id`, when
    given, must equal the backend's. `on_step`, when given, is called after every instruction (in
    every computation) with the instruction and its *exclusive* wall time in seconds: the time of
    its kernel minus that of the instructions evaluated inside it (while bodies, calls, ...), so
    the times add up without double counting (the profiling hook of `gspmdc run --profile`);
    the instructions constant folding spares are reported with no time each time their
    computation runs (so a profile counts the program's operations).
    `position`, when given, records every instruction right before its kernel runs (the innermost
    instruction executing is the last one recorded: how MPI ranks record where they are).
    `on_value`, when given, is called with every instruction and its value once it is computed
    (a collective's when it is finished), and with every parameter when its computation starts
    (in every computation, every time it runs; `gspmdc bisect` compares values this way).
    `live_arrays`, when given, holds every value from its definition to its last use (the entry
    arguments throughout; not the folded constants, which the executable keeps as XLA keeps the
    constants of a compiled program) and so measures the peak of live arrays
    (`runtime/live_arrays.py`). `rounding` is `"xla"` or `"per-op"` (see `rounding.py`).

    Raises GspmdcError for arguments that do not match the entry parameters, UnsupportedError for
    opcodes the interpreter does not implement (and for modules of several replicas), and
    RuntimeFailure (naming the computation and instruction) when a kernel fails.
    """
    backend = SinglePartitionBackend() if backend is None else backend
    if partition_id is not None and partition_id != backend.partition_id():
        raise GspmdcError(f"partition_id {partition_id} does not match the backend's partition "
                          f"{backend.partition_id()} (of {backend.num_partitions})")
    return Executable(module, backend, on_step=on_step, position=position, on_value=on_value,
                      live_arrays=live_arrays, rounding=rounding)(args)


class Executable:
    """`module` prepared for repeated execution on `backend` (see the module docstring): calling
    it with the entry arguments evaluates the entry computation as `evaluate` does (same hooks,
    same errors). The module must not change while an executable of it is in use."""

    __slots__ = ("_ctx",)

    def __init__(self, module: Module, backend: CollectiveBackend | None = None, *,
                 on_step: StepHook | None = None, position: Position | None = None,
                 on_value: ValueHook | None = None, live_arrays: LiveArrays | None = None,
                 rounding: str = DEFAULT_ROUNDING):
        if module.attrs.get("replica_count", 1) != 1:
            raise UnsupportedError(f"module {module.name} has replica_count="
                                   f"{module.attrs['replica_count']}; the interpreter runs one "
                                   "replica")
        check_rounding(rounding)
        backend = SinglePartitionBackend() if backend is None else backend
        self._ctx = EvalContext(module, backend, on_step, position, on_value, live_arrays,
                                rounding)

    def __call__(self, args: Sequence[Any]) -> Any:
        ctx = self._ctx
        entry = ctx.module.entry
        values = _check_entry_arguments(entry, args)
        live = ctx.live_arrays
        with np.errstate(all="ignore"):
            if live is None:
                return ctx.call(entry.name, values)
            live.hold(tuple(values))
            try:
                return ctx.call(entry.name, values)
            finally:
                live.drop(tuple(values))


class EvalContext:
    """What a kernel may use besides its operands.

    - `module`, `backend`, `partition_id` (this partition's id, an int);
    - `call(name, args)`: evaluate a computation of the module on argument values;
    - `cache`: a dict, kept as long as the executable, where kernel modules memoise analyses of
      computations (key tuples start with a tag naming the owner, e.g. `("scalar-plan", name)`);
    - `on_step`, `position`, `on_value`, `live_arrays`: the optional hooks, position record and
      live-array count (see `evaluate`);
    - `rounding`: where bf16 results are rounded (see `evaluate`).
    """

    __slots__ = ("module", "backend", "partition_id", "cache", "on_step", "position", "on_value",
                 "live_arrays", "rounding", "_plans", "_nested", "_started")

    def __init__(self, module: Module, backend: CollectiveBackend,
                 on_step: StepHook | None = None, position: Position | None = None,
                 on_value: ValueHook | None = None, live_arrays: LiveArrays | None = None,
                 rounding: str = DEFAULT_ROUNDING):
        self.module = module
        self.backend = backend
        self.partition_id = backend.partition_id()
        self.cache: dict[tuple, Any] = {}
        self.on_step = on_step
        self.position = position
        self.on_value = on_value
        self.live_arrays = live_arrays
        self.rounding = rounding
        self._plans: dict[str, _Plan] = {}
        self._nested = 0.0
        #: the start time of each pending collective, until it is finished and reported
        self._started: dict[int, float] = {}

    def call(self, computation_name: str, args: Sequence[Any]) -> Any:
        """Evaluate computation `computation_name` with `args` bound to its parameters."""
        return self._plan(computation_name).run(self, args)

    def loop_body(self, computation_name: str) -> Callable[[Any], Any]:
        """The iterations of one execution of a while loop whose body is `computation_name`: a
        function from the loop state to the next, called once per iteration (the loop-invariant
        values of the first iteration serve the later ones; module docstring)."""
        plan = self._plan(computation_name)
        if self.on_value is not None or self.live_arrays is not None or not plan.hoistable:
            return lambda state: plan.run(self, [state])
        return _LoopIterations(plan, self)

    def _plan(self, computation_name: str) -> _Plan:
        plan = self._plans.get(computation_name)
        if plan is None:
            plan = self._plans[computation_name] = _Plan(
                self.module.computation(computation_name), self.communicates, self.rounding,
                None if self.position is None else self.position.numbers,
                alias_identities=self.on_value is None and self.live_arrays is None)
        return plan

    def timed(self, kernel: Kernel, inst: Instruction, args: list) -> Any:
        """Run `kernel` and report its exclusive time to `on_step` (time spent in instructions
        evaluated inside it is reported by those and subtracted here); a collective that gives
        a `Pending` is reported when it is finished (`finish`)."""
        outer, self._nested = self._nested, 0.0
        start = perf_counter()
        try:
            value = kernel(inst, args, self)
        finally:
            elapsed = perf_counter() - start
            inner, self._nested = self._nested, outer + elapsed
        if type(value) is Pending:
            self._started[id(value)] = elapsed - inner
        else:
            self.on_step(inst, elapsed - inner)
        return value

    def finish(self, pending: Pending, inst: Instruction) -> Any:
        """The value of the pending collective `inst` (waiting for it), recorded on the position
        board while waiting and, when timed, reported with its start."""
        position = self.position
        if position is not None:
            position.slots[position.slot] = position.numbers[id(inst)]
        if self.on_step is None:
            return pending.result()
        start = perf_counter()
        value = pending.result()
        waited = perf_counter() - start
        self._nested += waited
        self.on_step(inst, self._started.pop(id(pending), 0.0) + waited)
        return value

    def communicates(self, computation_name: str) -> bool:
        """Whether the computation (or one it calls) has collectives or instructions with
        effects (`gspmdc.ir.schedule.ordered_computations`: a call of it is a barrier)."""
        key = ("communicates", computation_name)
        if key not in self.cache:
            comp = self.module.computation(computation_name)
            self.cache[key] = any(
                inst.opcode in COLLECTIVES or inst.opcode in SIDE_EFFECTING or
                any(self.communicates(name) for name in inst.called_computation_names())
                for inst in comp.instructions)
        return self.cache[key]


Kernel = Callable[[Instruction, list, EvalContext], Any]
StepHook = Callable[[Instruction, float], None]
ValueHook = Callable[[Instruction, Any], None]


class _Plan:
    """A computation compiled for repeated evaluation.

    Slot `i` holds the value of instruction `i` (program order). `steps` are tuples
    `(kernel, inst, fetch, out_slot, release_slots, dims, dtype, finish_slots, number,
    structural)`, everything an execution needs decoded once: `fetch(values)` the operand list
    (`_fetcher`), `dims`/`dtype` the expected array result (None for tuple and token results,
    checked structurally when `structural`: all but `tuple`, whose elements are checked values),
    `finish_slots` the pending collectives to finish before the step, `number` the step's
    position record (`Position.numbers`, 0 without a position board);
    `finish_at_end` those finished after the last step, `skipped` the instructions folding
    spares. `initial` holds the folded constants (module docstring) at their slots, None
    elsewhere; until the first complete run, `foldable` is the set of slots that may be folded
    (None afterwards). `hoistable`: the loop-invariant slots (module docstring) a while loop's
    first iteration keeps for the later ones (empty unless the computation is a body that passes
    state elements through); `loop_schedule(kept)` the steps of those later iterations. Under `"xla"` rounding an
    instruction whose f32 value some users read (`rounding.py`) computes it into an extra slot
    (numbered after the instructions'), which those users read; a second step rounds it into the
    instruction's own slot when other users or the root need it.
    """

    __slots__ = ("computation", "num_slots", "param_slots", "root_slot", "steps", "initial",
                 "foldable", "finish_at_end", "skipped", "hoistable", "_operands", "_windows",
                 "_unpacked",
                 "_pure", "_invariant", "_loop_schedules", "_collectives", "_barriers", "_wide",
                 "_rounded", "_numbers", "_aliased", "_donate")

    def __init__(self, comp: Computation, communicates: Callable[[str], bool],
                 rounding: str = DEFAULT_ROUNDING, numbers: Mapping[int, int] | None = None,
                 alias_identities: bool = False):
        self.computation = comp
        self._numbers = numbers
        #: whether steps may write over a dead operand (`buffer_donation.py`): not when a value
        #: hook or a live-array count may hold values
        self._donate = alias_identities
        slot = {inst: i for i, inst in enumerate(comp.instructions)}
        readers = unrounded_readers(comp) if rounding == "xla" else {}
        wide = {inst: len(comp.instructions) + k for k, inst in enumerate(readers)}
        alias = _identity_aliases(comp, readers) if alias_identities else {}
        #: the slots of the identity instructions whose readers read their operand's slot
        self._aliased = frozenset(slot[inst] for inst in alias)
        #: instruction slot -> the slot of its unrounded (f32) value
        self._wide = {slot[inst]: s for inst, s in wide.items()}
        self.num_slots = len(comp.instructions) + len(wide)
        self.param_slots = [slot[p] for p in comp.parameters]
        self.root_slot = slot[comp.root]
        #: (slot, parameter position, element index) of the `get-tuple-element`s of a parameter
        #: that are bound with the arguments instead of executed (when nothing watches values)
        self._unpacked = tuple(
            (slot[inst], comp.parameters.index(inst.operands[0]), inst.attr("index"))
            for inst in comp.instructions
            if alias_identities and inst.opcode == "get-tuple-element"
            and inst.operands[0].opcode == "parameter" and inst is not comp.root
            and inst not in readers) if alias_identities else ()
        fused = fused_pads(comp)
        windows = set(fused.values())
        #: slots of the dynamic-slices that read their window from a pad's operand
        self._windows = {slot[inst] for inst in windows}
        self._operands: list[tuple[int, ...] | None] = []
        for inst in comp.instructions:
            operands = inst.operands[0].operands + inst.operands[1:] if inst in windows \
                else inst.operands
            skipped = inst.opcode == "parameter" or inst in fused
            self._operands.append(None if skipped else tuple(
                wide[op] if inst in readers.get(op, ()) else slot[alias.get(op, op)]
                for op in operands))
        read = {s for operands in self._operands if operands is not None for s in operands}
        #: the instructions with an unrounded value whose rounded value is read too
        self._rounded = {i for i in self._wide if i == self.root_slot or i in read}
        foldable: set[int] = set()
        self._collectives: set[int] = set()
        self._barriers: set[int] = set()
        for i, inst in enumerate(comp.instructions):
            operands = self._operands[i]
            called = inst.called_computation_names()
            if operands is not None and inst.opcode not in _NOT_FOLDABLE and not called \
                    and i not in self._wide and all(s in foldable for s in operands):
                foldable.add(i)
            if inst.opcode in COLLECTIVES:
                self._collectives.add(i)
            elif inst.opcode in BARRIER_OPCODES or any(communicates(name) for name in called):
                self._barriers.add(i)
        self._pure = frozenset(foldable)
        self.foldable = foldable or None
        self.initial: list[Any] = [None] * self.num_slots
        self._invariant = self._loop_invariants(foldable)
        users = self._users()
        self.hoistable = frozenset(i for i in self._invariant
                                   if any(u not in self._invariant for u in users[i]))
        self._loop_schedules: dict[frozenset[int], tuple] = {}
        self.steps, self.finish_at_end, self.skipped = self._steps(set())

    def _users(self) -> list[list[int]]:
        """The instructions reading each slot."""
        users: list[list[int]] = [[] for _ in range(self.num_slots)]
        for i, operands in enumerate(self._operands):
            for s in operands or ():
                users[s].append(i)
        return users

    def _loop_invariants(self, foldable: set[int]) -> frozenset[int]:
        """The slots whose value is the same in every iteration of a while loop with this
        computation as its body, foldable ones aside (module docstring): the state elements its
        root passes through, read by `get-tuple-element`, and what could be folded given them."""
        comp = self.computation
        root = comp.root
        if len(comp.parameters) != 1 or root.opcode != "tuple":
            return frozenset()
        state = comp.parameters[0]
        through = {k for k, element in enumerate(root.operands)
                   if element.opcode == "get-tuple-element" and element.operands[0] is state
                   and element.attr("index") == k}
        invariant: set[int] = set()
        for i, inst in enumerate(comp.instructions):
            operands = self._operands[i]
            if operands is None or i in foldable or i == self.root_slot or i in self._wide:
                continue
            if inst.opcode == "get-tuple-element" and inst.operands[0] is state:
                if inst.attr("index") in through:
                    invariant.add(i)
            elif inst.opcode not in _NOT_FOLDABLE and not inst.called_computation_names() \
                    and all(s in invariant or s in foldable for s in operands) \
                    and any(s in invariant for s in operands):
                invariant.add(i)
        return frozenset(invariant)

    def loop_schedule(self, kept: frozenset[int]) -> tuple:
        """(steps, collectives finished at the end, skipped instructions) of a loop iteration
        that starts from the folded constants and the loop-invariant arrays of slots `kept`."""
        schedule = self._loop_schedules.get(kept)
        if schedule is None:
            folded = {i for i, value in enumerate(self.initial) if value is not None}
            schedule = self._loop_schedules[kept] = self._steps(folded | kept, self._invariant)
        return schedule

    def _steps(self, folded: set[int], invariant: frozenset[int] = frozenset()) \
            -> tuple[list[tuple], tuple[int, ...], tuple[Instruction, ...]]:
        """The steps of every instruction except the folded ones and the foldable (and
        `invariant`) ones only they read, in the schedule's order (`_issue_order`), each step
        releasing the slots whose last use it is; the collectives finished at the end; the
        instructions spared."""
        comp = self.computation
        users = self._users()
        spared = self._pure | invariant
        dropped = set(folded) | self._aliased | {s for s, _, _ in self._unpacked}
        for i in range(len(self._operands) - 1, -1, -1):
            if i in spared and i != self.root_slot and users[i] and \
                    all(u in dropped for u in users[i]):
                dropped.add(i)
        order = self._issue_order([i for i, operands in enumerate(self._operands)
                                   if i not in dropped and operands is not None])
        last_use: dict[int, int] = {}
        first_use: dict[int, int] = {}
        for i in order:
            for s in self._operands[i] + ((self._wide[i],) if i in self._rounded else ()):
                last_use[s] = i
                if s in self._collectives:
                    first_use.setdefault(s, i)
        releases: dict[int, list[int]] = {}
        for s, at in last_use.items():
            if s != self.root_slot and s not in dropped:
                releases.setdefault(at, []).append(s)
        finishes: dict[int, list[int]] = {}
        for s, at in first_use.items():
            finishes.setdefault(at, []).append(s)
        donated = donations(comp.instructions, self._operands, order, releases,
                            [[u for u in readers if u not in dropped] for readers in users],
                            self._undonatable(folded, invariant),
                            lambda inst, k: in_place_kernel_for(KERNELS.get(inst.opcode), inst, k)
                            ) if self._donate else {}
        # the instructions spared (reported to `on_step` with no time)
        skipped = tuple(comp.instructions[i] for i in sorted(dropped)
                        if self._operands[i] is not None)
        numbers = self._numbers
        steps = []
        for i in order:
            inst = comp.instructions[i]
            kernel = dynamic_slice_of_pad_for(inst) if i in self._windows else \
                KERNELS.get(inst.opcode)
            if kernel is None:
                raise UnsupportedError(f"opcode {inst.opcode} is not supported by the interpreter "
                                       f"(instruction {inst.name} in computation {comp.name})")
            if i in donated:
                kernel = donated[i]
            elif i not in self._wide:
                kernel = kernel_for(kernel, inst)
            dims, dtype = _expected(inst.shape)
            operands, release, finish = \
                self._operands[i], tuple(releases.get(i, ())), tuple(finishes.get(i, ()))
            number = 0 if numbers is None else numbers[id(inst)]
            # a tuple's elements are values already checked, its shape theirs (verifier)
            structural = inst.opcode != "tuple"
            if i in self._wide:
                rounded = i in self._rounded
                steps.append((unrounded(kernel, inst), inst, _fetcher(operands), self._wide[i],
                              () if rounded else release, dims, np.dtype(np.float32), finish,
                              number, structural))
                if not rounded:
                    continue
                kernel, operands, finish = round_to_bf16, (self._wide[i],), ()
            steps.append((kernel, inst, _fetcher(operands), i, release, dims, dtype, finish,
                          number, structural))
        at_end = tuple(s for s in order if s in self._collectives and s not in first_use)
        return steps, at_end, skipped

    def _undonatable(self, folded: set[int], invariant: frozenset[int]) -> set[int]:
        """The slots whose array may outlive its last use, or that are no instruction's own
        (`buffer_donation.donations`' `kept`): folded and foldable, loop-invariant, bf16 values
        with an unrounded twin and the twins' slots."""
        return set(folded) | self._pure | self._invariant | invariant | set(self._wide) | \
            set(self._wide.values())

    def _issue_order(self, order: list[int]) -> list[int]:
        """`order` in the schedule's order (`gspmdc.ir.schedule.issue_order`; an unrounded
        value's slot stands for its instruction's)."""
        owner = {wide: slot for slot, wide in self._wide.items()}
        instructions = self.computation.instructions
        reads = {slot: [owner.get(s, s) for s in self._operands[slot]] for slot in order}
        sizes = {slot: result_bytes(instructions[slot]) for slot in order}
        return issue_order(order, reads, sizes, self._collectives, self._barriers)

    def run(self, ctx: EvalContext, args: Sequence[Any]) -> Any:
        """The root's value for `args` (under `np.errstate(all="ignore")`, which the caller
        sets)."""
        values = self._bound(args, self.initial)
        captured = self._execute(ctx, values, args, (self.steps, self.finish_at_end, self.skipped),
                                 self.foldable)
        if captured is not None and self.foldable is not None:
            self._fold(captured)
        return values[self.root_slot]

    def first_iteration(self, ctx: EvalContext, state: Any) -> tuple[Any, list]:
        """The root's value for the loop state `state`, and the slots later iterations of the
        loop start from (`initial` with the loop-invariant arrays kept, module docstring)."""
        values = self._bound([state], self.initial)
        foldable = self.foldable
        captured = self._execute(ctx, values, [state],
                                 (self.steps, self.finish_at_end, self.skipped),
                                 self.hoistable if foldable is None else self.hoistable | foldable)
        if foldable is not None and self.foldable is not None:
            self._fold({s: v for s, v in captured.items() if s in foldable})
        start = self.initial.copy()
        total = 0
        for s in sorted(self.hoistable):
            value = captured.get(s)
            if value is not None:
                size = _held_bytes(value)
                if size <= FOLD_BYTES and total + size <= FOLD_PLAN_BYTES:
                    start[s] = value
                    total += size
        return values[self.root_slot], start

    def next_iteration(self, ctx: EvalContext, state: Any, start: list, schedule: tuple) -> Any:
        """The root's value for the loop state `state` of a later iteration, from the slots
        `first_iteration` gave and their `loop_schedule`."""
        values = self._bound([state], start)
        self._execute(ctx, values, [state], schedule, None)
        return values[self.root_slot]

    def _bound(self, args: Sequence[Any], start: list) -> list:
        """The slots of a run: a copy of `start` with the arguments at the parameters' slots."""
        if len(args) != len(self.param_slots):
            raise RuntimeFailure(f"computation {self.computation.name} called with {len(args)} "
                                 f"arguments, it has {len(self.param_slots)} parameters")
        values = start.copy()
        for s, value in zip(self.param_slots, args):
            values[s] = value
        for s, position, index in self._unpacked:
            values[s] = args[position][index]
        return values

    def _execute(self, ctx: EvalContext, values: list, args: Sequence[Any], schedule: tuple,
                 capture: set[int] | frozenset[int] | None) -> dict[int, np.ndarray] | None:
        """Run `schedule` (steps, collectives finished at the end, skipped instructions) on
        `values`: `_run_plain` when no hook watches, else `_run_hooked`. The array values of the
        slots `capture` are returned (None when `capture` is None)."""
        if ctx.on_step is None and ctx.on_value is None and ctx.live_arrays is None:
            return self._run_plain(ctx, values, schedule, capture)
        return self._run_hooked(ctx, values, args, schedule, capture)

    def _run_plain(self, ctx: EvalContext, values: list, schedule: tuple,
                   capture: set[int] | frozenset[int] | None) -> dict[int, np.ndarray] | None:
        """Run the steps on `values` (the slots, parameters set) with no hook but the position
        record: per step, a kernel call on the fetched operands, the result's check and the
        releases (the hot loop of an execution)."""
        steps, finish_at_end, _ = schedule
        captured: dict[int, np.ndarray] | None = {} if capture is not None else None
        ndarray = np.ndarray
        position = ctx.position
        board, at = (position.slots, position.slot) if position is not None else (None, 0)
        for kernel, inst, fetch, out, release, dims, dtype, finish, number, structural in steps:
            for s in finish:
                if type(values[s]) is Pending:
                    values[s] = self._finish(ctx, s, values[s])
            if board is not None:
                board[at] = number
            try:
                value = kernel(inst, fetch(values), ctx)
            except GspmdcError:
                raise
            except Exception as e:
                raise self._kernel_failure(inst, e) from e
            kind = type(value)
            if kind is Pending:
                pass                                # checked when finished
            elif dims is not None:
                if kind is not ndarray:
                    value = _as_array(value, self.computation, inst)
                if value.shape != dims or (value.dtype is not dtype and value.dtype != dtype):
                    _raise_mismatch(value, self.computation, inst)
                if captured is not None and out in capture:
                    captured[out] = value
            elif structural and _difference(value, inst.shape) is not None:
                _raise_mismatch(value, self.computation, inst)
            values[out] = value
            for s in release:
                values[s] = None
        for s in finish_at_end:
            if type(values[s]) is Pending:
                values[s] = self._finish(ctx, s, values[s])
        return captured

    def _run_hooked(self, ctx: EvalContext, values: list, args: Sequence[Any], schedule: tuple,
                    capture: set[int] | frozenset[int] | None) -> dict[int, np.ndarray] | None:
        """`_run_plain` with the hooks: step times, values, live arrays (see `evaluate`)."""
        comp = self.computation
        steps, finish_at_end, skipped = schedule
        captured: dict[int, np.ndarray] | None = {} if capture is not None else None
        timed = ctx.on_step is not None
        position = ctx.position
        board, at = (position.slots, position.slot) if position is not None else (None, 0)
        on_value, live = ctx.on_value, ctx.live_arrays
        if timed:
            for inst in skipped:
                ctx.on_step(inst, 0.0)
        if live is not None:
            live.hold(tuple(args))
        if on_value is not None:
            for param, value in zip(comp.parameters, args):
                on_value(param, value)
        for kernel, inst, fetch, out, release, dims, dtype, finish, number, structural in steps:
            for s in finish:
                if type(values[s]) is Pending:
                    values[s] = self._finish(ctx, s, values[s])
            if board is not None:
                board[at] = number
            try:
                if timed:
                    value = ctx.timed(kernel, inst, fetch(values))
                else:
                    value = kernel(inst, fetch(values), ctx)
            except GspmdcError:
                raise
            except Exception as e:
                raise self._kernel_failure(inst, e) from e
            if type(value) is Pending:
                pass                                # checked when finished
            elif dims is not None:
                if type(value) is not np.ndarray:
                    value = _as_array(value, comp, inst)
                if value.shape != dims or value.dtype != dtype:
                    _raise_mismatch(value, comp, inst)
                if captured is not None and out in capture:
                    captured[out] = value
            elif structural and _difference(value, inst.shape) is not None:
                _raise_mismatch(value, comp, inst)
            values[out] = value
            if type(value) is not Pending:
                if on_value is not None:
                    on_value(inst, value)
                if live is not None:
                    live.hold(value)
            elif live is not None:
                live.hold_pending(value, inst.shape.byte_size)
            if live is not None:
                for s in release:
                    live.drop(values[s])
            for s in release:
                values[s] = None
        for s in finish_at_end:
            if type(values[s]) is Pending:
                values[s] = self._finish(ctx, s, values[s])
        if live is not None:
            for value, folded in zip(values, self.initial):
                if folded is None:
                    live.drop(value)
        return captured

    def _kernel_failure(self, inst: Instruction, e: Exception) -> RuntimeFailure:
        """The error of a kernel (or a collective being finished) that raised something other than
        a GspmdcError."""
        return RuntimeFailure(f"{self.computation.name}/{inst.name}: {inst.opcode} failed: "
                              f"{type(e).__name__}: {e}")

    def _finish(self, ctx: EvalContext, s: int, pending: Pending) -> Any:
        """The checked value of the pending collective in slot `s`."""
        comp = self.computation
        inst = comp.instructions[s]
        try:
            value = ctx.finish(pending, inst)
        except GspmdcError:
            raise
        except Exception as e:
            raise self._kernel_failure(inst, e) from e
        dims, dtype = _expected(inst.shape)
        if dims is not None:
            if type(value) is not np.ndarray:
                value = _as_array(value, comp, inst)
            if value.shape != dims or value.dtype != dtype:
                _raise_mismatch(value, comp, inst)
        elif _difference(value, inst.shape) is not None:
            _raise_mismatch(value, comp, inst)
        if ctx.on_value is not None:
            ctx.on_value(inst, value)
        if ctx.live_arrays is not None:
            ctx.live_arrays.settle(pending, value)
        return value

    def _fold(self, candidates: dict[int, np.ndarray]) -> None:
        """After the first complete run: keep the foldable arrays that fit the limits and drop
        the steps they make unnecessary."""
        self.foldable = None
        kept, total = set(), 0
        for s, value in candidates.items():
            size = _held_bytes(value)
            if size <= FOLD_BYTES and total + size <= FOLD_PLAN_BYTES:
                kept.add(s)
                total += size
                self.initial[s] = value
        if kept:
            self.steps, self.finish_at_end, self.skipped = self._steps(kept)
            self._loop_schedules.clear()


class _LoopIterations:
    """The iterations of one execution of a while loop (`EvalContext.loop_body`): calling it
    with the loop state gives the next; the first call runs the whole body and keeps its
    loop-invariant arrays, the later ones start from them."""

    __slots__ = ("_plan", "_ctx", "_start", "_schedule")

    def __init__(self, plan: _Plan, ctx: EvalContext):
        self._plan, self._ctx, self._start, self._schedule = plan, ctx, None, None

    def __call__(self, state: Any) -> Any:
        plan = self._plan
        if self._start is None:
            result, start = plan.first_iteration(self._ctx, state)
            self._schedule = plan.loop_schedule(
                frozenset(s for s in plan.hoistable if start[s] is not None))
            self._start = start
            return result
        return plan.next_iteration(self._ctx, state, self._start, self._schedule)


def _identity_aliases(comp: Computation,
                      readers: Mapping[Instruction, Any]) -> dict[Instruction, Instruction]:
    """{instruction: the instruction whose value it is} for the instructions of `comp` whose
    value is their operand's, unchanged (a `copy`, a `reshape` or `broadcast` to the operand's
    own dimensions in order, a `transpose` by the identity): their readers read the operand
    instead, and they are not executed. Not the root, nor what takes part in bf16 rounding
    (`readers`: instruction -> the users reading its unrounded value)."""
    rounding = set(readers) | {user for users in readers.values() for user in users}
    alias: dict[Instruction, Instruction] = {}
    for inst in comp.instructions:
        if inst is comp.root or inst in rounding or not _is_identity(inst):
            continue
        source = inst.operands[0]
        if source not in rounding:
            alias[inst] = alias.get(source, source)
    return alias


def _is_identity(inst: Instruction) -> bool:
    """Whether `inst`'s value is its (single) operand's, the same array."""
    opcode = inst.opcode
    if opcode == "copy":
        return True
    if opcode not in ("reshape", "broadcast", "transpose") or \
            not isinstance(inst.shape, ArrayShape):
        return False
    dims = inst.shape.dims
    operand = inst.operands[0].shape
    if not isinstance(operand, ArrayShape) or operand.dims != dims:
        return False
    if opcode == "reshape":
        return True
    order = tuple(inst.attrs.get("dimensions", ()))
    return order == tuple(range(len(dims)))


def _fetcher(slots: tuple[int, ...]) -> Callable[[list], list]:
    """The function that reads a step's operands from the slots: `values -> [values[s] for s
    in slots]`, written out for up to three operands (no loop at execution time)."""
    if not slots:
        return lambda values: []
    if len(slots) == 1:
        a, = slots
        return lambda values: [values[a]]
    if len(slots) == 2:
        a, b = slots
        return lambda values: [values[a], values[b]]
    if len(slots) == 3:
        a, b, c = slots
        return lambda values: [values[a], values[b], values[c]]
    return lambda values: [values[s] for s in slots]


def _expected(shape: Shape) -> tuple[tuple[int, ...] | None, np.dtype | None]:
    """(dims, dtype) an array result must have; (None, None) for tuples and tokens."""
    if isinstance(shape, ArrayShape) and not shape.is_token:
        return shape.dims, dtypes.numpy_dtype(shape.element_type)
    return None, None


def _held_bytes(value: np.ndarray) -> int:
    """The bytes of memory an array keeps alive: its base's, for a view (a broadcast scalar
    holds a few bytes, whatever its shape)."""
    while isinstance(value.base, np.ndarray):
        value = value.base
    return value.nbytes


def _as_array(value: Any, comp: Computation, inst: Instruction) -> np.ndarray:
    if isinstance(value, np.generic):
        return np.asarray(value)
    _raise_mismatch(value, comp, inst)


def _difference(value: Any, shape: Shape) -> str | None:
    """How a kernel's result `value` differs from a value of `shape` (None: it conforms). Array
    results are plain `np.ndarray`s: the kernels and the backends count on numpy's own operators
    and memory, which subclasses (memory maps, masked arrays, matrices) change."""
    if isinstance(shape, TupleShape):
        if not isinstance(value, tuple):
            return f"{_describe(value)} instead of a tuple"
        if len(value) != len(shape.elements):
            return f"a tuple of {len(value)} elements instead of {len(shape.elements)}"
        for i, (v, s) in enumerate(zip(value, shape.elements)):
            inner = _difference(v, s)
            if inner is not None:
                return f"{inner} in tuple element {i}"
        return None
    if shape.is_token:
        return None if isinstance(value, Token) else f"{_describe(value)} instead of a token"
    if not isinstance(value, np.ndarray):
        return f"a {type(value).__name__} instead of an array"
    if type(value) is not np.ndarray:
        return f"a {type(value).__name__} (an ndarray subclass) instead of a numpy.ndarray"
    if value.shape != shape.dims:
        return f"shape {list(value.shape)} instead of {list(shape.dims)}"
    want = dtypes.numpy_dtype(shape.element_type)
    if value.dtype != want:
        return f"element type {_element_type_name(value.dtype)} instead of {shape.element_type}"
    return None


def _raise_mismatch(value: Any, comp: Computation, inst: Instruction):
    raise RuntimeFailure(f"{comp.name}/{inst.name}: the {inst.opcode} kernel produced "
                         f"{_difference(value, inst.shape)} (the instruction's shape is "
                         f"{inst.shape})")


def _element_type_name(dtype: np.dtype) -> str:
    try:
        return dtypes.element_type_of(dtype)
    except KeyError:
        return str(dtype)


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if isinstance(value, Token):
        return "token[]"
    if isinstance(value, (np.ndarray, np.generic)):
        return f"{_element_type_name(value.dtype)}[{','.join(map(str, np.shape(value)))}]"
    return f"a {type(value).__name__}"


def _check_entry_arguments(entry: Computation, args: Sequence[Any]) -> list[Any]:
    params = entry.parameters
    if len(args) != len(params):
        raise GspmdcError(f"entry computation {entry.name} has {len(params)} parameters, got "
                          f"{len(args)} arguments")
    return [_check_argument(a, p.shape, f"argument {p.parameter_number} (parameter {p.name})")
            for a, p in zip(args, params)]


def _check_argument(value: Any, shape: Shape, where: str) -> Any:
    if isinstance(shape, TupleShape):
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.elements):
            raise GspmdcError(f"{where}: expected a tuple {shape}, got {_describe(value)}")
        return tuple(_check_argument(v, s, f"{where} element {i}")
                     for i, (v, s) in enumerate(zip(value, shape.elements)))
    if shape.is_token:
        if not isinstance(value, Token):
            raise GspmdcError(f"{where}: expected a token, got {_describe(value)}")
        return TOKEN
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if (not isinstance(value, np.ndarray) or value.shape != shape.dims
            or value.dtype != dtypes.numpy_dtype(shape.element_type)):
        raise GspmdcError(f"{where}: expected {shape.without_layout()}, got {_describe(value)}")
    return np.asarray(value)        # a plain ndarray view of a subclass (a memory map, ...)
