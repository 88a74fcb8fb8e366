"""Peak memory of a program on one device, from the liveness of its values.

The model (what `gspmdc cost` reports as peak memory per device; run on a partitioned module, the
shapes are per device):

- Every array an instruction produces is a *buffer* of its shape's bytes, live from the
  instruction that defines it to the last instruction that uses a value holding it, in program
  order. A value that only refers to other values' arrays defines no buffer: `tuple`,
  `get-tuple-element`, and the operand-preserving `copy`, `opt-barrier`,
  `add-dependency` and `domain` (copies nothing writes to are elided, as XLA elides them), and
  the annotation custom-calls (`LayoutConstraint`, `Sharding`, barriers, placement; manual-region
  boundaries that keep the shape), whose result is their operand.
  A `pad` whose only user is a `dynamic-slice` of it is fused into the slice (the padded array
  never exists; XLA fuses the pair as well).
- The entry's parameters are live for the whole program; its result until the end.
- A called computation (`call`, `fusion`, branches of a `conditional`, the condition and body of
  a `while`) runs while the caller's operands are live: its own peak adds to what the caller
  holds at that instruction (for a conditional, the largest branch). Its parameters are the
  caller's buffers; its result becomes the caller's.
- A `while` loop's state: its operand stays live for the whole loop. From the second iteration
  on, the body's parameter holds the state the previous iteration made: every element the body
  computes anew (an element it passes through unchanged is still the operand's buffer) is live
  from the start of the body (and of the condition) until its last use there.
- A `conditional`'s result is a new buffer; a `call`'s result element that is one of its
  parameters is the caller's operand; a `while`'s result element the body passes through is its
  operand's.

Instructions run in the order the interpreter runs them (`gspmdc.ir.schedule`: of program
order and a free-first list schedule the one with the lower peak, then each collective issued
early as far as that peak allows, so a collective's result is live from its issue), and
`peak_bytes` is the largest sum of live buffers at any instruction, inside called computations
included. The interpreter measures the same quantity (`gspmdc run --profile`'s peak of live
arrays), so the two agree to within what the program's own tuples and copies share.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Union

from . import dtypes
from .module import Computation, Instruction, Module
from .schedule import (OPERAND_PRESERVING, execution_order, fused_pads, is_identity_call,
                       ordered_computations)
from .shapes import ArrayShape, Shape, TupleShape

#: a value as buffers: a buffer id, None (a token), or a tuple of values
Value = Union[int, None, tuple]


@dataclass(frozen=True)
class MemoryPoint:
    """One instruction of the entry computation: the bytes live once it has run
    (`after_bytes`) and the most live while it ran (`peak_bytes`, called computations
    included)."""

    name: str
    opcode: str
    after_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class MemoryProfile:
    """Memory of one device running the program (see the module docstring).

    `peak_bytes`: the most bytes live at once; `peak_at`: where (`computation/instruction`,
    innermost); `parameter_bytes` / `output_bytes`: the entry's parameters and result;
    `peak_parameter_bytes`, `peak_output_bytes`, `peak_loop_state_bytes`,
    `peak_temporary_bytes`: what is live at the peak (entry parameters; buffers of the entry's
    result; loop state: operands and carried state of the while loops running at the peak;
    everything else), which add up to `peak_bytes`; `timeline`: the entry's instructions."""

    peak_bytes: int
    peak_at: str
    parameter_bytes: int
    output_bytes: int
    peak_parameter_bytes: int
    peak_output_bytes: int
    peak_loop_state_bytes: int
    peak_temporary_bytes: int
    timeline: tuple[MemoryPoint, ...]


def memory_profile(module: Module) -> MemoryProfile:
    """The memory profile of `module`'s entry computation on one device."""
    analysis = _Analysis(module)
    entry = module.entry
    result = analysis.run(entry, counted=None, record=True)
    parameter_bytes = sum(shape_bytes(p.shape) for p in entry.parameters)
    return MemoryProfile(
        peak_bytes=result.peak, peak_at=result.peak_at, parameter_bytes=parameter_bytes,
        output_bytes=shape_bytes(entry.root.shape),
        peak_parameter_bytes=result.breakdown["parameter"],
        peak_output_bytes=result.breakdown["output"],
        peak_loop_state_bytes=result.breakdown["loop state"],
        peak_temporary_bytes=result.breakdown["temporary"],
        timeline=tuple(result.timeline))


def shape_bytes(shape: Shape) -> int:
    """Bytes of every array of `shape` (tokens have none)."""
    return sum(prod(leaf.dims) * dtypes.byte_width(leaf.element_type) for leaf in shape.leaves())


@dataclass
class _Result:
    """The peak of one run of a computation: bytes, where, and (for the recorded run) what
    was live at the peak by kind, and the entry's timeline."""

    peak: int
    peak_at: str
    breakdown: dict[str, int]
    timeline: list[MemoryPoint]


_KINDS = ("parameter", "output", "loop state", "temporary")


class _Analysis:
    """The liveness analysis of one module; `run` analyses one run of a computation.

    Buffers are numbered per run; `counted` says which parameter leaves count (None: all, as
    for the entry; otherwise a set of `(parameter number, leaf index)`): a parameter leaf the
    caller already holds is free inside the callee."""

    def __init__(self, module: Module):
        self.module = module
        self._passthrough: dict[str, list[tuple[int, int] | None]] = {}
        self._peaks: dict[tuple, _Result] = {}
        self._ordered = ordered_computations(module)

    # -- which result elements of a computation are its parameters' -------------------------

    def passthrough(self, name: str) -> list[tuple[int, int] | None]:
        """For each leaf of computation `name`'s result: the `(parameter number, leaf index)`
        it is, or None when the computation makes it."""
        found = self._passthrough.get(name)
        if found is None:
            comp = self.module.computation(name)
            values: dict[Instruction, Value] = {}
            origin: dict[int, tuple[int, int]] = {}
            counter = iter(range(1 << 62))
            for inst in comp.instructions:
                if inst.opcode == "parameter":
                    values[inst] = _fresh(inst.shape, counter)
                    for k, leaf in enumerate(_leaves(values[inst])):
                        origin[leaf] = (inst.parameter_number, k)
                else:
                    values[inst] = self._value(inst, values, counter)
            found = [origin.get(leaf) for leaf in _leaves(values[comp.root])]
            self._passthrough[name] = found
        return found

    def _value(self, inst: Instruction, values: dict[Instruction, Value], counter) -> Value:
        """The buffers of `inst`'s value: its operands' for the aliasing instructions, new ones
        (numbers from `counter`) otherwise."""
        opcode = inst.opcode
        if opcode == "tuple":
            return tuple(values.get(o) for o in inst.operands)
        if opcode == "get-tuple-element":
            operand = values.get(inst.operands[0])
            return operand[inst.attr("index")] if isinstance(operand, tuple) else None
        if opcode in OPERAND_PRESERVING:
            return values.get(inst.operands[0])
        if opcode == "custom-call" and is_identity_call(inst):
            if isinstance(inst.shape, TupleShape) and not inst.shape.elements:
                return ()
            if len(inst.operands) == 1:
                return values.get(inst.operands[0])
            return tuple(values.get(o) for o in inst.operands)
        if opcode in ("call", "fusion", "while"):
            callee = inst.attr("body" if opcode == "while" else
                               "to_apply" if opcode == "call" else "calls").name
            through = self.passthrough(callee)
            params = [_leaves(values.get(o)) for o in inst.operands]
            fresh = _fresh(inst.shape, counter)
            leaves = []
            for k, (leaf, source) in enumerate(zip(_leaves(fresh), through)):
                if source is not None and (opcode != "while" or source == (0, k)):
                    leaves.append(params[source[0]][source[1]])
                else:
                    leaves.append(leaf)
            return _rebuild(fresh, iter(leaves))
        return _fresh(inst.shape, counter)

    # -- the peak of one run -------------------------------------------------------------

    def run(self, comp: Computation, counted: frozenset | None, record: bool = False) -> _Result:
        key = (comp.name, counted)
        if not record and key in self._peaks:
            return self._peaks[key]
        fused = fused_pads(comp)
        instructions = comp.parameters + execution_order(comp, self._ordered)
        last = len(instructions)
        counter = iter(range(1 << 62))
        values: dict[Instruction, Value] = {}
        size: dict[int, int] = {}
        kind: dict[int, str] = {}
        defined: dict[int, int] = {}
        for i, inst in enumerate(instructions):
            if inst.opcode == "parameter":
                value = values[inst] = _fresh(inst.shape, counter)
                for k, (leaf, shape) in enumerate(zip(_leaves(value), _arrays(inst.shape))):
                    is_counted = counted is None or (inst.parameter_number, k) in counted
                    size[leaf] = _bytes(shape) if is_counted else 0
                    kind[leaf] = "parameter" if counted is None else "loop state"
                    defined[leaf] = -1
                continue
            value = values[inst] = self._value(inst, values, counter)
            for leaf, shape in zip(_leaves(value), _arrays(inst.shape)):
                if leaf not in defined:
                    defined[leaf] = i
                    kind[leaf] = "temporary"
                    size[leaf] = _bytes(shape)
        end = dict(defined)
        for i, inst in enumerate(instructions):
            operands = inst.operands
            if operands and operands[0] in fused:
                operands = list(operands[0].operands) + list(operands[1:])
            for operand in operands:
                for leaf in _leaves(values.get(operand)):
                    end[leaf] = max(end[leaf], i)
        for leaf in _leaves(values[comp.root]):
            end[leaf] = last
            if record and kind[leaf] == "temporary":
                kind[leaf] = "output"
        if counted is None:                     # the entry's parameters live throughout
            for leaf, at in defined.items():
                if at == -1:
                    end[leaf] = last
        starting: dict[int, list[int]] = {}
        ending: dict[int, list[int]] = {}
        for leaf, at in defined.items():
            starting.setdefault(at, []).append(leaf)
            ending.setdefault(end[leaf], []).append(leaf)
        live = set(starting.get(-1, ()))
        held = sum(size[leaf] for leaf in live)
        best = _Result(held, f"{comp.name}/(parameters)", _breakdown(live, size, kind), [])
        timeline: list[MemoryPoint] = []
        for i, inst in enumerate(instructions):
            if inst.opcode == "parameter":
                continue
            nested = self._nested(inst)
            during = held + (nested.peak if nested is not None else 0)
            if nested is not None and during > best.peak:
                state = set(_leaves(values.get(inst.operands[0]))) \
                    if inst.opcode == "while" else set()
                outer = _breakdown(live, size, kind, state)
                best = _Result(during, nested.peak_at, _merge(outer, nested.breakdown), [])
            live.update(starting.get(i, ()))
            held += sum(size[leaf] for leaf in starting.get(i, ()))
            if held > best.peak:
                best = _Result(held, f"{comp.name}/{inst.name}", _breakdown(live, size, kind), [])
            peak_here = max(during, held)
            for leaf in ending.get(i, ()):
                if leaf in live:
                    live.discard(leaf)
                    held -= size[leaf]
            if record:
                timeline.append(MemoryPoint(inst.name, inst.opcode, held, peak_here))
        best.timeline = timeline
        if not record:
            self._peaks[key] = best
        return best

    def _nested(self, inst: Instruction) -> _Result | None:
        """The peak of the computations `inst` runs, beyond what the caller holds."""
        opcode = inst.opcode
        computation = self.module.computation
        if opcode in ("call", "fusion", "call-start"):
            name = inst.attr("calls" if opcode == "fusion" else "to_apply").name
            return self.run(computation(name), frozenset())
        if opcode == "conditional":
            return max((self.run(computation(name), frozenset())
                        for name in inst.branch_computation_names()),
                       key=lambda r: r.peak)
        if opcode == "while":
            body = computation(inst.attr("body").name)
            condition = computation(inst.attr("condition").name)
            carried = frozenset((0, k) for k, source in enumerate(self.passthrough(body.name))
                                if source != (0, k))
            runs = [self.run(c, frozenset()) for c in (condition, body)] + \
                [self.run(c, carried) for c in (condition, body)]
            return max(runs, key=lambda r: r.peak)
        return None


def _breakdown(live, size: dict[int, int], kind: dict[int, str],
               loop_state=frozenset()) -> dict[str, int]:
    """Bytes of the `live` buffers by kind; those in `loop_state` (a running loop's operand)
    count as loop state unless they are entry parameters."""
    totals = dict.fromkeys(_KINDS, 0)
    for leaf in live:
        name = kind[leaf]
        if leaf in loop_state and name == "temporary":
            name = "loop state"
        totals[name] += size[leaf]
    return totals


def _merge(outer: dict[str, int], inner: dict[str, int]) -> dict[str, int]:
    """What the caller holds plus what a called computation holds at its peak (a callee's own
    buffers are temporaries or loop state, never the entry's parameters or result)."""
    totals = dict(outer)
    for name, count in inner.items():
        target = name if name in ("loop state", "temporary") else "temporary"
        totals[target] = totals.get(target, 0) + count
    return totals


def _arrays(shape: Shape) -> list[ArrayShape]:
    """The array leaves of `shape` (tokens have no buffer)."""
    return [leaf for leaf in shape.leaves() if not leaf.is_token]


def _bytes(shape: ArrayShape) -> int:
    return prod(shape.dims) * dtypes.byte_width(shape.element_type)


def _fresh(shape: Shape, counter) -> Value:
    if isinstance(shape, TupleShape):
        return tuple(_fresh(s, counter) for s in shape.elements)
    return None if shape.is_token else next(counter)


def _leaves(value: Value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, tuple):
        return [leaf for element in value for leaf in _leaves(element)]
    return [value]


def _rebuild(template: Value, leaves) -> Value:
    if isinstance(template, tuple):
        return tuple(_rebuild(t, leaves) for t in template)
    return None if template is None else next(leaves)


__all__ = ["MemoryProfile", "MemoryPoint", "memory_profile", "shape_bytes",
           "OPERAND_PRESERVING"]
