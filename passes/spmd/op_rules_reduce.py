"""Partitioning of `reduce` (docs/design/partitioning.md#reduce).

Candidates, chosen by bytes moved:

1. inputs in the result's tiling with the reduced dims untiled: a purely local reduce;
2. inputs kept as they are (the first input's sharding for all): a local reduce whose result is
   a *partial* value wherever a reduced dim is tiled — its tiles become the `unreduced` subgroup
   of the result sharding, and the reshard to the annotated sharding combines them with the
   reduce's own computation (an all-reduce, or a reduce-scatter when the annotated sharding tiles
   a dim by the same devices). Variadic reduces (arg-max, arg-min: values with their indices and
   a comparator) cannot combine partial tuples with an all-reduce; their local reduce leaves one
   partial tuple per tile of the reduced dims, and the lowering combines those itself: each
   partial leaf gets a new leading dim of 1, is all-gathered along it over the devices holding
   the other tiles (in tile order), and a second local reduce over that dim with the same
   computation and init values gives the result. That moves `tiles - 1` partial results per
   device (the reduced dims' size is gone), far less than gathering the reduced dims; the
   indices operand is tiled like the values, so its shards hold global indices (an `iota` is
   lowered with its partition's offset) and ties resolve as in the unpartitioned reduce;
3. everything replicated.

Init values are always replicated. The partitioned input's padding on reduced dims is masked
with the init value by the pad-uneven pass (every input of a variadic reduce with its own init).
"""
from __future__ import annotations

from math import prod

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding

from .op_rules import (
    LowerContext, OpPlan, PartitionRule, clone, without_partials,
)
from .tiling import Tiling


@PARTITION_RULES.register("reduce", instance=True)
class ReduceRule(PartitionRule):
    def plan(self, inst, ctx):
        count = len(inst.operands) // 2
        inputs = inst.operands[:count]
        dims = sorted(inst.attr("dimensions"))
        rank = inputs[0].shape.rank
        replicated = HloSharding.replicate()
        leaf = inst.sharding.leaf_shardings(inst.shape)[0]
        target = without_partials(leaf)

        def plan(input_sharding, result, reason):
            if count > 1:
                result = HloSharding.tuple([result] * count)
            return OpPlan((input_sharding,) * count + (replicated,) * count, result, reason)

        if target.kind == "maximal":
            whole = HloSharding.tuple([target] * count) if count > 1 else target
            return OpPlan((target,) * (2 * count), whole, "reduce on one device")
        candidates = [plan(algebra.insert_dims(ctx.tiling(target, rank - len(dims)).sharding, dims),
                           target, "reduce input takes the result's tiling")]
        source = inputs[0].sharding
        if source.kind in ("tiled", "replicated") and source == without_partials(source):
            tiling = ctx.tiling(source, rank)
            if count > 1:
                result = algebra.remove_dims(
                    algebra.partially_replicate_on_dims(tiling.sharding, dims), dims)
                tiles = prod(tiling.counts[d] for d in dims)
                reason = "variadic reduce combines its partial results by an all-gather" \
                    if tiles > 1 else "reduce keeps its input's tiling"
                candidates.append(plan(source, result, reason)._replace(
                    cost=(tiles - 1) * partial_result_bytes(inst, result)))
            else:
                partial = algebra.remove_dims(algebra.unreduce_on_dims(tiling.sharding, dims),
                                              dims)
                candidates.append(plan(source, partial,
                                       "reduce keeps its input's tiling"))
        candidates.append(plan(replicated, replicated, "reduce runs replicated"))
        # on a tie of the busiest device, the fewest bytes over all devices: a partial scalar
        # all-reduced over 3 tiles sends 8 B from one device and 4 B from the others, the
        # gather of its 3 one-element shards 8 B from each
        return ctx.choose(inst, candidates, totals=True)

    def lower(self, inst, ctx: LowerContext):
        count = len(inst.operands) // 2
        source = inst.operands[0]
        dims = sorted(inst.attr("dimensions"))
        tiled = []
        if count > 1 and source.sharding.is_tiled:
            tiling = Tiling(source.sharding, source.shape.rank, ctx.num_devices)
            tiled = [d for d in dims if tiling.counts[d] > 1]
        if not tiled:
            return clone(inst, ctx)
        groups = algebra.partial_groups(algebra.unreduce_on_dims(tiling.sharding, tiled),
                                        tiling.rank, tiling.num_devices)
        return combine_partials(inst, ctx, groups)


def partial_result_bytes(inst: Instruction, result: HloSharding) -> float:
    """Bytes per device of one local result of the reduce `inst` whose every leaf is laid out
    in `result` (a variadic reduce combining its partial results gathers `tiles - 1` of
    them)."""
    return float(sum(dtypes.byte_width(leaf.element_type) * prod(result.shard_shape(leaf).dims)
                     for leaf in inst.shape.leaves()))


def combine_partials(inst: Instruction, ctx: LowerContext, groups) -> Instruction:
    """A variadic reduce's local reduce, its partial results combined over the rows of
    `groups` (the devices holding the other tiles of its reduced dims, in tile order): each
    partial leaf gets a new leading dim of 1, is all-gathered along it, and a second reduce over
    that dim with the same computation and init values gives `inst`'s local result."""
    count = len(inst.operands) // 2
    b = ctx.builder
    partial = clone(inst, ctx)
    partial.name = b.names(f"{inst.name}.partial")
    gathered = []
    for i, leaf in enumerate(partial.shape.elements):
        element = b.add("get-tuple-element", leaf, [partial], {"index": i})
        element = b.reshape(element, (1,) + leaf.dims)
        gathered.append(b.all_gather(element, 0, groups, ctx.channels()))
    inits = ctx.operands(inst)[count:]
    return b.append(Instruction(inst.name, "reduce", partial.shape, gathered + inits,
                                {**inst.attrs, "dimensions": (0,)}, sharding=inst.sharding))


__all__ = ["ReduceRule", "combine_partials", "partial_result_bytes"]
