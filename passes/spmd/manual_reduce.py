"""`reduce` inside a partially manual region (docs/design/partitioning.md#manual-regions):
partitioned inside every manual group as an ordinary reduce of the group's tiled value.

Every manual group holds an ordinary tiled value (the manual dim read as replication, its *auto
equivalent*), so the reduce's candidates are those of an ordinary reduce, each kept inside the
groups:

1. inputs in the result's tiling with the reduced dims untiled: a purely local reduce;
2. inputs kept in the first input's tiling, when it divides the reduced dims evenly: a local
   reduce, and where a reduced dim is tiled, its partial results combined over the devices
   holding the other tiles of the reduced dims (the same manual group, since they differ only
   in those data tiles): a single-output reduce all-reduces them with its own computation, a
   variadic one (arg-max: values with indices) all-gathers each partial leaf along a new
   leading dim and reduces that dim again (`op_rules_reduce.combine_partials`). The result is
   the input's sharding with the reduced dims' tiles folded into replication;
3. every group's whole operands (the fallback of any pure op in such a region).

Init values are manual scalars used as they are, or replicated. The combine's collectives are
checked to stay inside the manual groups.
"""
from __future__ import annotations

from math import prod

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding

from .manual_groups import (
    auto_equivalent, check_within_groups, is_partially_manual, same_manual_groups,
)
from .op_rules import LowerContext, OpPlan, PlanContext, clone, has_manual_leaf, replicated_for
from .op_rules_reduce import combine_partials, partial_result_bytes


def reduce_plans(inst: Instruction, ctx: PlanContext, fallback: OpPlan) -> OpPlan:
    """The cheapest of the candidates of the module docstring for a `reduce` whose result
    sharding is partially manual (`fallback`: the whole-operands plan)."""
    count = len(inst.operands) // 2
    inputs, inits = inst.operands[:count], inst.operands[count:]
    dims = sorted(inst.attr("dimensions"))
    leaf = inst.sharding.leaf_shardings(inst.shape)[0]
    init_needs = tuple(o.sharding if has_manual_leaf(o.sharding) else replicated_for(o.shape)
                       for o in inits)

    def plan(input_sharding, result, reason, cost=0.0):
        whole = HloSharding.tuple([result] * count) if count > 1 else result
        return OpPlan((input_sharding,) * count + init_needs, whole, reason, cost)

    candidates = []
    if is_partially_manual(leaf) and len(set(inst.sharding.leaves())) == 1:
        candidates.append(plan(algebra.insert_dims(leaf, dims), leaf,
                               "partially manual region: reduce input takes the result's tiling"))
    source = inputs[0].sharding
    if same_manual_groups(source, leaf) and not any(s.has_unreduced for s in source.leaves()):
        counts = source.tile_counts
        tiled = [d for d in dims if counts[d] > 1]
        if all(inputs[0].shape.dims[d] % counts[d] == 0 for d in tiled):
            result = algebra.remove_dims(algebra.partially_replicate_on_dims(source, tiled), dims)
            candidates.append(plan(source, result,
                                   "partially manual region: reduce keeps its input's tiling",
                                   _combine_bytes(inst, result, prod(counts[d] for d in tiled))))
    return ctx.choose(inst, candidates + [fallback])


def _combine_bytes(inst: Instruction, result: HloSharding, tiles: int) -> float:
    """Bytes per device of combining `tiles` partial results: a ring all-reduce of a
    single-output reduce's, `tiles - 1` gathered partials of a variadic one's."""
    if tiles == 1:
        return 0.0
    local = partial_result_bytes(inst, result)
    if len(inst.operands) == 2:
        return 2.0 * (tiles - 1) / tiles * local
    return float((tiles - 1) * local)


def lower_reduce(inst: Instruction, ctx: LowerContext) -> Instruction:
    """The local reduce; where the input's reduced dims are tiled, its partial results combined
    inside the manual groups (the module docstring's second candidate)."""
    count = len(inst.operands) // 2
    source = inst.operands[0].sharding
    dims = sorted(inst.attr("dimensions"))
    if not is_partially_manual(source) or \
            not any(source.tile_counts[d] > 1 for d in dims):
        return clone(inst, ctx)
    tiled = [d for d in dims if source.tile_counts[d] > 1]
    rank = inst.operands[0].shape.rank
    groups = algebra.partial_groups(algebra.unreduce_on_dims(auto_equivalent(source), tiled),
                                    rank, ctx.num_devices)
    mark = len(ctx.builder.instructions)
    if count > 1:
        local = combine_partials(inst, ctx, groups)
    else:
        b = ctx.builder
        partial = clone(inst, ctx)
        partial.name = b.names(f"{inst.name}.partial")
        local = b.all_reduce(partial, groups, inst.attrs["to_apply"].name, ctx.channels())
        local.name, local.sharding = inst.name, inst.sharding
    check_within_groups(ctx.builder.instructions[mark:], source, inst.name)
    return local


__all__ = ["reduce_plans", "lower_reduce"]
