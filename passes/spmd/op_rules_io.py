"""Partitioning of tokens and infeeds (docs/design/partitioning.md#tokens-and-infeeds), as XLA's
partitioner does them:

- `after-all`: a token only orders side effects, so every partition makes its own; the op runs
  unchanged on every partition whatever its sharding, its token operands taken as they are.
- `infeed`: each partition reads its own shard of the data from the host. When every data leaf
  partitions evenly (tiled evenly, replicated or manual) that is one infeed of the data's shard
  shape. When all of the infeed is on one device, it runs in a conditional on
  `partition-id == device` and the other partitions get zeros (and a token of their own).
  Otherwise a conditional picks, by a `partition-id` table, one branch per distinct unpadded
  shape: its infeed reads this partition's unpadded shape (an empty tuple `()` for a leaf
  another single device holds) and pads each leaf with zeros to the shard shape.
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir.attributes import ComputationRef
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from .builder import Builder, NameUniquer, add_computation
from .op_rules import LowerContext, OpPlan, PartitionRule, clone

#: the empty tuple an infeed reads for a leaf another single device holds
_NOTHING = TupleShape(())


class _TakenAsTheyAre(PartitionRule):
    """Operands and result keep their shardings: nothing is resharded around the op."""

    reason = ""

    def plan(self, inst, ctx):
        return OpPlan(tuple(o.sharding for o in inst.operands), inst.sharding, self.reason)


@PARTITION_RULES.register("after-all", instance=True)
class AfterAllRule(_TakenAsTheyAre):
    reason = "a token orders side effects: every partition makes its own"


@PARTITION_RULES.register("infeed", instance=True)
class InfeedRule(_TakenAsTheyAre):
    reason = "each partition reads its own shard from the host"

    def lower(self, inst, ctx):
        data_shape = inst.shape.elements[0]
        leaves = inst.sharding.subsharding(inst.shape, (0,)).leaf_shardings(data_shape)
        if not any(True for _ in data_shape.leaves()) or all(
                _even(s, shape) for s, shape in zip(leaves, data_shape.leaves())):
            return clone(inst, ctx)
        device = inst.sharding.unique_device
        if device is not None:
            return _on_one_device(inst, ctx, device)
        return _per_partition_shapes(inst, ctx, data_shape, leaves)


def _even(sharding: HloSharding, shape: ArrayShape) -> bool:
    """Whether every partition's shard of `shape` is the shard shape itself."""
    if sharding.kind == "tiled":
        counts = sharding.tile_counts_for_rank(shape.rank)
        return all(d % t == 0 for d, t in zip(shape.dims, counts))
    return sharding.kind in ("replicated", "manual")


def _on_one_device(inst: Instruction, ctx: LowerContext, device: int) -> Instruction:
    """`conditional(partition-id == device)`: the infeed on `device`, zeros elsewhere."""
    (token,) = ctx.operands(inst)
    operands = TupleShape((token.shape,))
    on, b = _branch(operands)
    infeed = b.add("infeed", inst.shape, [b.add("get-tuple-element", token.shape, [on],
                                                {"index": 0})], _infeed_attrs(inst))
    then = add_computation(ctx.module, f"{inst.name}.on_device", b.instructions, infeed)
    _, b = _branch(operands)
    zeros = add_computation(ctx.module, f"{inst.name}.elsewhere", b.instructions,
                            _zeros(b, inst.shape))
    packed = ctx.builder.add("tuple", operands, [token])
    return _conditional(inst, ctx, inst.shape, [ctx.tables.device_is(device), packed, packed],
                        {"true_computation": ComputationRef(then.name),
                         "false_computation": ComputationRef(zeros.name)})


def _per_partition_shapes(inst: Instruction, ctx: LowerContext, data_shape: Shape,
                          leaves: list[HloSharding]) -> Instruction:
    """A conditional with one branch per distinct unpadded data shape, each infeed padded to
    the shard shape."""
    (token,) = ctx.operands(inst)
    shard = inst.sharding.shard_shape(inst.shape)
    shapes: list[Shape] = []
    index = np.zeros(ctx.tables.num_devices, dtype=np.int32)
    for partition in range(ctx.tables.num_devices):
        unpadded = _unpadded(data_shape, iter(leaves), partition)
        if unpadded not in shapes:
            shapes.append(unpadded)
        index[partition] = shapes.index(unpadded)
    branches = []
    for k, unpadded in enumerate(shapes):
        param, b = _branch(token.shape)
        infeed = b.add("infeed", TupleShape((unpadded, token.shape)), [param],
                       _infeed_attrs(inst))
        data = b.add("get-tuple-element", unpadded, [infeed], {"index": 0})
        read = b.add("get-tuple-element", token.shape, [infeed], {"index": 1})
        root = b.add("tuple", shard, [_padded(b, data, shard.elements[0]), read])
        branches.append(add_computation(ctx.module, f"{inst.name}.branch_{k}", b.instructions,
                                        root))
    selector = ctx.tables.lookup(index, "infeed_branch")
    return _conditional(inst, ctx, shard, [selector] + [token] * len(branches),
                        {"branch_computations": tuple(ComputationRef(c.name) for c in branches)})


def _conditional(inst: Instruction, ctx: LowerContext, shape: Shape, operands: list,
                 attrs: dict) -> Instruction:
    """The conditional standing for `inst` in the partitioned program (its name and sharding)."""
    return ctx.builder.append(Instruction(inst.name, "conditional", shape, operands, attrs,
                                          sharding=inst.sharding))


def _unpadded(shape: Shape, leaves, partition: int) -> Shape:
    """`shape` as `partition` reads it: each leaf's unpadded shard, `()` for a leaf on another
    single device."""
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(_unpadded(e, leaves, partition) for e in shape.elements))
    sharding = next(leaves)
    if sharding.kind == "maximal" and sharding.device != partition:
        return _NOTHING
    return shape.with_dims(sharding.non_padded_shape(shape, partition))


def _padded(b: Builder, value: Instruction, target: Shape) -> Instruction:
    """`value` padded with zeros at the high end to `target` (zeros for an empty tuple)."""
    if value.shape == target:
        return value
    if isinstance(target, TupleShape):
        parts = [_padded(b, b.add("get-tuple-element", s, [value], {"index": i}), t)
                 for i, (s, t) in enumerate(zip(value.shape.elements, target.elements))]
        return b.add("tuple", target, parts)
    if value.shape == _NOTHING:
        return _zeros(b, target)
    return b.pad_high(value, target.dims)


def _zeros(b: Builder, shape: Shape) -> Instruction:
    """Zeros of `shape` (a fresh token for a token)."""
    if isinstance(shape, TupleShape):
        return b.add("tuple", shape, [_zeros(b, e) for e in shape.elements])
    if shape.element_type == "token":
        return b.add("after-all", shape)
    zero = b.zero(shape.element_type)
    return b.broadcast(zero, shape.dims) if shape.dims else zero


def _branch(parameter: Shape) -> tuple[Instruction, Builder]:
    """A builder for a branch computation and its one parameter."""
    b = Builder(NameUniquer())
    return b.add("parameter", parameter, name="param", parameter_number=0), b


def _infeed_attrs(inst: Instruction) -> dict:
    return {k: v for k, v in inst.attrs.items() if k == "infeed_config"}


__all__ = ["AfterAllRule", "InfeedRule"]
