"""Partitioning of control flow (docs/design/partitioning.md#control-flow): `while`, `conditional`
and `call`.

Their callees are partitioned as computations of their own (`call_graph.py`); these rules fix the
shardings at the boundary, and insert-reshards gives the callees' parameters and roots those
shardings (`boundary_shardings`):

- while: one sharding `W` (the while's own, partial sums resolved) for the init value, the body
  parameter, the body root, the condition parameter and the result; the condition's root is
  replicated so every partition takes the same trip count (in manual code it stays per
  device). The loop state stays sharded across iterations: only the body's own instructions
  reshard.
- conditional: the selector replicated (every partition takes the same branch, so collectives
  inside branches match; a manual selector stays per device); branch k's parameter arrives in
  operand k+1's sharding (and is resharded inside the branch when its annotation differs);
  every branch root and the result in the conditional's sharding.
- call: likewise, the callee parameters arrive in the operands' shardings; the callee root and
  the result in the call's sharding.

Each lowers to itself on local shapes, calling the partitioned callees.
"""
from __future__ import annotations

from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import Shape, TupleShape

from .op_rules import (
    OpPlan, PartitionRule, has_manual_leaf, replicated_for, without_partials,
)


def _whole(sharding: HloSharding, shape: Shape) -> HloSharding:
    """`sharding` without partial sums (per leaf for tuple shapes)."""
    if isinstance(shape, TupleShape):
        return HloSharding.tuple([without_partials(leaf)
                                  for leaf in sharding.leaf_shardings(shape)])
    return without_partials(sharding)


@PARTITION_RULES.register("while", instance=True)
class WhileRule(PartitionRule):
    def plan(self, inst, ctx):
        state = _whole(inst.sharding, inst.shape)
        return OpPlan((state,), state, "the loop state keeps the while's sharding in every "
                                       "iteration")


@PARTITION_RULES.register("conditional", instance=True)
class ConditionalRule(PartitionRule):
    def plan(self, inst, ctx):
        selector = inst.operands[0]
        needs = (_agreed(selector.sharding, selector.shape),) + \
            tuple(o.sharding for o in inst.operands[1:])
        return OpPlan(needs, _whole(inst.sharding, inst.shape),
                      "every partition takes the same branch (replicated selector)")


@PARTITION_RULES.register("call", instance=True)
class CallRule(PartitionRule):
    def plan(self, inst, ctx):
        return OpPlan(tuple(o.sharding for o in inst.operands),
                      _whole(inst.sharding, inst.shape),
                      "the callee runs on the operands' shardings")


def _agreed(sharding: HloSharding | None, shape: Shape) -> HloSharding:
    """The sharding of a branch selector or loop predicate: replicated, so every partition
    takes the same branch or trip count, except inside manual code, where it is per device."""
    return sharding if has_manual_leaf(sharding) else replicated_for(shape)


def boundary_shardings(inst: Instruction, callee: Computation
                       ) -> tuple[list[HloSharding], HloSharding]:
    """For `callee` run by the planned control-flow instruction `inst`: the shardings its
    parameters arrive in and the sharding its root must have."""
    if inst.opcode == "while":
        state = inst.sharding
        if callee.name == inst.attr("condition").name:
            return [state], _agreed(callee.root.sharding, callee.root.shape)
        return [state], state
    if inst.opcode == "conditional":
        index = inst.branch_computation_names().index(callee.name)
        return [inst.operands[index + 1].sharding], inst.sharding
    return [o.sharding for o in inst.operands], inst.sharding


__all__ = ["WhileRule", "ConditionalRule", "CallRule", "boundary_shardings"]
