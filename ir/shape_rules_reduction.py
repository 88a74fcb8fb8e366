"""Shape rules of ops that apply a computation: reduce and reduce-window (variadic),
select-and-scatter, sort (variadic), map; and top-k.

Reducers take 2N scalars (N accumulators, then N inputs) and return the N accumulators; sort
comparators take 2N scalars (two per operand) and return pred[]; map's function takes one scalar
per operand.
"""
from __future__ import annotations

from .module import Instruction, Module
from .ops import SHAPE_RULES
from .shape_rules_common import (
    attr_bool, attr_int, attr_ints, attr_value, called, check_dimension_list, check_reducer,
    check_scalar_function, fail, operand_array, operand_scalar, strip, tuple_or_single,
    window_output_dims,
)
from .shapes import ArrayShape, Shape, TupleShape


def _inputs_and_inits(inst: Instruction) -> tuple[list[ArrayShape], list[ArrayShape]]:
    """The N inputs (one dims) and N scalar init values of a variadic reduce/reduce-window. Their
    element types may differ; the reducer relates them (accumulator i has init i's type)."""
    count = len(inst.operands)
    if count % 2 != 0:
        fail(f"{inst.opcode} needs N inputs and N init values, "
             f"found {count} operands")
    n = count // 2
    inputs = [operand_array(inst, i) for i in range(n)]
    inits = [operand_scalar(inst, n + i) for i in range(n)]
    if len({x.dims for x in inputs}) != 1:
        fail(f"{inst.opcode} inputs must have identical dims, found " + ", ".join(map(str, inputs)))
    return inputs, inits


@SHAPE_RULES.register("reduce")
def reduce(inst: Instruction, module: Module) -> Shape:
    """reduce(x_1..x_N, init_1..init_N), dimensions=D: each result keeps the dims not in D and
    takes its init value's element type; one array for N = 1, else an N-tuple."""
    inputs, inits = _inputs_and_inits(inst)
    dims = attr_ints(inst, "dimensions")
    check_dimension_list(dims, inputs[0].rank, "reduce dimension")
    check_reducer(called(inst, module, "to_apply"), [i.element_type for i in inits],
                  [x.element_type for x in inputs], "reducer")
    kept = tuple(size for d, size in enumerate(inputs[0].dims) if d not in dims)
    return tuple_or_single([ArrayShape(i.element_type, kept) for i in inits])


@SHAPE_RULES.register("reduce-window")
def reduce_window(inst: Instruction, module: Module) -> Shape:
    """reduce-window(x_1..x_N, init_1..init_N), window=W: each result has the window output dims
    over the inputs' dims and its init value's element type."""
    inputs, inits = _inputs_and_inits(inst)
    dims = window_output_dims(attr_value(inst, "window"), inputs[0].dims, "reduce-window")
    check_reducer(called(inst, module, "to_apply"), [i.element_type for i in inits],
                  [x.element_type for x in inputs], "reducer")
    return tuple_or_single([ArrayShape(i.element_type, dims) for i in inits])


@SHAPE_RULES.register("select-and-scatter")
def select_and_scatter(inst: Instruction, module: Module) -> Shape:
    """select-and-scatter(operand, source, init): source has the window output dims over the
    operand; `select` is (T, T) -> pred over the operand type T, `scatter` a reducer of the source
    values into init's type; the result is the operand's shape."""
    x, source, init = operand_array(inst, 0), operand_array(inst, 1), operand_scalar(inst, 2)
    dims = window_output_dims(attr_value(inst, "window"), x.dims, "select-and-scatter")
    if source.dims != dims:
        fail(f"source {source} must have the window output dims {list(dims)}")
    t = x.element_type
    selected = check_scalar_function(called(inst, module, "select"), [t, t], "select")
    if selected.element_type != "pred":
        fail(f"select computation must return pred[], returns {selected}")
    check_reducer(called(inst, module, "scatter"), [init.element_type], [source.element_type],
                  "scatter")
    return strip(x)


@SHAPE_RULES.register("sort")
def sort(inst: Instruction, module: Module) -> Shape:
    """sort(x_1..x_N), dimensions={d}: comparator (x_1, x_1, ..., x_N, x_N scalars) -> pred[];
    the result is the operand (N = 1) or the tuple of operands."""
    xs = [operand_array(inst, i) for i in range(len(inst.operands))]
    if len({x.dims for x in xs}) != 1:
        fail("sort operands must have identical dims, found " + ", ".join(map(str, xs)))
    dims = attr_ints(inst, "dimensions")
    if len(dims) != 1:
        fail(f"sort needs exactly one dimension, found {list(dims)}")
    check_dimension_list(dims, xs[0].rank, "sort dimension")
    attr_bool(inst, "is_stable")
    types = [t for x in xs for t in (x.element_type, x.element_type)]
    result = check_scalar_function(called(inst, module, "to_apply"), types, "comparator")
    if result.element_type != "pred":
        fail(f"comparator must return pred[], returns {result}")
    return tuple_or_single([strip(x) for x in xs])


@SHAPE_RULES.register("map")
def map_(inst: Instruction, module: Module) -> Shape:
    """map(x_1..x_N), to_apply=f: f takes one scalar per operand; the result has the operands'
    dims and f's result type."""
    xs = [operand_array(inst, i) for i in range(len(inst.operands))]
    if len({x.dims for x in xs}) != 1:
        fail("map operands must have identical dims, found " + ", ".join(map(str, xs)))
    dims = attr_ints(inst, "dimensions", tuple(range(xs[0].rank)))
    if dims != tuple(range(xs[0].rank)):
        fail(f"map dimensions {list(dims)} must list every operand dimension in order")
    result = check_scalar_function(called(inst, module, "to_apply"),
                                   [x.element_type for x in xs], "mapped computation")
    return ArrayShape(result.element_type, xs[0].dims)


@SHAPE_RULES.register("topk")
def top_k(inst: Instruction, module: Module) -> Shape:
    """topk(x), k=K: the K largest (or smallest) along the last dim: (values, s32 indices)."""
    x = operand_array(inst, 0)
    k = attr_int(inst, "k")
    attr_bool(inst, "largest", True)
    if not (x.rank >= 1 and 0 <= k <= x.dims[-1]):
        fail(f"k={k} must be between 0 and the last dimension of {x}")
    dims = x.dims[:-1] + (k,)
    return TupleShape((x.with_dims(dims), ArrayShape("s32", dims)))
