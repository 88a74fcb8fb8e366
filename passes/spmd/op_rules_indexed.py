"""Partitioning of `dynamic-slice`, `dynamic-update-slice`, `sort`, `topk` and custom-call `TopK`
(docs/design/partitioning.md, sections sort-and-topk and dynamic-slices).

Each op has *kept* dims, along which it works index by index (a dynamic slice or update covering
the whole dim, a dim that is not sorted, every dim of a TopK but the last): candidates tile the
result and the array operands alike on kept dims only (from the annotated result, or from the
first operand), the other dims whole; start indices are replicated, but those of kept dims (HLO
clamps them to 0 whatever they are) stay as they are and read as 0 locally. Locally, dynamic-slice
sizes become the shard size on tiled kept dims (their start is clamped to 0 both globally and
locally).

More strategies, chosen by bytes like the others:

- `sort` along a tiled dim: the first operand's tiling with the sorted dim's tiles moved to a kept
  dim they divide (an all-to-all instead of a gather).
- TopK along a tiled last dim: the top k of every shard, all-gathered, then the top k of those
  (`TopKRule`).
- `dynamic-slice` of a tiled *sliced* dim d (the slice is smaller than the dim): the operand
  stays tiled and each partition cuts the window from its own shard —
  `dynamic-slice(pad(shard, U_d on both sides of d), s - lo + U_d)`, with `s` the start clamped
  as HLO does and `lo` the partition's offset — zeroed outside its range
  `lo <= s + iota < lo + shard`; the result is a partial value (an `unreduced` subgroup) that
  the reshard to the annotated sharding sums: an all-reduce of the slice instead of a gather of
  the operand.
- `dynamic-update-slice` on a tiled *sliced* dim d (the update is smaller than the dim): the
  operand is tiled (as it is, or as the annotated result is), the update is whole on d, and each
  partition writes the part of the update that falls in its range. With `s` the start clamped as
  HLO does (`[0, S_d - U_d]`) and `lo` the partition's offset, the local window of the update is
  `dynamic-slice(pad(update, shard on both sides of d), lo - s + shard)` (`shard` elements, the
  part of the update over this partition's range wherever they overlap); it is written at 0 on
  d (and at the original start on whole dims), and a mask `s <= lo + iota < s + U_d` keeps the
  operand elsewhere. Padding of uneven shards is never written (`s + U_d <= S_d`).
"""
from __future__ import annotations

from math import prod

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import PadDim
from gspmdc.ir.custom_call_targets import TOPK
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .op_rules import LowerContext, OpPlan, PartitionRule, clone, without_partials
from .tiling import Tiling


def _result_leaf(inst: Instruction) -> ArrayShape:
    return inst.shape.elements[0] if isinstance(inst.shape, TupleShape) else inst.shape


def _kept_dims(inst: Instruction) -> list[int]:
    """The dims the op works on index by index."""
    opcode = inst.opcode
    rank = _result_leaf(inst).rank
    if opcode == "sort":
        return [d for d in range(rank) if d not in inst.attr("dimensions")]
    if opcode == "dynamic-slice":
        dims = inst.operands[0].shape.dims
        return [d for d, s in enumerate(inst.attr("dynamic_slice_sizes")) if s == dims[d]]
    if opcode == "dynamic-update-slice":
        operand, update = inst.operands[0].shape, inst.operands[1].shape
        return [d for d in range(rank) if update.dims[d] == operand.dims[d]]
    return list(range(rank - 1))                                  # topk, TopK


def _ignored_starts(inst: Instruction) -> set[int]:
    """The start-index operands of a dynamic-(update-)slice whose value never matters: those of
    kept dims, whose start HLO clamps to 0 whatever it is. They are not resharded (a start on
    one device is not broadcast) and lowering reads 0 for them (`_local_operands`)."""
    if inst.opcode not in ("dynamic-slice", "dynamic-update-slice"):
        return set()
    arrays = _array_operands(inst)
    return {arrays + d for d in _kept_dims(inst)
            if inst.operands[arrays + d].sharding is not None and
            not inst.operands[arrays + d].sharding.has_manual_leaf}


def _local_operands(inst: Instruction, ctx: LowerContext) -> list[Instruction]:
    """`inst`'s local operands, a start its plan left unresharded (`_ignored_starts`) replaced
    by 0, what HLO clamps it to: nothing reads the value, so a reshard made for it alone (e.g.
    of a start on one device to its replicated annotation) is dead code."""
    local = ctx.operands(inst)
    for k in _ignored_starts(inst):
        local[k] = ctx.builder.constant(0, inst.operands[k].shape.element_type)
    return local


def _array_operands(inst: Instruction) -> int:
    """How many leading operands are arrays tiled like the result (the rest: scalar indices)."""
    return {"dynamic-slice": 1, "dynamic-update-slice": 2}.get(inst.opcode, len(inst.operands))


class _KeptDimsRule(PartitionRule):
    """Result and array operands tiled alike on kept dims; start indices replicated."""

    def candidates(self, inst, ctx) -> list[OpPlan]:
        leaf = _result_leaf(inst)
        rank = leaf.rank
        kept = _kept_dims(inst)
        folded = [d for d in range(rank) if d not in kept]
        candidates = []
        for target in dict.fromkeys(map(without_partials,
                                        inst.sharding.leaf_shardings(inst.shape))):
            if target.kind == "maximal":
                candidates.append(self.plan_for(inst, target, f"{inst.opcode} on one device"))
            else:
                candidates.append(self.plan_for(
                    inst, algebra.partially_replicate_on_dims(ctx.tiling(target, rank).sharding,
                                                              folded),
                    f"{inst.opcode} keeps the result's tiling of its kept dims"))
        source = inst.operands[0].sharding
        if source.is_tiled and source == without_partials(source):
            plain = ctx.tiling(source, rank).sharding
            candidates.append(self.plan_for(
                inst, algebra.partially_replicate_on_dims(plain, folded),
                f"{inst.opcode} keeps its operand's tiling of its kept dims"))
        candidates.append(self.plan_for(inst, HloSharding.replicate(),
                                        f"{inst.opcode} runs replicated"))
        return candidates

    def plan(self, inst, ctx):
        return ctx.choose(inst, self.candidates(inst, ctx))

    @staticmethod
    def plan_for(inst: Instruction, sharding: HloSharding, reason: str,
                 operands: tuple[HloSharding, ...] | None = None) -> OpPlan:
        arrays = _array_operands(inst)
        if operands is None:
            operands = (sharding,) * arrays
        scalar = sharding if sharding.kind == "maximal" else HloSharding.replicate()
        ignored = _ignored_starts(inst) if sharding.kind != "maximal" else set()
        operands = operands + tuple(
            inst.operands[k].sharding if k in ignored else scalar
            for k in range(arrays, len(inst.operands)))
        if isinstance(inst.shape, TupleShape):
            result = HloSharding.tuple([sharding] * len(inst.shape.elements))
        else:
            result = sharding
        return OpPlan(operands, result, reason)


@PARTITION_RULES.register("sort", instance=True)
class SortRule(_KeptDimsRule):
    def candidates(self, inst, ctx):
        candidates = super().candidates(inst, ctx)
        source = inst.operands[0].sharding
        shape = _result_leaf(inst)
        (dim,) = inst.attr("dimensions")
        if not source.is_tiled or source != without_partials(source):
            return candidates
        tiling = ctx.tiling(source, shape.rank)
        count = tiling.counts[dim]
        if count == 1:
            return candidates
        for kept in _kept_dims(inst):
            if shape.dims[kept] % (tiling.counts[kept] * count) == 0:
                moved, _ = algebra.move_tiles(tiling.sharding, dim, kept, count, shape.rank,
                                              ctx.num_devices)
                candidates.insert(0, self.plan_for(
                    inst, moved,
                    f"sort moves the tiles of its sorted dim to dim {kept}"))
                break
        return candidates


def _gathered_leaves(inst: Instruction, ctx) -> list[bool]:
    """Per result leaf of a TopK, whether `_top_k_of_shards` all-gathers its candidates: the
    values always (the second TopK ranks them), the indices unless every user's need leaves
    them `{unknown}` (`PlanContext.result_needs`: no user reads them, the gather is dead)."""
    needs = ctx.result_needs(inst) if ctx.result_needs is not None else ()
    if not needs or not all(need.is_tuple for need in needs):
        return [True, True]
    return [True, any(need.leaf_shardings(inst.shape)[1].kind != "unknown" for need in needs)]


@PARTITION_RULES.register("topk", targets=(TOPK,), instance=True)
class TopKRule(_KeptDimsRule):
    """Besides the kept-dims candidates: when the operand tiles the last dim into `t` shards of at
    least k elements and `k * t` is below the dim, each partition takes the top k of its shard
    (padding masked with the worst value), adds its offset to their indices, the `k * t`
    candidates are all-gathered, and a second TopK over them picks the result; its indices are
    taken from the candidates' (a gather along the last dim). Candidates are gathered in shard
    order and TopK is stable, so ties keep the lowest global index. The all-gather of the
    candidates' values and indices is the plan's own cost: where it exceeds gathering the
    operand's last dim (k not well below the shard), the operand is gathered, as XLA does
    (indices no user reads are not gathered, so not counted)."""

    def candidates(self, inst, ctx):
        candidates = super().candidates(inst, ctx)
        source = inst.operands[0].sharding
        shape = inst.operands[0].shape
        last = shape.rank - 1
        k = _result_leaf(inst).dims[-1]
        if not source.is_tiled or source != without_partials(source) or \
                inst.shape.elements[0].element_type in ("pred",):
            return candidates
        tiling = ctx.tiling(source, shape.rank)
        count = tiling.counts[last]
        if count == 1 or k > -(-shape.dims[last] // count) or k * count >= shape.dims[last]:
            return candidates
        result = algebra.partially_replicate_on_dims(tiling.sharding, [last])
        gathered = sum(dtypes.byte_width(leaf.element_type) * prod(result.shard_shape(leaf).dims)
                       for leaf, read in zip(inst.shape.leaves(), _gathered_leaves(inst, ctx))
                       if read)
        candidates.insert(0, OpPlan((source,), HloSharding.tuple([result, result]),
                                    f"top {k} of every shard, all-gathered, then top {k} of "
                                    "those", cost=float((count - 1) * gathered)))
        return candidates

    def lower(self, inst, ctx: LowerContext):
        operand = inst.operands[0]
        sharding = operand.sharding
        last = operand.shape.rank - 1
        if not sharding.is_tiled or sharding.tile_counts[last] == 1:
            return clone(inst, ctx)
        return _top_k_of_shards(inst, ctx, Tiling(sharding, last + 1, ctx.num_devices))


@PARTITION_RULES.register("dynamic-slice", instance=True)
class DynamicSliceRule(_KeptDimsRule):
    def candidates(self, inst, ctx):
        candidates = super().candidates(inst, ctx)
        source = inst.operands[0].sharding
        rank = inst.shape.rank
        if not source.is_tiled or source != without_partials(source):
            return candidates
        tiling = ctx.tiling(source, rank)
        sliced = [d for d in range(rank) if d not in _kept_dims(inst) and tiling.counts[d] > 1]
        if sliced:
            partial = algebra.unreduce_on_dims(tiling.sharding, sliced)
            candidates.append(self.plan_for(
                inst, partial, "dynamic-slice keeps its operand tiled on sliced dims: masked "
                "local windows, summed", (source,)))
        return candidates

    def lower(self, inst, ctx: LowerContext):
        tiling, tiled = _tiled_sliced_dims(inst, ctx)
        if tiled:
            return _masked_slice(inst, ctx, tiling, tiled)
        local = clone(inst, ctx, _local_operands(inst, ctx))
        local.attrs["dynamic_slice_sizes"] = tuple(local.shape.dims)
        return local


@PARTITION_RULES.register("dynamic-update-slice", instance=True)
class DynamicUpdateSliceRule(_KeptDimsRule):
    def candidates(self, inst, ctx):
        candidates = super().candidates(inst, ctx)
        rank = inst.shape.rank
        sliced = [d for d in range(rank) if d not in _kept_dims(inst)]
        # the operand's tiling first, the result's last: on a tie of bytes the operand stays,
        # and the result's tiling wins only where it moves fewer
        source = inst.operands[0].sharding
        tilings = [(source, "its operand tiled")] + [
            (target, "the result's tiling") for target in inst.sharding.leaf_shardings(inst.shape)]
        seen = set()
        for sharding, whose in tilings:
            if not sharding.is_tiled or sharding != without_partials(sharding):
                continue
            tiling = ctx.tiling(sharding, rank)
            if tiling.sharding in seen or not any(tiling.counts[d] > 1 for d in sliced):
                continue
            seen.add(tiling.sharding)
            on_update = algebra.partially_replicate_on_dims(tiling.sharding, sliced)
            plan = self.plan_for(
                inst, tiling.sharding, f"dynamic-update-slice keeps {whose} on sliced dims: "
                "each partition writes the part of the update in its range",
                (tiling.sharding, on_update))
            if sharding is source:
                candidates.insert(0, plan)
            else:
                candidates.append(plan)
        return candidates

    def lower(self, inst, ctx: LowerContext):
        tiling, tiled = _tiled_sliced_dims(inst, ctx)
        if not tiled:
            return clone(inst, ctx, _local_operands(inst, ctx))
        return _masked_update(inst, ctx, tiling, tiled)


def _tiled_sliced_dims(inst: Instruction, ctx: LowerContext) -> tuple[Tiling | None, list[int]]:
    """The (planned) tiling of `inst`'s operand and the dims it slices that this tiling tiles."""
    operand = inst.operands[0]
    if not operand.sharding.is_tiled:
        return None, []
    tiling = Tiling(operand.sharding, operand.shape.rank, ctx.num_devices)
    kept = _kept_dims(inst)
    return tiling, [d for d in range(operand.shape.rank)
                    if d not in kept and tiling.counts[d] > 1]


def _top_k_of_shards(inst: Instruction, ctx: LowerContext, tiling: Tiling) -> Instruction:
    """The TopK of an operand tiled on its last dim (see `TopKRule`)."""
    b = ctx.builder
    (x,) = ctx.operands(inst)
    dims = inst.operands[0].shape.dims
    last = len(dims) - 1
    values_type = inst.shape.elements[0].element_type
    index_type = inst.shape.elements[1].element_type
    k = inst.shape.elements[0].dims[-1]
    largest = inst.opcode != "topk" or bool(inst.attr("largest", True))
    offset = ctx.tables.offsets(tiling, dims)[last]
    local = x.shape.dims
    position = b.binary("add", b.iota("s32", local, last), b.broadcast(offset, local))
    if dims[last] % tiling.counts[last]:
        inside = b.compare(position, b.broadcast(b.constant(dims[last], "s32"), local), "LT")
        worst = b.broadcast(b.constant(_worst(values_type, largest), values_type), local)
        x = b.select(inside, x, worst)
    batch = local[:-1]
    shard_top = _top_k(b, inst, x, batch + (k,), "top")
    values = b.add("get-tuple-element", shard_top.shape.elements[0], [shard_top], {"index": 0})
    indices = b.add("get-tuple-element", shard_top.shape.elements[1], [shard_top], {"index": 1})
    indices = b.binary("add", indices, b.broadcast(b.convert(offset, index_type), indices.shape.dims))
    _, groups = algebra.gather_tiles(tiling.sharding, last, tiling.counts[last], tiling.rank,
                                     tiling.num_devices)
    values = b.all_gather(values, last, groups, ctx.channels())
    indices = b.all_gather(indices, last, groups, ctx.channels())
    final = _top_k(b, inst, values, batch + (k,), "top.candidates")
    best_values = b.add("get-tuple-element", final.shape.elements[0], [final], {"index": 0})
    best = b.add("get-tuple-element", final.shape.elements[1], [final], {"index": 1})
    starts = b.reshape(best, best.shape.dims + (1,))
    rank = len(dims)
    picked = b.add("gather", indices.shape.with_dims(batch + (k,)), [indices, starts], {
        "offset_dims": (), "collapsed_slice_dims": (last,), "start_index_map": (last,),
        "operand_batching_dims": tuple(range(last)),
        "start_indices_batching_dims": tuple(range(last)), "index_vector_dim": rank,
        "slice_sizes": (1,) * rank})
    attrs = {"metadata": inst.attrs["metadata"]} if "metadata" in inst.attrs else {}
    return b.append(Instruction(inst.name, "tuple", TupleShape((best_values.shape,
                                                                picked.shape)),
                                [best_values, picked], attrs, sharding=inst.sharding))


def _top_k(b, inst: Instruction, x: Instruction, dims, name: str) -> Instruction:
    """`inst`'s TopK (same opcode and attributes) applied to `x`, with result dims `dims`."""
    shape = TupleShape((x.shape.with_dims(dims),
                        inst.shape.elements[1].with_dims(dims)))
    attrs = {k: v for k, v in inst.attrs.items() if k not in ("metadata", "sharding")}
    return b.add(inst.opcode, shape, [x], attrs, name=f"{inst.name}.{name}")


def _worst(element_type: str, largest: bool):
    """The value TopK ranks last: the lowest (largest=true) or highest value of the type."""
    dtype = dtypes.numpy_dtype(element_type)
    if dtype.kind == "f" or element_type == "bf16":
        return -np.inf if largest else np.inf
    info = np.iinfo(dtype)
    return info.min if largest else info.max


#: start index types an `s32` cannot hold every value of
_WIDE_STARTS = frozenset({"u32", "u64", "s64"})


def s32_starts(b, starts: list[Instruction], dims, sizes) -> list[Instruction]:
    """The local start indices `starts` of a window of `sizes` in an array of `dims` as `s32`
    (the local index arithmetic's type). A start of a type an `s32` cannot hold (`u32`, `u64`,
    `s64`) is first clamped to `[0, dim - size]` in its own type, as HLO clamps it: converted
    first, a `u32` start of 2^31 or more would turn negative and clamp to 0 instead of to the
    end."""
    result = []
    for start, n, size in zip(starts, dims, sizes):
        element_type = start.shape.element_type
        if element_type in _WIDE_STARTS:
            start = b.binary("minimum", start, b.constant(n - size, element_type))
            if element_type == "s64":
                start = b.binary("maximum", start, b.constant(0, element_type))
        result.append(b.convert(start, "s32"))
    return result


def _masked_slice(inst: Instruction, ctx: LowerContext, tiling: Tiling,
                  tiled: list[int]) -> Instruction:
    """This partition's addend of a dynamic-slice of an operand tiled on the sliced dims
    `tiled`: the window over its own range, zero elsewhere (see the module docstring)."""
    local_operand, *starts = _local_operands(inst, ctx)
    starts = s32_starts(ctx.builder, starts, inst.operands[0].shape.dims,
                        inst.attr("dynamic_slice_sizes"))
    return masked_window(inst, ctx, local_operand, starts, inst.attr("dynamic_slice_sizes"),
                         tiling, tiled)


def masked_window(inst: Instruction, ctx: LowerContext, local_operand: Instruction,
                  starts: list[Instruction], sizes, tiling: Tiling,
                  tiled: list[int]) -> Instruction:
    """The window `[starts, starts + sizes)` of the global operand of `inst` (tiled by
    `tiling`; `local_operand` is this partition's shard) as this partition's addend: on the
    tiled dims `tiled` the elements of its own range, zero elsewhere, so that the sum over the
    partitions of those tiles is the window. Starts are s32 scalars, clamped into range as
    dynamic-slice does. The result keeps `inst`'s name and (partial) sharding."""
    b = ctx.builder
    dims = inst.operands[0].shape.dims
    shard = tiling.shard_dims(dims)
    offsets = ctx.tables.offsets(tiling, dims)
    zero = b.constant(0, "s32")
    clamped = _clamped_starts(b, zero, starts, dims, sizes, tiled)
    local = local_operand.shape
    padded = b.add("pad", local.with_dims([n + 2 * sizes[d] if d in tiled else n
                                           for d, n in enumerate(local.dims)]),
                   [local_operand, b.zero(local.element_type)],
                   {"padding": tuple(PadDim(sizes[d], sizes[d]) if d in tiled else PadDim(0, 0)
                                     for d in range(len(dims)))})
    window_starts, window_sizes = [], []
    for d, n in enumerate(local.dims):
        if d in tiled:
            relative = b.binary("subtract", clamped[d], offsets[d])
            window_starts.append(b.binary("add", relative, b.constant(sizes[d], "s32")))
            window_sizes.append(sizes[d])
        elif sizes[d] == dims[d]:
            window_starts.append(zero)
            window_sizes.append(n)
        else:
            window_starts.append(starts[d])
            window_sizes.append(sizes[d])
    window = b.dynamic_slice(padded, window_starts, window_sizes)
    dims_of_window = window.shape.dims
    mask = _inside(b, dims_of_window, tiled, clamped, offsets, shard)
    fill = b.broadcast(b.zero(local.element_type), dims_of_window)
    return _select_as(inst, b, mask, window, fill)


def _clamped_starts(b, zero: Instruction, starts: list[Instruction], dims, sizes,
                    tiled: list[int]) -> dict[int, Instruction]:
    """The starts of the dims `tiled`, clamped into `[0, dim - size]` as dynamic-slice and
    dynamic-update-slice clamp them (`zero`: an s32 0)."""
    return {d: b.add("clamp", ArrayShape("s32", ()),
                     [zero, starts[d], b.constant(dims[d] - sizes[d], "s32")])
            for d in tiled}


def _inside(b, dims, tiled: list[int], position: dict, start: dict, size) -> Instruction:
    """`pred[dims]`: true where, on every dim d of `tiled`, the global index `position[d] +
    iota` lies in `[start[d], start[d] + size[d])` (`position`, `start`: s32 scalars)."""
    mask = None
    for d in tiled:
        index = b.binary("add", b.iota("s32", dims, d), b.broadcast(position[d], dims))
        low = b.broadcast(start[d], dims)
        high = b.broadcast(b.binary("add", start[d], b.constant(size[d], "s32")), dims)
        inside = b.add("and", ArrayShape("pred", dims),
                       [b.compare(index, low, "GE"), b.compare(index, high, "LT")])
        mask = inside if mask is None else b.add("and", inside.shape, [mask, inside])
    return mask


def _select_as(inst: Instruction, b, mask: Instruction, on_true: Instruction,
               on_false: Instruction) -> Instruction:
    """`select(mask, on_true, on_false)` standing for `inst`: its name, metadata and sharding."""
    attrs = {"metadata": inst.attrs["metadata"]} if "metadata" in inst.attrs else {}
    shape = on_true.shape
    return b.append(Instruction(inst.name, "select", shape.with_dims(shape.dims),
                                [mask, on_true, on_false], attrs, sharding=inst.sharding))


def _masked_update(inst: Instruction, ctx: LowerContext, tiling: Tiling,
                   tiled: list[int]) -> Instruction:
    """The local dynamic-update-slice of an operand tiled on the sliced dims `tiled` (see the
    module docstring)."""
    b = ctx.builder
    local_operand, local_update, *starts = _local_operands(inst, ctx)
    operand_dims = inst.operands[0].shape.dims
    update_dims = inst.operands[1].shape.dims
    shard = tiling.shard_dims(operand_dims)
    offsets = ctx.tables.offsets(tiling, operand_dims)
    starts = s32_starts(b, starts, operand_dims, update_dims)
    zero = b.constant(0, "s32")
    clamped = _clamped_starts(b, zero, starts, operand_dims, update_dims, tiled)
    padding = tuple(PadDim(shard[d], shard[d]) if d in tiled else PadDim(0, 0)
                    for d in range(len(operand_dims)))
    padded_dims = [n + 2 * shard[d] if d in tiled else n
                   for d, n in enumerate(local_update.shape.dims)]
    padded = b.add("pad", local_update.shape.with_dims(padded_dims),
                   [local_update, b.zero(local_update.shape.element_type)],
                   {"padding": padding})
    window_starts, window_sizes = [], []
    for d, n in enumerate(local_update.shape.dims):
        if d in tiled:
            relative = b.binary("subtract", offsets[d], clamped[d])
            window_starts.append(b.binary("add", relative, b.constant(shard[d], "s32")))
            window_sizes.append(shard[d])
        else:
            window_starts.append(zero)
            window_sizes.append(n)
    window = b.dynamic_slice(padded, window_starts, window_sizes)
    update_starts = [zero if d in tiled else s for d, s in enumerate(starts)]
    local_shape = local_operand.shape
    written = b.add("dynamic-update-slice", local_shape.with_dims(local_shape.dims),
                    [local_operand, window, *update_starts])
    mask = _inside(b, local_shape.dims, tiled, offsets, clamped, update_dims)
    return _select_as(inst, b, mask, written, local_operand)


__all__ = ["SortRule", "TopKRule", "DynamicSliceRule", "DynamicUpdateSliceRule", "masked_window"]
