"""Partitioning of `ragged-dot` whose ragged dimension is a batch dimension (XLA's third mode:
batches are independent, so the grouping does not change any element and the op is an ordinary
dot of its first two operands).

The plan is the dot rule's (docs/design/partitioning.md#dot: compatible operand pairs, aligned
operands, the
output's tiling, partial results over tiled contracting dims combined by addition) with
`group_sizes` replicated; the local op is the same ragged-dot on the shards. The other two
modes (a free or a contracting ragged dim, where each position's group decides its rhs slice
or its output entry) run replicated through the default action.
"""
from __future__ import annotations

from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding

from .op_rules import DEFAULT_RULE, OpPlan, PartitionRule


@PARTITION_RULES.register("ragged-dot", instance=True)
class RaggedDotRule(PartitionRule):
    def plan(self, inst, ctx):
        ragged = tuple(inst.attr("lhs_ragged_dims", ()))
        if len(ragged) != 1 or ragged[0] not in tuple(inst.attr("lhs_batch_dims", ())):
            return DEFAULT_RULE.plan(inst, ctx)
        lhs, rhs, _ = inst.operands
        as_dot = Instruction(inst.name, "dot", inst.shape, [lhs, rhs], dict(inst.attrs),
                             sharding=inst.sharding)
        plan = PARTITION_RULES["dot"].plan(as_dot, ctx)
        return OpPlan(plan.operands + (HloSharding.replicate(),), plan.result,
                      f"ragged-dot over a batch dim partitions as a dot: {plan.reason}")


__all__ = ["RaggedDotRule"]
