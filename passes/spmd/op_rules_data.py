"""Partitioning of values and data movement (docs/partitioning.md, "Per-op strategies"):
`parameter`, `constant`, `get-dimension-size`, `iota`, `broadcast`, `transpose`, `reshape`,
`tuple`, `get-tuple-element`, `opt-barrier` and the `Sharding` custom-call (a reshard node).

- parameter: a parameter of the shard shape (entry parameters are scattered by the runtime).
- constant: a whole constant when replicated or on one device, a shard-shaped constant when every
  element is equal; otherwise the whole constant, resharded (a local slice).
- iota: a local iota; along a tiled dim, plus this partition's offset (a table lookup).
- get-dimension-size: the global size of the dim (a constant), its operand left as it is.
- broadcast: the operand in the result's sharding restricted to the kept dims, or the result in
  the operand's sharding extended by untiled new dims; local broadcast to the shard shape.
- transpose: the operand in the result's sharding transposed back, or the result in the operand's
  sharding transposed; local transpose.
- reshape: XLA's pairs of shardings (HandleReshape: equal tile counts, the algebra's
  `reshape_sharding` in either direction, docs/design/sharding-algebra.md#reshape), whose shards
  correspond under a local reshape; or, where the one tiled dim is split or merged unevenly, the
  operand in the result's devices and a halo exchange realigning the shards around the local
  reshape (`reshape_halo.py`); else replicated; local reshape.
- tuple / get-tuple-element: leaf shardings pass through; local tuple / get-tuple-element.
- opt-barrier: its operand takes its sharding; local barrier on the shards.
- Sharding custom-call: no local op; lower-spmd emits the reshard from the operand's sharding
  to the custom-call's (`reshard.py`), or, for an operand uniform along some dims
  (`uniform_dims.py`), the reshard of its first element along them, broadcast locally
  (`reshard_uniform.py`), where that sends fewer bytes.
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir import sharding_algebra
from gspmdc.ir.attributes import Literal
from gspmdc.ir.custom_call_targets import SHARDING
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .op_rules import (
    LowerContext, OpPlan, PartitionRule, clone, replicated_for, without_partials,
)
from .reshard import emit_reshard
from .reshard_nodes import is_inserted_reshard, reshard_metadata
from .reshape_halo import emit_reshape_halo, plan_reshape_halo
from .reshard_plan import plan_reshard
from .reshard_routes import LoweredReshard
from .reshard_uniform import emit_uniform, plan_uniform, sends_less
from .tiling import Tiling


@PARTITION_RULES.register("parameter", instance=True)
class ParameterRule(PartitionRule):
    def plan(self, inst, ctx):
        return OpPlan((), inst.sharding, "parameter")


@PARTITION_RULES.register("constant", instance=True)
class ConstantRule(PartitionRule):
    def plan(self, inst, ctx):
        target = without_partials(inst.sharding)
        if target.is_tile_maximal or target.is_tuple or not is_splat(inst):
            if not target.is_tile_maximal:
                target = replicated_for(inst.shape)
            return OpPlan((), target, "constants are materialised whole, then sliced")
        return OpPlan((), target, "a splat constant is built shard-shaped")

    def lower(self, inst, ctx):
        if not inst.sharding.is_tiled:
            return clone(inst, ctx)
        shape = inst.sharding.shard_shape(inst.shape)
        value = inst.literal.value.reshape(-1)[:1].reshape(())
        local = clone(inst, ctx, [], shape)
        local.literal = Literal(np.full(shape.dims, value, dtype=value.dtype))
        return local


def is_splat(inst: Instruction) -> bool:
    """Whether every element of the constant has the same bits."""
    lit = inst.literal
    if lit is None or lit.elided or lit.value is None or lit.value.size == 0:
        return False
    flat = np.ascontiguousarray(lit.value).reshape(-1)
    raw = flat.view(np.uint8).reshape(flat.size, -1)
    return bool((raw == raw[0]).all())


@PARTITION_RULES.register("get-dimension-size", instance=True)
class GetDimensionSizeRule(PartitionRule):
    """`get-dimension-size` of a static shape is the global size of that dim, whatever the
    operand's sharding: the operand is not resharded and the local op is that constant."""

    def plan(self, inst, ctx):
        result = without_partials(inst.sharding)
        if result.kind not in ("replicated", "maximal"):
            result = HloSharding.replicate()
        return OpPlan((inst.operands[0].sharding,), result,
                      "get-dimension-size is its operand's global size")

    def lower(self, inst, ctx):
        (dim,) = inst.attr("dimensions")
        local = clone(inst, ctx, [], ArrayShape("s32", ()))
        local.opcode = "constant"
        local.attrs = {k: v for k, v in local.attrs.items() if k == "metadata"}
        local.literal = Literal(np.asarray(inst.operands[0].shape.dims[dim], dtype=np.int32))
        return local


@PARTITION_RULES.register("iota", instance=True)
class IotaRule(PartitionRule):
    def plan(self, inst, ctx):
        return OpPlan((), without_partials(inst.sharding), "iota is computed shard-shaped")

    def lower(self, inst, ctx):
        local = clone(inst, ctx)
        sharding = inst.sharding
        dim = inst.attr("iota_dimension")
        if not sharding.is_tiled or sharding.tile_counts[dim] == 1:
            return local
        b = ctx.builder
        local.name = b.names(f"{inst.name}.local")
        tiling = Tiling(sharding, inst.shape.rank, ctx.num_devices)
        offset = b.convert(ctx.tables.offsets(tiling, inst.shape.dims)[dim],
                           inst.shape.element_type)
        start = b.broadcast(offset, local.shape.dims)
        attrs = {"metadata": inst.attrs["metadata"]} if "metadata" in inst.attrs else {}
        return b.append(Instruction(inst.name, "add", local.shape, [local, start], attrs,
                                    sharding=sharding))


@PARTITION_RULES.register("broadcast", instance=True)
class BroadcastRule(PartitionRule):
    def plan(self, inst, ctx):
        operand = inst.operands[0]
        dims = list(inst.attr("dimensions"))
        rank = inst.shape.rank
        new = [d for d in range(rank) if d not in dims]
        target = without_partials(inst.sharding)
        candidates = []
        if target.is_tile_maximal:
            candidates.append(OpPlan((target,), target, "broadcast of a whole value"))
        else:
            candidates.append(OpPlan((broadcast_operand_sharding(inst, target, ctx.num_devices),),
                                     target,
                                     "broadcast operand takes the result's tiling of kept dims"))
        source = operand.sharding
        if source.is_tiled and source == without_partials(source):
            extended = sharding_algebra.transpose(ctx.tiling(source, operand.shape.rank).sharding,
                                                  _order(dims))
            extended = sharding_algebra.insert_dims(extended, new)
            candidates.append(OpPlan((source,), extended,
                                     "broadcast keeps the operand's tiling"))
        return ctx.choose(inst, candidates)


def broadcast_operand_sharding(inst: Instruction, target: HloSharding,
                               num_devices: int) -> HloSharding:
    """The sharding the operand of broadcast `inst` needs for a local broadcast to produce the
    (tiled or replicated) `target`: its tiling of the kept dims, in operand order; the tiles of
    new dims become replicas."""
    dims = list(inst.attr("dimensions"))
    rank = inst.shape.rank
    new = [d for d in range(rank) if d not in dims]
    plain = Tiling(target, rank, num_devices).sharding
    restricted = sharding_algebra.remove_dims(
        sharding_algebra.partially_replicate_on_dims(plain, new), new)
    return sharding_algebra.transpose(restricted, _order(_order(dims)))


def _order(values: list[int]) -> list[int]:
    """The positions of distinct `values` in increasing order of value (an argsort without
    numpy's conversion of a short list)."""
    return sorted(range(len(values)), key=values.__getitem__)


@PARTITION_RULES.register("transpose", instance=True)
class TransposeRule(PartitionRule):
    def plan(self, inst, ctx):
        perm = list(inst.attr("dimensions"))
        rank = inst.shape.rank
        target = without_partials(inst.sharding)
        candidates = []
        if target.is_tile_maximal:
            candidates.append(OpPlan((target,), target, "transpose of a whole value"))
        else:
            back = sharding_algebra.transpose(ctx.tiling(target, rank).sharding,
                                              _order(perm))
            candidates.append(OpPlan((back,), target,
                                     "transpose operand takes the result's tiling"))
        source = inst.operands[0].sharding
        if source.is_tiled and source == without_partials(source):
            forward = sharding_algebra.transpose(ctx.tiling(source, rank).sharding, perm)
            candidates.append(OpPlan((source,), forward,
                                     "transpose keeps the operand's tiling"))
        return ctx.choose(inst, candidates)


@PARTITION_RULES.register("reshape", instance=True)
class ReshapeRule(PartitionRule):
    def plan(self, inst, ctx):
        operand = inst.operands[0]
        in_shape, out_shape = operand.shape, inst.shape
        target = without_partials(inst.sharding)
        if target.is_tile_maximal:
            return OpPlan((target,), target, "reshape of a whole value")
        candidates = []

        def add(in_sharding, out_sharding, reason):
            if in_sharding is not None and out_sharding is not None and \
                    local_reshape_ok(in_shape, out_shape, in_sharding, out_sharding):
                candidates.append(OpPlan((in_sharding,), out_sharding, reason))

        add(sharding_algebra.reshape_sharding(target, out_shape.dims, in_shape.dims), target,
            "reshape operand takes the result's tiling")
        source = operand.sharding
        if source.is_tiled and source == without_partials(source):
            add(source, sharding_algebra.reshape_sharding(source, in_shape.dims, out_shape.dims),
                "reshape keeps the operand's tiling")
            through = sharding_algebra.propagate_through_reshape(source, in_shape.dims,
                                                             out_shape.dims)
            if through.is_tiled:
                add(sharding_algebra.reshape_sharding(through, out_shape.dims, in_shape.dims),
                    through, "reshape keeps the part of the operand's tiling that survives")
            halo = plan_reshape_halo(in_shape, out_shape, source, target, ctx.num_devices)
            if halo is not None:
                candidates.append(OpPlan((halo.operand,), target,
                                         "reshape realigns the shards by a halo exchange",
                                         halo.cost, halo.total))
        replicated = HloSharding.replicate()
        candidates.append(OpPlan((replicated,), replicated,
                                 "no tiling survives this reshape: it runs replicated"))
        return ctx.choose(inst, candidates)

    def lower(self, inst, ctx):
        operand = inst.operands[0]
        halo = None if local_reshape_ok(operand.shape, inst.shape, operand.sharding,
                                        inst.sharding) else \
            plan_reshape_halo(operand.shape, inst.shape, operand.sharding, inst.sharding,
                              ctx.num_devices)
        if halo is None:
            return clone(inst, ctx)
        return emit_reshape_halo(ctx, inst, ctx.operands(inst)[0], halo)


@sharding_algebra.cached
def local_reshape_ok(in_shape: ArrayShape, out_shape: ArrayShape, a: HloSharding,
                     b: HloSharding) -> bool:
    """Whether reshaping every device's shard of `in_shape` under `a` gives its shard of
    `out_shape` under `b`: both whole (replicated or on the same device), or XLA's pair
    (HandleReshape): equal tile counts and `b = ReshapeSharding(a)` or `a` the reshape of `b`
    read backwards. With no tile lost to replication every tile follows the reshape whole, so
    the shards correspond (docs/design/sharding-algebra.md#reshape). Answered once per distinct
    question (a model's layers ask the same ones)."""
    if a.is_tile_maximal or b.is_tile_maximal:
        return a == b
    if not a.is_tiled or not b.is_tiled or a.num_tiles != b.num_tiles:
        return False
    return sharding_algebra.reshape_sharding(a, in_shape.dims, out_shape.dims) == b or \
        sharding_algebra.reshape_sharding(b, out_shape.dims, in_shape.dims) == a


@PARTITION_RULES.register("tuple", instance=True)
class TupleRule(PartitionRule):
    def plan(self, inst, ctx):
        sharding = inst.sharding
        if not sharding.is_tuple:
            sharding = HloSharding.tuple(sharding.leaf_shardings(inst.shape))
        needs = tuple(sharding.subsharding(inst.shape, (i,)) for i in range(len(inst.operands)))
        return OpPlan(needs, sharding, "tuple elements keep their shardings")


@PARTITION_RULES.register("opt-barrier", instance=True)
class OptBarrierRule(PartitionRule):
    """An optimization barrier passes its operand through unchanged: the operand takes the
    barrier's own sharding (leaf by leaf) and the local barrier runs on the shards, as XLA
    partitions it (like an elementwise op); nothing is gathered for it."""

    def plan(self, inst, ctx):
        leaves = [without_partials(s) for s in inst.sharding.leaf_shardings(inst.shape)]
        sharding = HloSharding.tuple(leaves) if isinstance(inst.shape, TupleShape) \
            else leaves[0]
        return OpPlan((sharding,), sharding, "an optimization barrier keeps its sharding")


@PARTITION_RULES.register("get-tuple-element", instance=True)
class GetTupleElementRule(PartitionRule):
    def plan(self, inst, ctx):
        operand = inst.operands[0]
        element = operand.sharding.subsharding(operand.shape, (inst.attr("index"),))
        return OpPlan((operand.sharding,), element,
                      "get-tuple-element keeps the element's sharding")


@PARTITION_RULES.register(targets=(SHARDING,), instance=True)
class ShardingRule(PartitionRule):
    def plan(self, inst, ctx):
        if isinstance(inst.shape, TupleShape):
            return OpPlan((inst.sharding,), inst.sharding, "sharding annotation on a tuple")
        return OpPlan((inst.operands[0].sharding,), inst.sharding,
                      "sharding annotation: reshard to it")

    def lower(self, inst, ctx):
        return lower_reshard(inst, ctx)


def lower_reshard(inst: Instruction, ctx: LowerContext) -> Instruction:
    """The local program of a reshard node (a `Sharding` custom-call): the plan from its operand's
    sharding to its own, leaf by leaf for tuples; for an operand uniform along some dims, the
    plan through its first element along them where no device sends more bytes and some
    device sends fewer (`reshard_uniform.sends_less`). A plan emitted whole is recorded in
    `ctx.reshards` (lower-spmd may re-route it for the whole program: `reshard_routes.py`)."""
    operand = inst.operands[0]
    value = ctx.local[operand]
    reducer = partial_reducer(operand)
    metadata = inst.attr("metadata")
    if not is_inserted_reshard(inst):
        metadata = reshard_metadata(operand, operand.sharding, inst.sharding, inst, "annotation",
                                    "sharding annotation")
    if isinstance(inst.shape, TupleShape):
        return value            # insert-reshards resharded the leaves already
    plan = plan_reshard(inst.shape, operand.sharding, inst.sharding, ctx.num_devices)
    uniform = ctx.uniform(operand) if plan.cost else frozenset()
    if uniform:
        through = plan_uniform(inst.shape, operand.sharding, inst.sharding, uniform,
                               ctx.num_devices)
        if through is not None and sends_less(through, plan, ctx.num_devices):
            return emit_uniform(ctx, value, inst.shape, through, metadata)
    start = len(ctx.builder.instructions)
    result = emit_reshard(ctx, value, inst.shape, plan, reducer, metadata)
    if plan.cost:
        ctx.reshards.append(LoweredReshard(inst, value, plan, reducer, metadata,
                                           ctx.builder.instructions[start:], result))
    return result


def partial_reducer(producer: Instruction) -> str | None:
    """The computation combining partial values of `producer`'s result: a reduce's own reducer,
    a scatter's own combiner, addition otherwise (dots)."""
    if (producer.opcode == "reduce" and len(producer.operands) == 2) or \
            (producer.opcode == "scatter" and len(producer.operands) == 3):
        return producer.attr("to_apply").name
    return None


__all__ = ["broadcast_operand_sharding", "is_splat", "local_reshape_ok", "lower_reshard", "partial_reducer"]
