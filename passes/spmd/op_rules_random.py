"""Partitioning of `rng` and `rng-bit-generator`: every sharding gives the unpartitioned values,
bit for bit.

Both generators are counter-based on *global* element indices: an element's value depends only on
the generator state, the global shape and its global position (see runtime/kernels/random.py and ir/random_shards.py).
So a partition computes exactly its shard, with no communication:

- `rng-bit-generator(state)`, result bits tiled: the state is replicated and each partition runs

      custom-call(state, offset_0, ..., offset_{r-1}), custom_call_target="gspmdc.RngBitGeneratorShard",
        algorithm=A, frontend_attributes={global_dims="d0,...,d{r-1}"}

  whose result is `(new state, bits shard)` — the new state is the global one (replicated);
- `rng(a, b)`, result tiled: `a`, `b` replicated; the global rng state is read and advanced by the
  *global* draw (`rng-get-and-update-state(), delta=<blocks of the whole result>`, as XLA's
  RngExpander does), and

      custom-call(a, b, state, offset_0, ...), custom_call_target="gspmdc.RngShard",
        distribution=D, frontend_attributes={global_dims="..."}

  computes the shard. Every partition advances the state exactly as the unpartitioned program
  does, so later random ops stay in step.

The offsets are this partition's tile starts (partition-id table lookups); padding elements of
uneven shards repeat the last real element. Replicated results run the op unchanged on every
partition (each computes the whole value, identically); a result on one device is computed so
too when its operands are replicated (then nothing moves), or on that device's operands.
"""
from __future__ import annotations

from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.custom_call_targets import RNG_BIT_GENERATOR_SHARD, RNG_SHARD
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.random_shards import GLOBAL_DIMS_KEY, rng_state_delta
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .op_rules import LowerContext, OpPlan, PartitionRule, clone, maximal_for, without_partials
from .tiling import Tiling


def _bits_shape(inst: Instruction) -> ArrayShape:
    return inst.shape.elements[1] if isinstance(inst.shape, TupleShape) else inst.shape


def _is_split(sharding: HloSharding) -> bool:
    return sharding.is_tiled and any(c > 1 for c in sharding.tile_counts)


def _shard_attrs(inst: Instruction, target: str, kept: str) -> dict:
    dims = ",".join(str(d) for d in _bits_shape(inst).dims)
    attrs = {"custom_call_target": target, kept: inst.attrs[kept],
             "frontend_attributes": KeyValueList(((GLOBAL_DIMS_KEY, dims),))}
    if "metadata" in inst.attrs:
        attrs["metadata"] = inst.attrs["metadata"]
    return attrs


def _offsets(inst: Instruction, sharding: HloSharding, ctx: LowerContext) -> list[Instruction]:
    dims = _bits_shape(inst).dims
    tiling = Tiling(sharding, len(dims), ctx.num_devices)
    return ctx.tables.offsets(tiling, dims)


@PARTITION_RULES.register("rng-bit-generator", instance=True)
class RngBitGeneratorRule(PartitionRule):
    def plan(self, inst, ctx):
        leaves = inst.sharding.leaf_shardings(inst.shape)
        bits = without_partials(leaves[-1])
        replicated = HloSharding.replicate()
        candidates = []
        if bits.kind == "maximal":
            device = bits.unique_device
            candidates.append(OpPlan((maximal_for(inst.operands[0].shape, device),),
                                     maximal_for(inst.shape, device),
                                     "rng-bit-generator on one device"))
            bits = replicated
        result = HloSharding.tuple([replicated, bits]) if isinstance(inst.shape, TupleShape) \
            else bits
        candidates.append(OpPlan((replicated,), result,
                                 "rng-bit-generator computes its shard of the global bits"))
        return ctx.choose(inst, candidates)

    def lower(self, inst, ctx: LowerContext):
        bits = inst.sharding.leaf_shardings(inst.shape)[-1]
        if not _is_split(bits):
            return clone(inst, ctx)
        (state,) = ctx.operands(inst)
        local = inst.sharding.shard_shape(inst.shape)
        return ctx.builder.append(Instruction(
            inst.name, "custom-call", local, [state, *_offsets(inst, bits, ctx)],
            _shard_attrs(inst, RNG_BIT_GENERATOR_SHARD, "algorithm"),
            sharding=inst.sharding))


@PARTITION_RULES.register("rng", instance=True)
class RngRule(PartitionRule):
    def plan(self, inst, ctx):
        target = without_partials(inst.sharding)
        replicated = HloSharding.replicate()
        candidates = []
        if target.kind == "maximal":
            candidates.append(OpPlan((target, target), target, "rng on one device"))
            target = replicated
        candidates.append(OpPlan((replicated, replicated), target,
                                 "rng computes its shard of the global values"))
        return ctx.choose(inst, candidates)

    def lower(self, inst, ctx: LowerContext):
        if not _is_split(inst.sharding):
            return clone(inst, ctx)
        b = ctx.builder
        a, high = ctx.operands(inst)
        shape = inst.shape
        delta = rng_state_delta(str(inst.attr("distribution")), shape.element_type,
                                shape.num_elements)
        state = b.add("rng-get-and-update-state", ArrayShape("u64", (2,)), attrs={"delta": delta},
                      name=f"{inst.name}.state")
        return b.append(Instruction(
            inst.name, "custom-call", inst.sharding.shard_shape(shape),
            [a, high, state, *_offsets(inst, inst.sharding, ctx)],
            _shard_attrs(inst, RNG_SHARD, "distribution"), sharding=inst.sharding))


__all__ = ["RngRule", "RngBitGeneratorRule"]
