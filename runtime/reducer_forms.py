"""The forms of variadic reducer computations that `reduce` runs as whole-array numpy operations.

A variadic `reduce` hands its reducer tuples of scalars: parameters `0..n-1` hold the accumulated
side `a`, parameters `n..2n-1` the side `b`. Folding such a reducer pairwise applies its whole
computation once per tree level; two forms are instead recognised here and computed directly:

- `elementwise_ufuncs`: the root is a tuple whose output `k` is a ufunc (add, multiply, maximum,
  minimum, and, or, xor) of parameters `k` and `n + k`: n independent reductions (a sum and a max
  reduced together, say);
- `arg_selection`: argmax / argmin with an index tie-break, JAX's form: over (value, index) pairs,
  `value = select(pick, a, b)` and `index = select(pick or (a == b and ai < bi), ai, bi)` where
  `pick` is `a > b` (`<` for argmin) or, for floats, `a > b or a != a` (a NaN wins).

The second is recognised by its *truth table*, not its spelling: the select conditions are boolean
expressions (and, or, xor, not) of comparisons between the parameters, so their value is a
function of how `a` compares with `b` (less, equal, greater, or which of them is NaN) and how `ai`
compares with `bi`; every such case is evaluated and the table must equal the form's table (a
cell may differ only where both sides give the same value: the index when `ai == bi`, an integer
value when `a == b`). Any spelling with that table (operands of `select` swapped with a negated
condition, comparisons mirrored, `!(a <= b)`, ...) is the same reducer.

The reducer is associative, so its pairwise fold selects, in every row, the first NaN (its value
and index) when there is one, else among the elements equal to the extreme value the one whose
value is rightmost (the value select keeps `b` on equality: `-0.0` and `0.0` compare equal) with
the smallest index among them (`selected_arg` computes exactly this).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.shapes import ArrayShape

_UFUNCS = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}
#: how `a` compares with `b`: less, equal, greater, or a NaN on one side or both
_ORDERED = ("lt", "eq", "gt")
_WITH_NAN = _ORDERED + ("a_nan", "b_nan", "both_nan")
_COMPARISONS = {
    "EQ": lambda rel: rel == "eq", "NE": lambda rel: rel != "eq",
    "LT": lambda rel: rel == "lt", "GT": lambda rel: rel == "gt",
    "LE": lambda rel: rel in ("lt", "eq"), "GE": lambda rel: rel in ("gt", "eq"),
}
_MIRRORED = {"lt": "gt", "gt": "lt", "eq": "eq", "a_nan": "b_nan", "b_nan": "a_nan",
             "both_nan": "both_nan"}


@dataclass(frozen=True)
class ArgSelection:
    """An argmax (`largest`) or argmin reducer over (value, index) pairs (module docstring)."""

    largest: bool


def elementwise_ufuncs(computation: Computation) -> tuple[np.ufunc, ...] | None:
    """The ufunc of each output of a reducer whose tuple root combines parameters `k` and `n + k`
    with a ufunc for every `k` (module docstring), else None."""
    params = computation.parameters
    root = computation.root
    n = len(params) // 2
    if root.opcode != "tuple" or len(root.operands) != n or len(params) != 2 * n or n < 2:
        return None
    by_number = {p.parameter_number: p for p in params}
    if set(by_number) != set(range(2 * n)) or any(not _is_scalar(p) for p in params):
        return None
    ufuncs = []
    for k, element in enumerate(root.operands):
        ufunc = _UFUNCS.get(element.opcode)
        if ufunc is None or len(element.operands) != 2:
            return None
        if {id(op) for op in element.operands} != {id(by_number[k]), id(by_number[n + k])}:
            return None
        ufuncs.append(ufunc)
    return tuple(ufuncs)


def _is_scalar(inst: Instruction) -> bool:
    return isinstance(inst.shape, ArrayShape) and not inst.shape.dims


def arg_selection(computation: Computation) -> ArgSelection | None:
    """The argmax / argmin form of a reducer over (value, index) pairs (module docstring), else
    None."""
    params = computation.parameters
    root = computation.root
    if len(params) != 4 or root.opcode != "tuple" or len(root.operands) != 2:
        return None
    by_number = {p.parameter_number: p for p in params}
    if set(by_number) != {0, 1, 2, 3}:
        return None
    if any(not _is_scalar(p) for p in params):
        return None
    a, ai, b, bi = (by_number[k] for k in range(4))
    value_type, index_type = a.shape.element_type, ai.shape.element_type
    if b.shape.element_type != value_type or bi.shape.element_type != index_type:
        return None
    floating = dtypes.is_float(value_type)
    if not dtypes.is_integer(index_type) or not (floating or dtypes.is_integer(value_type)):
        return None
    value_pick = _select_condition(root.operands[0], a, b)
    index_pick = _select_condition(root.operands[1], ai, bi)
    if value_pick is None or index_pick is None:
        return None
    sides = {id(a): ("value", "a"), id(b): ("value", "b"), id(ai): ("index", "a"),
             id(bi): ("index", "b")}
    relations = _WITH_NAN if floating else _ORDERED
    for largest in (True, False):
        if _matches(value_pick, index_pick, sides, relations, largest, floating):
            return ArgSelection(largest)
    return None


def selected_arg(form: ArgSelection, values: np.ndarray, indices: np.ndarray):
    """The pairwise fold of the argmax / argmin reducer along the last axis (non-empty):
    `(value, index)` arrays of the leading shape (module docstring)."""
    floating = values.dtype.kind not in "biu"
    nan = np.isnan(values) if floating else None
    has_nan = nan is not None and bool(nan.any())
    # rows with a NaN get a NaN extreme and no tied element here: they are decided below
    value = values.max(axis=-1) if form.largest else values.min(axis=-1)
    tied = values == value[..., None]
    index = np.where(tied, indices, indices.dtype.type(np.iinfo(indices.dtype).max)).min(axis=-1)
    if floating and bool((value == 0).any()):
        # -0.0 and 0.0 tie: the value is the rightmost tied element's
        rightmost = values.shape[-1] - 1 - np.argmax(tied[..., ::-1], axis=-1)
        value = np.take_along_axis(values, rightmost[..., None], axis=-1)[..., 0]
    if has_nan:
        any_nan = nan.any(axis=-1)
        first = np.argmax(nan, axis=-1)[..., None]
        value = np.where(any_nan, np.take_along_axis(values, first, axis=-1)[..., 0], value)
        index = np.where(any_nan, np.take_along_axis(indices, first, axis=-1)[..., 0], index)
    return value, index


def combined_arg(form: ArgSelection, a: tuple[np.ndarray, np.ndarray],
                 b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The reducer applied once to the (value, index) pairs `a` and `b` (broadcast together)."""
    (a_value, a_index), (b_value, b_index) = a, b
    pick = a_value > b_value if form.largest else a_value < b_value
    if a_value.dtype.kind not in "biu":
        pick |= np.isnan(a_value)
    pick_index = pick | ((a_value == b_value) & (a_index < b_index))
    return np.where(pick, a_value, b_value), np.where(pick_index, a_index, b_index)


def _default_comparison(element_type: str) -> str:
    """The comparison type a compare of `element_type` has when it states none."""
    if dtypes.is_float(element_type):
        return "FLOAT"
    return "UNSIGNED" if dtypes.is_unsigned(element_type) else "SIGNED"


def _select_condition(inst: Instruction, a: Instruction, b: Instruction):
    """The condition under which `inst` (a select of `a` and `b`) takes `a`: (expression,
    negated), or None when `inst` is not such a select."""
    if inst.opcode != "select":
        return None
    condition, on_true, on_false = inst.operands
    if on_true is a and on_false is b:
        return condition, False
    if on_true is b and on_false is a:
        return condition, True
    return None


def _matches(value_pick, index_pick, sides, relations, largest: bool, floating: bool) -> bool:
    """Whether the two select conditions have the argmax (`largest`) / argmin table."""
    better = "gt" if largest else "lt"
    for value_rel, index_rel in product(relations, _ORDERED):
        case = {"value": value_rel, "index": index_rel}
        takes_a_value = _evaluate(value_pick, sides, case)
        takes_a_index = _evaluate(index_pick, sides, case)
        if takes_a_value is None or takes_a_index is None:
            return False
        want_value = value_rel in (better, "a_nan", "both_nan")
        want_index = want_value or (value_rel == "eq" and index_rel == "lt")
        if takes_a_value != want_value and (floating or value_rel != "eq"):
            return False
        if takes_a_index != want_index and index_rel != "eq":
            return False
    return True


def _evaluate(condition, sides, case) -> bool | None:
    """The truth of a select condition `(expression, negated)` in `case` (the relations of the
    value pair and of the index pair), None when the expression is not a boolean combination of
    comparisons between the parameters."""
    expression, negated = condition
    value = _truth(expression, sides, case, 0)
    return None if value is None else value != negated


def _truth(inst: Instruction, sides, case, depth: int) -> bool | None:
    if depth > 32 or inst.shape.element_type != "pred" or inst.shape.dims:
        return None
    if inst.opcode == "compare":
        return _comparison(inst, sides, case)
    parts = [_truth(op, sides, case, depth + 1) for op in inst.operands]
    if any(p is None for p in parts):
        return None
    if inst.opcode == "not" and len(parts) == 1:
        return not parts[0]
    if inst.opcode == "and" and len(parts) == 2:
        return parts[0] and parts[1]
    if inst.opcode == "or" and len(parts) == 2:
        return parts[0] or parts[1]
    if inst.opcode == "xor" and len(parts) == 2:
        return parts[0] != parts[1]
    return None


def _comparison(inst: Instruction, sides, case) -> bool | None:
    """A comparison of two parameters of the same pair, in `case`."""
    direction = str(inst.attrs.get("direction"))
    if direction not in _COMPARISONS:
        return None
    x, y = (sides.get(id(op)) for op in inst.operands)
    if x is None or y is None or x[0] != y[0]:
        return None
    stated = inst.attrs.get("type")
    if stated is not None and str(stated) != _default_comparison(inst.operands[0].shape.element_type):
        return None
    relation = case[x[0]]
    if x[1] == y[1]:        # a parameter with itself: equal unless NaN
        nan = relation in ("both_nan", f"{x[1]}_nan")
        relation = "a_nan" if nan else "eq"
    elif x[1] == "b":
        relation = _MIRRORED[relation]
    if relation.endswith("nan"):
        return direction == "NE"
    return _COMPARISONS[direction](relation)
