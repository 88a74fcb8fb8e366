"""Gather and scatter as dimension correspondences (docs/design/propagation.md#gather-and-scatter;
XLA's
hlo_sharding_util gather/scatter helpers).

`IndexedOp` is the common view: the *result* is the gather output or a scatter update; its
*window* dims (offset_dims / update_window_dims) come from the operand slice, its *batch* dims from
the index dims other than `index_vector_dim`, in order. Three kinds of correspondence carry
shardings:

* index passthrough: index batch dim k <-> result batch dim k;
* operand passthrough: an operand dim that is neither collapsed nor a batching dim, whose slice is
  the whole dim, <-> its window dim (only while window dims stay in operand order);
* parallel dims: operand dim <-> index dim <-> result dim walked in lockstep, explicit
  (`operand_batching_dims` / `input_batching_dims`) or implicit (an index component that is an
  iota along an index dim, addressing an operand dim of slice size 1 and the same size).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import merge_sharding

from .graph import ModuleGraph


@dataclass(frozen=True, slots=True)
class IndexedOp:
    operand_dims: tuple[int, ...]
    indices_rank: int
    result_rank: int
    window_dims: tuple[int, ...]
    collapsed: tuple[int, ...]
    index_map: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]
    operand_batching: tuple[int, ...]
    indices_batching: tuple[int, ...]

    # ---- index <-> result ------------------------------------------------------------------

    def index_batch_dims(self) -> list[int]:
        return [d for d in range(self.indices_rank) if d != self.index_vector_dim]

    def result_batch_dims(self) -> list[int]:
        return [d for d in range(self.result_rank) if d not in self.window_dims]

    def result_dim_of_index_dim(self, index_dim: int) -> int:
        return dict(zip(self.index_batch_dims(), self.result_batch_dims()))[index_dim]

    # ---- operand <-> result ----------------------------------------------------------------

    def operand_passthrough(self) -> list[tuple[int, int]]:
        """`(operand dim, window dim)` pairs of dims the slice keeps whole (XLA's
        GetGatherScatterOperandPassthroughOperandDims)."""
        pairs, skipped = [], 0
        for i, size in enumerate(self.operand_dims):
            if i in self.collapsed or i in self.operand_batching:
                skipped += 1
                continue
            k = i - skipped
            if self.slice_sizes[i] != size:
                continue
            if k > 0 and self.window_dims[k] < self.window_dims[k - 1]:
                continue
            pairs.append((i, self.window_dims[k]))
        return pairs

    # ---- parallel dims ---------------------------------------------------------------------

    def explicit_parallel(self) -> list[tuple[int, int]]:
        """`(operand dim, index dim)` pairs of the explicit batching dims."""
        return list(zip(self.operand_batching, self.indices_batching))

    def implicit_parallel(self, indices: Instruction, graph: ModuleGraph | None = None,
                          moved: Callable[[Instruction], Instruction] | None = None
                          ) -> list[tuple[int, int]]:
        """`(operand dim, index dim)` pairs found from iota index components (XLA's
        GetGatherScatterBatchParallelDims): a component that is an iota along index dim d
        makes its operand dim parallel to d when that operand dim's slice size is 1 and d is
        not an explicit batching dim. Empty when none, when two components are iotas along
        one index dim, or when a parallel operand dim's size differs from d's. Without `graph`
        (the partitioner's use, on a module it is rewriting) `iota_dimension` does not look
        into called computations' parameters; `moved` (the partitioner's) gives the value a
        node stands for (the value one of its reshard nodes moves, else the node)."""
        ivd = self.index_vector_dim
        source = _concatenate_through_copies(indices, moved)
        iota_dims: list[int | None] = [None] * len(self.index_map)
        if source.opcode == "concatenate" and source.attrs["dimensions"][0] == ivd:
            offset = 0
            for op in source.operands:
                count = op.shape.dims[ivd] if op.shape.rank > ivd else 1
                dim = iota_dimension(op, graph, moved)
                if dim is not None and dim != ivd:
                    iota_dims[offset:offset + count] = [dim] * count
                offset += count
        else:
            dim = iota_dimension(source, graph, moved)
            if dim is not None and dim != ivd:
                count = source.shape.dims[ivd] if source.shape.rank > ivd else 1
                iota_dims[:count] = [dim] * count
        pairs: list[tuple[int, int]] = []
        for component, index_dim in enumerate(iota_dims[:len(self.index_map)]):
            if index_dim is None:
                continue
            if any(i == index_dim for _, i in pairs):
                return []
            operand_dim = self.index_map[component]
            if self.slice_sizes[operand_dim] != 1 or index_dim in self.indices_batching:
                continue
            if self.operand_dims[operand_dim] != source.shape.dims[index_dim]:
                return []
            pairs.append((operand_dim, index_dim))
        return pairs


def _concatenate_through_copies(indices: Instruction,
                                moved: Callable[[Instruction], Instruction] | None = None
                                ) -> Instruction:
    """The concatenate `indices` is a chain of copies of, else `indices` itself (seen through
    `moved`, see `IndexedOp.implicit_parallel`)."""
    inst = indices if moved is None else moved(indices)
    while inst.opcode == "copy":
        inst = inst.operands[0] if moved is None else moved(inst.operands[0])
    return inst if inst.opcode == "concatenate" else indices


def iota_dimension(inst: Instruction, graph: ModuleGraph | None,
                   moved: Callable[[Instruction], Instruction] | None = None) -> int | None:
    """The dim along which `inst` is an iota (an `iota`, an s32 constant equal to its index along
    one dim of size > 1, a broadcast of such, or an element of a loop body's or a branch's
    parameter that is one, see `_argument_element`), else None (XLA's GetDimensionForIota);
    seen through `moved` (see `IndexedOp.implicit_parallel`)."""
    if moved is not None:
        inst = moved(inst)
    if inst.opcode == "iota":
        return inst.attrs["iota_dimension"]
    if inst.shape.is_tuple or inst.shape.element_type != "s32":
        return None
    if inst.opcode == "constant" and inst.literal is not None and inst.literal.value is not None:
        value = np.asarray(inst.literal.value)
        for d in range(value.ndim):
            if value.shape[d] > 1:
                index = np.arange(value.shape[d]).reshape([-1 if e == d else 1
                                                           for e in range(value.ndim)])
                if np.array_equal(value, np.broadcast_to(index, value.shape)):
                    return d
        return None
    if inst.opcode == "broadcast":
        dim = iota_dimension(inst.operands[0], graph, moved)
        return None if dim is None else inst.attrs["dimensions"][dim]
    if graph is not None and inst.opcode == "get-tuple-element" and \
            inst.operands[0].opcode == "parameter":
        element = _argument_element(inst, graph)
        return None if element is None else iota_dimension(element, graph, moved)
    return None


def _argument_element(gte: Instruction, graph: ModuleGraph) -> Instruction | None:
    """What element `gte` of a called computation's parameter holds, when its one caller shows
    it: a `while` body that passes the element through unchanged reads the element of the
    loop's operand tuple on every iteration; a `conditional` branch reads the element of its
    operand tuple. Else None (another caller, several callers, an operand that is no tuple)."""
    comp = graph.computation_of[gte]
    callers = graph.callers(comp.name)
    if len(callers) != 1:
        return None
    caller, index = callers[0], gte.attrs["index"]
    if caller.opcode == "while":
        init, root = caller.operands[0], comp.root
        if init.opcode == "tuple" and root.opcode == "tuple" and root.operands[index] is gte:
            return init.operands[index]
    elif caller.opcode == "conditional" and comp.name in caller.branch_computation_names():
        argument = caller.operands[caller.branch_computation_names().index(comp.name) + 1]
        if argument.opcode == "tuple":
            return argument.operands[index]
    return None


def gather_view(gather: Instruction) -> IndexedOp:
    a = gather.attrs
    operand, indices = gather.operands
    rank = indices.shape.rank
    ivd = a.get("index_vector_dim", rank)
    return IndexedOp(operand.shape.dims, rank + (1 if ivd == rank else 0), gather.shape.rank,
                     tuple(a.get("offset_dims", ())), tuple(a.get("collapsed_slice_dims", ())),
                     tuple(a.get("start_index_map", ())), ivd, tuple(a["slice_sizes"]),
                     tuple(a.get("operand_batching_dims", ())),
                     tuple(a.get("start_indices_batching_dims", ())))


def scatter_operand_count(scatter: Instruction) -> int:
    return (len(scatter.operands) - 1) // 2


def scatter_view(scatter: Instruction) -> IndexedOp:
    a = scatter.attrs
    n = scatter_operand_count(scatter)
    operand, indices, update = scatter.operands[0], scatter.operands[n], scatter.operands[n + 1]
    rank = indices.shape.rank
    ivd = a.get("index_vector_dim", rank)
    window = tuple(a.get("update_window_dims", ()))
    inserted = tuple(a.get("inserted_window_dims", ()))
    batching = tuple(a.get("input_batching_dims", ()))
    sizes, k = [], 0
    for i in range(operand.shape.rank):
        if i in inserted or i in batching:
            sizes.append(1)
        else:
            sizes.append(update.shape.dims[window[k]])
            k += 1
    return IndexedOp(operand.shape.dims, rank + (1 if ivd == rank else 0), update.shape.rank,
                     window, inserted, tuple(a.get("scatter_dims_to_operand_dims", ())), ivd,
                     tuple(sizes), batching, tuple(a.get("scatter_indices_batching_dims", ())))


# ---- shardings -----------------------------------------------------------------------------

def result_from_indices(s: HloSharding, view: IndexedOp, indices_rank: int) -> HloSharding:
    """Index batch dims -> result batch dims, everything else replicated."""
    if not s.is_tiled:
        return s
    pairs = [(i, r) for i, r in zip(view.index_batch_dims(), view.result_batch_dims())
             if i < indices_rank]
    return algebra.propagate_along_dims(s, [i for i, _ in pairs], [r for _, r in pairs],
                                    view.result_rank)


def indices_from_result(s: HloSharding, view: IndexedOp, indices_rank: int) -> HloSharding:
    """Result batch dims -> index batch dims (index_vector_dim replicated)."""
    if not s.is_tiled:
        return s
    pairs = [(r, i) for i, r in zip(view.index_batch_dims(), view.result_batch_dims())
             if i < indices_rank]
    return algebra.propagate_along_dims(s, [r for r, _ in pairs], [i for _, i in pairs], indices_rank)


def result_from_operand(s: HloSharding, view: IndexedOp) -> HloSharding | None:
    """Operand passthrough dims -> window dims, everything else replicated; None when the
    operand is not tiled or nothing tiled passes through."""
    if not s.is_tiled:
        return None
    pairs = view.operand_passthrough()
    out = algebra.propagate_along_dims(s, [o for o, _ in pairs], [r for _, r in pairs],
                                       view.result_rank)
    return None if out.is_tile_maximal else out


def operand_from_result(s: HloSharding, view: IndexedOp) -> HloSharding | None:
    """Window dims -> operand passthrough dims; None when nothing passes through."""
    if not s.is_tiled:
        return s
    pairs = view.operand_passthrough()
    out = algebra.propagate_along_dims(s, [r for _, r in pairs], [o for o, _ in pairs],
                                   len(view.operand_dims))
    return None if out.is_tile_maximal else out


def along(s: HloSharding, source: list[int], target: list[int], rank: int) -> HloSharding:
    """Tiling of `source` dims moved to `target` dims of a rank-`rank` value, others replicated."""
    if not s.is_tiled:
        return s
    return algebra.propagate_along_dims(s, source, target, rank)


def merge_parallel_and_passthrough(parallel: HloSharding | None,
                                   passthrough: HloSharding | None) -> HloSharding | None:
    """XLA's combination of the parallel-dims and passthrough candidates of an operand/update:
    merged when compatible, else the more specific, else the parallel one."""
    if passthrough is None:
        return parallel
    if parallel is None:
        return passthrough
    changed, merged = merge_sharding(parallel, passthrough, True)
    if changed:
        return merged
    changed, merged = merge_sharding(passthrough, parallel, True)
    return merged if changed else parallel
