"""Partitioning of `dot` (docs/design/partitioning.md#dot): batch-, contracting-,
non-contracting-partitioned and
mixed operands on meshes of any rank, by one compatibility rule instead of XLA's recursion.

A local dot of two shards is a correct piece of the global dot when, on every device, both
operands hold the same block of every batch dim and of every contracting dim. Then the device's
result is the output block (batch, lhs-free and rhs-free blocks of its operands) summed over its
contracting block only: `dot_result` builds that result sharding, with the contracting tiles as
the `unreduced` subgroup (partial sums), or finds that the pair is incompatible (blocks disagree,
or the output blocks do not cover the output evenly). XLA's grouped cases (cases 1-4 there) are
exactly the compatible pairs whose devices form groups; no in-group ids are needed because every
table and collective is built over global device ids.

Candidate operand pairs, chosen by bytes the busiest device sends (operand reshards +
resharding the result, partial sums included — an all-reduce, or a reduce-scatter when the
annotated output is tiled), then by bytes all devices send, then by local work:

1. the operands as they are;
2. rhs aligned to the lhs on batch and contracting dims (replicated elsewhere, or keeping the
   rhs's own free-dim tiling when it merges), and the mirror image;
3. both operands derived from the output sharding (batch and free dims; contracting whole);
4. both replicated.

A dot marked by the `windowed-einsum` pass (`windowed_einsum.py`, off by default) is lowered as a
loop of partial dots with collective-permutes instead of a dot after an all-gather, or before a
reduce-scatter.
"""
from __future__ import annotations

from math import prod
from typing import NamedTuple

import numpy as np

from gspmdc.ir import sharding_algebra
from gspmdc.ir.frontend_attributes import WINDOWED_EINSUM, frontend_attribute
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import cached
from gspmdc.ir.tile_assignment import atomic_axes, from_axes

from .op_rules import OpPlan, PartitionRule, PlanContext, Signature, clone, without_partials
from .tiling import Tiling, remap, tiling_from_coordinates


class DotDims(NamedTuple):
    """The dimension classes of a dot: batch and contracting pairs, free dims of each side (an
    immutable named tuple: made for every dot planned, a key of its plan's cache)."""

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]

    @classmethod
    def of(cls, inst) -> "DotDims":
        lb, rb = tuple(inst.attr("lhs_batch_dims", ())), tuple(inst.attr("rhs_batch_dims", ()))
        lc = tuple(inst.attr("lhs_contracting_dims", ()))
        rc = tuple(inst.attr("rhs_contracting_dims", ()))
        lhs_rank, rhs_rank = inst.operands[0].shape.rank, inst.operands[1].shape.rank
        lhs_paired, rhs_paired = lb + lc, rb + rc
        lf = tuple([d for d in range(lhs_rank) if d not in lhs_paired])
        rf = tuple([d for d in range(rhs_rank) if d not in rhs_paired])
        return cls(lb, rb, lc, rc, lf, rf)

    def lhs_to_output(self, lhs_rank: int) -> list[int]:
        """Output position of each lhs dim (-1 for contracting dims)."""
        out = [-1] * lhs_rank
        for k, d in enumerate(self.lhs_batch + self.lhs_free):
            out[d] = k
        return out

    def rhs_to_output(self, rhs_rank: int) -> list[int]:
        out = [-1] * rhs_rank
        for k, d in enumerate(self.rhs_batch):
            out[d] = k
        for k, d in enumerate(self.rhs_free):
            out[d] = len(self.lhs_batch) + len(self.lhs_free) + k
        return out

    def lhs_to_rhs(self, lhs_rank: int) -> list[int]:
        """rhs position of each lhs dim (-1 for lhs-free dims)."""
        out = [-1] * lhs_rank
        for a, b in zip(self.lhs_batch + self.lhs_contracting,
                        self.rhs_batch + self.rhs_contracting):
            out[a] = b
        return out

    def rhs_to_lhs(self, rhs_rank: int) -> list[int]:
        out = [-1] * rhs_rank
        for a, b in zip(self.lhs_batch + self.lhs_contracting,
                        self.rhs_batch + self.rhs_contracting):
            out[b] = a
        return out


def dot_result(lhs: Tiling, rhs: Tiling, dn: DotDims) -> Tiling | None:
    """The sharding of the local dot of shards of `lhs` and `rhs` (contracting tiles as partial
    sums), or None when the pair is not compatible."""
    if lhs.unreduced > 1 or rhs.unreduced > 1:
        return None
    axes = atomic_axes(lhs.tiles, rhs.tiles)
    if axes is not None:
        return _dot_result_of_axes(lhs, rhs, dn, *axes)
    return _dot_result_by_devices(lhs, rhs, dn)


def _dot_result_of_axes(lhs: Tiling, rhs: Tiling, dn: DotDims, lhs_axes,
                        rhs_axes) -> Tiling | None:
    """`dot_result` of iota operands, on the digits of the device ids each tile index reads
    (`atomic_axes`), at any device count: the paired dims must read the same digits, and the
    output blocks cover the output evenly exactly when no digit is read twice."""
    pairs = zip(dn.lhs_batch + dn.lhs_contracting, dn.rhs_batch + dn.rhs_contracting)
    if any(lhs_axes[a] != rhs_axes[b] for a, b in pairs):
        return None
    out = [lhs_axes[d] for d in dn.lhs_batch + dn.lhs_free] + \
        [rhs_axes[d] for d in dn.rhs_free]
    partial = [digit for d in dn.lhs_contracting for digit in lhs_axes[d]]
    read = [digit for axis in out for digit in axis] + partial
    seen = set(read)
    if len(seen) != len(read):
        return None
    rest = [digit for axis in lhs_axes for digit in axis if digit not in seen]
    counts = [lhs.counts[d] for d in dn.lhs_batch + dn.lhs_free] + \
        [rhs.counts[d] for d in dn.rhs_free]
    u = prod(lhs.counts[d] for d in dn.lhs_contracting)
    tiles = from_axes(counts + [u, lhs.num_devices // (prod(counts) * u)], out + [partial, rest])
    return Tiling(sharding_algebra.sharding_of_devices(tiles), len(counts), lhs.num_devices)


def _dot_result_by_devices(lhs: Tiling, rhs: Tiling, dn: DotDims) -> Tiling | None:
    """`dot_result` on per-device coordinate tables (explicit device orders)."""
    lc, rc = lhs.coordinates(), rhs.coordinates()
    for a, b in zip(dn.lhs_batch + dn.lhs_contracting, dn.rhs_batch + dn.rhs_contracting):
        if lhs.counts[a] != rhs.counts[b] or not np.array_equal(lc[:, a], rc[:, b]):
            return None
    n = lhs.num_devices
    counts = [lhs.counts[d] for d in dn.lhs_batch + dn.lhs_free] + \
        [rhs.counts[d] for d in dn.rhs_free]
    columns = [lc[:, d] for d in dn.lhs_batch + dn.lhs_free] + [rc[:, d] for d in dn.rhs_free]
    partial_counts = [lhs.counts[d] for d in dn.lhs_contracting]
    u = prod(partial_counts)
    key = _flat(columns, counts, n) * u + _flat([lc[:, d] for d in dn.lhs_contracting],
                                                 partial_counts, n)
    cells = prod(counts) * u
    if n % cells:
        return None
    r = n // cells
    occupancy = np.bincount(key, minlength=cells)
    if occupancy.min() != r or occupancy.max() != r:
        return None
    order = np.lexsort((np.arange(n), key))
    return Tiling.of_devices(order.reshape(tuple(counts) + (u, r)))


def _flat(columns, counts, n) -> np.ndarray:
    if not columns:
        return np.zeros(n, dtype=np.int64)
    return np.ravel_multi_index(tuple(columns), counts)


@PARTITION_RULES.register("dot", instance=True)
class DotRule(PartitionRule):
    def plan(self, inst, ctx):
        """The cheapest candidate priced to the dot's annotation (planned once per layer), or,
        when that one is a pair split by the output's tiles (whose partial sums are summed
        only as the output's tiles) or computes the dot in another sharding than its
        annotation, the cheapest priced where the dot's users read it: a user reading the dot
        whole would gather those tiles again, or gather the annotation that its own tiles
        reach cheaply. Where insert-reshards shares a reshard of an operand with its other
        users (made for an earlier one, or paid in part by later ones: `PlanContext.signature`
        without users), the candidates are priced with it, still to the annotation: a dot
        reading an operand's replicated node made for another user runs replicated instead of
        gathering its own result (XLA's reshard cache)."""
        dn, signature = DotDims.of(inst), Signature.of(inst).without_metadata()
        plan = _dot_plan(dn, signature, ctx.num_devices)
        candidates = dot_candidates(dn, signature, ctx.num_devices)
        if plan.reason == OUTPUT_SPLIT or plan.result != signature.sharding:
            return ctx.choose(inst, candidates, lambda p: (ctx.total_of(inst, p),
                                                           _local_work(dn, signature, p)))
        shared = ctx.signature(inst, candidates, users=False, own=signature)
        if shared is signature:
            return plan
        return _dot_plan(dn, signature, ctx.num_devices, shared.without_metadata())

    def lower(self, inst, ctx):
        if frontend_attribute(inst, WINDOWED_EINSUM) is None:
            return clone(inst, ctx)     # most dots: no import statement run for them
        # imported here: the windowed einsum builds on this module's DotDims
        from .windowed_einsum import Windowing, lower_windowed
        return lower_windowed(inst, ctx, Windowing.of(inst))


#: the reason of a candidate pair split by the output's tiles (`output_split_pairs`)
OUTPUT_SPLIT = "dot operands' replicas split by the output's free-dim tiles"


@cached
def _dot_plan(dn: DotDims, signature: Signature, num_devices: int,
              shared: Signature | None = None) -> OpPlan:
    """The dot's candidate (`dot_candidates` of its dims and metadata-free `signature`)
    moving the fewest bytes, then the fewest all devices send, then doing the least local
    work: priced to its annotation (`signature`), or, given `shared` (its signature with its
    operands' shared reshards, metadata-free), with those. A function of its arguments alone,
    so planned once per layer, the shared pricing too (a later user planned ahead with the
    same shared reshards assumed asks the same question for every layer)."""
    ctx, priced = PlanContext(num_devices), signature if shared is None else shared
    return ctx.choose_for(priced, dot_candidates(dn, signature, num_devices),
                          lambda p: (ctx.total_for(priced, p), _local_work(dn, signature, p)))


@cached
def dot_candidates(dn: DotDims, signature: Signature, num_devices: int
                   ) -> tuple[OpPlan, ...]:
    """The dot's candidate plans, in XLA's order of preference."""
    ctx = PlanContext(num_devices)
    (lhs_shape, rhs_shape), (lhs_sharding, rhs_sharding) = \
        signature.operand_shapes, signature.operand_shardings
    lr, rr, out_rank = lhs_shape.rank, rhs_shape.rank, signature.shape.rank
    target = without_partials(signature.sharding)
    if target.kind == "maximal":
        return (OpPlan((target, target), target, "dot on one device"),)
    pairs: list[tuple[HloSharding, HloSharding, str]] = []

    def tiling(s, rank):
        if s.kind in ("tiled", "replicated") and s == without_partials(s):
            return ctx.tiling(s, rank)
        return None

    lt, rt = tiling(lhs_sharding, lr), tiling(rhs_sharding, rr)
    if lt is not None and rt is not None:
        pairs.append((lhs_sharding, rhs_sharding, "dot operands are compatible"))
    pairs += aligned_operand_pairs(
        None if lt is None else lt.sharding, None if rt is None else rt.sharding, dn, lr, rr,
        ("rhs aligned to lhs on batch/contracting dims",
         "rhs aligned to lhs, keeping its free-dim tiling",
         "lhs aligned to rhs on batch/contracting dims",
         "lhs aligned to rhs, keeping its free-dim tiling"))
    out_tiling = ctx.tiling(target, out_rank)
    pairs += output_split_pairs(pairs, out_tiling, dn, lr, rr, num_devices, OUTPUT_SPLIT)
    out = out_tiling.sharding
    out_to_lhs = _inverse(dn.lhs_to_output(lr), out_rank)
    out_to_rhs = _inverse(dn.rhs_to_output(rr), out_rank)
    pairs.append((remap(out, out_to_lhs, lr), remap(out, out_to_rhs, rr),
                  "dot operands follow the output's tiling"))
    replicated = HloSharding.replicate()
    pairs.append((replicated, replicated, "dot runs replicated"))

    candidates, seen = [], set()
    for a, b, reason in pairs:
        if (a, b) in seen:
            continue
        seen.add((a, b))
        result = dot_result(ctx.tiling(a, lr), ctx.tiling(b, rr), dn)
        if result is not None:
            candidates.append(OpPlan((a, b), result.sharding, reason))
    return tuple(candidates)


def _inverse(mapping: list[int], rank: int) -> list[int]:
    """For each of `rank` dims, the dim mapping to it (-1 if none)."""
    out = [-1] * rank
    for d, t in enumerate(mapping):
        if t >= 0:
            out[t] = d
    return out


def aligned_operand_pairs(lhs: HloSharding | None, rhs: HloSharding | None, dn: DotDims,
                          lhs_rank: int, rhs_rank: int, reasons: tuple[str, str, str, str]
                          ) -> list[tuple[HloSharding, HloSharding, str]]:
    """Candidate (lhs, rhs, reason) operand shardings in which one operand keeps its sharding and
    the other is aligned to it on the batch and contracting dims: first the rhs aligned to the
    lhs (alone, then keeping the rhs's own free-dim tiling where the two merge), then the lhs
    aligned to the rhs likewise; an operand given as None proposes nothing. `reasons` name the
    four candidates in that order (dots and convolutions word them differently)."""
    found = []
    for side, (own, other) in enumerate(((lhs, rhs), (rhs, lhs))):
        if own is None:
            continue
        mapping, rank, free = (dn.lhs_to_rhs(lhs_rank), rhs_rank, dn.rhs_free) if side == 0 \
            else (dn.rhs_to_lhs(rhs_rank), lhs_rank, dn.lhs_free)
        aligned = remap(own, mapping, rank)
        merged = None if other is None else _merge_free(other, aligned, free)
        for partner, reason in ((aligned, reasons[2 * side]), (merged, reasons[2 * side + 1])):
            if partner is not None:
                found.append((own, partner, reason) if side == 0 else (partner, own, reason))
    return found


def gathered_contracting_pairs(lhs: HloSharding | None, rhs: HloSharding | None, dn: DotDims,
                               lhs_rank: int, rhs_rank: int, reasons: tuple[str, str]
                               ) -> list[tuple[HloSharding, HloSharding, str]]:
    """Candidate (lhs, rhs, reason) operand shardings in which one operand keeps its batch and
    free tiling but gathers its tiled contracting dims, and the other is aligned to it on the
    batch dims (replicated elsewhere): the local dot then has whole contracting dims and no
    partial sums. This is XLA's choice when an operand is contracting-partitioned alone: it
    gathers that operand rather than slicing its partner and all-reducing a result larger
    than the gathered operand (within each group of devices sharing a batch block). The
    convolution rule asks it of its dims in the dot's terms, where a batch-grouped
    convolution's output tiling does not lead back to the input's batch tiles. First the lhs
    kept (`reasons[0]`), then the rhs (`reasons[1]`); an operand given as None, or without
    tiled contracting dims, proposes nothing."""
    found = []
    for side, (own, contracting, rank) in enumerate(
            ((lhs, dn.lhs_contracting, lhs_rank), (rhs, dn.rhs_contracting, rhs_rank))):
        if own is None or not own.is_tiled or \
                not any(own.tile_counts[d] > 1 for d in contracting):
            continue
        gathered = sharding_algebra.partially_replicate_on_dims(own, contracting)
        mapping, other_rank = (dn.lhs_to_rhs(lhs_rank), rhs_rank) if side == 0 \
            else (dn.rhs_to_lhs(rhs_rank), lhs_rank)
        partner = remap(gathered, mapping, other_rank)
        found.append((gathered, partner, reasons[0]) if side == 0
                     else (partner, gathered, reasons[1]))
    return found


def output_split_pairs(pairs: list[tuple[HloSharding, HloSharding, str]],
                       out: Tiling, dn: DotDims, lhs_rank: int, rhs_rank: int,
                       num_devices: int, reason: str
                       ) -> list[tuple[HloSharding, HloSharding, str]]:
    """For each (lhs, rhs) of `pairs`, the pair whose operands keep their tiling and split
    their replicas (a local slice) on their untiled free dims into the output's tiles of those
    dims (`out`), as far as the replicas divide (free dims pair with nothing on the other side,
    so the pair stays compatible); then the pair split so that every device takes its own
    tile of `out` there, where the replicas spread evenly so. This is XLA's dot partitioning
    grouped on the contracting dims: within each group of devices holding one contracting
    block, the operand replicated there is sliced by the output's sharding (its groups aligned
    with the output's), and the partial results summed over the groups are already tiled like
    the output (docs/design/partitioning.md#dot)."""
    found = []
    for lhs, rhs, _ in pairs:
        for split in (_split_free, _split_free_as_output):
            split_lhs = split(lhs, lhs_rank, dn.lhs_free, dn.lhs_to_output(lhs_rank), out,
                              num_devices)
            split_rhs = split(rhs, rhs_rank, dn.rhs_free, dn.rhs_to_output(rhs_rank), out,
                              num_devices)
            if split_lhs is not None or split_rhs is not None:
                found.append((split_lhs or lhs, split_rhs or rhs, reason))
    return found


def _split_free(s: HloSharding, rank: int, free: tuple[int, ...], to_output: list[int],
                out: Tiling, num_devices: int) -> HloSharding | None:
    """`s` with its replicas split on its untiled `free` dims into the output's tile counts
    there (each factor taken when it divides the replicas left), or None when none splits."""
    if s.kind not in ("tiled", "replicated") or s.has_unreduced or s.has_manual_leaf:
        return None
    tiling = Tiling(s, rank, num_devices)
    factors, left = [1] * rank, tiling.replication
    for d in free:
        want = out.counts[to_output[d]]
        if tiling.counts[d] == 1 and want > 1 and left % want == 0:
            factors[d], left = want, left // want
    if left == tiling.replication:
        return None
    return sharding_algebra.split_replication(s, factors, rank, num_devices)


def _split_free_as_output(s: HloSharding, rank: int, free: tuple[int, ...],
                          to_output: list[int], out: Tiling,
                          num_devices: int) -> HloSharding | None:
    """`s` with its replicas split on its untiled `free` dims so that every device holds its
    own tile of `out` there (the other dims as in `s`), or None when no dim splits or the
    devices holding a tile of `s` do not spread evenly over the output's tiles."""
    if s.kind not in ("tiled", "replicated") or s.has_unreduced or s.has_manual_leaf:
        return None
    return _split_as_output(s, rank, tuple(free), tuple(to_output), out.sharding, out.rank,
                            num_devices)


@cached
def _split_as_output(s: HloSharding, rank: int, free: tuple[int, ...],
                     to_output: tuple[int, ...], out_sharding: HloSharding, out_rank: int,
                     num_devices: int) -> HloSharding | None:
    """`_split_free_as_output` of a tiled or replicated `s`, the output's tiling given by its
    sharding and rank: on the digits of the device ids where both are iota tilings
    (`_split_by_axes`, at any device count), else on per-device tables (`_split_by_devices`)."""
    out = Tiling(out_sharding, out_rank, num_devices)
    tiling = Tiling(s, rank, num_devices)
    dims = [d for d in free if tiling.counts[d] == 1 and out.counts[to_output[d]] > 1]
    if not dims:
        return None
    axes = atomic_axes(tiling.tiles, out.tiles)
    if axes is not None:
        return _split_by_axes(tiling, out, dims, to_output, *axes)
    return _split_by_devices(tiling, out, dims, to_output)


def _split_by_axes(tiling: Tiling, out: Tiling, dims: list[int], to_output: tuple[int, ...],
                   own_axes, out_axes) -> HloSharding | None:
    """`_split_as_output` of iota tilings, on the digits of the device ids each tile index
    reads (`atomic_axes`): dim d of `dims` reads the digits of the output's dim
    `to_output[d]`, the others their own; the tiles spread evenly exactly when no digit is read
    twice, and the devices of one tile (the digits no dim reads) are its replicas (in any
    order: the sharding sorts them)."""
    rank = tiling.rank
    tile_axes = [out_axes[to_output[d]] if d in dims else own_axes[d] for d in range(rank)]
    read = [digit for axis in tile_axes for digit in axis]
    seen = set(read)
    if len(seen) != len(read):
        return None
    rest = [digit for axis in own_axes for digit in axis if digit not in seen]
    counts = [out.counts[to_output[d]] if d in dims else tiling.counts[d] for d in range(rank)]
    tiles = from_axes(counts + [1, tiling.num_devices // prod(counts)],
                      tile_axes + [[], rest])
    return sharding_algebra.sharding_of_devices(tiles)


def _split_by_devices(tiling: Tiling, out: Tiling, dims: list[int],
                      to_output: tuple[int, ...]) -> HloSharding | None:
    """`_split_as_output` on per-device coordinate tables (explicit device orders)."""
    rank = tiling.rank
    coords = tiling.coordinates()[:, :rank].copy()
    counts = list(tiling.counts)
    for d in dims:
        coords[:, d] = out.coordinates()[:, to_output[d]]
        counts[d] = out.counts[to_output[d]]
    tiled = tiling_from_coordinates(coords, tuple(counts))
    return None if tiled is None else tiled.sharding


def _merge_free(own: HloSharding, aligned: HloSharding,
                free: tuple[int, ...]) -> HloSharding | None:
    """`aligned` refined with `own`'s tiling of the free dims, when the two merge."""
    own_free = sharding_algebra.replicate_all_except(own, free)
    if not own_free.is_tiled:
        return None
    return sharding_algebra.merge_if_compatible(own_free, aligned, 0)


def _local_work(dn: DotDims, signature: Signature, plan: OpPlan) -> float:
    """Multiply-adds of the local dot: local output elements times local contracting size."""
    out = plan.result.shard_shape(signature.shape)
    contracting = plan.operands[0].shard_shape(signature.operand_shapes[0])
    size = prod(contracting.dims[d] for d in dn.lhs_contracting)
    return float(prod(out.dims) * size)


__all__ = ["DotDims", "dot_result", "DotRule", "gathered_contracting_pairs"]
