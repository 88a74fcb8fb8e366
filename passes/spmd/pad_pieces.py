"""A `pad` without interior padding, or a `slice` without strides, by an exchange of pieces
(docs/design/partitioning.md#pad-by-pieces).

Each tile of the result's tiling reads one box of the operand: result elements `[a, b)` of dim
d are operand elements `[a - low_d, b - low_d)`, cut to the operand's extent (`low_d`: the
pad's low edge padding, or minus the slice's start: a slice is a pad cropping both edges).
Every device receives the parts of its box it does not hold from devices holding them
(`reshard_exchange.plan_exchange` with `shifted`: one `collective-permute` per round, a
replicated part sent by its least busy holder), writes them at their places in its result tile
and (a pad) fills the positions outside the operand with the pad value. XLA's partitioner
reshards the operand to the result's sharding and exchanges halos between neighbours: whole
shards move, then the halos, including elements the result's tiles never read (a negative
padding's cut) and, when the operand's tiles are another device order, twice over the busiest
devices. The pieces move each element a tile reads once, from its holder.

`pieces_plan(inst, source, target, n)` gives the rounds and their bytes (`Pieces`, priced as
lowering emits them) when the operand (sharded `source`) and the result (`target`) are both
tiled without partial or manual subgroups and the pad has no interior padding (the slice no
strides), else None (also when more rounds than `MAX_ROUNDS` would be needed);
`emit_pad_pieces` emits them.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape

from .reshard import EmitContext, emit_pieces
from .reshard_exchange import Round, plan_exchange
from .reshard_plan import Exchange
from .tiling import Tiling


class Pieces(NamedTuple):
    """The rounds of an exchange of pieces and the bytes they send: from the busiest device
    and from all devices together (as lowering emits them)."""

    rounds: tuple[Round, ...]
    busiest: float
    total: float

    @property
    def sent(self) -> tuple[float, float]:
        return self.busiest, self.total


def pieces_plan(inst: Instruction, source: HloSharding, target: HloSharding,
                num_devices: int) -> Pieces | None:
    """The exchange moving the operand of pad `inst` from `source` into the pieces of the
    tiles of its result under `target` (None where it does not apply, see the module
    docstring)."""
    low = _low(inst)
    if low is None or not (_plain_tiled(source) and _plain_tiled(target)):
        return None
    return _pieces(inst.operands[0].shape, inst.shape.dims, low, source, target, num_devices)


def _low(inst: Instruction) -> tuple[int, ...] | None:
    """Per dim, where the operand's first element lies in the result (a pad's low edge
    padding, a slice's start negated), or None where the result is not the operand shifted and
    cut (a pad with interior padding, a strided slice)."""
    if inst.opcode == "slice":
        slices = inst.attr("slice")
        return None if any(s.stride != 1 for s in slices) else tuple(-s.start for s in slices)
    padding = inst.attr("padding")
    return None if any(p.interior for p in padding) else tuple(p.low for p in padding)


@algebra.cached
def _pieces(shape: ArrayShape, result_dims: tuple[int, ...], low: tuple[int, ...],
            source: HloSharding, target: HloSharding, num_devices: int) -> Pieces | None:
    rank = shape.rank
    rounds = plan_exchange(shape.dims, Tiling(source, rank, num_devices),
                           Tiling(target, rank, num_devices), shifted=(result_dims, low))
    if rounds is None:
        return None
    replicated = Tiling.replicated(rank, num_devices)
    traffic = Exchange(replicated, replicated, rounds=tuple(rounds)).traffic(
        shape.dims, dtypes.byte_width(shape.element_type))
    if traffic is None:
        return Pieces(tuple(rounds), 0.0, 0.0)
    return Pieces(tuple(rounds), float(traffic.max_sent), float(traffic.total_sent))


def emit_pad_pieces(ctx: EmitContext, inst: Instruction, value: Instruction,
                    scalars: list[Instruction], rounds: tuple[Round, ...]) -> Instruction:
    """This partition's result tile of pad or slice `inst` (sharded as planned) from its
    operand shard `value`: the pieces of `rounds` at their places, and for a pad the pad value
    (`scalars`: the local pad value) at the positions outside the operand."""
    b, tables = ctx.builder, ctx.tables
    operand = inst.operands[0]
    rank = operand.shape.rank
    target = Tiling(inst.sharding, rank, ctx.num_devices)
    new = target.shard_dims(inst.shape.dims)
    tile = emit_pieces(ctx, value, rounds, new)
    if inst.opcode == "slice":
        return tile
    (pad_value,) = scalars
    offsets = target.offsets(inst.shape.dims)
    keep = None
    for d, p in enumerate(inst.attr("padding")):
        # only positive edge padding is filled (the positions past the result's end are
        # padding of its uneven tiles, whose values do not matter)
        start = offsets[:, d] - p.low
        lo = np.clip(-start, 0, new[d]) if p.low > 0 else np.zeros_like(start)
        hi = np.clip(operand.shape.dims[d] - start, 0, new[d]) if p.high > 0 else \
            np.full_like(start, new[d])
        if not lo.any() and (hi == new[d]).all():
            continue
        index = b.iota("s32", new, d)
        inside = b.binary("and",
                          b.compare(index, b.broadcast(tables.lookup(lo, f"pad.lo.{d}"), new),
                                    "GE"),
                          b.compare(index, b.broadcast(tables.lookup(hi, f"pad.hi.{d}"), new),
                                    "LT"))
        keep = inside if keep is None else b.binary("and", keep, inside)
    if keep is None:
        return tile
    return b.select(keep, tile, b.broadcast(pad_value, new))


def _plain_tiled(s: HloSharding) -> bool:
    return s.is_tiled and not s.has_unreduced and not s.has_manual_leaf


__all__ = ["Pieces", "emit_pad_pieces", "pieces_plan"]
