"""The reshard library: emits the local IR of a `ReshardPlan` (docs/partitioning.md,
"Resharding").

`emit_reshard(ctx, value, shape, plan)` takes the local instruction holding this partition's
shard of a global array of `shape` laid out as the plan's source, and returns the local
instruction holding its shard in the plan's target layout. Each step becomes:

| step                  | local program                                                    |
|-----------------------|------------------------------------------------------------------|
| `AllReduce`           | `all-reduce` over the partial groups with the value's reducer     |
| `ReduceScatter(d)`    | pad dim d to `u * shard'` when the dim was whole; `reduce-scatter` |
| `AllGather(d, g)`     | `all-gather` dim d; slice to the real size when the dim is whole   |
| `AllToAll(moves)`     | the sequence below                                                |
| `MaskedGather`        | padding zeroed; `dynamic-update-slice` into zeros; `all-reduce`   |
| `Slice`               | pad (uneven); `dynamic-slice` at table offsets `new - old`        |
| `Permute`             | `collective-permute`, one pair per target device                  |
| `Exchange`            | per round: `dynamic-slice` of the piece, `collective-permute`,     |
|                       | placed into the new tile (`dynamic-update-slice`) and selected     |
| `ZeroPartials`        | `select(partial index == 0, x, 0)`                                |
| `BroadcastFromDevice` | `select(partition-id == k, x, 0)`; `all-reduce` (add, or for pred) |
| `SendToDevice`        | `collective-permute {k -> j}`                                     |

An all-to-all moving g tiles from dim i to dim j pads dim j to `g * shard'`, reshapes it into
`[g, shard']`, exchanges the g pieces, transposes the received axis in front of dim i, merges it
into dim i, and slices dim i to its real size when it became whole. One moving tiles between
several pairs of dims splits every target dim so, transposes the sub-tile axes to the front
and merges them into one axis (in the order of the moves), exchanges it, splits it again and
puts each received axis in front of its source dim.

A masked gather writes the shard at its offset in the gathered shard (`new`, extended by one
shard so the update never clamps, then cut back to `new`) filled with zeros, padding elements
first replaced by zeros, and sums over the group: every real element has one contributor.

Padding elements carry unspecified values throughout (every step keeps real elements at their
positions and only moves padding into padding), so no other step masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.pass_manager import ChannelIds

from .builder import Builder, scalar_reducer
from .partition_ids import PartitionTables
from .reshard_plan import (
    AllGather, AllReduce, AllToAll, BroadcastFromDevice, Exchange, MaskedGather, Permute,
    ReduceScatter, ReshardPlan, SendToDevice, Slice, ZeroPartials,
)


@dataclass
class EmitContext:
    """What emitting local code needs: the builder of the computation, its partition tables, the
    module (for reducer computations) and its channel ids."""

    builder: Builder
    tables: PartitionTables
    module: Module
    channels: ChannelIds

    @property
    def num_devices(self) -> int:
        return self.tables.num_devices


def emit_reshard(ctx: EmitContext, value: Instruction, shape: ArrayShape, plan: ReshardPlan,
                 reducer: str | None = None, metadata: KeyValueList | None = None) -> Instruction:
    """Local code for `plan` applied to `value` (the shard of a global array of `shape`).
    `reducer` names the computation combining partial values (default: add). Every emitted
    instruction carries `metadata` plus `spmd_step` (what its step does). A plan on padded
    dims (`plan.padded`) starts from the shard padded to the padded array's and ends cut to
    the target's shard of `shape`."""
    real = shape
    if plan.padded is not None:
        shape = ArrayShape(shape.element_type, plan.padded)
    last = len(plan.steps) - 1
    for index, step in enumerate(plan.steps):
        scope = None
        if metadata is not None:
            scope = KeyValueList(metadata.items + (
                ("spmd_step", f"{index + 1}/{len(plan.steps)}: {step.describe()}"),))
        with ctx.builder.scope(scope):
            if index == 0 and plan.padded is not None:
                value = ctx.builder.pad_high(value, step.before.shard_dims(shape.dims))
            value = _EMITTERS[type(step)](ctx, value, shape, step, reducer)
            if index == last and plan.padded is not None:
                value = ctx.builder.slice_to(value, step.after.shard_dims(real.dims))
    return value


def _reducer(ctx: EmitContext, value: Instruction, reducer: str | None) -> str:
    if reducer is not None:
        return reducer
    t = value.shape.element_type
    return scalar_reducer(ctx.module, "or" if t == "pred" else "add", t)


def _all_reduce(ctx, value, shape, step: AllReduce, reducer):
    return ctx.builder.all_reduce(value, step.groups, _reducer(ctx, value, reducer),
                                  ctx.channels())


def _reduce_scatter(ctx, value, shape, step: ReduceScatter, reducer):
    b, d = ctx.builder, step.dim
    u = step.groups.shape[1]
    dims = list(value.shape.dims)
    dims[d] = u * step.after.shard_dims(shape.dims)[d]
    value = b.pad_high(value, dims)
    return b.reduce_scatter(value, d, step.groups, _reducer(ctx, value, reducer), ctx.channels())


def _all_gather(ctx, value, shape, step: AllGather, reducer):
    b, d = ctx.builder, step.dim
    gathered = b.all_gather(value, d, step.groups, ctx.channels())
    return b.slice_to(gathered, step.after.shard_dims(shape.dims))


def _all_to_all(ctx, value, shape, step: AllToAll, reducer):
    b = ctx.builder
    new_local = step.after.shard_dims(shape.dims)
    factors = {j: g for _, j, g in step.moves}
    dims = list(value.shape.dims)
    for j, g in factors.items():
        dims[j] = g * new_local[j]
    value = b.pad_high(value, dims)
    # each target dim j split into [g, its new shard]: axis at[j] holds the g sub-tiles
    split, at = [], {}
    for d, size in enumerate(dims):
        if d in factors:
            at[d] = len(split)
            split += [factors[d], new_local[d]]
        else:
            split.append(size)
    value = b.reshape(value, split)
    if len(step.moves) == 1:
        (i, j, g), = step.moves
        value = b.all_to_all(value, j, step.groups, ctx.channels())
        if step.reversed:
            # the pieces arrived from the members in reverse order of their sub-tiles of dim i
            value = b.add("reverse", value.shape, [value], {"dimensions": (j,)})
        # the received axis (at j) indexes the source sub-tiles of dim i: put it before dim i
        i_at = i if i < j else i + 1
        order = [a for a in range(len(split)) if a != j]
        order.insert(order.index(i_at), j)
    else:
        # the sub-tile axes brought together in the order of the moves, exchanged as one
        front = [at[j] for _, j, _ in step.moves]
        rest = [a for a in range(len(split)) if a not in front]
        value = b.transpose(value, front + rest)
        value = b.reshape(value, [prod(split[a] for a in front)] + [split[a] for a in rest])
        value = b.all_to_all(value, 0, step.groups, ctx.channels())
        value = b.reshape(value, [split[a] for a in front + rest])
        # received axis k indexes the source sub-tiles of move k's dim i: put it before dim i
        m, source_of = len(step.moves), {i: k for k, (i, _, _) in enumerate(step.moves)}
        order = []
        for d in range(len(dims)):
            if d in source_of:
                order.append(source_of[d])
            order.append(m + d)
    value = b.transpose(value, order)
    merged = list(dims)
    for i, j, g in step.moves:
        merged[j] = new_local[j]
        merged[i] = g * dims[i]
    value = b.reshape(value, merged)
    return b.slice_to(value, new_local)


def _masked_gather(ctx, value, shape, step: MaskedGather, reducer):
    b, tables = ctx.builder, ctx.tables
    before, after = step.before, step.after
    old, new = before.shard_dims(shape.dims), after.shard_dims(shape.dims)
    t = value.shape.element_type
    value = _zero_padding(ctx, value, shape, before, step.realigned)
    relative = before.offsets(shape.dims) - after.offsets(shape.dims)     # [N, rank]
    for d in step.realigned:        # member j of a group holds the j-th part of its tile
        factor = before.counts[d] // after.counts[d]
        relative[:, d] = before.coordinates()[:, d] % factor * old[d]
    room = [n + o if moved else n for n, o, moved in zip(new, old, relative.any(axis=0))]
    zeros = b.broadcast(b.zero(t), room)
    starts = [tables.lookup(relative[:, d], f"gather.offset.{d}") for d in range(len(new))]
    placed = b.add("dynamic-update-slice", zeros.shape.with_dims(room), [zeros, value, *starts])
    placed = b.slice_to(placed, new)
    combine = scalar_reducer(ctx.module, "or" if t == "pred" else "add", t)
    return b.all_reduce(placed, step.groups, combine, ctx.channels())


def _zero_padding(ctx, value, shape, tiling,
                  zeroed: frozenset = frozenset()) -> Instruction:
    """`value` (a shard under `tiling`) with its padding elements (beyond the dim's size) set to
    zero, except on the dims `zeroed` (whose padding is zero already)."""
    b = ctx.builder
    dims = value.shape.dims
    keep = None
    for d, (size, count) in enumerate(zip(shape.dims, tiling.counts)):
        if size % count == 0 or d in zeroed:
            continue
        start = ctx.tables.offsets(tiling, shape.dims)[d]
        index = b.binary("add", b.iota("s32", dims, d), b.broadcast(start, dims))
        inside = b.compare(index, b.broadcast(b.constant(size, "s32"), dims), "LT")
        keep = inside if keep is None else b.binary("and", keep, inside)
    if keep is None:
        return value
    return b.select(keep, value, b.broadcast(b.zero(value.shape.element_type), dims))


def _slice(ctx, value, shape, step: Slice, reducer):
    b, tables = ctx.builder, ctx.tables
    before, after = step.before, step.after
    old, new = before.shard_dims(shape.dims), after.shard_dims(shape.dims)
    offsets = after.offsets(shape.dims) - before.offsets(shape.dims)      # [N, rank]
    start = after.offsets(shape.dims)
    empty = start >= np.asarray(shape.dims)
    needed = np.where(empty, 0, offsets + np.asarray(new))
    padded = np.maximum(np.asarray(old), needed.max(axis=0, initial=0))
    offsets = np.where(empty, np.minimum(np.maximum(offsets, 0), padded - np.asarray(new)),
                       offsets)
    value = b.pad_high(value, [int(n) for n in padded])
    if not (offsets != 0).any():
        return b.slice_to(value, new)
    starts = [tables.lookup(offsets[:, d], f"slice.offset.{d}") for d in range(len(new))]
    return b.dynamic_slice(value, starts, new)


def _permute(ctx, value, shape, step: Permute, reducer):
    return ctx.builder.collective_permute(value, step.pairs, ctx.channels())


def _exchange(ctx, value, shape, step: Exchange, reducer):
    return emit_pieces(ctx, value, step.rounds, step.after.shard_dims(shape.dims))


def emit_pieces(ctx: EmitContext, value: Instruction, rounds, new: tuple[int, ...]
                ) -> Instruction:
    """The new tiles of shape `new` assembled from the pieces of `rounds`
    (`reshard_exchange.Round`s) cut from the local shard `value`. Per round (the local pieces
    first): every device cuts the piece it sends out of its shard (padded where some device's
    cut would run past it, so that no cut clamps), the round's permute moves it, the receiver
    writes it at its place in a zero tile (grown where some piece would run past it) and keeps
    it where the piece lies (what no piece fills is zero), the part kept per dim compared on
    that dim alone, on the dims where some device keeps less than the whole tile."""
    b, tables = ctx.builder, ctx.tables
    t = value.shape.element_type
    held = value.shape.dims
    rank = len(new)
    result = None
    for r in rounds:
        padded = b.pad_high(value, _reach(held, r.send_at, r.size))
        piece = b.dynamic_slice(padded, [tables.lookup(r.send_at[:, d], f"exchange.send.{d}")
                                         for d in range(rank)], list(r.size))
        if r.pairs is not None:
            piece = b.collective_permute(piece, r.pairs, ctx.channels())
        room = _reach(new, r.place_at, r.size)
        zeros = b.broadcast(b.zero(t), room)
        starts = [tables.lookup(r.place_at[:, d], f"exchange.place.{d}") for d in range(rank)]
        placed = b.add("dynamic-update-slice", zeros.shape.with_dims(room),
                       [zeros, piece, *starts])
        placed = b.slice_to(placed, new)
        keep = None
        for d in range(rank):
            if not (r.lo[:, d] != 0).any() and (r.hi[:, d] == new[d]).all():
                continue                    # every device keeps the whole dim
            line = (new[d],)
            index = b.iota("s32", line, 0)
            low = b.broadcast(tables.lookup(r.lo[:, d], f"exchange.lo.{d}"), line)
            high = b.broadcast(tables.lookup(r.hi[:, d], f"exchange.hi.{d}"), line)
            inside = b.binary("and", b.compare(index, low, "GE"), b.compare(index, high, "LT"))
            inside = b.broadcast(inside, new, (d,))
            keep = inside if keep is None else b.binary("and", keep, inside)
        if keep is None:
            result = placed
            continue
        base = result if result is not None else b.broadcast(b.zero(t), new)
        result = b.select(keep, placed, base)
    return result if result is not None else b.broadcast(b.zero(t), new)


def _reach(dims, starts: np.ndarray, size) -> list[int]:
    """`dims` grown where a block of `size` at some device's `starts` ([N, rank]) would run
    past them."""
    ends = starts.max(axis=0, initial=0) + np.asarray(size, dtype=np.int64)
    return [max(int(d), int(e)) for d, e in zip(dims, ends)]


def _zero_partials(ctx, value, shape, step: ZeroPartials, reducer):
    b = ctx.builder
    keep = b.compare(ctx.tables.partial_index(step.after), ctx.tables.zero(), "EQ")
    return _select_scalar(b, keep, value)


def _broadcast_from_device(ctx, value, shape, step: BroadcastFromDevice, reducer):
    b = ctx.builder
    mine = _select_scalar(b, ctx.tables.device_is(step.before.device), value)
    everyone = np.arange(ctx.num_devices)[None, :]
    t = value.shape.element_type
    combine = scalar_reducer(ctx.module, "or" if t == "pred" else "add", t)
    return b.all_reduce(mine, everyone, combine, ctx.channels())


def _send_to_device(ctx, value, shape, step: SendToDevice, reducer):
    pairs = np.array([[step.before.device, step.after.device]])
    return ctx.builder.collective_permute(value, pairs, ctx.channels())


def _select_scalar(b: Builder, predicate: Instruction, value: Instruction) -> Instruction:
    """`value` where the scalar `predicate` holds, zeros elsewhere."""
    dims = value.shape.dims
    mask = b.broadcast(predicate, dims)
    zeros = b.broadcast(b.zero(value.shape.element_type), dims)
    return b.select(mask, value, zeros)


_EMITTERS = {
    AllReduce: _all_reduce, ReduceScatter: _reduce_scatter, AllGather: _all_gather,
    AllToAll: _all_to_all, MaskedGather: _masked_gather, Slice: _slice, Permute: _permute,
    Exchange: _exchange,
    ZeroPartials: _zero_partials,
    BroadcastFromDevice: _broadcast_from_device, SendToDevice: _send_to_device,
}


__all__ = ["EmitContext", "emit_pieces", "emit_reshard"]
