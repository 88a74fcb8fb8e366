"""The sharding algebra as sharding propagation uses it (XLA's hlo_sharding_util, §2.7 and §3.4).

Most operations come from `gspmdc.ir.sharding_ops`. This module adds what propagation needs on top,
following XLA where its choices are observable in the propagated shardings:

* `reshape_sharding` / `propagate_through_reshape`: XLA's stack-based ReshapeSharding, which only
  *reshapes* the tile assignment (tiles that cannot follow a reshape become trailing replication,
  in row-major device order), and the piecewise PropagateShardingThroughReshape built on it.
* `merge_if_compatible`: XLA's transpose/reshape fast path (stays in iota form, so its cost does not
  depend on the device count), falling back to the device-set construction of `sharding_ops`.
* `is_subtiling_or_equal`: XLA's shortcut on tile-assignment dims, with the per-device check of
  `sharding_ops` as the fallback.
* the "improve" decision (`improved_sharding`, §3.4) with `merge_sharding`, `is_strictly_better`,
  `find_common_sharding`, and tuple helpers.
"""
from __future__ import annotations

import functools
from itertools import permutations
from math import gcd, prod
from typing import Callable, Sequence

from gspmdc.ir import sharding_ops as ops
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment

is_more_specific = ops.is_more_specific

#: cap on the permutations the merge fast path tries (XLA enumerates them all; ranks are small)
_MAX_FAST_PATH_DIMS = 6
#: entries kept per memoized function before its table is cleared
_MEMO_SIZE = 1 << 16


def _memo_key(value):
    """Shardings compare without metadata; the key keeps the metadata so that a cached result
    carries the right one. Lists of dims count as tuples."""
    if isinstance(value, HloSharding):
        return value, tuple(leaf.metadata for leaf in value.leaves())
    if isinstance(value, list):
        return tuple(value)
    return value


_MEMO_TABLES: list[dict] = []


def clear_memos() -> None:
    """Empty every memo table (benchmarks measure cold caches)."""
    for table in _MEMO_TABLES:
        table.clear()


def memoized(fn: Callable) -> Callable:
    """Cache a pure function of hashable arguments (shardings, shapes, dim tuples). Propagation
    asks the same questions over and over (every layer of a model, every level of the driver);
    the answers are immutable values, so sharing them is safe."""
    table: dict = {}
    _MEMO_TABLES.append(table)

    @functools.wraps(fn)
    def cached(*args):
        key = tuple(_memo_key(a) for a in args)
        try:
            return table[key]
        except KeyError:
            pass
        if len(table) >= _MEMO_SIZE:
            table.clear()
        result = table[key] = fn(*args)
        return result
    return cached


# ---- predicates --------------------------------------------------------------------------------

def is_spatially_partitioned(s: HloSharding | None) -> bool:
    """Tiled, manual or replicated (any leaf of a tuple): XLA's IsSpatiallyPartitioned. A
    single-device sharding is not."""
    if s is None:
        return False
    if s.is_tuple:
        return any(is_spatially_partitioned(e) for e in s.elements)
    return s.kind != "maximal"


def is_strictly_better(a: HloSharding, b: HloSharding) -> bool:
    """Manual beats tile-maximal; tuples: no leaf worse and at least one better."""
    if a.is_tuple:
        better = False
        for x, y in zip(a.elements, b.elements):
            if is_strictly_better(y, x):
                return False
            better |= is_strictly_better(x, y)
        return better
    return a.kind == "manual" and b.is_tile_maximal


def leaf_count(shape: Shape) -> int:
    return sum(1 for _ in shape.leaves())


def single_tuple(shape: Shape, s: HloSharding) -> HloSharding:
    """`s` on every leaf of a tuple shape (XLA's SingleTuple); `s` itself for arrays."""
    if not isinstance(shape, TupleShape):
        return s
    return HloSharding.tuple([s] * leaf_count(shape))


def for_shape(s: HloSharding, shape: Shape) -> HloSharding:
    """Normalise: a tuple-shaped value always carries a tuple sharding (one leaf per array leaf)."""
    if isinstance(shape, TupleShape) and not s.is_tuple:
        return single_tuple(shape, s)
    return s


# ---- memoized forms of sharding_ops used in every layer of a model -------------------------------

@memoized
def transpose(s: HloSharding, perm: tuple[int, ...]) -> HloSharding:
    """`sharding_ops.transpose` (output dim i is input dim `perm[i]`)."""
    return ops.transpose(s, perm)


@memoized
def replicate_dims(s: HloSharding, dims: tuple[int, ...]) -> HloSharding:
    """`sharding_ops.partially_replicate_on_dims` for any sharding (non-tiled ones unchanged)."""
    return ops.partially_replicate_on_dims(s, dims) if s.is_tiled else s


# ---- reshape -----------------------------------------------------------------------------------

def _reshape_tile_dims(source: Sequence[int], target: Sequence[int],
                       counts: Sequence[int]) -> list[int] | None:
    """XLA's ReshapeSharding scan: target tile counts such that tiles follow the reshape (dims
    merged only when the minor ones are unsharded, split by divisibility, a gcd taken when a split
    does not divide); None when no tile can follow."""
    sources, tiles, targets = list(reversed(source)), list(reversed(counts)), list(reversed(target))
    out: list[int] = []
    while sources or targets:
        if not targets:
            if prod(tiles) != 1:
                return None
            break
        s_size, s_parts = (sources.pop(), tiles.pop()) if sources else (1, 1)
        t_size = targets.pop()
        if s_parts * prod(tiles) == 1:
            out.append(1)
        elif s_size == t_size:
            out.append(s_parts)
        elif t_size == 1:
            out.append(1)
            sources.append(s_size)
            tiles.append(s_parts)
        elif s_size == 1:
            targets.append(t_size)
        elif s_size > t_size:
            if s_size % s_parts or s_size % t_size:
                return None
            if t_size % s_parts == 0:
                out.append(s_parts)
                sources.append(s_size // t_size)
                tiles.append(1)
            elif s_parts % t_size == 0:
                out.append(t_size)
                sources.append(s_size // t_size)
                tiles.append(s_parts // t_size)
            else:
                out.append(gcd(t_size, s_parts))
                break
        else:
            if s_size % s_parts or not sources or (tiles[-1] != 1 and s_size != s_parts):
                return None
            sources[-1] *= s_size
            tiles[-1] *= s_parts
            targets.append(t_size)
    if prod(out) == 1:
        return None
    return out + [1] * (len(target) - len(out))


@memoized
def reshape_sharding(source: Sequence[int], target: Sequence[int],
                     s: HloSharding) -> HloSharding | None:
    """The sharding of `reshape(x)` (x of dims `source`, result of dims `target`) when x has `s`,
    or None. The tile assignment is only reshaped: tiles that cannot follow (a sharded size-1 dim
    that disappears, the remainder of a gcd split) become replication."""
    if not s.is_tiled:
        return s
    if tuple(source) == tuple(target):
        return s
    out = _reshape_tile_dims(source, target, s.tile_counts)
    if out is None:
        return None
    ta, rank = s.tile_assignment, s.data_rank
    dims = out + list(ta.dims[rank:])
    types = list(s.subgroup_types)
    quotient = ta.num_devices // prod(dims)
    if quotient > 1:
        if "replicated" in types:
            dims[len(out) + types.index("replicated")] *= quotient
        else:
            dims.append(quotient)
            types.append("replicated")
    return HloSharding.tiled(ta.reshape(dims), types)


@memoized
def propagate_through_reshape(source: Sequence[int], target: Sequence[int],
                              s: HloSharding) -> HloSharding:
    """XLA's PropagateShardingThroughReshape: for each start dim, the longest run of source dims
    whose tiling alone survives the reshape is kept (its devices are `T` transposed to put the run
    first, reshaped to the result tiling, the rest replicated) and merged into the result; dims
    whose tiling cannot follow end up replicated. Manual subgroups are kept aside and restored."""
    source, target = tuple(source), tuple(target)
    if not s.is_tiled:
        return s
    if s.has_manual_subgroup:
        grouped = ops.group_on_dims(s, [s.subgroup_dim("manual")])
        inner = propagate_through_reshape(source, target, grouped.sharding)
        return ops.ungroup(grouped.with_sharding(inner, len(target)))
    rank, ta = s.data_rank, s.tile_assignment
    counts = s.tile_counts
    result = HloSharding.replicate()
    start = 0
    while start < rank:
        for end in range(rank, start, -1):
            run = [counts[i] if start <= i < end else 1 for i in range(rank)]
            if prod(run) == 1:
                continue
            reshaped = reshape_sharding(source, target, HloSharding.tiled(TileAssignment.iota(run)))
            if reshaped is None or not reshaped.is_tiled:
                continue
            perm = list(range(start, end)) + list(range(start)) + list(range(end, ta.ndim))
            dims = list(reshaped.tile_assignment.dims)
            replicated = ta.num_devices // prod(dims)
            if len(dims) == len(target):
                dims.append(replicated)
            else:
                dims[-1] *= replicated
            piece = HloSharding.tiled(ta.transpose(perm).reshape(dims), ["replicated"])
            merged = merge_if_compatible(piece, result)
            if merged is not None:
                result = merged
                start = end
                break
        else:
            start += 1
    return result


# ---- merging and comparing ---------------------------------------------------------------------

def _fast_candidates(s: HloSharding, merged: list[int], replication: int,
                     ndim: int) -> list[TileAssignment]:
    """XLA's compatible tile assignments of `s` for the merged tiling: its replication dim split
    into the tile counts it lacks (+ the remaining replication), in every order, moved in place."""
    ta = s.tile_assignment
    if not s.has_partial_replication or s.subgroup_size("replicated") == replication:
        return [ta]
    rank = s.data_rank
    counts = s.tile_counts
    kept = [i for i in range(rank) if counts[i] == merged[i]]
    new_positions = [i for i in range(rank) if counts[i] != merged[i]]
    new_sizes = [merged[i] for i in new_positions]
    if replication > 1:
        new_positions.append(ndim - 1)
        new_sizes.append(replication)
    if len(new_sizes) > _MAX_FAST_PATH_DIMS:
        return []
    out = []
    for order in permutations(range(len(new_sizes))):
        perm = [0] * (rank + (1 if replication > 1 else 0))
        for k, i in enumerate(kept):
            perm[i] = k
        for k, o in enumerate(order):
            perm[new_positions[o]] = len(kept) + k
        shape = [counts[i] for i in kept] + [new_sizes[o] for o in order]
        out.append(ta.reshape(shape).transpose(perm))
    return out


@memoized
def merge_if_compatible(to_merge: HloSharding, dst: HloSharding,
                        minimum_tiles: int | None = None) -> HloSharding | None:
    """§2.7(l), XLA's MergeShardingIfCompatible (default `minimum_tiles`: `dst`'s tiles + 1).
    Tries the transpose/reshape fast path first (no per-device work for iota assignments)."""
    if minimum_tiles is None:
        minimum_tiles = dst.num_tiles + 1 if dst.is_tiled else 2
    if to_merge.is_tuple or dst.is_tuple or "manual" in (to_merge.kind, dst.kind):
        return None
    if not to_merge.is_tiled:
        return None
    if dst.is_tile_maximal:
        return to_merge
    if not dst.is_tiled or not dst.has_partial_replication or dst.data_rank != to_merge.data_rank \
            or to_merge.has_manual_subgroup or dst.has_manual_subgroup:
        return ops.merge_if_compatible(to_merge, dst, minimum_tiles)
    merged = []
    for a, b in zip(to_merge.tile_counts, dst.tile_counts):
        if a != b and a != 1 and b != 1:
            return None
        merged.append(max(a, b))
    n = to_merge.tile_assignment.num_devices
    tiles = prod(merged)
    if n != dst.tile_assignment.num_devices or n % tiles or tiles < minimum_tiles:
        return None
    replication = n // tiles
    ndim = dst.tile_assignment.ndim
    dst_candidates = _fast_candidates(dst, merged, replication, ndim)
    for a in _fast_candidates(to_merge, merged, replication, ndim):
        for b in dst_candidates:
            if a == b:
                return HloSharding.tiled(a, ["replicated"] if replication > 1 else [])
    return ops.merge_if_compatible(to_merge, dst, minimum_tiles)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@memoized
def is_subtiling_or_equal(dims: Sequence[int], sub: HloSharding, sup: HloSharding) -> bool:
    """§2.7(n), XLA's IsSubTilingOrEqualSharding: every device's region under `sub` lies inside
    its region under `sup`. Uses XLA's tile-dims shortcut when every tile holds real data and the
    counts divide; the per-device check otherwise."""
    if "manual" in (sub.kind, sup.kind):
        return False
    if sup.is_tile_maximal:
        return True
    if sub.is_tile_maximal or not sub.is_tiled or not sup.is_tiled:
        return False
    rank = sub.data_rank
    if rank != sup.data_rank or rank != len(dims):
        return False
    reshape_dims = list(sub.tile_assignment.dims)
    shortcut, inserted = True, 0
    for i in range(rank):
        p, s, size = sub.tile_counts[i], sup.tile_counts[i], dims[i]
        if p < s:
            return False
        p_base, s_base = _cdiv(size, p), _cdiv(size, s)
        if s != 1 and (p % s or s_base % p_base or size <= (p - 1) * p_base
                       or size <= (s - 1) * s_base):
            shortcut = False
        if shortcut and p != s:
            reshape_dims[i + inserted] = s
            reshape_dims.insert(i + inserted + 1, p // s)
            inserted += 1
    if not shortcut:
        return ops.is_subtiling_or_equal(tuple(dims), sub, sup)
    if not sup.has_partial_replication:
        return sub == sup
    perm = list(range(len(reshape_dims)))
    for i in range(rank):
        if sub.tile_counts[i] != sup.tile_counts[i]:
            element = perm.pop(i + 1)
            perm.append(element)
    reshaped = sub.tile_assignment.reshape(reshape_dims).transpose(perm).reshape(
        sup.tile_assignment.dims)
    candidate = HloSharding.tiled(reshaped, ["replicated"])
    return candidate.is_tiled and candidate.tile_assignment == sup.tile_assignment


@memoized
def merge_sharding(old: HloSharding, candidate: HloSharding,
                   may_combine: bool) -> tuple[bool, HloSharding]:
    """XLA's MergeSharding(old, &candidate): `(whether the result improves on old, result)`. With
    `may_combine`, two partially replicated shardings over the same devices merge into a strictly
    more tiled one; otherwise the candidate counts only if it is more specific. Tuples leaf-wise
    (the candidate's leaves are kept where they do not improve)."""
    if old.is_tuple:
        changed, leaves = False, []
        for a, b in zip(old.elements, candidate.elements):
            leaf_changed, leaf = merge_sharding(a, b, may_combine)
            changed |= leaf_changed
            leaves.append(leaf)
        return changed, HloSharding.tuple(leaves)
    if may_combine and old.has_partial_replication and candidate.has_partial_replication and \
            old.total_num_tiles == candidate.total_num_tiles:
        merged = merge_if_compatible(old, candidate,
                                     max(old.num_tiles, candidate.num_tiles) + 1)
        if merged is not None:
            return True, merged
    return is_more_specific(candidate, old), candidate


def improved_sharding(candidate: HloSharding, current: HloSharding | None, shape: Shape, *,
                      may_combine: bool, aggressive: bool = False) -> HloSharding | None:
    """§3.4, XLA's ReturnImprovedShardingImpl: the sharding `current` should become given the
    `candidate`, or None for "no change"."""
    return _improved(candidate, current, shape, may_combine, aggressive)


@memoized
def _improved(candidate: HloSharding, current: HloSharding | None, shape: Shape,
              may_combine: bool, aggressive: bool) -> HloSharding | None:
    candidate = for_shape(candidate, shape)
    if current is not None and is_strictly_better(candidate, current):
        return candidate
    if not is_spatially_partitioned(candidate):
        return None
    if current is None:
        return candidate
    if candidate.is_manual:
        return None
    tiles = candidate.num_tiles if not candidate.is_tuple else None
    changed, result = merge_sharding(current, candidate, may_combine)
    if not changed:
        return None
    if not aggressive and isinstance(shape, ArrayShape) and not current.is_tile_maximal and \
            result.num_tiles == tiles and not is_subtiling_or_equal(shape.dims, result, current):
        return None
    return result


def find_common_sharding(shardings: Sequence[HloSharding],
                         default: HloSharding | None = None) -> HloSharding:
    """XLA's FindCommonSharding: all shardings merged when pairwise compatible, else `default`
    (or the first)."""
    common = shardings[0]
    for s in shardings[1:]:
        if s == common:
            continue
        merged = merge_if_compatible(s, common)
        if merged is None:
            return default if default is not None else shardings[0]
        common = merged
    return common


__all__ = [
    "is_more_specific", "is_spatially_partitioned", "is_strictly_better", "leaf_count",
    "single_tuple", "for_shape", "reshape_sharding", "propagate_through_reshape",
    "merge_if_compatible", "is_subtiling_or_equal", "merge_sharding", "improved_sharding",
    "find_common_sharding", "memoized", "clear_memos", "transpose", "replicate_dims",
]
