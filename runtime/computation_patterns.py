"""Applying the small scalar computations of reduce, sort, scatter, map and collectives to arrays.

HLO hands these ops a computation on scalars (`to_apply`, `select`, `scatter`, a comparator).
Calling it per element would be hopeless in Python, so:

- `reducer_ufunc` recognises a reducer that is exactly `add/multiply/maximum/minimum/and/or/xor` of
  its two parameters and returns the numpy ufunc;
- `comparator_keys` recognises a sort comparator that is a lexicographic chain of `LT`/`GT`
  comparisons of operand pairs (with `EQ`/`NE` tie-breaks, any comparison type);
- `apply_scalar_computation` evaluates any scalar computation *vectorised*: each parameter is bound to
  an array (all broadcastable to one shape) and the computation's elementwise kernels run once on
  whole arrays; shape-only ops on scalars (`broadcast`, `reshape`, ...) pass values through;
- `apply_binary_computation` combines two arrays with a binary computation (ufunc when recognised);
- `accumulate_at` combines updates into an array at indices, in order, duplicates included.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from gspmdc.errors import UnsupportedError
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape, compatible

_REDUCER_UFUNCS = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}
#: ops that change only the shape, so on scalars they pass the (batched) value through
_PASS_THROUGH = frozenset({"broadcast", "reshape", "copy", "bitcast", "transpose",
                           "optimization-barrier"})
#: ops that call a computation with their operands (evaluated vectorised too)
_CALLS = {"call": "to_apply", "fusion": "calls"}
#: other ops whose kernels are shape-agnostic
_SHAPE_AGNOSTIC = frozenset({"constant", "tuple", "get-tuple-element", "convert", "bitcast-convert",
                             "partition-id", "replica-id"})


def reducer_ufunc(computation: Computation) -> np.ufunc | None:
    """The numpy ufunc equal to `computation` when its root is one of add, multiply, maximum,
    minimum, and, or, xor applied to its two (scalar) parameters, else None."""
    params = computation.parameters
    root = computation.root
    ufunc = _REDUCER_UFUNCS.get(root.opcode)
    if ufunc is None or len(params) != 2 or len(root.operands) != 2:
        return None
    if {id(op) for op in root.operands} != {id(p) for p in params}:
        return None
    if any(not _is_scalar(p.shape) or not compatible(p.shape, root.shape) for p in params):
        return None
    return ufunc


@dataclass(frozen=True)
class SortKey:
    """One key of a lexicographic comparator: operand `operand`, descending (`GT`) or ascending
    (`LT`), compared as TOTALORDER or with the type's default order."""

    operand: int
    descending: bool
    total_order: bool


def comparator_keys(computation: Computation) -> tuple[SortKey, ...] | None:
    """The keys of a comparator of the form `less_0 or (eq_0 and (less_1 or ...))` (also written
    with `select(eq_i, rest, less_i)` or `select(ne_i, less_i, rest)`), where `less_i` is an `LT` or
    `GT` comparison of parameters `2i` and `2i+1` (either order) and `eq_i`/`ne_i` compares the same
    pair. None when the comparator has another form."""
    numbers = {id(p): p.parameter_number for p in computation.parameters}
    keys = _chain(computation.root, numbers)
    return None if keys is None else tuple(keys)


def _pair(inst: Instruction, numbers: dict[int, int]) -> tuple[int, bool] | None:
    """(operand index, lhs-first) when `inst` compares the two parameters of one operand."""
    if inst.opcode != "compare":
        return None
    a, b = (numbers.get(id(op)) for op in inst.operands)
    if a is None or b is None or a // 2 != b // 2 or a == b:
        return None
    shape = inst.operands[0].shape
    if not isinstance(shape, ArrayShape) or shape.element_type in ("c64", "c128"):
        return None
    return a // 2, a % 2 == 0


def _less(inst: Instruction, numbers) -> SortKey | None:
    pair = _pair(inst, numbers)
    direction = str(inst.attrs.get("direction"))
    if pair is None or direction not in ("LT", "GT"):
        return None
    operand, lhs_first = pair
    return SortKey(operand, (direction == "GT") == lhs_first,
                   inst.attrs.get("type") == "TOTALORDER")


def _equal(inst: Instruction, numbers, direction: str) -> tuple[int, bool] | None:
    pair = _pair(inst, numbers)
    if pair is None or str(inst.attrs.get("direction")) != direction:
        return None
    return pair[0], inst.attrs.get("type") == "TOTALORDER"


def _chain(inst: Instruction, numbers) -> list[SortKey] | None:
    key = _less(inst, numbers)
    if key is not None:
        return [key]
    if inst.opcode == "or":
        for first, second in (inst.operands, reversed(inst.operands)):
            key = _less(first, numbers)
            if key is None or second.opcode != "and":
                continue
            for tie, rest in (second.operands, list(reversed(second.operands))):
                if _equal(tie, numbers, "EQ") == (key.operand, key.total_order):
                    tail = _chain(rest, numbers)
                    if tail is not None:
                        return [key] + tail
        return None
    if inst.opcode == "select":
        condition, on_true, on_false = inst.operands
        for direction, key_side, rest_side in (("EQ", on_false, on_true), ("NE", on_true, on_false)):
            tie = _equal(condition, numbers, direction)
            key = _less(key_side, numbers)
            if tie is not None and key is not None and tie == (key.operand, key.total_order):
                tail = _chain(rest_side, numbers)
                if tail is not None:
                    return [key] + tail
    return None


# ---------------------------------------------------------------------- vectorised evaluation

def apply_scalar_computation(ctx, computation_name: str, args: Sequence[np.ndarray]) -> Any:
    """Evaluate the scalar computation `computation_name` elementwise over arrays.

    `args[i]` holds the values of parameter i (arrays broadcastable to one shape S, of the
    parameter's element type). Returns the root's value with every array broadcast to S (a tuple
    for tuple-shaped roots). Raises UnsupportedError for computations with non-scalar shapes or ops
    that are not elementwise (loops, reductions, ...)."""
    plan = ctx.cache.get(("scalar-plan", computation_name))
    if plan is None:
        plan = ctx.cache[("scalar-plan", computation_name)] = _scalar_plan(
            ctx.module.computation(computation_name))
    num_slots, param_slots, root_slot, steps = plan
    values: list[Any] = [None] * num_slots
    for s, value in zip(param_slots, args):
        values[s] = value
    for fn, inst, operand_slots, out in steps:
        values[out] = fn(inst, [values[s] for s in operand_slots], ctx)
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    return _broadcast_leaves(values[root_slot], shape)


def apply_binary_computation(ctx, computation_name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`computation(a, b)` elementwise for a binary scalar computation (a combiner or reducer),
    broadcast to the common shape of `a` and `b`."""
    ufunc = ctx.cache.get(("reducer-ufunc", computation_name), False)
    if ufunc is False:
        ufunc = ctx.cache[("reducer-ufunc", computation_name)] = reducer_ufunc(
            ctx.module.computation(computation_name))
    if ufunc is not None:
        return np.asarray(ufunc(a, b))
    return apply_scalar_computation(ctx, computation_name, [a, b])


def accumulate_at(ctx, computation_name: str, target: np.ndarray, indices: np.ndarray,
                  updates: np.ndarray) -> np.ndarray:
    """A copy of the flat array `target` where, for each k in order, `target[indices[k]]` becomes
    `computation(target[indices[k]], updates[k])` (repeated indices combine in order)."""
    out = target.copy()
    if indices.size == 0:
        return out
    order = np.argsort(indices, kind="stable")
    indices, updates = indices[order], updates[order]
    starts = np.r_[True, indices[1:] != indices[:-1]]
    rank = np.arange(indices.size) - np.maximum.accumulate(np.where(starts, np.arange(indices.size), 0))
    for r in range(int(rank.max()) + 1):
        chosen = rank == r
        where = indices[chosen]
        out[where] = apply_binary_computation(ctx, computation_name, out[where], updates[chosen])
    return out


def _scalar_plan(comp: Computation):
    # imported here: kernel modules import this module while the kernel table loads
    from .kernels import KERNELS
    from .kernels.elementwise import ELEMENTWISE_OPCODES
    slot = {id(inst): i for i, inst in enumerate(comp.instructions)}
    steps = []
    for i, inst in enumerate(comp.instructions):
        if not _is_scalar(inst.shape):
            raise UnsupportedError(f"computation {comp.name} cannot be applied elementwise: "
                                   f"{inst.name} has the non-scalar shape {inst.shape}")
        if inst.opcode == "parameter":
            continue
        if inst.opcode in _PASS_THROUGH:
            fn = _pass_through
        elif inst.opcode in _CALLS:
            fn = _call_vectorised
        elif inst.opcode in ELEMENTWISE_OPCODES or inst.opcode in _SHAPE_AGNOSTIC:
            fn = KERNELS[inst.opcode]
        else:
            raise UnsupportedError(f"computation {comp.name} cannot be applied elementwise: "
                                   f"it contains {inst.opcode} ({inst.name})")
        steps.append((fn, inst, [slot[id(op)] for op in inst.operands], i))
    params = comp.parameters
    return len(comp.instructions), [slot[id(p)] for p in params], slot[id(comp.root)], steps


def _pass_through(inst, args, ctx):
    return args[0]


def _call_vectorised(inst, args, ctx):
    return apply_scalar_computation(ctx, inst.attrs[_CALLS[inst.opcode]].name, args)


def _is_scalar(shape: Shape) -> bool:
    if isinstance(shape, TupleShape):
        return all(_is_scalar(e) for e in shape.elements)
    return not shape.dims


def _broadcast_leaves(value: Any, shape: tuple[int, ...]) -> Any:
    if isinstance(value, tuple):
        return tuple(_broadcast_leaves(v, shape) for v in value)
    value = np.asarray(value)
    return value if value.shape == shape else np.broadcast_to(value, shape)
