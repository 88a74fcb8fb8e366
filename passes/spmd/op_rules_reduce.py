"""Partitioning of `reduce` (reference §4.7.3).

Candidates, chosen by bytes moved:

1. inputs in the result's tiling with the reduced dims untiled: a purely local reduce;
2. inputs kept as they are (the first input's sharding for all): a local reduce whose result is
   a *partial* value wherever a reduced dim is tiled — its tiles become the `unreduced` subgroup
   of the result sharding, and the reshard to the annotated sharding combines them with the
   reduce's own computation (an all-reduce, or a reduce-scatter when the annotated sharding tiles
   a dim by the same devices). Variadic reduces cannot combine partial tuples that way; they
   gather the reduced dims instead;
3. everything replicated.

Init values are always replicated. The partitioned input's padding on reduced dims is masked
with the init value by the pad-uneven pass.
"""
from __future__ import annotations

from gspmdc.ir.sharding import HloSharding

from .op_rules import OpPlan, OpRule, op_rule, without_partials


@op_rule("reduce")
class ReduceRule(OpRule):
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
            return OpPlan((target,) * (2 * count), inst.sharding, "reduce on one device")
        candidates = [plan(ctx.tiling(target, rank - len(dims)).insert_dims(dims).to_sharding(),
                           target, "reduce input takes the result's tiling")]
        source = inputs[0].sharding
        if source.kind in ("tiled", "replicated") and source == without_partials(source):
            tiling = ctx.tiling(source, rank)
            if count > 1:
                gathered = tiling.fold_dims(dims, "replicated")
                candidates.append(plan(gathered.to_sharding(),
                                       gathered.remove_dims(dims).to_sharding(),
                                       "variadic reduce gathers its reduced dims"))
            else:
                partial = tiling.fold_dims(dims, "unreduced").remove_dims(dims)
                candidates.append(plan(source, partial.to_sharding(),
                                       "reduce keeps its input's tiling"))
        candidates.append(plan(replicated, replicated, "reduce runs replicated"))
        return ctx.choose(inst, candidates)


__all__ = ["ReduceRule"]
