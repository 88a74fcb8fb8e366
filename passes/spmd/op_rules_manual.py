"""Manual regions (docs/design/partitioning.md#manual-regions): code the user partitioned by hand
runs per device unchanged.

A value with a `{manual}` sharding is per-device data: its shape is already the per-device shape
and nothing reshards it. A partially manual value (`last_tile_dims={manual, ...}`) is per-device
data across its manual subgroup and an ordinary tiled value inside each manual group; its local
shape is the shard shape of its data dims.

- `SPMDFullToShardShape` (and `xla.sdy.GlobalToLocalShape`) enters a region: the operand keeps
  its own sharding, whose shard is exactly the (per-device) result, so it lowers to a local
  `copy`, the padding of uneven tiles replaced by zeros (the code in the region reads it as
  data; XLA pads such shards with zeros there too). `SPMDShardToFullShape`
  (`xla.sdy.LocalToGlobalShape`) leaves one: the local value becomes this device's shard of the
  result's sharding, again a local `copy`. Each checks that the shard shapes agree
  (ShardingError otherwise).
- An instruction with a `{manual}` sharding is cloned on local operands (XLA partitions it "as
  if on device 0": no resharding); a `Sharding` annotation inside such a region is a local
  `copy`. Manual operands are used as they are; a non-manual operand (a constant feeding manual
  code) is first made replicated (in a partially manual region: laid out like the auto
  equivalent of the operand's need, scalars replicated).
- Inside a fully manual region the ops whose meaning depends on the partition (`partition-id`,
  collectives written by the user) run unchanged: their partition ids are the global ones.
- Inside a partially manual region every manual group partitions its own value
  (`manual_groups.py`): an elementwise op runs on operands tiled like it; a `reduce` is
  partitioned like an ordinary reduce inside each group (`manual_reduce.py`), a `dot` by the
  ordinary dot's local candidates every group holds alike (`manual_dot.py`); any other pure op
  runs on each group's whole operands (gathered inside the group) and its result is sliced to its
  annotated tiling; a `Sharding` annotation (or a reshard insert-reshards adds) reshards inside
  every group, by the plan of the auto-equivalent shardings, and is refused (UnsupportedError)
  when that plan would need a collective across groups. Collectives written by the user run as
  written on local tiles when their groups join devices holding the same free tile and no free
  axis splits a dimension they gather, scatter or exchange along (their operands are resharded
  to their tiling first); a `partition-id` or another collective inside one is rejected: those
  need the group-local ids of XLA's subgroup partitioner.

Tuples, get-tuple-element, parameters and control flow keep their own rules: they pass leaf
shardings through unchanged, manual ones included.
"""
from __future__ import annotations

import numpy as np

from gspmdc.errors import ShardingError, UnsupportedError
from gspmdc.ir.custom_call_targets import MANUAL_BOUNDARIES, MANUAL_ENTRIES, target_of
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import ELEMENTWISE, PARTITION_DEPENDENT, PARTITION_RULES, opcodes
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape, compatible

from .manual_groups import (
    auto_equivalent, check_within_groups, is_partially_manual, whole_in_groups,
)
from .op_rules import (
    LowerContext, OpPlan, PartitionRule, clone, has_manual_leaf, replicated_for,
    zero_uneven_padding,
)
from .manual_dot import dot_plans
from .manual_reduce import lower_reduce, reduce_plans
from .op_rules_data import lower_reshard
from .reshard_nodes import is_reshard
from .tiling import Tiling

#: opcodes running on equally tiled local operands as written (a bitcast-convert may change the
#: rank; random numbers drawn per tile are not the global program's)
_ON_TILES = ELEMENTWISE - opcodes("bitcast-convert", "rng")


class ManualRule(PartitionRule):
    """Instructions inside manual regions: cloned on local operands (see the module
    docstring). `partition_rules.rule_for` picks it for any instruction with a manual leaf."""

    def plan(self, inst, ctx):
        sharding = inst.sharding
        if all(leaf.kind == "manual" for leaf in sharding.leaves()):
            return OpPlan(tuple(o.sharding if has_manual_leaf(o.sharding) else
                                replicated_for(o.shape) for o in inst.operands),
                          sharding, "manual region: the op runs per device unchanged")
        if is_reshard(inst):
            operand = inst.operands[0]
            need = operand.sharding if has_manual_leaf(operand.sharding) else \
                _like(operand, sharding)
            return OpPlan((need,), sharding,
                          "sharding annotation inside a partially manual region: reshard to it "
                          "inside each manual group")
        if inst.opcode in PARTITION_DEPENDENT:
            if not _runs_as_written(inst):
                raise UnsupportedError(f"{inst.name}: {inst.opcode} inside a partially manual "
                                       f"region ({sharding.to_text(False)}) is not supported")
            return OpPlan(tuple(sharding if has_manual_leaf(o.sharding) else
                                auto_equivalent(sharding) for o in inst.operands), sharding,
                          "a collective of the partially manual region runs as written")
        if _elementwise(inst):
            return OpPlan(tuple(_like(o, sharding) for o in inst.operands), sharding,
                          "partially manual region: elementwise on equally tiled operands")
        leaf = inst.sharding.leaf_shardings(inst.shape)[0]
        whole = OpPlan(tuple(whole_in_groups(leaf, o.shape) if has_manual_leaf(o.sharding) else
                             replicated_for(o.shape) for o in inst.operands),
                       whole_in_groups(leaf, inst.shape),
                       "partially manual region: the op runs on each manual group's whole "
                       "operands")
        if inst.opcode == "reduce":
            return reduce_plans(inst, ctx, whole)
        if inst.opcode == "dot":
            return dot_plans(inst, ctx, whole)
        return whole

    def lower(self, inst, ctx):
        if inst.opcode == "reduce":
            return lower_reduce(inst, ctx)
        if not is_reshard(inst):
            return clone(inst, ctx)
        operand = inst.operands[0]
        if operand.sharding == inst.sharding or isinstance(inst.shape, TupleShape) or \
                not has_manual_leaf(operand.sharding) or not is_partially_manual(inst.sharding):
            # the value as it is (tuples: resharded leaf by leaf before; a non-manual operand
            # has the auto equivalent's layout)
            return _local_copy(inst, ctx)
        mark = len(ctx.builder.instructions)
        local = lower_reshard(inst, ctx)
        check_within_groups(ctx.builder.instructions[mark:], inst.sharding, inst.name)
        return local


def _elementwise(inst: Instruction) -> bool:
    """An elementwise op of one array whose non-scalar operands have its shape: it runs on
    equally tiled local operands as written."""
    return inst.opcode in _ON_TILES and isinstance(inst.shape, ArrayShape) and all(
        isinstance(o.shape, ArrayShape) and (o.shape.rank == 0 or o.shape.dims == inst.shape.dims)
        for o in inst.operands)


def _like(operand: Instruction, sharding: HloSharding) -> HloSharding:
    """The layout an elementwise op's operand needs: the op's own sharding (its auto equivalent
    for a non-manual operand), a manual scalar as it is, a non-manual scalar replicated."""
    if operand.shape.rank == 0:
        return operand.sharding if has_manual_leaf(operand.sharding) else HloSharding.replicate()
    return sharding if has_manual_leaf(operand.sharding) else auto_equivalent(sharding)


#: collectives a partially manual region may hold, with the dimensions they gather, scatter or
#: exchange along (None: none, they combine or move whole values)
_COLLECTIVE_DIMS = {"all-reduce": None, "collective-permute": None, "collective-broadcast": None,
                    "all-gather": "dimensions", "reduce-scatter": "dimensions",
                    "all-to-all": "dimensions"}


def _runs_as_written(inst: Instruction) -> bool:
    """Whether a collective inside a partially manual region runs as the user wrote it on each
    device's local tile: its operands are tiled like its result, no free (non-manual) axis
    splits a dimension it gathers, scatters or exchanges along, and each of its groups (each
    permute pair) joins devices holding the same free tile, differing in manual axes only (as a
    shard_map writes them)."""
    if inst.opcode not in _COLLECTIVE_DIMS or inst.shape.is_tuple or not inst.sharding.is_tiled:
        return False
    attr = _COLLECTIVE_DIMS[inst.opcode]
    dims = inst.attrs.get(attr, ()) if attr is not None else ()
    dims = (dims,) if isinstance(dims, int) else dims
    counts = inst.sharding.tile_counts_for_rank(inst.shape.rank)
    if any(counts[d] != 1 for d in dims):
        return False
    free = _free_coordinates(inst.sharding)
    if free is None:
        return False
    if inst.opcode == "collective-permute":
        groups = inst.attrs.get("source_target_pairs", ())
    else:
        replica_groups = inst.attrs.get("replica_groups")
        groups = replica_groups.groups if replica_groups is not None else ()
        if not groups:
            groups = (tuple(free),)
    return all(len({free.get(d) for d in group}) == 1 and all(d in free for d in group)
               for group in groups)


def _free_coordinates(sharding: HloSharding) -> dict[int, tuple] | None:
    """Each device's position in a partially manual sharding's device array, the manual
    dimension left out: devices with the same one hold the same data (None without a manual
    dimension)."""
    if "manual" not in sharding.subgroup_types:
        return None
    array = np.asarray(sharding.tile_assignment.array).reshape(sharding.tile_assignment.dims)
    manual = len(sharding.tile_counts) + list(sharding.subgroup_types).index("manual")
    return {int(array[index]): index[:manual] + index[manual + 1:]
            for index in np.ndindex(array.shape)}


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
        copy = _local_copy(inst, ctx)
        operand = inst.operands[0]
        if target_of(inst) not in MANUAL_ENTRIES or not operand.sharding.is_tiled:
            return copy
        rank = operand.shape.rank
        return zero_uneven_padding(ctx, copy, operand.shape,
                                   Tiling(operand.sharding, rank, ctx.num_devices), range(rank))


def _local_copy(inst: Instruction, ctx: LowerContext) -> Instruction:
    """`copy` of the operand's local value, named and sharded like `inst`."""
    attrs = {"metadata": inst.attrs["metadata"]} if "metadata" in inst.attrs else {}
    return ctx.builder.append(Instruction(
        inst.name, "copy", inst.sharding.shard_shape(inst.shape), ctx.operands(inst), attrs,
        sharding=inst.sharding))


PARTITION_RULES.add(_BoundaryRule(), targets=tuple(sorted(MANUAL_BOUNDARIES)))


__all__ = ["ManualRule"]
