"""Shape rules of gather and (variadic) scatter, with every dimension number XLA has, including the
batching dims (`operand_batching_dims`/`start_indices_batching_dims` for gather,
`input_batching_dims`/`scatter_indices_batching_dims` for scatter).

Indices: when `index_vector_dim` equals the rank of the indices array, the indices are read as if
they had a trailing dim of size 1. The "batch" (scatter) dims of the indices are all dims but
`index_vector_dim`.
"""
from __future__ import annotations

from . import dtypes
from .module import Instruction, Module
from .ops import SHAPE_RULES
from .shape_rules_common import (
    attr_bool, attr_int, attr_ints, called, check_dimension_list, check_reducer, fail,
    operand_array, strip, tuple_or_single,
)
from .shapes import ArrayShape, Shape


def _index_batch_dims(inst: Instruction, indices: ArrayShape, index_map: tuple[int, ...],
                      map_name: str) -> tuple[int, tuple[int, ...]]:
    """(index_vector_dim, positions of the indices' batch dims) after checking that the index
    vector has one entry per `index_map` entry."""
    if not dtypes.is_integer(indices.element_type):
        fail(f"indices {indices} must be integral")
    ivd = attr_int(inst, "index_vector_dim")
    if not 0 <= ivd <= indices.rank:
        fail(f"index_vector_dim {ivd} is out of range for indices {indices}")
    vector = indices.dims[ivd] if ivd < indices.rank else 1
    if vector != len(index_map):
        fail(f"{map_name} {list(index_map)} must have one entry per "
             f"index vector element ({vector})")
    return ivd, tuple(d for d in range(indices.rank) if d != ivd)


def _check_batching(operand_dims: tuple[int, ...], op_rank: int, operand: ArrayShape,
                    index_dims: tuple[int, ...], ivd: int, indices: ArrayShape,
                    names: tuple[str, str]) -> None:
    """Operand batching dims pair with equally sized index batching dims."""
    if len(operand_dims) != len(index_dims):
        fail(f"{names[0]} {list(operand_dims)} and {names[1]} {list(index_dims)} differ in length")
    check_dimension_list(operand_dims, op_rank, names[0])
    check_dimension_list(index_dims, indices.rank, names[1])
    for o, i in zip(operand_dims, index_dims):
        if i == ivd:
            fail(f"{names[1]} must not contain index_vector_dim {ivd}")
        if operand.dims[o] != indices.dims[i]:
            fail(f"{names[0]} dim {o} of {operand} and "
                 f"{names[1]} dim {i} of {indices} differ in size")


@SHAPE_RULES.register("gather")
def gather(inst: Instruction, module: Module) -> Shape:
    """Result rank = len(offset_dims) + number of index batch dims. Result dims listed in
    offset_dims take, in order, the slice sizes of the operand dims that are neither collapsed nor
    batching; the other result dims take, in order, the sizes of the indices' batch dims."""
    operand, indices = operand_array(inst, 0), operand_array(inst, 1)
    offset_dims = attr_ints(inst, "offset_dims")
    collapsed = attr_ints(inst, "collapsed_slice_dims", ())
    start_map = attr_ints(inst, "start_index_map")
    batching = attr_ints(inst, "operand_batching_dims", ())
    index_batching = attr_ints(inst, "start_indices_batching_dims", ())
    sizes = attr_ints(inst, "slice_sizes")
    attr_bool(inst, "indices_are_sorted")
    ivd, batch_positions = _index_batch_dims(inst, indices, start_map, "start_index_map")
    rank = operand.rank
    if len(sizes) != rank:
        fail(f"slice_sizes {list(sizes)} must have one entry per dim of "
             f"{operand}")
    for d, (s, size) in enumerate(zip(sizes, operand.dims)):
        if not 0 <= s <= size:
            fail(f"slice size {s} is out of range for dim {d} of {operand}")
    check_dimension_list(collapsed, rank, "collapsed_slice_dims", increasing=True)
    check_dimension_list(start_map, rank, "start_index_map")
    _check_batching(batching, rank, operand, index_batching, ivd, indices,
                    ("operand_batching_dims", "start_indices_batching_dims"))
    for d in collapsed + batching:
        if not sizes[d] <= 1:
            fail(f"collapsed or batching dim {d} needs a slice size of at most 1, "
                 f"found {sizes[d]}")
    if set(collapsed) & set(batching):
        fail("collapsed_slice_dims and operand_batching_dims overlap")
    if set(start_map) & set(batching):
        fail("start_index_map and operand_batching_dims overlap")
    window = [sizes[d] for d in range(rank) if d not in collapsed and d not in batching]
    if len(offset_dims) != len(window):
        fail(f"offset_dims {list(offset_dims)} must have one entry per slice dim that is neither "
             f"collapsed nor batching ({len(window)})")
    out_rank = len(offset_dims) + len(batch_positions)
    check_dimension_list(offset_dims, out_rank, "offset_dims", increasing=True)
    windows, batches = iter(window), iter(indices.dims[d] for d in batch_positions)
    dims = [next(windows) if d in offset_dims else next(batches) for d in range(out_rank)]
    return ArrayShape(operand.element_type, tuple(dims))


@SHAPE_RULES.register("scatter")
def scatter(inst: Instruction, module: Module) -> Shape:
    """scatter(operand_1..N, indices, update_1..N): the updates' dims not in update_window_dims
    equal the indices' batch dims (in order); update window dim j has at most the size of the
    j-th operand dim that is neither inserted nor batching. The combiner (to_apply) is a reducer of
    N values; the result is the operand (N = 1) or the tuple of operands."""
    count = len(inst.operands)
    if count % 2 != 1:
        fail(f"scatter needs N operands, indices and N updates, found {count} "
             "operands")
    n = count // 2
    operands = [operand_array(inst, i) for i in range(n)]
    indices = operand_array(inst, n)
    updates = [operand_array(inst, n + 1 + i) for i in range(n)]
    if not (len({x.dims for x in operands}) == 1 and len({u.dims for u in updates}) == 1):
        fail("scatter operands (and updates) must have identical dims")
    for x, u in zip(operands, updates):
        if x.element_type != u.element_type:
            fail(f"update {u} does not match the element type of operand {x}")
    operand, update = operands[0], updates[0]
    window_dims = attr_ints(inst, "update_window_dims")
    inserted = attr_ints(inst, "inserted_window_dims", ())
    to_operand = attr_ints(inst, "scatter_dims_to_operand_dims")
    batching = attr_ints(inst, "input_batching_dims", ())
    index_batching = attr_ints(inst, "scatter_indices_batching_dims", ())
    attr_bool(inst, "indices_are_sorted")
    attr_bool(inst, "unique_indices")
    ivd, batch_positions = _index_batch_dims(inst, indices, to_operand,
                                             "scatter_dims_to_operand_dims")
    rank = operand.rank
    check_dimension_list(window_dims, update.rank, "update_window_dims", increasing=True)
    check_dimension_list(inserted, rank, "inserted_window_dims", increasing=True)
    check_dimension_list(to_operand, rank, "scatter_dims_to_operand_dims")
    _check_batching(batching, rank, operand, index_batching, ivd, indices,
                    ("input_batching_dims", "scatter_indices_batching_dims"))
    if set(inserted) & set(batching):
        fail("inserted_window_dims and input_batching_dims overlap")
    if set(to_operand) & set(batching):
        fail("scatter_dims_to_operand_dims and input_batching_dims overlap")
    if rank != len(window_dims) + len(inserted) + len(batching):
        fail(f"operand rank {rank} must equal the number of update_window_dims, "
             "inserted_window_dims and input_batching_dims")
    scatter_dims = [d for d in range(update.rank) if d not in window_dims]
    expected = tuple(indices.dims[d] for d in batch_positions)
    if tuple(update.dims[d] for d in scatter_dims) != expected:
        fail(f"update {update} scatter dims must equal the indices' batch dims {list(expected)}")
    targets = [d for d in range(rank) if d not in inserted and d not in batching]
    for w, d in zip(window_dims, targets):
        if not update.dims[w] <= operand.dims[d]:
            fail(f"update window dim {w} of {update} exceeds "
                 f"operand dim {d} of {operand}")
    check_reducer(called(inst, module, "to_apply"), [x.element_type for x in operands],
                  [u.element_type for u in updates], "combiner")
    return tuple_or_single([strip(x) for x in operands])
