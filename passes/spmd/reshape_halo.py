"""A reshape that splits or merges the one tiled dim, its shards realigned by a halo exchange
(XLA's HandleReshape when no pair of shardings reshapes locally,
docs/design/partitioning.md#reshape-by-halo-exchange).

The operand is tiled `c` ways on its dim `i` alone (of size `A`) and the result `c` ways on its
dim `j` alone (of size `B`; but see the grouped dims below), the dims before `i` and before `j`
having the same product, so a row-major position before them is one index on both sides and
every device's data is a contiguous run of each "major row". The operand takes the result's devices in the same order
(tile `k` of dim `i` on the device of tile `k` of dim `j`; a partially replicated result keeps
its replication). Shards are `a = cdiv(A, c)` and `s = cdiv(B, c)`:

- split, `A % B == 0` (`k = A / B`): result shard `o` holds rows `[s·o, s·o + s)` of dim `j`,
  which are rows `[s·k·o, s·k·(o+1))` of dim `i`. A halo exchange on dim `i` (window 1, the
  operand padded to `s·k·c` rows) gives each shard those `s·k` rows, then a local reshape;
- merge, `B % A == 0` (`m = B / A`): the shard reshaped locally holds positions
  `[a·m·o, a·m·(o+1))` of dim `j` (a run of `a·m` of the `a·m·c` padded positions); a halo
  exchange on dim `j` (window 1, cut to `B` positions) gives each shard its `s`.

Dims whose tiling survives the reshape group the devices, as XLA's recursion does: the
operand's tiling propagated through the reshape, and back, pairs operand and result dims (kept
whole, or split or merged with the tiles on the major part) that the result tiles alike; each
group runs the above on the shapes with those dims at their shard sizes (the products before
`i` and `j` taken so), exchanging along `i` or `j` within the group.

Only positions of real data travel (`WindowedDim.outputs`): positions at or past `A` (split) or
`B` (merge) are padding of the result too, left as they are. The plan is a candidate of the
reshape rule priced by its exchange (`halo.halo_sent`); lower-spmd emits it
(`emit_reshape_halo`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape

from .halo import HaloPlan, WindowedDim, halo_sent, plan_halo, windowed_input
from .reshard import EmitContext
from .tiling import Tiling, cdiv


@dataclass(frozen=True)
class ReshapeHalo:
    """How a reshape realigns its shards: `split` (exchange on the operand's dim `dim`, then
    reshape) or `merge` (reshape to `merged`, a local shape, then exchange on the result's dim
    `dim`); `operand` is the sharding the operand takes; `cost` / `total` the bytes of the
    exchange (busiest device, all devices)."""

    split: bool
    dim: int
    plan: HaloPlan
    operand: HloSharding
    merged: tuple[int, ...]
    cost: float
    total: float


def _tiling(s: HloSharding, rank: int, n: int) -> Tiling | None:
    """The tiling of `s` when it tiles dims and replicates (nothing else), else None."""
    if not s.is_tiled or set(s.subgroup_types) - {"replicated"}:
        return None
    tiling = Tiling(s, rank, n)
    return tiling if tiling.unreduced == 1 else None


def _grouped(in_shape: ArrayShape, out_shape: ArrayShape, source: HloSharding,
             src: Tiling, dst: Tiling) -> dict[int, int] | None:
    """The dims whose tiling survives the reshape, operand dim -> result dim (XLA's recursion:
    the tiled dims of the operand's sharding propagated through the reshape, and of that
    propagated back to the operand), paired in order; None unless they pair one to one and the
    result tiles each like the propagated sharding (XLA then groups on the result's sharding
    itself)."""
    through = sharding_algebra.propagate_through_reshape(source, in_shape.dims, out_shape.dims)
    if not through.is_tiled:
        return {}
    back = sharding_algebra.reshape_sharding(through, out_shape.dims, in_shape.dims)
    if back is None or not back.is_tiled:
        return {}
    ins = [d for d, c in enumerate(back.tile_counts_for_rank(in_shape.rank)) if c > 1]
    outs = [e for e, c in enumerate(through.tile_counts_for_rank(out_shape.rank)) if c > 1]
    if len(ins) != len(outs) or any(src.counts[d] != dst.counts[e] or
                                    dst.counts[e] != through.tile_counts[e]
                                    for d, e in zip(ins, outs)):
        return None
    return dict(zip(ins, outs))


@sharding_algebra.cached
def plan_reshape_halo(in_shape: ArrayShape, out_shape: ArrayShape, source: HloSharding,
                      target: HloSharding, n: int) -> ReshapeHalo | None:
    """The split or merge of the module docstring for reshaping an operand sharded `source` to
    a result sharded `target` on `n` devices, or None where XLA's conditions do not hold.
    Dims whose tiling survives the reshape group the devices (`_grouped`: XLA's recursion on
    the dims `PropagateShardingThroughReshape` keeps): within a group, read with those dims at
    their shard sizes, both are tiled on one dim alone the same number of ways, with equal
    products of the dims before them, and one size a multiple of the other."""
    src, dst = _tiling(source, in_shape.rank, n), _tiling(target, out_shape.rank, n)
    if src is None or dst is None:
        return None
    grouped = _grouped(in_shape, out_shape, source, src, dst)
    if grouped is None:
        return None
    rest_in = [d for d, c in enumerate(src.counts) if c > 1 and d not in grouped]
    rest_out = [e for e, c in enumerate(dst.counts) if c > 1 and e not in grouped.values()]
    if len(rest_in) != 1 or len(rest_out) != 1:
        return None
    (i,), (j,) = rest_in, rest_out
    c = dst.counts[j]
    moved = {**grouped, i: j}
    inner_in = [cdiv(x, src.counts[d]) if d in grouped else x
                for d, x in enumerate(in_shape.dims)]
    inner_out = [cdiv(x, dst.counts[e]) if e in grouped.values() else x
                 for e, x in enumerate(out_shape.dims)]
    targets = [moved[d] for d in sorted(moved)]
    if src.counts[i] != c or targets != sorted(targets) or \
            math.prod(inner_in[:i]) != math.prod(inner_out[:j]):
        return None
    size_a, size_b = in_shape.dims[i], out_shape.dims[j]
    counts = tuple(dst.counts[moved[d]] if d in moved else 1 for d in range(in_shape.rank))
    operand = Tiling.of_devices(dst.devices.reshape(counts + dst.devices.shape[-2:])).sharding
    a, s = cdiv(size_a, c), cdiv(size_b, c)
    width = dtypes.byte_width(in_shape.element_type)
    if size_a % size_b == 0:
        rows = s * (size_a // size_b)
        plan = plan_halo(WindowedDim(size_a, c, padding_high=rows * c - size_a,
                                     outputs=(0, size_a)))
        local = Tiling(operand, in_shape.rank, n).shard_dims(in_shape.dims)
        split, dim, merged = True, i, ()
    elif size_b % size_a == 0:
        positions = a * (size_b // size_a)
        plan = plan_halo(WindowedDim(positions * c, c, padding_high=size_b - positions * c,
                                     outputs=(0, size_b)))
        local = dst.shard_dims(out_shape.dims)
        local = local[:j] + (positions,) + local[j + 1:]
        split, dim, merged = False, j, local
    else:
        return None
    return ReshapeHalo(split, dim, plan, operand, merged, *halo_sent({dim: plan}, local, width, n))


def emit_reshape_halo(ctx: EmitContext, inst: Instruction, value: Instruction,
                      halo: ReshapeHalo) -> Instruction:
    """The local program of reshape `inst` on `value`, the operand's shard under
    `halo.operand`: the exchange and the local reshape in the order of `halo.split`. The
    reshape keeps `inst`'s name and sharding."""
    operand = inst.operands[0]
    shard = inst.sharding.shard_shape(inst.shape)
    if halo.split:
        tiling = Tiling(halo.operand, operand.shape.rank, ctx.num_devices)
        with ctx.builder.scope(_metadata(inst, operand.name, halo)):
            value = windowed_input(ctx, value, tiling, {halo.dim: halo.plan}, None)
        return _local_reshape(ctx, inst, value, shard)
    tiling = Tiling(inst.sharding, inst.shape.rank, ctx.num_devices)
    merged = _local_reshape(ctx, inst, value, shard.with_dims(halo.merged))
    with ctx.builder.scope(_metadata(inst, inst.name, halo)):
        return windowed_input(ctx, merged, tiling, {halo.dim: halo.plan}, None)


def _metadata(inst: Instruction, value: str, halo: ReshapeHalo) -> KeyValueList:
    """What `explain` shows of the exchange's instructions."""
    what = "splits" if halo.split else "merges"
    return KeyValueList((("op_type", "halo-exchange"), ("op_name", inst.name),
                         ("spmd_value", value),
                         ("spmd_reason", f"reshape {what} its tiled dim unevenly: the shards "
                                         f"realign by a halo exchange (dim {halo.dim}: "
                                         f"{halo.plan.describe()})")))


def _local_reshape(ctx: EmitContext, inst: Instruction, value: Instruction,
                   shape: ArrayShape) -> Instruction:
    local = Instruction(inst.name, "reshape", shape, [value], inst.attrs,    # copied
                        sharding=inst.sharding)
    return ctx.builder.append(local)


__all__ = ["ReshapeHalo", "emit_reshape_halo", "plan_reshape_halo"]
