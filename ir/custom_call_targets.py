"""The `custom_call_target`s gspmdc gives a meaning to, as named constants, and their groups.

XLA's: sharding annotations and reshards (`Sharding`), manual-region boundaries
(`SPMDFullToShardShape`, `SPMDShardToFullShape`), propagation barriers (`ShardBarrierFrom`,
`ShardBarrierTo`), layout and placement annotations, and `TopK`. Shardy's (`xla.sdy.*`): its
manual-region boundaries and annotations. gspmdc's own (`gspmdc.*`, written by the partitioner,
read by the runtime) have their operands and attributes defined in `random_shards.py`.

Any other target is opaque: propagation leaves it alone, the partitioner runs it on replicated
operands, and the runtime refuses it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .module import Instruction

SHARDING = "Sharding"
FULL_TO_SHARD = "SPMDFullToShardShape"
SHARD_TO_FULL = "SPMDShardToFullShape"
BARRIER_FROM = "ShardBarrierFrom"
BARRIER_TO = "ShardBarrierTo"
LAYOUT_CONSTRAINT = "LayoutConstraint"
X64_COMBINE = "X64Combine"
MOVE_TO_HOST = "MoveToHost"
MOVE_TO_DEVICE = "MoveToDevice"
PIN_TO_DEVICE = "PinToDevice"
ANNOTATE_DEVICE_PLACEMENT = "annotate_device_placement"
TOPK = "TopK"
SDY_GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
SDY_LOCAL_TO_GLOBAL = "xla.sdy.LocalToGlobalShape"
SDY_FUNC_RESULT_SHARDING = "xla.sdy.FuncResultSharding"
SDY_SHARDING_CONSTRAINT = "xla.sdy.ShardingConstraint"
SDY_PROPAGATION_BARRIER = "xla.sdy.PropagationBarrier"
SDY_SHARDING_GROUP = "xla.sdy.ShardingGroup"
RNG_BIT_GENERATOR_SHARD = "gspmdc.RngBitGeneratorShard"
RNG_SHARD = "gspmdc.RngShard"

#: calls that enter a manual region, and that leave one
MANUAL_ENTRIES = frozenset({FULL_TO_SHARD, SDY_GLOBAL_TO_LOCAL})
MANUAL_EXITS = frozenset({SHARD_TO_FULL, SDY_LOCAL_TO_GLOBAL})
#: calls that enter or leave a manual region (the values inside are per-device data)
MANUAL_BOUNDARIES = MANUAL_ENTRIES | MANUAL_EXITS
#: annotations: the value passes unchanged on one device
ANNOTATIONS = frozenset({
    SHARDING, BARRIER_FROM, BARRIER_TO, LAYOUT_CONSTRAINT, MOVE_TO_HOST, MOVE_TO_DEVICE,
    PIN_TO_DEVICE, ANNOTATE_DEVICE_PLACEMENT, SDY_FUNC_RESULT_SHARDING, SDY_SHARDING_CONSTRAINT,
    SDY_PROPAGATION_BARRIER, SDY_SHARDING_GROUP,
})
BARRIERS = frozenset({BARRIER_FROM, BARRIER_TO})
#: calls that forward their operand's sharding unchanged (XLA's IsPassthroughCustomOps)
PASS_THROUGH = frozenset({SHARDING, X64_COMBINE, LAYOUT_CONSTRAINT})
#: single-operand calls that pass a sharding through when they keep the rank
SAME_RANK_PASS_THROUGH = frozenset({
    "ResizeNearest", "ResizeBilinear", "ResizeNearestGrad", "ResizeBilinearGrad", "Cholesky",
    MOVE_TO_HOST, MOVE_TO_DEVICE, PIN_TO_DEVICE,
})
#: memory-placement annotations of one array: the value passes unchanged, partitioned like an
#: elementwise op (XLA's partitioner: `MoveToHost` takes the result's sharding, the others
#: their operand's)
PLACEMENT = frozenset({MOVE_TO_HOST, MOVE_TO_DEVICE, PIN_TO_DEVICE})
#: gspmdc's own targets (`random_shards.py`)
GSPMDC_PRIVATE = frozenset({RNG_BIT_GENERATOR_SHARD, RNG_SHARD})
#: every target with a meaning to gspmdc
KNOWN = MANUAL_BOUNDARIES | ANNOTATIONS | PASS_THROUGH | SAME_RANK_PASS_THROUGH | \
    GSPMDC_PRIVATE | {TOPK}


def target_of(inst: Instruction) -> str | None:
    """The `custom_call_target` of a custom-call, else None."""
    return inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None
