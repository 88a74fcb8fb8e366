"""Applying the small scalar computations of reduce, sort, scatter, map and collectives to arrays.

HLO hands these ops a computation on scalars (`to_apply`, `select`, `scatter`, a comparator).
Calling it per element would be hopeless in Python, so:

- `reducer_ufunc` recognises a reducer that is exactly `add/multiply/maximum/minimum/and/or/xor` of
  its two parameters and returns the numpy ufunc;
- `comparator_keys` recognises a sort comparator that is a lexicographic chain of `LT`/`GT`
  comparisons of per-element key expressions (with `EQ`/`NE` tie-breaks, any comparison type);
  `sort_key_values` evaluates such a key over whole operands;
- `apply_scalar_computation` evaluates any scalar computation *vectorised*: each parameter is bound to
  an array (all broadcastable to one shape) and the computation's elementwise kernels run once on
  whole arrays; shape-only ops on scalars (`broadcast`, `reshape`, ...) pass values through;
- `apply_binary_computation` combines two arrays with a binary computation (ufunc when recognised);
- `accumulate_at` combines updates into an array at indices (in place, in order, duplicates
  included).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from gspmdc.errors import UnsupportedError
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.ops import CATALOGUE, ELEMENTWISE_PURE, opcodes
from gspmdc.ir.shapes import Shape, TupleShape, compatible

_REDUCER_UFUNCS = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}
#: ops that change only the shape, so on scalars they pass the (batched) value through
_PASS_THROUGH = opcodes("broadcast", "reshape", "copy", "bitcast", "transpose", "opt-barrier")
#: ops that call a computation with their operands (evaluated vectorised too)
_CALLS = {op: CATALOGUE[op].calls[0] for op in opcodes("call", "fusion")}
#: ops besides the catalogue's `ELEMENTWISE_PURE` whose kernels are shape-agnostic
_SHAPE_AGNOSTIC = opcodes("constant", "tuple", "get-tuple-element", "partition-id", "replica-id")


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


@dataclass(frozen=True, eq=False)
class SortKey:
    """One key of a lexicographic comparator: the comparator orders elements by the values of
    `expression`, an instruction of the comparator that reads only left-hand parameters (parameter
    `2k` stands for an element of operand k), descending (`GT`) or ascending (`LT`), compared as
    TOTALORDER or with the type's default order."""

    expression: Instruction
    descending: bool
    total_order: bool


def comparator_keys(computation: Computation) -> tuple[SortKey, ...] | None:
    """The keys of a comparator that is a lexicographic chain `less_0 or (tie_0 and (less_1 or
    ...))` (also written `select(tie_i, rest, less_i)` or `select(not_tie_i, less_i, rest)`).

    `less_i` is `compare(g(a), g(b))` with direction LT or GT, where `g(a)` reads only left-hand
    parameters and `g(b)` is the same expression on the matching right-hand ones (parameters 2k+1),
    e.g. `a0 < b0`, or XLA's TopK comparator that orders floats through integer bit tricks.
    `tie_i` is `g(a) == g(b)` or `(a < b) == (b < a)` for the same `g` (`!=` for `not_tie_i`).
    None when the comparator has another form."""
    analysis = _ComparatorAnalysis(computation)
    keys = analysis.chain(computation.root)
    return None if keys is None else tuple(keys)


#: attributes that do not change what an instruction computes
_NON_SEMANTIC_ATTRIBUTES = frozenset({"metadata", "frontend_attributes", "backend_config",
                                      "statistics", "control-predecessors"})


class _ComparatorAnalysis:
    """Structural matching of the expressions of one comparator computation."""

    def __init__(self, computation: Computation):
        numbers = [p.parameter_number for p in computation.parameters]
        self.mirror = {k: k + 1 for k in numbers if k % 2 == 0}
        self.identity = {k: k for k in numbers}
        self.memo: dict[tuple[int, int, int], bool] = {}

    def same(self, x: Instruction, y: Instruction, params: dict[int, int]) -> bool:
        """x and y compute the same function when x's parameter k is read as y's `params[k]`."""
        key = (id(x), id(y), id(params))
        if key not in self.memo:
            if x.opcode == "parameter":
                result = y.opcode == "parameter" and params.get(x.parameter_number) == y.parameter_number
            else:
                result = (x.opcode == y.opcode and compatible(x.shape, y.shape)
                          and _semantic_attributes(x) == _semantic_attributes(y)
                          and x.literal == y.literal and len(x.operands) == len(y.operands)
                          and all(self.same(a, b, params) for a, b in zip(x.operands, y.operands)))
            self.memo[key] = result
        return self.memo[key]

    def less(self, inst: Instruction) -> SortKey | None:
        """The key of `compare(g(a), g(b)), direction=LT|GT` (either operand order)."""
        if inst.opcode != "compare" or str(inst.attrs.get("direction")) not in ("LT", "GT"):
            return None
        x, y = inst.operands
        if x.shape.element_type in ("c64", "c128"):
            return None
        greater = str(inst.attrs.get("direction")) == "GT"
        total = inst.attrs.get("type") == "TOTALORDER"
        if self.same(x, y, self.mirror):
            return SortKey(x, greater, total)
        if self.same(y, x, self.mirror):
            return SortKey(y, not greater, total)
        return None

    def tie(self, inst: Instruction, key: SortKey, direction: str) -> bool:
        """`inst` is `g(a) == g(b)` for the key's g (`!=` with direction NE), written directly or
        as `(a < b) == (b < a)`."""
        if inst.opcode != "compare" or str(inst.attrs.get("direction")) != direction:
            return False
        x, y = inst.operands
        total = inst.attrs.get("type") == "TOTALORDER"
        for a, b in ((x, y), (y, x)):
            if (total == key.total_order and self.same(key.expression, a, self.identity)
                    and self.same(a, b, self.mirror)):
                return True
        first, second = self.less(x), self.less(y)
        return (first is not None and second is not None
                and first.descending != second.descending
                and first.total_order == second.total_order == key.total_order
                and self.same(key.expression, first.expression, self.identity)
                and self.same(key.expression, second.expression, self.identity))

    def chain(self, inst: Instruction) -> list[SortKey] | None:
        key = self.less(inst)
        if key is not None:
            return [key]
        if inst.opcode == "or":
            for first, second in (inst.operands, list(reversed(inst.operands))):
                key = self.less(first)
                if key is None or second.opcode != "and":
                    continue
                for tie, rest in (second.operands, list(reversed(second.operands))):
                    if self.tie(tie, key, "EQ"):
                        tail = self.chain(rest)
                        if tail is not None:
                            return [key] + tail
            return None
        if inst.opcode == "select":
            condition, on_true, on_false = inst.operands
            for direction, key_side, rest_side in (("EQ", on_false, on_true),
                                                   ("NE", on_true, on_false)):
                key = self.less(key_side)
                if key is not None and self.tie(condition, key, direction):
                    tail = self.chain(rest_side)
                    if tail is not None:
                        return [key] + tail
        return None


def _semantic_attributes(inst: Instruction) -> dict:
    return {k: v for k, v in inst.attrs.items() if k not in _NON_SEMANTIC_ATTRIBUTES}


def sort_key_values(ctx, computation_name: str, key: SortKey,
                    operands: Sequence[np.ndarray]) -> np.ndarray:
    """The values of `key.expression` for every element, parameter 2k bound to `operands[k]`."""
    expression = key.expression
    if expression.opcode == "parameter":
        return operands[expression.parameter_number // 2]
    cache_key = ("scalar-plan", computation_name, expression.name)
    plan = ctx.cache.get(cache_key)
    if plan is None:
        plan = ctx.cache[cache_key] = _scalar_plan(ctx.module.computation(computation_name),
                                                   expression)
    args = [operands[k // 2] if k % 2 == 0 else None for k in range(2 * len(operands))]
    value = _run_scalar_plan(ctx, plan, args)
    return np.broadcast_to(value, operands[0].shape)


# ---------------------------------------------------------------------- vectorised evaluation

def apply_scalar_computation(ctx, computation_name: str, args: Sequence[np.ndarray]) -> Any:
    """Evaluate the scalar computation `computation_name` elementwise over arrays.

    `args[i]` holds the values of parameter i (arrays broadcastable to one shape S, of the
    parameter's element type). Returns the root's value with every array broadcast to S (a tuple
    for tuple-shaped roots). Raises UnsupportedError for computations with non-scalar shapes or ops
    that are not elementwise (loops, reductions, ...)."""
    plan = ctx.cache.get(("scalar-plan", computation_name))
    if plan is None:
        comp = ctx.module.computation(computation_name)
        plan = ctx.cache[("scalar-plan", computation_name)] = _scalar_plan(comp, comp.root)
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    return _broadcast_leaves(_run_scalar_plan(ctx, plan, args), shape)


def apply_binary_computation(ctx, computation_name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`computation(a, b)` elementwise for a binary scalar computation (a combiner or reducer),
    broadcast to the common shape of `a` and `b`."""
    ufunc = reducer_ufunc_of(ctx, computation_name)
    if ufunc is not None:
        return np.asarray(ufunc(a, b))
    return apply_scalar_computation(ctx, computation_name, [a, b])


def reducer_ufunc_of(ctx, computation_name: str) -> np.ufunc | None:
    """`reducer_ufunc` of a computation of the evaluation's module, worked out once per
    evaluation context (kernels call it on every execution)."""
    ufunc = ctx.cache.get(("reducer-ufunc", computation_name), False)
    if ufunc is False:
        ufunc = ctx.cache[("reducer-ufunc", computation_name)] = reducer_ufunc(
            ctx.module.computation(computation_name))
    return ufunc


def accumulate_at(ctx, computation_name: str, target: np.ndarray, indices: np.ndarray,
                  updates: np.ndarray) -> None:
    """In place on the flat array `target`: for each k in order, `target[indices[k]]` becomes
    `computation(target[indices[k]], updates[k])` (repeated indices combine in order)."""
    if indices.size == 0:
        return
    ufunc = reducer_ufunc_of(ctx, computation_name)
    if ufunc is not None:
        ufunc.at(target, indices, updates)
        return
    order = np.argsort(indices, kind="stable")
    indices, updates = indices[order], updates[order]
    starts = np.r_[True, indices[1:] != indices[:-1]]
    position = np.arange(indices.size)
    rank = position - np.maximum.accumulate(np.where(starts, position, 0))
    for r in range(int(rank.max()) + 1):
        chosen = rank == r
        where = indices[chosen]
        target[where] = apply_binary_computation(ctx, computation_name, target[where],
                                                 updates[chosen])


def _scalar_plan(comp: Computation, target: Instruction):
    """Steps `(fn, inst, operand slots, out slot)` computing `target` from the parameters: only the
    instructions `target` depends on, in program order."""
    # imported here: kernel modules import this module while the kernel table loads
    from .kernels import KERNELS
    needed = {id(target)}
    for inst in reversed(comp.instructions):
        if id(inst) in needed:
            needed.update(id(op) for op in inst.operands)
    slot = {id(inst): i for i, inst in enumerate(comp.instructions)}
    steps = []
    for i, inst in enumerate(comp.instructions):
        if id(inst) not in needed:
            continue
        if not _is_scalar(inst.shape):
            raise UnsupportedError(f"computation {comp.name} cannot be applied elementwise: "
                                   f"{inst.name} has the non-scalar shape {inst.shape}")
        if inst.opcode == "parameter":
            continue
        if inst.opcode in _PASS_THROUGH:
            fn = _pass_through
        elif inst.opcode in _CALLS:
            fn = _call_vectorised
        elif inst.opcode in ELEMENTWISE_PURE or inst.opcode in _SHAPE_AGNOSTIC:
            fn = KERNELS[inst.opcode]
        else:
            raise UnsupportedError(f"computation {comp.name} cannot be applied elementwise: "
                                   f"it contains {inst.opcode} ({inst.name})")
        steps.append((fn, inst, [slot[id(op)] for op in inst.operands], i))
    param_slots = {p.parameter_number: slot[id(p)] for p in comp.parameters}
    return len(comp.instructions), param_slots, slot[id(target)], steps


def _run_scalar_plan(ctx, plan, args: Sequence[Any]) -> Any:
    num_slots, param_slots, target_slot, steps = plan
    values: list[Any] = [None] * num_slots
    for number, value in enumerate(args):
        values[param_slots[number]] = value
    for fn, inst, operand_slots, out in steps:
        values[out] = fn(inst, [values[s] for s in operand_slots], ctx)
    return values[target_slot]


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
