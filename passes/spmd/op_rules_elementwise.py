"""Partitioning of elementwise ops (docs/design/partitioning.md#per-op-rules): the catalogue's
`ELEMENTWISE` but `rng`
(which has its own rule): `copy`, `convert`, `compare`, `select`, `clamp`, every unary and binary
arithmetic/logical op, `map`, and `bitcast-convert` between types of one width (one that changes the width changes the rank and runs replicated), and a
cross-replica `all-reduce` of one array (no `channel_id`: it combines the values of the same
partition on every replica, so it is elementwise across partitions, as in XLA's HandleAllReduce;
with one replica it returns its operand). An all-reduce with a `channel_id` talks across
partitions: outside a manual region it runs replicated, on every partition's copy of its
operand, unchanged (XLA's HandleAllReduce); any other sharding of it is refused. The
memory-placement custom-calls (`MoveToHost`, `MoveToDevice`, `PinToDevice`) pass their one
operand through unchanged and are partitioned the same way (XLA's partitioner computes them in
the result's sharding or their operand's, both candidates here; before, they ran on a
replicated operand).

The op runs on equally sharded operands and produces that sharding; padding stays padding (its
values are unspecified and never read as data). Candidates: the annotated result sharding, and
each operand's own sharding (computing there, then resharding the result, is cheaper when most
operands already agree), the one moving the fewest bytes from the busiest device, then in all
(the cost model's measure: docs/design/cost-model.md#a-programs-bytes), then the first. Scalar
operands of a non-scalar op (`clamp`'s bounds) are replicated.
A linear op (`LINEAR`) also runs on partial sums: every operand in the result's unreduced
sharding or the first operand's, the result keeping it.
"""
from __future__ import annotations

from gspmdc.errors import UnsupportedError
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.custom_call_targets import PLACEMENT
from gspmdc.ir.ops import ELEMENTWISE, PARTITION_RULES, RNG_STATE
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .op_rules import DEFAULT_RULE, OpPlan, PartitionRule, without_partials


@PARTITION_RULES.register(*(ELEMENTWISE - RNG_STATE), instance=True)
class ElementwiseRule(PartitionRule):
    def plan(self, inst, ctx):
        if isinstance(inst.shape, TupleShape):
            if inst.opcode == "copy":                  # leaf by leaf: the copy keeps them
                (operand,) = inst.operands
                return OpPlan((operand.sharding,), operand.sharding,
                              "a tuple copy keeps its operand's shardings")
            return DEFAULT_RULE.plan(inst, ctx)
        if inst.opcode == "bitcast-convert" and inst.shape.rank != inst.operands[0].shape.rank:
            return _width_change_plan(inst, ctx)
        target = without_partials(inst.sharding)
        rank = inst.shape.rank
        scalar = [isinstance(o.shape, ArrayShape) and o.shape.rank == 0 and rank > 0
                  for o in inst.operands]
        candidates = [target]
        for operand, is_scalar in zip(inst.operands, scalar):
            sharding = operand.sharding
            if not is_scalar and sharding not in candidates and sharding == \
                    without_partials(sharding):
                candidates.append(sharding)
        replicated = HloSharding.replicate()
        plans = [OpPlan(tuple(replicated if s else c for s in scalar), c,
                        "elementwise operands share the result's sharding") for c in candidates]
        if inst.opcode in LINEAR and not any(scalar):
            plans += _partial_sum_plans(inst)
        return ctx.choose(inst, plans, totals=True)


#: ops linear in every operand: on partial sums they compute the partial sums of their result
LINEAR = frozenset({"copy", "negate", "add", "subtract"})


def _partial_sum_plans(inst) -> list[OpPlan]:
    """A linear op computing on partial sums: its result's unreduced sharding, or its first
    operand's, taken by every operand and kept by the result (a sum of partial sums needs no
    reduction before it; each operand's partials are reduced once, after it, if at all)."""
    plans = []
    for partial in (inst.sharding, inst.operands[0].sharding):
        if partial.kind == "maximal" or partial == without_partials(partial) or \
                any(p.result == partial for p in plans):
            continue
        plans.append(OpPlan((partial,) * len(inst.operands), partial,
                            "a linear op keeps its operands' partial sums"))
    return plans


PARTITION_RULES.add(ElementwiseRule(), targets=tuple(sorted(PLACEMENT)))


@PARTITION_RULES.register("all-reduce", instance=True)
class AllReduceRule(ElementwiseRule):
    def plan(self, inst, ctx):
        if len(inst.operands) != 1 or isinstance(inst.shape, TupleShape):
            raise UnsupportedError(f"{inst.name}: an all-reduce of several operands cannot be "
                                   "partitioned outside a manual region")
        if inst.attr("channel_id") is None:
            return super().plan(inst, ctx)
        if not inst.sharding.is_replicated:
            raise UnsupportedError(f"{inst.name}: an all-reduce across partitions (channel_id) "
                                   "outside a manual region must be replicated (it reduces "
                                   "every partition's whole copy), not "
                                   f"{inst.sharding}")
        replicated = HloSharding.replicate()
        return OpPlan((replicated,), replicated, "an all-reduce across partitions reduces "
                      "every partition's replicated copy of its operand")


def _width_change_plan(inst, ctx):
    """A bitcast-convert between widths adds (wide to narrow) or drops (narrow to wide) a
    trailing dim of the width ratio; the other dims map one to one. The candidates keep the
    result's tiling or the operand's on the shared dims, with the trailing dim untiled."""
    (operand,) = inst.operands
    rank, shared = inst.shape.rank, min(inst.shape.rank, operand.shape.rank)
    plans = []
    for source, source_rank in ((without_partials(inst.sharding), rank),
                                (operand.sharding, operand.shape.rank)):
        if source.kind == "maximal" or source != without_partials(source):
            continue
        common = ctx.tiling(source, source_rank).sharding
        if source_rank > shared:
            common = algebra.remove_dims(algebra.partially_replicate_on_dims(common, [shared]),
                                         [shared])
        result = algebra.insert_dims(common, [shared]) if rank > shared else common
        needed = algebra.insert_dims(common, [shared]) if operand.shape.rank > shared else common
        plans.append(OpPlan((needed,), result,
                            "a width-changing bitcast-convert keeps the shared dims' tiling"))
    if not plans:
        return DEFAULT_RULE.plan(inst, ctx)
    return ctx.choose(inst, plans)


__all__ = ["ElementwiseRule"]
