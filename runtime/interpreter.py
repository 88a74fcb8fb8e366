"""The reference interpreter: evaluates an HLO module with the per-opcode kernel table.

`evaluate(module, args)` runs the entry computation on numpy values (arrays, tuples of values,
`TOKEN`) and returns the root's value. Each computation is compiled once per evaluation into a plan
(kernel, instruction, operand slots, slots to release) that calls, while loops and conditionals reuse.
Instructions run in program order; a value is released right after its last use, so memory holds only
live values. One fusion: a `pad` read only by a `dynamic-slice` is not evaluated, the slice reads its
window from the pad's operand (`_windows_of_pads`; the hooks see the dynamic-slice only). Values are
immutable: kernels never write into their operands, and a result may alias an operand (a view). Kernels run under `np.errstate(all="ignore")`: HLO arithmetic has no traps.

The same interpreter runs the unpartitioned program on one device and each partition of an SPMD
program; collectives go through `ctx.backend` (a `CollectiveBackend`), `partition-id` reads
`ctx.partition_id`.

`rounding` chooses where bf16 results are rounded (`rounding.py`): `"xla"`, the default, as XLA's
CPU backend with its default flags, or `"per-op"`, every result rounded to its type.
"""
from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Sequence

import numpy as np

from gspmdc.errors import GspmdcError, RuntimeFailure, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from .collectives import CollectiveBackend, SinglePartitionBackend
from .kernels import KERNELS, TOKEN, Token
from .kernels.indexing import dynamic_slice_of_pad
from .live_arrays import LiveArrays
from .rounding import DEFAULT_ROUNDING, check_rounding, round_to_bf16, unrounded, unrounded_readers


def evaluate(module: Module, args: Sequence[Any], *, backend: CollectiveBackend | None = None,
             partition_id: int | None = None, on_step: StepHook | None = None,
             on_enter: EnterHook | None = None, on_value: ValueHook | None = None,
             live_arrays: LiveArrays | None = None, rounding: str = DEFAULT_ROUNDING) -> Any:
    """Evaluate the entry computation of `module` on `args` (one value per entry parameter, in
    parameter-number order) and return the root's value. An array argument may be an ndarray
    subclass (a memory map of an input file): it is taken as a plain ndarray view, the only kind
    of array value kernels see and must return.

    `backend` performs collectives (default: a `SinglePartitionBackend`); `partition_id`, when
    given, must equal the backend's. `on_step`, when given, is called after every instruction (in
    every computation) with the instruction and its *exclusive* wall time in seconds: the time of
    its kernel minus that of the instructions evaluated inside it (while bodies, calls, ...), so
    the times add up without double counting (the profiling hook of `gspmdc run --profile`).
    `on_enter`, when given, is called with every instruction right before its kernel runs (the
    innermost instruction executing is the last one entered: how MPI ranks record where they are).
    `on_value`, when given, is called with every instruction and its value right after it ran,
    and with every parameter when its computation starts (in every computation, every time it
    runs; `gspmdc bisect` compares values this way).
    `live_arrays`, when given, holds every value from its definition to its last use (the entry
    arguments for the whole evaluation) and so measures the peak of live arrays
    (`runtime/live_arrays.py`). `rounding` is `"xla"` or `"per-op"` (see `rounding.py`).

    Raises GspmdcError for arguments that do not match the entry parameters, UnsupportedError for
    opcodes the interpreter does not implement (and for modules of several replicas), and
    RuntimeFailure (naming the computation and instruction) when a kernel fails.
    """
    if module.attrs.get("replica_count", 1) != 1:
        raise UnsupportedError(f"module {module.name} has replica_count="
                               f"{module.attrs['replica_count']}; the interpreter runs one replica")
    check_rounding(rounding)
    backend = SinglePartitionBackend() if backend is None else backend
    if partition_id is not None and partition_id != backend.partition_id():
        raise GspmdcError(f"partition_id {partition_id} does not match the backend's partition "
                          f"{backend.partition_id()} (of {backend.num_partitions})")
    entry = module.entry
    values = _check_entry_arguments(entry, args)
    ctx = EvalContext(module, backend, on_step, on_enter, on_value, live_arrays, rounding)
    if live_arrays is None:
        return ctx.call(entry.name, values)
    live_arrays.hold(tuple(values))
    try:
        return ctx.call(entry.name, values)
    finally:
        live_arrays.drop(tuple(values))


class EvalContext:
    """What a kernel may use besides its operands.

    - `module`, `backend`, `partition_id` (this partition's id, an int);
    - `call(name, args)`: evaluate a computation of the module on argument values;
    - `cache`: a per-evaluation dict where kernel modules memoise analyses of computations (key
      tuples start with a tag naming the owner, e.g. `("scalar-plan", name)`);
    - `on_step`, `on_enter`, `on_value`, `live_arrays`: the optional hooks (see `evaluate`);
    - `rounding`: where bf16 results are rounded (see `evaluate`).
    """

    __slots__ = ("module", "backend", "partition_id", "cache", "on_step", "on_enter", "on_value",
                 "live_arrays", "rounding", "_plans", "_nested")

    def __init__(self, module: Module, backend: CollectiveBackend,
                 on_step: StepHook | None = None, on_enter: EnterHook | None = None,
                 on_value: ValueHook | None = None, live_arrays: LiveArrays | None = None,
                 rounding: str = DEFAULT_ROUNDING):
        self.module = module
        self.backend = backend
        self.partition_id = backend.partition_id()
        self.cache: dict[tuple, Any] = {}
        self.on_step = on_step
        self.on_enter = on_enter
        self.on_value = on_value
        self.live_arrays = live_arrays
        self.rounding = rounding
        self._plans: dict[str, _Plan] = {}
        self._nested = 0.0

    def call(self, computation_name: str, args: Sequence[Any]) -> Any:
        """Evaluate computation `computation_name` with `args` bound to its parameters."""
        plan = self._plans.get(computation_name)
        if plan is None:
            plan = self._plans[computation_name] = _Plan(self.module.computation(computation_name),
                                                         self.rounding)
        return plan.run(self, args)

    def timed(self, kernel: Kernel, inst: Instruction, args: list) -> Any:
        """Run `kernel` and report its exclusive time to `on_step` (time spent in instructions
        evaluated inside it is reported by those and subtracted here)."""
        outer, self._nested = self._nested, 0.0
        start = perf_counter()
        try:
            value = kernel(inst, args, self)
        finally:
            elapsed = perf_counter() - start
            inner, self._nested = self._nested, outer + elapsed
        self.on_step(inst, elapsed - inner)
        return value


Kernel = Callable[[Instruction, list, EvalContext], Any]
StepHook = Callable[[Instruction, float], None]
EnterHook = Callable[[Instruction], None]
ValueHook = Callable[[Instruction, Any], None]


class _Plan:
    """A computation compiled for repeated evaluation.

    Slot `i` holds the value of instruction `i` (program order). `steps` are tuples
    `(kernel, inst, operand_slots, out_slot, release_slots, dims, dtype)` where `dims`/`dtype` give
    the expected array result (None for tuple and token results, checked structurally). Under
    `"xla"` rounding an instruction whose f32 value some users read (`rounding.py`) computes it
    into an extra slot (numbered after the instructions'), which those users read; a second step
    rounds it into the instruction's own slot when other users or the root need it.
    """

    __slots__ = ("computation", "num_slots", "param_slots", "root_slot", "steps")

    def __init__(self, comp: Computation, rounding: str = DEFAULT_ROUNDING):
        self.computation = comp
        slot = {inst: i for i, inst in enumerate(comp.instructions)}
        readers = unrounded_readers(comp) if rounding == "xla" else {}
        wide = {inst: len(comp.instructions) + k for k, inst in enumerate(readers)}
        self.num_slots = len(comp.instructions) + len(wide)
        self.param_slots = [slot[p] for p in comp.parameters]
        self.root_slot = slot[comp.root]
        fused = _windows_of_pads(comp)
        reads = {inst: tuple(wide[op] if inst in readers.get(op, ()) else slot[op] for op in
                             (inst.operands[0].operands + inst.operands[1:]
                              if inst in fused.values() else inst.operands))
                 for inst in comp.instructions}
        users = comp.users() if wide else {}
        rounded = {inst for inst in wide if inst is comp.root or any(
            slot[inst] in reads[user] for user in users[inst])}
        last_use = {s: s for s in range(len(comp.instructions))}
        for i, inst in enumerate(comp.instructions):
            for s in reads[inst] + ((wide[inst],) if inst in rounded else ()):
                last_use[s] = i
        last_use[self.root_slot] = self.num_slots
        releases: dict[int, list[int]] = {}
        for s, at in last_use.items():
            releases.setdefault(at, []).append(s)
        steps = []
        for i, inst in enumerate(comp.instructions):
            if inst.opcode == "parameter" or inst in fused:
                continue
            kernel = dynamic_slice_of_pad if inst in fused.values() else KERNELS.get(inst.opcode)
            if kernel is None:
                raise UnsupportedError(f"opcode {inst.opcode} is not supported by the interpreter "
                                       f"(instruction {inst.name} in computation {comp.name})")
            shape = inst.shape
            array = isinstance(shape, ArrayShape) and not shape.is_token
            dims = shape.dims if array else None
            dtype = dtypes.numpy_dtype(shape.element_type) if array else None
            release = tuple(s for s in releases.get(i, ()) if s != self.root_slot)
            if inst in wide:
                steps.append((unrounded(kernel, inst), inst, reads[inst], wide[inst],
                              () if inst in rounded else release, dims, np.dtype(np.float32)))
                if inst not in rounded:
                    continue
                kernel, reads[inst] = round_to_bf16, (wide[inst],)
            steps.append((kernel, inst, reads[inst], i, release, dims, dtype))
        self.steps = steps

    def run(self, ctx: EvalContext, args: Sequence[Any]) -> Any:
        comp = self.computation
        if len(args) != len(self.param_slots):
            raise RuntimeFailure(f"computation {comp.name} called with {len(args)} arguments, "
                                 f"it has {len(self.param_slots)} parameters")
        values: list[Any] = [None] * self.num_slots
        for s, value in zip(self.param_slots, args):
            values[s] = value
        timed = ctx.on_step is not None
        enter, on_value, live = ctx.on_enter, ctx.on_value, ctx.live_arrays
        if live is not None:
            live.hold(tuple(args))
        if on_value is not None:
            for param, value in zip(comp.parameters, args):
                on_value(param, value)
        with np.errstate(all="ignore"):
            for kernel, inst, operand_slots, out, release, dims, dtype in self.steps:
                if enter is not None:
                    enter(inst)
                try:
                    if timed:
                        value = ctx.timed(kernel, inst, [values[s] for s in operand_slots])
                    else:
                        value = kernel(inst, [values[s] for s in operand_slots], ctx)
                except GspmdcError:
                    raise
                except Exception as e:
                    raise RuntimeFailure(f"{comp.name}/{inst.name}: {inst.opcode} failed: "
                                         f"{type(e).__name__}: {e}") from e
                if dims is not None:
                    if type(value) is not np.ndarray:
                        value = _as_array(value, comp, inst)
                    if value.shape != dims or value.dtype != dtype:
                        _raise_mismatch(value, comp, inst)
                elif _difference(value, inst.shape) is not None:
                    _raise_mismatch(value, comp, inst)
                values[out] = value
                if on_value is not None:
                    on_value(inst, value)
                if live is not None:
                    live.hold(value)
                    for s in release:
                        live.drop(values[s])
                for s in release:
                    values[s] = None
        if live is not None:
            for value in values:
                live.drop(value)
        return values[self.root_slot]


def _windows_of_pads(comp: Computation) -> dict[Instruction, Instruction]:
    """The fusion of `_Plan`: `{pad: dynamic-slice}` for every pad (no interior padding, not the
    root) whose only user is a dynamic-slice of it. The pad is not evaluated; the dynamic-slice
    reads its window from the pad's operand (`dynamic_slice_of_pad`), so the padded array, which
    the partitioner's replicated-to-tiled reshards of uneven dimensions make whole on every
    partition, never exists."""
    users = comp.users()
    return {inst: users[inst][0] for inst in comp.instructions
            if inst.opcode == "pad" and inst is not comp.root and len(users[inst]) == 1
            and users[inst][0].opcode == "dynamic-slice" and users[inst][0].operands[0] is inst
            and inst not in users[inst][0].operands[1:]
            and all(p.interior == 0 for p in inst.attrs["padding"])}


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
