"""Resharding a value known uniform along some dims (`uniform_dims.py`,
docs/design/partitioning.md#values-uniform-along-a-dim): along those dims every element is the
same, so a device can build any tile of them from one element of its own shard.

`plan_uniform` collapses the uniform dims to size 1 (each device keeps the first element of
its shard along them), plans the reshard of that smaller value between the two shardings with
those dims replicated, and broadcasts the result locally to the target's shard. Where the two
shardings differ only in how the uniform dims are tiled (as in XLA's reshard of a broadcast
between two device orders, which it does by a local copy) that plan moves nothing. A dim
qualifies where every tile of the source holds a real element (an uneven tiling whose last
tiles are all padding does not). `emit_uniform` writes the local program; lower-spmd uses it
where no device sends more than in the plan of the whole value and some device sends less
(`sends_less`), so that no program sends more on any device.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape

from .reshard import EmitContext, emit_reshard
from .reshard_plan import ReshardPlan, plan_reshard
from .tiling import cdiv


class UniformPlan(NamedTuple):
    """The reshard of the first element along `dims` (a value of `collapsed` shape), and the
    target sharding the result is broadcast into."""

    dims: tuple[int, ...]
    collapsed: ArrayShape
    plan: ReshardPlan
    target: HloSharding


def plan_uniform(shape: ArrayShape, source: HloSharding, target: HloSharding,
                 uniform: frozenset[int], num_devices: int) -> UniformPlan | None:
    """The plan through the first element along the `uniform` dims of a value of `shape`, or
    None where it does not apply: a source that is not tiled (a replicated one reshards
    locally already, one on a single device has nothing to build from), partial or manual
    values, no dim holding a real element in every source tile."""
    if not source.is_tiled or source.has_manual_leaf or source.has_unreduced or \
            target.is_tuple or target.has_manual_leaf or target.has_unreduced or \
            target.kind not in ("tiled", "replicated", "maximal") or 0 in shape.dims:
        return None
    counts = source.tile_counts_for_rank(shape.rank)
    dims = tuple(sorted(d for d in uniform if d < shape.rank and
                        (counts[d] - 1) * cdiv(shape.dims[d], counts[d]) < shape.dims[d]))
    if not dims:
        return None
    collapsed = ArrayShape(shape.element_type,
                           tuple(1 if d in dims else n for d, n in enumerate(shape.dims)))
    plan = plan_reshard(collapsed, algebra.partially_replicate_on_dims(source, dims),
                        algebra.partially_replicate_on_dims(target, dims), num_devices)
    return UniformPlan(dims, collapsed, plan, target)


def sends_less(uniform: UniformPlan, plan: ReshardPlan, num_devices: int) -> bool:
    """Whether no device sends more bytes in `uniform` than in `plan` (the plan of the whole
    value) and some device sends fewer."""
    through, whole = _sent(uniform.plan, num_devices), _sent(plan, num_devices)
    return bool((through <= whole).all() and (through < whole).any())


def _sent(plan: ReshardPlan, num_devices: int) -> np.ndarray:
    """The bytes each device sends in `plan`."""
    dims = plan.shape.dims if plan.padded is None else plan.padded
    width = max(dtypes.byte_width(plan.shape.element_type), 1)
    sent = np.zeros(num_devices, dtype=np.int64)
    for step in plan.steps:
        traffic = step.traffic(dims, width)
        if traffic is not None:
            sent += traffic.sent
    return sent


def emit_uniform(ctx: EmitContext, value: Instruction, shape: ArrayShape, uniform: UniformPlan,
                 metadata: KeyValueList | None = None) -> Instruction:
    """Local code for `uniform` applied to `value` (this device's source shard of a global
    array of `shape`): the first element along the dims, their reshard, a local broadcast to
    the target's shard."""
    b, dims = ctx.builder, uniform.dims
    shard = uniform.target.shard_shape(shape).dims
    first = [1 if d in dims else n for d, n in enumerate(value.shape.dims)]
    with b.scope(_step(metadata, f"first element along uniform dims {list(dims)}")):
        value = b.slice_to(value, first)
    value = emit_reshard(ctx, value, uniform.collapsed, uniform.plan, None, metadata)
    if value.shape.dims == tuple(shard):
        return value
    kept = [d for d in range(len(shard)) if d not in dims]
    with b.scope(_step(metadata, f"broadcast along uniform dims {list(dims)}")):
        value = b.reshape(value, [value.shape.dims[d] for d in kept])
        return b.broadcast(value, shard, kept)


def _step(metadata: KeyValueList | None, what: str) -> KeyValueList | None:
    if metadata is None:
        return None
    return KeyValueList(metadata.items + (("spmd_step", what),))


__all__ = ["UniformPlan", "plan_uniform", "sends_less", "emit_uniform"]
