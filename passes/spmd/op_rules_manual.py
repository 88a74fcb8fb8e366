"""Manual regions (reference §4.10): code the user partitioned by hand runs per device unchanged.

A value with a `{manual}` sharding is per-device data: its shape is already the per-device shape
and nothing reshards it. A partially manual value (`last_tile_dims={manual, ...}`) is per-device
data across its manual subgroup and an ordinary tiled value inside each manual group; its local
shape is the shard shape of its data dims.

- `SPMDFullToShardShape` (and `xla.sdy.GlobalToLocalShape`) enters a region: the operand keeps
  its own sharding, whose shard is exactly the (per-device) result, so it lowers to a local
  `copy`. `SPMDShardToFullShape` (`xla.sdy.LocalToGlobalShape`) leaves one: the local value
  becomes this device's shard of the result's sharding, again a local `copy`. Each checks that
  the shard shapes agree (ShardingError otherwise).
- An instruction with a manual sharding is cloned on local operands (XLA partitions it "as if on
  device 0": no resharding); a `Sharding` annotation inside a region is a local `copy`. Manual
  operands are used as they are; a non-manual operand (a constant feeding manual code) is first
  made replicated (fully manual) or laid out like the result's data dims (partially manual, same
  rank; scalars replicated).
- Inside a fully manual region the ops whose meaning depends on the partition (`partition-id`,
  collectives written by the user) run unchanged: their partition ids are the global ones.
  Partially manual regions support ops needing no communication between the devices of a manual
  group; a collective, a `partition-id`, or an operand laid out differently from the
  instruction's data tiling inside one is rejected (UnsupportedError): those need the
  group-local ids and resharding of XLA's subgroup partitioner.

Tuples, get-tuple-element, parameters and control flow keep their own rules: they pass leaf
shardings through unchanged, manual ones included.
"""
from __future__ import annotations

from gspmdc.errors import ShardingError, UnsupportedError
from gspmdc.ir.custom_call_targets import MANUAL_BOUNDARIES, SHARDING, target_of
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_DEPENDENT, PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, compatible

from .op_rules import (
    LowerContext, OpPlan, PartitionRule, clone, has_manual_leaf, replicated_for,
)


def auto_equivalent(sharding: HloSharding) -> HloSharding:
    """A partially manual leaf sharding with its manual subgroup turned into replication: the
    non-manual layout giving every device the same data tile."""
    types = tuple("replicated" if t == "manual" else t for t in sharding.subgroup_types)
    return HloSharding.tiled(sharding.tile_assignment, types)


class ManualRule(PartitionRule):
    """Instructions inside manual regions: cloned on local operands (see the module
    docstring). `partition_rules.rule_for` picks it for any instruction with a manual leaf."""

    def plan(self, inst, ctx):
        sharding = inst.sharding
        fully = all(leaf.kind == "manual" for leaf in sharding.leaves())
        if not fully and inst.opcode in PARTITION_DEPENDENT:
            raise UnsupportedError(f"{inst.name}: {inst.opcode} inside a partially manual region "
                                   f"({sharding.to_text(False)}) is not supported")
        needs = []
        for operand in inst.operands:
            if has_manual_leaf(operand.sharding):
                if not fully and not _same_local_layout(operand, inst):
                    raise UnsupportedError(
                        f"{inst.name}: operand {operand.name} has the partially manual sharding "
                        f"{operand.sharding.to_text(False)}, the instruction "
                        f"{sharding.to_text(False)}: resharding inside a partially manual "
                        "region is not supported")
                needs.append(operand.sharding)
            elif fully or not isinstance(operand.shape, ArrayShape) or operand.shape.rank == 0:
                needs.append(replicated_for(operand.shape))
            elif isinstance(inst.shape, ArrayShape) and operand.shape.rank == inst.shape.rank:
                needs.append(auto_equivalent(sharding))
            else:
                raise UnsupportedError(
                    f"{inst.name}: non-manual operand {operand.name} of another rank inside the "
                    f"partially manual region {sharding.to_text(False)} is not supported")
        return OpPlan(tuple(needs), sharding, "manual region: the op runs per device unchanged")

    def lower(self, inst, ctx):
        if target_of(inst) == SHARDING:
            return _local_copy(inst, ctx)      # a manual annotation: the value as it is
        return clone(inst, ctx)


def _same_local_layout(operand: Instruction, inst: Instruction) -> bool:
    """Whether `operand` is a scalar or laid out with `inst`'s (partially manual) sharding (the
    first leaf's, for variadic ops)."""
    shape = operand.shape
    first = inst.sharding.leaf_shardings(inst.shape)[0]
    return (isinstance(shape, ArrayShape) and shape.rank == 0) or operand.sharding == first


class _BoundaryRule(PartitionRule):
    """A manual region boundary: the operand keeps its sharding; locally a copy."""

    def plan(self, inst, ctx):
        operand = inst.operands[0]
        have = operand.sharding.shard_shape(operand.shape)
        want = inst.sharding.shard_shape(inst.shape)
        if not compatible(have.without_layout(), want.without_layout()):
            raise ShardingError(
                f"{inst.name}: custom-call {inst.attr('custom_call_target')!r} maps "
                f"{operand.shape} sharded {operand.sharding.to_text(False)} (shards {have}) to "
                f"{inst.shape} sharded {inst.sharding.to_text(False)} (shards {want}): the "
                "per-device shapes must agree")
        return OpPlan((operand.sharding,), inst.sharding,
                      f"{inst.attr('custom_call_target')}: the shards are the per-device values")

    def lower(self, inst: Instruction, ctx: LowerContext) -> Instruction:
        return _local_copy(inst, ctx)


def _local_copy(inst: Instruction, ctx: LowerContext) -> Instruction:
    """`copy` of the operand's local value, named and sharded like `inst`."""
    attrs = {"metadata": inst.attrs["metadata"]} if "metadata" in inst.attrs else {}
    return ctx.builder.append(Instruction(
        inst.name, "copy", inst.sharding.shard_shape(inst.shape), ctx.operands(inst), attrs,
        sharding=inst.sharding))


PARTITION_RULES.add(_BoundaryRule(), targets=tuple(sorted(MANUAL_BOUNDARIES)))


__all__ = ["ManualRule", "auto_equivalent"]
