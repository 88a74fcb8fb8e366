"""Partitioning of `gather` (reference §4.7.6).

A gather's output dims are *batch* dims (one per indices dim but `index_vector_dim`, in order) and
*offset* dims (one per operand window dim — not collapsed, not a batching dim — in order). The
strategies tile an *extended* index space: the output dims plus one extra dim per *indexed*
operand dim (a dim of `start_index_map` with slice size 1 that is not a batching dim). From a
tiling `E` of that space,

- the operand takes `E`'s tiles of the output offset dims on its *pass-through* window dims
  (slice size = the whole dim: operand pass-through), of the output batch dims on its batching
  dims (explicit batch), and of the extra dims on its indexed dims (trivially sliced operand);
- the indices take `E`'s tiles of the output batch dims on their own dims (index pass-through),
  replicated over the rest;
- the local result is `E` with the extra dims' tiles as partial values (an `unreduced` subgroup).

Locally, the start indices are clamped globally as HLO does (`[0, S_d - slice_d]`), shifted by the
partition's offset on each tiled indexed dim, and gathered from the local operand (slice sizes of
tiled pass-through dims become the shard size); results whose index fell outside the partition's
range are zeroed, so the reshard to the annotated sharding sums them (an all-reduce or
reduce-scatter over the operand's index tiles) into the one real value. Padding of uneven indexed
dims is never read (clamped indices stay below `S_d`).

Candidates (fewest bytes wins, first on ties): the annotated result's tiling with the operand's
tiles of its indexed dims, the annotated result's tiling alone, the operand's tiling carried
through, the indices' tiling with the operand's indexed tiles, the indices' tiling alone, and
everything replicated. A candidate whose device groups do not combine into one tiling is skipped.
`pred` gathers do not use partial values (no sum), so their indexed dims are gathered.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from gspmdc.ir.attributes import SliceDim
from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.sharding import HloSharding

from .op_rules import LowerContext, OpPlan, OpRule, clone, op_rule, without_partials
from .tiling import Tiling, cdiv


def tiling_from_coordinates(coords: np.ndarray, counts: tuple[int, ...]) -> Tiling | None:
    """The tiling in which device `k` holds tile `coords[k]` (`[N, rank]`, each within `counts`),
    devices of one tile being replicas (by device id); None unless every tile has the same
    number of devices."""
    n = coords.shape[0]
    tiles = prod(counts)
    if n % tiles:
        return None
    keys = np.ravel_multi_index(tuple(coords.T), counts) if counts else np.zeros(n, np.int64)
    if not np.array_equal(np.bincount(keys, minlength=tiles), np.full(tiles, n // tiles)):
        return None
    order = np.lexsort((np.arange(n), keys))
    return Tiling(order.reshape(tuple(counts) + (1, n // tiles)))


@dataclass(frozen=True)
class GatherDims:
    """How a gather's output dims, extra (indexed) dims, operand dims and indices dims relate."""

    output_rank: int
    operand_rank: int
    indices_rank: int
    index_vector_dim: int
    #: per extended dim (output dims, then one per indexed operand dim): the operand dim it maps
    #: to (-1: none) and the indices dim it maps to (-1: none)
    to_operand: tuple[int, ...]
    to_indices: tuple[int, ...]
    #: the operand dims addressed with slice size 1 (the extra dims, in order)
    indexed: tuple[int, ...]
    #: the output batch dims, in order (one per indices dim but index_vector_dim)
    batch: tuple[int, ...]

    @classmethod
    def of(cls, inst: Instruction) -> "GatherDims":
        operand, indices = inst.operands[0].shape, inst.operands[1].shape
        rank = inst.shape.rank
        ivd = inst.attr("index_vector_dim")
        offset_dims = sorted(inst.attr("offset_dims", ()))
        collapsed = set(inst.attr("collapsed_slice_dims", ()))
        op_batching = list(inst.attr("operand_batching_dims", ()))
        idx_batching = list(inst.attr("start_indices_batching_dims", ()))
        start_map = list(inst.attr("start_index_map", ()))
        sizes = inst.attr("slice_sizes")
        window = [d for d in range(operand.rank) if d not in collapsed and d not in op_batching]
        batch = [d for d in range(rank) if d not in offset_dims]
        indices_dims = [d for d in range(indices.rank) if d != ivd]
        to_operand, to_indices = [-1] * rank, [-1] * rank
        for out, w in zip(offset_dims, window):
            if sizes[w] == operand.dims[w]:
                to_operand[out] = w
        for out, i in zip(batch, indices_dims):
            to_indices[out] = i
            if i in idx_batching:
                to_operand[out] = op_batching[idx_batching.index(i)]
        indexed = tuple(d for d in start_map if sizes[d] == 1 and d not in op_batching
                        and operand.dims[d] > 1)
        if inst.shape.element_type == "pred":
            indexed = ()
        return cls(rank, operand.rank, indices.rank, ivd, tuple(to_operand) + indexed,
                   tuple(to_indices) + (-1,) * len(indexed), indexed, tuple(batch))

    @property
    def extra(self) -> list[int]:
        return list(range(self.output_rank, len(self.to_operand)))


@op_rule("gather")
class GatherRule(OpRule):
    def plan(self, inst, ctx):
        dims = GatherDims.of(inst)
        target = without_partials(inst.sharding)
        if target.kind == "maximal":
            return OpPlan((target, target), target, "gather on one device")
        n = ctx.num_devices
        operand, indices = inst.operands
        width = len(dims.to_operand)

        def coords_from(sharding, rank, mapping):
            """Per device, its tile index on each extended dim that `mapping` (extended dim ->
            dim of the value, -1: none) takes from `sharding`; counts alike."""
            coords = np.zeros((n, width), np.int64)
            counts = [1] * width
            if not sharding.is_tiled or sharding != without_partials(sharding):
                return coords, counts
            tiling = ctx.tiling(sharding, rank)
            table = tiling.coordinates()
            for e, d in enumerate(mapping):
                if d >= 0 and tiling.counts[d] > 1:
                    coords[:, e], counts[e] = table[:, d], tiling.counts[d]
            return coords, counts

        def merge(*parts):
            coords = np.zeros((n, width), np.int64)
            counts = [1] * width
            for part_coords, part_counts, dims_taken in parts:
                for e in dims_taken:
                    coords[:, e], counts[e] = part_coords[:, e], part_counts[e]
            return coords, counts

        output = list(range(dims.output_rank))
        legal = [e for e in output if dims.to_operand[e] >= 0 or dims.to_indices[e] >= 0]
        from_target = coords_from(target, dims.output_rank,
                                  [e if e in legal else -1 for e in output])
        from_operand = coords_from(operand.sharding, operand.shape.rank, dims.to_operand)
        from_indices = coords_from(indices.sharding, indices.shape.rank, dims.to_indices)
        extra = dims.extra
        sources = [
            ((from_target, output), (from_operand, extra), "the result's tiling, the operand's "
             "index tiles (masked local gathers summed)"),
            ((from_target, output), "gather keeps the result's tiling"),
            ((from_operand, output + extra), "gather keeps its operand's tiling"),
            ((from_indices, output), (from_operand, extra), "the indices' tiling, the operand's "
             "index tiles (masked local gathers summed)"),
            ((from_indices, output), "gather keeps its indices' tiling"),
        ]
        candidates = []
        for *parts, reason in sources:
            coords, counts = merge(*((c, k, taken) for (c, k), taken in parts))
            tiling = tiling_from_coordinates(coords, tuple(counts))
            if tiling is not None:
                candidates.append(self._plan(dims, tiling, operand, indices, reason))
        replicated = HloSharding.replicate()
        candidates.append(OpPlan((replicated, replicated), replicated, "gather runs replicated"))
        return ctx.choose(inst, candidates)

    @staticmethod
    def _plan(dims: GatherDims, extended: Tiling, operand, indices, reason) -> OpPlan:
        on_operand = extended.remap(dims.to_operand, dims.operand_rank).to_sharding()
        on_indices = extended.remap(dims.to_indices, dims.indices_rank).to_sharding()
        result = extended.fold_dims(dims.extra, "unreduced").remove_dims(dims.extra)
        return OpPlan((on_operand, on_indices), result.to_sharding(), reason)

    def lower(self, inst, ctx: LowerContext):
        operand, indices = inst.operands
        local_operand, local_indices = ctx.operands(inst)
        dims = GatherDims.of(inst)
        tiling = Tiling.from_sharding(operand.sharding, operand.shape.rank, ctx.num_devices) \
            if operand.sharding.is_tiled else None
        tiled_indexed = [d for d in dims.indexed if tiling is not None and tiling.counts[d] > 1]
        new_indices = local_indices
        valid = None
        if tiled_indexed:
            new_indices, valid = _shift_indices(inst, ctx, local_indices, tiling, tiled_indexed)
        local = clone(inst, ctx, [local_operand, new_indices])
        sizes = list(inst.attr("slice_sizes"))
        for d, size in enumerate(sizes):
            if size == operand.shape.dims[d]:
                sizes[d] = local_operand.shape.dims[d]
        local.attrs["slice_sizes"] = tuple(sizes)
        if valid is None:
            return local
        b = ctx.builder
        local.name = b.names(f"{inst.name}.local")
        mask = b.add("broadcast", ArrayShape("pred", local.shape.dims), [valid],
                     {"dimensions": dims.batch})
        zero = b.broadcast(b.zero(inst.shape.element_type), local.shape.dims)
        return b.append(Instruction(inst.name, "select", local.shape, [mask, local, zero],
                                    {"metadata": inst.attrs["metadata"]}
                                    if "metadata" in inst.attrs else {},
                                    sharding=inst.sharding))


def _shift_indices(inst, ctx: LowerContext, indices: Instruction, tiling: Tiling,
                   tiled: list[int]) -> tuple[Instruction, Instruction]:
    """The local start indices (clamped as HLO does, minus this partition's offset on the tiled
    indexed dims `tiled`) and `pred[batch dims]`: whether every tiled indexed component falls in
    this partition's range."""
    b = ctx.builder
    operand = inst.operands[0].shape
    ivd = inst.attr("index_vector_dim")
    start_map = list(inst.attr("start_index_map"))
    sizes = inst.attr("slice_sizes")
    index_type = indices.shape.element_type
    batch_dims = indices.shape.dims
    if ivd == indices.shape.rank:
        indices = b.reshape(indices, batch_dims + (1,))
    else:
        batch_dims = batch_dims[:ivd] + batch_dims[ivd + 1:]
    shape = indices.shape
    high = b.broadcast(b.constant([operand.dims[d] - sizes[d] for d in start_map], index_type),
                       shape.dims, (ivd,))
    low = b.broadcast(b.zero(index_type), shape.dims)
    clamped = b.add("clamp", shape, [low, indices, high])
    offsets = ctx.tables.offsets(tiling, operand.dims)
    vector = b.add("concatenate", ArrayShape("s32", (len(start_map),)),
                   [b.reshape(offsets[d], (1,)) for d in start_map], {"dimensions": (0,)})
    shifted = b.binary("subtract", clamped,
                       b.broadcast(b.convert(vector, index_type), shape.dims, (ivd,)))
    shard = tiling.shard_dims(operand.dims)
    valid = None
    component_dims = shape.dims[:ivd] + (1,) + shape.dims[ivd + 1:]
    for d in tiled:
        c = start_map.index(d)
        limits = [(0, n) if k != ivd else (c, c + 1) for k, n in enumerate(shape.dims)]
        component = b.add("slice", shape.with_dims(component_dims), [shifted],
                          {"slice": tuple(SliceDim(lo, hi) for lo, hi in limits)})
        component = b.reshape(component, batch_dims)
        zero = b.broadcast(b.zero(index_type), batch_dims)
        size = b.broadcast(b.constant(shard[d], index_type), batch_dims)
        inside = b.add("and", ArrayShape("pred", batch_dims),
                       [b.compare(component, zero, "GE"), b.compare(component, size, "LT")])
        valid = inside if valid is None else b.add("and", inside.shape, [valid, inside])
    return shifted, valid


__all__ = ["GatherRule", "GatherDims", "tiling_from_coordinates"]
