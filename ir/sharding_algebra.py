"""The sharding algebra: every sharding derived from another, as pure functions on immutable
`HloSharding` values (the algorithms are described in docs/design/sharding-algebra.md).

Conventions, the same for every function:

* argument order: the sharding (or shardings) first, then dims and shapes, then options;
* functions named after an XLA function (`reshape_sharding` for ReshapeSharding, ...) give the
  answer XLA's own function gives, device order included; the design note lists them;
* non-tiled shardings (replicated, maximal, manual, unknown, unreduced) pass through unchanged
  unless stated otherwise; functions whose transformation can be impossible return `None` exactly
  where XLA returns no sharding;
* tile-assignment arithmetic goes through `TileAssignment.transpose/reshape`, which stay in iota
  form, so most operations cost the same at 8 and at 4096 devices: the partitioner's collective
  steps (`gather_tiles`, `move_tiles`, `split_replication`, `all_reduce_partials`) transform the
  device array as a tile assignment too; the general merge, reversing, ungrouping and
  `reduce_scatter_partials` use vectorised numpy over the device array.

The algebra owns the project's one cache: `cached` memoizes a pure function of hashable values
(shardings, shapes, tuples of dims) and `clear_caches()` empties every table.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import permutations
from math import gcd, prod
from typing import Callable, Sequence

import numpy as np

from gspmdc.errors import ShardingError, UnsupportedError

from .shapes import ArrayShape, Shape, TupleShape
from .sharding import SUBGROUP_TYPES, HloSharding
from . import sharding, tile_assignment
from .tile_assignment import TileAssignment

# ---- the cache ---------------------------------------------------------------------------------

#: entries kept per cached function before its table is emptied
CACHE_SIZE = 1 << 16
_TABLES: list[dict] = [tile_assignment._INTERNED, sharding._TILED, sharding._SHARD_SHAPES,
                       sharding._VALID]


def _key(value):
    """Shardings compare without metadata; the key keeps the metadata so that a cached result
    carries the right one (`HloSharding.memo_key`, computed once). Lists and arrays of dims count
    as tuples."""
    kind = type(value)
    if kind is HloSharding:
        return value.memo_key
    if kind is list or kind is np.ndarray:
        return tuple(int(v) for v in value)
    return value


#: argument types that count as tuples of dims in a memo key
_SEQUENCES = (list, np.ndarray)


def cached(fn: Callable) -> Callable:
    """Memoize a pure function of hashable arguments. Compilation asks the same questions over and
    over (every layer of a model, every level of propagation, every reshard of the same shapes);
    the answers are immutable values, so sharing them is safe."""
    table: dict = {}
    _TABLES.append(table)

    @functools.wraps(fn)
    def memo(*args, **kwargs):
        # `_key` inlined: this runs for every call of every cached function. Usually no
        # argument needs a key of its own (no metadata, no list): the arguments are the key.
        key = args
        for a in args:
            kind = type(a)
            if kind is HloSharding:
                if a.memo_key is a:
                    continue
            elif kind is not list and kind is not np.ndarray:
                continue
            key = tuple([a.memo_key if type(a) is HloSharding else
                         tuple([int(v) for v in a]) if type(a) in _SEQUENCES else a
                         for a in args])
            break
        if kwargs:
            key += tuple((name, _key(value)) for name, value in sorted(kwargs.items()))
        try:
            return table[key]
        except KeyError:
            pass
        if len(table) >= CACHE_SIZE:
            table.clear()
        result = table[key] = fn(*args, **kwargs)
        return result
    return memo


def clear_caches() -> None:
    """Empty every table of `cached` (benchmarks measure cold caches)."""
    for table in _TABLES:
        table.clear()


# ---- helpers -----------------------------------------------------------------------------------

def _leaf(s: HloSharding, what: str) -> None:
    if s.is_tuple:
        raise ShardingError(f"{what} needs a leaf sharding, got tuple sharding {s.to_text()}")


def _dims_of(shape) -> tuple[int, ...]:
    return tuple(shape.dims) if isinstance(shape, ArrayShape) else tuple(int(d) for d in shape)


def _data_dims(s: HloSharding, dims: Sequence[int], what: str) -> list[int]:
    dims = [int(d) for d in dims]
    if any(not 0 <= d < s.data_rank for d in dims) or len(set(dims)) != len(dims):
        raise ShardingError(f"{what}: bad dims {dims} for {s.to_text()} of data rank {s.data_rank}")
    return dims


def _rebuild(s: HloSharding, ta: TileAssignment, subgroup_types=None) -> HloSharding:
    """A canonical tiled sharding with `s`'s metadata and shard group."""
    types = s.subgroup_types if subgroup_types is None else subgroup_types
    return HloSharding.tiled(ta, types, s.metadata, s.shard_group)


# ---- predicates and tuples ---------------------------------------------------------------------

def is_spatially_partitioned(s: HloSharding | None) -> bool:
    """Tiled, manual or replicated (any leaf of a tuple): XLA's IsSpatiallyPartitioned. A
    single-device sharding is not."""
    if s is None:
        return False
    if s.kind == "tuple":
        return any(is_spatially_partitioned(e) for e in s.elements)
    return s.kind != "maximal"


def leaf_count(shape: Shape) -> int:
    return sum(1 for _ in shape.leaves())


def single_tuple(s: HloSharding, shape: Shape) -> HloSharding:
    """`s` on every leaf of a tuple shape (XLA's SingleTuple); `s` itself for arrays."""
    if not isinstance(shape, TupleShape):
        return s
    return HloSharding.tuple([s] * leaf_count(shape))


def for_shape(s: HloSharding, shape: Shape) -> HloSharding:
    """Normalise: a tuple-shaped value always carries a tuple sharding (one leaf per array leaf)."""
    if isinstance(shape, TupleShape) and not s.is_tuple:
        return single_tuple(s, shape)
    return s


# ---- replication and dim removal ---------------------------------------------------------------

@cached
def partially_replicate_on_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """Stop tiling data dims `dims` (XLA's PartiallyReplicateTiledShardingOnDims): their tiles fold
    into the replication subgroup, as its major part. Dims beyond the data rank are ignored;
    non-tiled shardings (tuples included) are returned unchanged."""
    if not s.is_tiled:
        return s
    rank = s.data_rank
    dims = sorted({int(d) for d in dims if 0 <= int(d) < rank})
    counts = s.tile_counts
    group = prod(counts[d] for d in dims)
    if group == 1:
        return s
    if group == s.num_tiles and not s.subgroup_types:
        return HloSharding.replicate(s.metadata, s.shard_group)
    ta = s.tile_assignment
    kept = [d for d in range(rank) if d not in dims]
    moved = ta.transpose(kept + dims + list(range(rank, ta.ndim)))
    new_dims = [1 if d in dims else counts[d] for d in range(rank)] + [group] + \
        list(ta.dims[rank:])
    return _rebuild(s, moved.reshape(new_dims), ("replicated",) + s.subgroup_types)


def replicate_all_except(s: HloSharding, keep: Sequence[int]) -> HloSharding:
    """Replicate every data dim not in `keep` (XLA's
    PartiallyReplicateTiledShardingOnAllDimsExcept)."""
    _leaf(s, "replicate_all_except")
    if not s.is_tiled:
        return s
    keep = set(int(d) for d in keep)
    return partially_replicate_on_dims(s, [d for d in range(s.data_rank) if d not in keep])


def replicate_all_data_dims(s: HloSharding, data_rank: int | None = None) -> HloSharding:
    """`{replicated}`, except that manual subgroups survive (all data dims then have one tile,
    re-ranked to `data_rank` when given): XLA's ReplicateAllDataDims."""
    _leaf(s, "replicate_all_data_dims")
    if s.kind == "manual":
        return s
    if not s.subgroup_types:
        return HloSharding.replicate(s.metadata, s.shard_group)
    result = replicate_all_except(s, ())
    if data_rank is not None and result.is_tiled and data_rank != result.data_rank:
        ta = result.tile_assignment
        ta = ta.reshape([1] * data_rank + list(ta.dims[result.data_rank:]))
        result = _rebuild(result, ta)
    return result


@cached
def remove_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """Delete data dims `dims`, each of which must have a single tile (XLA's
    RemoveShapeDimensions)."""
    _leaf(s, "remove_dims")
    if not s.is_tiled or not len(dims):
        return s
    dims = _data_dims(s, dims, "remove_dims")
    cut = [d for d in dims if s.tile_counts[d] != 1]
    if cut:
        raise ShardingError(f"remove_dims: dims {cut} of {s.to_text()} are tiled")
    ta = s.tile_assignment
    return _rebuild(s, ta.reshape([n for i, n in enumerate(ta.dims) if i not in dims] or [1]))


# ---- moving tiles between dims -----------------------------------------------------------------

@cached
def transpose(s: HloSharding, perm: Sequence[int]) -> HloSharding:
    """The sharding of `transpose(x, perm)` (output dim i = input dim `perm[i]`; XLA's
    TransposeSharding). `perm` covers the data dims (subgroup dims stay last) or all dims of `T`
    (subgroup dims must stay last)."""
    _leaf(s, "transpose")
    if not s.is_tiled:
        return s
    perm = [int(p) for p in perm]
    rank, ndim = s.data_rank, s.tile_assignment.ndim
    if len(perm) == rank:
        perm += list(range(rank, ndim))
    if sorted(perm) != list(range(ndim)) or sorted(perm[:rank]) != list(range(rank)):
        raise ShardingError(
            f"transpose: perm {perm} does not permute the data dims of {s.to_text()}")
    types = tuple(s.subgroup_types[p - rank] for p in perm[rank:])
    return _rebuild(s, s.tile_assignment.transpose(perm), types)


def reverse(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """The sharding of `reverse(x, dims)`: `T` flipped along those dims (XLA's ReverseSharding)."""
    _leaf(s, "reverse")
    if not s.is_tiled or not len(dims):
        return s
    dims = _data_dims(s, dims, "reverse")
    if all(s.tile_counts[d] == 1 for d in dims):
        return s
    return _rebuild(s, TileAssignment.from_array(np.flip(s.tile_assignment.array, axis=dims)))


def move_and_merge(s: HloSharding, source_dim: int, target_dim: int) -> HloSharding:
    """Move the tiles of `source_dim` into `target_dim` (target count becomes
    `t_target * t_source`, source 1); source tiles become the minor part of the target's (XLA's
    MoveAndMergeShardingTiles)."""
    _leaf(s, "move_and_merge")
    if not s.is_tiled:
        raise ShardingError(f"move_and_merge needs a tiled sharding, got {s.to_text()}")
    _data_dims(s, [source_dim, target_dim], "move_and_merge")
    ta = s.tile_assignment
    order = [d for d in range(ta.ndim) if d != source_dim]
    order.insert(order.index(target_dim) + 1, source_dim)
    dims = list(ta.dims)
    dims[target_dim] *= dims[source_dim]
    dims[source_dim] = 1
    return _rebuild(s, ta.transpose(order).reshape(dims))


def transpose_with_collapsed_dims(s: HloSharding, src_to_tgt: Sequence[int],
                                  tgt_to_src: Sequence[int]) -> HloSharding | None:
    """Map `s` from source data dims to target data dims (XLA's
    TransposeShardingWithCollapsedDims): `src_to_tgt[i] = -1` means dim i disappears and must have
    one tile (else None); `tgt_to_src[j] = -1` means a new dim with one tile."""
    _leaf(s, "transpose_with_collapsed_dims")
    if not s.is_tiled:
        return s
    src_to_tgt, tgt_to_src = [int(x) for x in src_to_tgt], [int(x) for x in tgt_to_src]
    rank = s.data_rank
    forward_ok = all(j < 0 or (j < len(tgt_to_src) and tgt_to_src[j] == i)
                     for i, j in enumerate(src_to_tgt))
    backward_ok = all(i < 0 or (i < rank and src_to_tgt[i] == j) for j, i in enumerate(tgt_to_src))
    if len(src_to_tgt) != rank or not forward_ok or not backward_ok:
        raise ShardingError(f"transpose_with_collapsed_dims: inconsistent maps {src_to_tgt} / "
                            f"{tgt_to_src} for {s.to_text()}")
    counts = s.tile_counts
    if any(j < 0 and counts[i] != 1 for i, j in enumerate(src_to_tgt)):
        return None
    ta = s.tile_assignment
    kept = sorted((j, i) for i, j in enumerate(src_to_tgt) if j >= 0)
    order = [i for _, i in kept] + [i for i, j in enumerate(src_to_tgt) if j < 0] + \
        list(range(rank, ta.ndim))
    new_dims = [counts[i] if i >= 0 else 1 for i in tgt_to_src] + list(ta.dims[rank:])
    return _rebuild(s, ta.transpose(order).reshape(new_dims or [1]))


def propagate_along_dims(s: HloSharding, source_dims: Sequence[int], target_dims: Sequence[int],
                         target_rank: int) -> HloSharding:
    """Keep the tiling of `source_dims[k]` on `target_dims[k]` of a rank-`target_rank` value and
    replicate every other source dim (XLA's PropagateShardingAlongDimsAndReplicateOthers, used for
    gather/scatter passthrough and index dims)."""
    _leaf(s, "propagate_along_dims")
    if len(source_dims) != len(target_dims):
        raise ShardingError(f"propagate_along_dims: {list(source_dims)} vs {list(target_dims)}")
    if not s.is_tiled:
        return s
    source_dims = _data_dims(s, source_dims, "propagate_along_dims")
    target_dims = [int(d) for d in target_dims]
    if any(not 0 <= d < target_rank for d in target_dims) or \
            len(set(target_dims)) != len(target_dims):
        raise ShardingError(
            f"propagate_along_dims: bad target dims {target_dims} for rank {target_rank}")
    kept = replicate_all_except(s, source_dims)
    if not kept.is_tiled:
        return kept
    ta = kept.tile_assignment
    rank = kept.data_rank
    by_target = [sd for _, sd in sorted(zip(target_dims, source_dims))]
    order = by_target + [d for d in range(rank) if d not in source_dims] + \
        list(range(rank, ta.ndim))
    new_dims = [1] * target_rank
    for sd, td in zip(source_dims, target_dims):
        new_dims[td] = ta.dims[sd]
    new_dims += list(ta.dims[rank:])
    return _rebuild(kept, ta.transpose(order).reshape(new_dims or [1]))


# ---- reshape -----------------------------------------------------------------------------------

def _reshape_tile_counts(source: Sequence[int], target: Sequence[int], counts: Sequence[int]):
    """XLA's ReshapeSharding scan (the design note's two-pointer form): `(target tile counts,
    sharded size-1 source dims to replicate)`, or None when no tile can follow."""
    src_rank, tgt_rank = len(source), len(target)
    if src_rank == 0 or tgt_rank == 0:
        return None
    out = [1] * tgt_rank
    marked: list[int] = []
    i = j = 0
    ss, st, ts = source[0], counts[0], target[0]
    ts_fresh = True             # target dim j not yet partly consumed by a split

    def advance_i():
        nonlocal i, ss, st
        i += 1
        if i < src_rank:
            ss, st = source[i], counts[i]

    def advance_j():
        nonlocal j, ts, ts_fresh
        j += 1
        ts_fresh = True
        if j < tgt_rank:
            ts = target[j]

    while i < src_rank and j < tgt_rank:
        acc = 1
        while i < src_rank and st == 1:          # unsharded source dims merge freely
            acc *= ss
            advance_i()
        while j < tgt_rank and acc != 1 and acc % ts == 0:
            acc //= ts
            advance_j()
        if i >= src_rank or j >= tgt_rank or acc != 1:
            break
        if ss == ts:
            if not ts_fresh and ss % st != 0:
                out[j] *= gcd(ss, st)            # the minor rest of a split dim, uneven
                break
            out[j] *= st
            advance_i()
            advance_j()
        elif ts == 1:
            advance_j()
        elif ss == 1:
            if st > 1:
                marked.append(i)
            advance_i()
        elif ss % st != 0:
            return None
        else:
            g = gcd(st, ts)
            if g == 1:
                break
            ss, st, ts = ss // g, st // g, ts // g
            ts_fresh = False
            out[j] *= g
    if prod(out) == 1:
        return None
    return out, marked


@cached
def reshape_sharding(s: HloSharding, source_dims, target_dims) -> HloSharding | None:
    """The sharding of `reshape(x)` from dims `source_dims` to `target_dims` given `x`'s sharding
    `s`, or None when no tile can follow (XLA's ReshapeSharding). The tile assignment is only
    reshaped, never permuted: tiles that cannot follow (a sharded size-1 dim that disappears, the
    remainder of a gcd split) become replication. Between equal dims too the scan decides (as
    in XLA): a sharded size-1 dim after an unsharded one hands its tiles to the first size-1
    target dim (`[1,1,4]` tiled `[1,2,4]` becomes `[2,1,4]`). When every sharded source dim
    divides evenly, every device's elements lie inside its target tile; for uneven dims XLA's
    answer may let them straddle tiles (callers that need containment check it themselves)."""
    _leaf(s, "reshape_sharding")
    if not s.is_tiled:
        return s
    source, target = _dims_of(source_dims), _dims_of(target_dims)
    if s.data_rank != len(source) or prod(source) != prod(target):
        raise ShardingError(f"reshape_sharding: {s.to_text()} cannot map {list(source)} "
                            f"to {list(target)}")
    if source == target and not any(d == 1 and c > 1 for d, c in zip(source, s.tile_counts)):
        return s                    # the scan maps every dim to itself
    scan = _reshape_tile_counts(source, target, s.tile_counts)
    if scan is None:
        return None
    out, marked = scan
    base = partially_replicate_on_dims(s, marked) if marked else s
    if not base.is_tiled:
        return None
    ta, rank = base.tile_assignment, base.data_rank
    types = list(base.subgroup_types)
    dims = out + [1 if t == "replicated" else ta.dims[rank + k] for k, t in enumerate(types)]
    quotient = ta.num_devices // prod(dims)
    if quotient > 1:
        if "replicated" in types:
            dims[len(out) + types.index("replicated")] = quotient
        else:
            dims.append(quotient)
            types.append("replicated")
    return _rebuild(base, ta.reshape(dims), types)


@cached
def propagate_through_reshape(s: HloSharding, source_dims, target_dims) -> HloSharding:
    """The sharding of `reshape(x)` propagated from `x`'s sharding `s` (XLA's
    PropagateShardingThroughReshape): from each start dim, the longest run of source dims whose
    tile counts alone survive `reshape_sharding` gives a piece (the devices of `T` transposed to
    put the run first, reshaped to the reshaped tile counts plus replication), merged into the
    result with `merge_if_compatible`; dims whose tiling cannot follow end up replicated. Only
    the tile *counts* of the run are reshaped, as in XLA, so a sharded size-1 dim keeps its place
    in the device order. Manual subgroups are set aside and restored."""
    _leaf(s, "propagate_through_reshape")
    if not s.is_tiled:
        return s
    source, target = _dims_of(source_dims), _dims_of(target_dims)
    if s.has_manual_subgroup:
        grouped = group_on_dims(s, [s.subgroup_dim("manual")])
        inner = propagate_through_reshape(grouped.sharding, source, target)
        return ungroup(grouped.with_sharding(inner, len(target)))
    rank, ta = s.data_rank, s.tile_assignment
    counts = s.tile_counts
    result = HloSharding.replicate()
    start = 0
    while start < rank:
        for end in range(rank, start, -1):
            run = [counts[i] if start <= i < end else 1 for i in range(rank)]
            if prod(run) == 1:
                continue
            reshaped = reshape_sharding(HloSharding.tiled(TileAssignment.iota(run)), source,
                                        target)
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
    return result.with_metadata(s.metadata)


# ---- merging and comparing ---------------------------------------------------------------------

#: cap on the permutations the merge fast path tries (XLA enumerates them all; ranks are small)
_MAX_FAST_PATH_DIMS = 6


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


def _merged_metadata(to_merge: HloSharding, dst: HloSharding) -> tuple:
    return dst.metadata + tuple(m for m in to_merge.metadata if m not in dst.metadata)


@cached
def merge_if_compatible(to_merge: HloSharding, dst: HloSharding,
                        minimum_tiles: int | None = None) -> HloSharding | None:
    """Combine two shardings that tile different data dims (or the same dims equally) into one
    refining both, with at least `minimum_tiles` tiles (default: `dst`'s tiles + 1, a strict
    refinement), or None when incompatible: XLA's MergeShardingIfCompatible. A tile-maximal `dst`
    is replaced by `to_merge`. Each merged tile takes, in ascending order, the devices that hold
    the corresponding tile in both inputs; the transpose/reshape fast path (no per-device work
    for iota assignments) is tried first."""
    _leaf(to_merge, "merge_if_compatible")
    _leaf(dst, "merge_if_compatible")
    if minimum_tiles is None:
        minimum_tiles = dst.num_tiles + 1 if dst.is_tiled else 2
    if "manual" in (to_merge.kind, dst.kind) or to_merge.is_tile_maximal or \
            not to_merge.is_tiled:
        return None
    if dst.is_tile_maximal:
        return to_merge
    if not dst.is_tiled or not dst.has_partial_replication or dst.data_rank != to_merge.data_rank:
        return None
    manual = to_merge.subgroup_size("manual")
    if to_merge.has_manual_subgroup != dst.has_manual_subgroup or \
            manual != dst.subgroup_size("manual"):
        return None
    n = to_merge.tile_assignment.num_devices
    if n != dst.tile_assignment.num_devices:
        return None
    merged = []
    for a, b in zip(to_merge.tile_counts, dst.tile_counts):
        if a != b and a != 1 and b != 1:
            return None
        merged.append(max(a, b))
    tiles = prod(merged)
    if n % (tiles * manual) or tiles < minimum_tiles:
        return None
    replication = n // (tiles * manual)
    metadata = _merged_metadata(to_merge, dst)
    # an unreduced subgroup is replication to the merge, by devices only
    # (docs/design/sharding-algebra.md#merging-and-comparing)
    if manual == 1 and not (to_merge.has_unreduced or dst.has_unreduced):
        ndim = dst.tile_assignment.ndim
        dst_candidates = _fast_candidates(dst, merged, replication, ndim)
        for a in _fast_candidates(to_merge, merged, replication, ndim):
            for b in dst_candidates:
                if a == b:
                    return HloSharding.tiled(a, ["replicated"] if replication > 1 else [],
                                             metadata)
    return _merge_by_devices(to_merge, dst, merged, manual, replication, metadata)


def _merge_by_devices(to_merge: HloSharding, dst: HloSharding, merged: list[int], manual: int,
                      replication: int, metadata: tuple) -> HloSharding | None:
    """The general merge: each device's merged index is `to_merge`'s coordinate where it tiles a
    dim, `dst`'s elsewhere; coordinates on a dim both tile (and manual coordinates) must agree."""
    a_ta, b_ta = to_merge.tile_assignment, dst.tile_assignment
    n = a_ta.num_devices
    rank = dst.data_rank
    a_coords, b_coords = a_ta.coordinates(), b_ta.coordinates()
    devices = np.intersect1d(a_ta.array.ravel(), b_ta.array.ravel())
    if devices.size != n:
        return None
    a_c, b_c = a_coords[devices], b_coords[devices]
    index = np.where(np.asarray(to_merge.tile_counts) > 1, a_c[:, :rank], b_c[:, :rank])
    consistent = np.ones(n, dtype=bool)
    for d in range(rank):
        if to_merge.tile_counts[d] > 1 and dst.tile_counts[d] > 1:
            consistent &= a_c[:, d] == b_c[:, d]
    if manual > 1:
        a_m = a_c[:, to_merge.subgroup_dim("manual")]
        consistent &= a_m == b_c[:, dst.subgroup_dim("manual")]
        index = np.concatenate([index, a_m[:, None]], axis=1)
    if not consistent.all():
        return None
    position_dims = merged + ([manual] if manual > 1 else [])
    flat = np.ravel_multi_index(tuple(index.T), position_dims)
    if np.bincount(flat, minlength=prod(position_dims)).max() != replication:
        return None
    order = np.lexsort((devices, flat))
    types = (("manual",) if manual > 1 else ()) + (("replicated",) if replication > 1 else ())
    dims = position_dims + ([replication] if replication > 1 else [])
    return HloSharding.tiled(TileAssignment.from_array(devices[order], dims), types, metadata)


def is_more_specific(a: HloSharding, b: HloSharding) -> bool:
    """Whether `a` carries strictly more sharding information than `b` (XLA's
    IsShardingMoreSpecific); tuples: no leaf less specific and at least one more. `{unknown}`
    counts as replicated."""
    if a.is_tuple != b.is_tuple:
        raise ShardingError(f"is_more_specific: {a.to_text()} vs {b.to_text()}")
    if a.is_tuple:
        if len(a.elements) != len(b.elements):
            raise ShardingError(f"is_more_specific: {a.to_text()} vs {b.to_text()}")
        better = False
        for x, y in zip(a.elements, b.elements):
            if is_more_specific(y, x):
                return False
            better |= is_more_specific(x, y)
        return better
    a_kind = "replicated" if a.kind == "unknown" else a.kind
    b_kind = "replicated" if b.kind == "unknown" else b.kind
    if a_kind == "manual" and b_kind in ("replicated", "maximal"):
        return True
    if "manual" in (a_kind, b_kind) or "unreduced" in (a_kind, b_kind):
        return False
    if b_kind == "tiled":
        return a.num_tiles > b.num_tiles
    if b_kind == "maximal":
        return a_kind == "tiled"
    return a_kind != "replicated"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@cached
def is_subtiling_or_equal(sub: HloSharding, sup: HloSharding, shape) -> bool:
    """Whether, on every device, the region of `shape` (an ArrayShape or its dims) that `sub`
    assigns lies inside the region `sup` assigns, ignoring the padding overhang of last tiles
    (XLA's IsSubTilingOrEqualSharding). XLA's shortcut on tile-assignment dims when every tile
    holds real data and the counts divide; the per-device check otherwise."""
    _leaf(sub, "is_subtiling_or_equal")
    _leaf(sup, "is_subtiling_or_equal")
    if "manual" in (sub.kind, sup.kind):
        return False
    if sup.is_tile_maximal:
        return True
    if sub.is_tile_maximal or not sub.is_tiled or not sup.is_tiled:
        return False
    dims = _dims_of(shape)
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
        return _subtiling_by_devices(sub, sup, dims)
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


def _subtiling_by_devices(sub: HloSharding, sup: HloSharding, dims: tuple[int, ...]) -> bool:
    if any(x < y for x, y in zip(sub.tile_counts, sup.tile_counts)):
        return False
    array_shape = ArrayShape("f32", dims)
    rows = max(sub.tile_assignment.max_device, sup.tile_assignment.max_device) + 1
    a_off, b_off = sub.offset_table(array_shape, rows), sup.offset_table(array_shape, rows)
    a_shard = np.asarray(sub.shard_shape(array_shape).dims)
    b_shard = np.asarray(sup.shard_shape(array_shape).dims)
    devices = sub.tile_assignment.array.ravel()
    a_off, b_off = a_off[devices], b_off[devices]
    if (a_off < b_off).any():
        return False
    a_end = a_off + a_shard
    inside = (a_end > np.asarray(dims)) | (a_end <= b_off + b_shard)
    return bool(inside.all())


@cached
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


# ---- grouping ----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class GroupedSharding:
    """A sharding split into device groups (XLA's GroupedSharding), the basis of nested
    partitioning.

    * `device_groups`: `[num_groups, group_size]` array; row g = the devices of group g in in-group
      id order (column = in-group partition id).
    * `group_dims`: dims of the original `T` the groups are formed on (data dims or subgroup dims);
      `group_dim_sizes`: number of groups along each.
    * `data_rank`: data rank of the original; `subgroup_types`: its subgroup types, which give the
      meaning of group dims `>= data_rank`.
    * `sharding`: the inner sharding over in-group ids `0..group_size-1`.
    """

    device_groups: np.ndarray
    group_dims: tuple[int, ...]
    group_dim_sizes: tuple[int, ...]
    data_rank: int
    subgroup_types: tuple[str, ...]
    sharding: HloSharding

    @property
    def num_groups(self) -> int:
        return self.device_groups.shape[0]

    @property
    def group_size(self) -> int:
        return self.device_groups.shape[1]

    def in_group_ids(self) -> np.ndarray:
        """`[max_device + 1]` table: the in-group id (column) of each device."""
        table = np.full(int(self.device_groups.max()) + 1, -1, dtype=np.int64)
        table[self.device_groups] = np.arange(self.group_size)[None, :]
        return table

    def with_sharding(self, sharding: HloSharding,
                      data_rank: int | None = None) -> "GroupedSharding":
        """The same groups with a new inner sharding (of data rank `data_rank`, shifting group dims
        that name subgroup dims)."""
        data_rank = self.data_rank if data_rank is None else data_rank
        shift = data_rank - self.data_rank
        dims = tuple(d + shift if d >= self.data_rank else d for d in self.group_dims)
        return GroupedSharding(self.device_groups, dims, self.group_dim_sizes, data_rank,
                               self.subgroup_types, sharding)


def group_on_dims(s: HloSharding, dims: Sequence[int],
                  shards: Sequence[int] | None = None) -> GroupedSharding:
    """Group the devices of `s` by their coordinates on `T` dims `dims` (XLA's GroupShardingOnDims;
    in that order; dim d splits into `t_d // shards[i]` groups of `shards[i]` tiles, default 1).
    The inner sharding is `s`'s tiling with those dims reduced to `shards`, over in-group ids."""
    _leaf(s, "group_on_dims")
    if not s.is_tiled:
        raise ShardingError(f"group_on_dims needs a tiled sharding, got {s.to_text()}")
    ta = s.tile_assignment
    dims = [int(d) for d in dims]
    shards = [1] * len(dims) if shards is None else [int(x) for x in shards]
    if len(shards) != len(dims) or len(set(dims)) != len(dims) or \
            any(not 0 <= d < ta.ndim for d in dims) or \
            any(x < 1 or ta.dims[d] % x for d, x in zip(dims, shards)):
        raise ShardingError(f"group_on_dims: bad dims {dims} / shards {shards} for {s.to_text()}")
    sizes = [ta.dims[d] // x for d, x in zip(dims, shards)]
    # split each grouped dim d into (groups, shards), move the group parts to the front
    split_dims, position = [], {}
    for d in range(ta.ndim):
        if d in dims:
            position[d] = len(split_dims)
            split_dims += [sizes[dims.index(d)], shards[dims.index(d)]]
        else:
            split_dims.append(ta.dims[d])
    group_axes = [position[d] for d in dims]
    rest = [a for a in range(len(split_dims)) if a not in group_axes]
    num_groups = prod(sizes)
    groups = ta.reshape(split_dims).transpose(group_axes + rest).reshape(
        [num_groups, ta.num_devices // num_groups]).array
    inner_dims = [shards[dims.index(d)] if d in dims else n for d, n in enumerate(ta.dims)]
    inner = HloSharding.tiled(TileAssignment.iota(inner_dims), s.subgroup_types, s.metadata)
    return GroupedSharding(groups, tuple(dims), tuple(sizes), s.data_rank, s.subgroup_types, inner)


def ungroup(grouped: GroupedSharding) -> HloSharding:
    """Inverse of `group_on_dims` (XLA's UngroupSharding): expand in-group ids through the group
    rows and interleave the group coordinates (major) with the inner tile coordinates on each
    group dim."""
    inner, rank = grouped.sharding, grouped.data_rank
    if inner.is_tuple or inner.kind in ("maximal", "unknown", "unreduced"):
        raise ShardingError(f"ungroup: cannot expand inner sharding {inner.to_text()}")
    inner_types = inner.subgroup_types if inner.is_tiled else ()
    group_types = {grouped.subgroup_types[d - rank] for d in grouped.group_dims if d >= rank}
    present = set(grouped.subgroup_types) | set(inner_types) | group_types
    if inner.kind in ("replicated", "manual"):
        present.add(inner.kind)
    types = tuple(t for t in SUBGROUP_TYPES if t in present)
    layout = list(inner.tile_counts_for_rank(rank)) + \
        [inner.subgroup_size(t) if inner.is_tiled else 1 for t in types]
    if inner.is_tiled:
        inner_ids = inner.tile_assignment.array.reshape(layout)
    else:
        layout[rank + types.index(inner.kind)] = grouped.group_size
        inner_ids = np.arange(grouped.group_size).reshape(layout)
    if inner_ids.size != grouped.group_size:
        raise ShardingError(f"ungroup: inner sharding {inner.to_text()} has {inner_ids.size} "
                            f"devices, groups have {grouped.group_size}")
    old_positions = {d: (d if d < rank else rank + types.index(grouped.subgroup_types[d - rank]))
                     for d in grouped.group_dims}
    devices = grouped.device_groups[:, inner_ids.ravel()].reshape(
        list(grouped.group_dim_sizes) + layout)
    ngroup = len(grouped.group_dims)
    order, dims = [], []
    for axis in range(len(layout)):
        size = layout[axis]
        for i, d in enumerate(grouped.group_dims):
            if old_positions[d] == axis:
                order.append(i)
                size *= grouped.group_dim_sizes[i]
        order.append(ngroup + axis)
        dims.append(size)
    array = devices.transpose(order).reshape(dims)
    return HloSharding.tiled(TileAssignment.from_array(array), types, inner.metadata)


# ---- device arrays and the partitioner's collective steps --------------------------------------

@cached
def device_tiles(s: HloSharding, rank: int, num_devices: int) -> TileAssignment:
    """The devices of a replicated, unknown, unreduced or tiled (unreduced and replicated
    subgroups) leaf sharding of a rank-`rank` array over `num_devices` devices, as a tile
    assignment of shape `tile counts + (u, r)`: element `[i..., k, j]` is the j-th device holding
    partial value k of tile `i` (`u > 1`: the tile is the sum of `u` partial values; `r > 1`:
    each is held by `r` devices). An iota sharding gives an iota value: the collective steps
    below transform it without per-device work. `UnsupportedError` for manual shardings
    (per-device data has no tiling), `ShardingError` for maximal and tuple ones."""
    kind = s.kind
    if kind in ("replicated", "unknown"):
        return TileAssignment.iota((1,) * rank + (1, num_devices))
    if kind == "unreduced":
        return TileAssignment.iota((1,) * rank + (num_devices, 1))
    if kind == "manual" or s.has_manual_subgroup:
        raise UnsupportedError(f"manual sharding {s.to_text(False)}: manual values are "
                               "per-device data and are not resharded (enter and leave manual "
                               "regions through SPMDFullToShardShape / SPMDShardToFullShape)")
    if kind != "tiled":
        raise ShardingError(f"sharding {s.to_text(False)} has no tiling")
    counts = s.tile_counts_for_rank(rank)
    ta = s.tile_assignment
    if ta.num_devices != num_devices:
        raise ShardingError(f"sharding {s.to_text(False)} covers {ta.num_devices} devices, "
                            f"expected {num_devices}")
    return ta.reshape(tuple(counts) + (s.subgroup_size("unreduced"),
                                       s.subgroup_size("replicated")))


def device_array(s: HloSharding, rank: int, num_devices: int) -> np.ndarray:
    """`device_tiles` as a read-only numpy array (materialised once per value)."""
    return device_tiles(s, rank, num_devices).array


def sharding_of_devices(devices: np.ndarray | TileAssignment) -> HloSharding:
    """The canonical sharding whose device array (`device_array`) is `devices` (replicas in any
    order), given as an array or as a tile assignment."""
    if not isinstance(devices, TileAssignment):
        devices = np.asarray(devices)
        if devices.ndim < 2:
            raise ShardingError(
                f"a device array needs partial and replica axes, got {devices.shape}")
        if devices.size == 1:
            return HloSharding.replicate()
        devices = TileAssignment.from_array(devices)
    elif devices.ndim < 2:
        raise ShardingError(f"a device array needs partial and replica axes, got {devices.dims}")
    if devices.num_devices == 1:
        return HloSharding.replicate()
    return HloSharding.tiled(devices, ("unreduced", "replicated"))


def _groups(tiles: TileAssignment, axes: Sequence[int]) -> np.ndarray:
    """`[G, S]`: devices that differ only in `axes` (row-major in them), groups ordered by the
    other coordinates."""
    axes = list(axes)
    others = [a for a in range(tiles.ndim) if a not in axes]
    size = prod(tiles.dims[a] for a in axes)
    return tiles.transpose(others + axes).reshape((tiles.num_devices // size, size)).array


def _merge_axis(tiles: TileAssignment, source: int, target: int,
                major: bool) -> TileAssignment:
    """Merge axis `source` of a device array into axis `target`, as its major or minor part."""
    order = [a for a in range(tiles.ndim) if a != source]
    at = order.index(target)
    order.insert(at if major else at + 1, source)
    moved = tiles.transpose(order)
    shape = list(moved.dims)
    p = min(order.index(source), order.index(target))
    shape[p:p + 2] = [shape[p] * shape[p + 1]]
    return moved.reshape(shape)


def _split_axis(tiles: TileAssignment, axis: int, minor: int) -> TileAssignment:
    """The device array with `axis` split into `(size // minor, minor)`."""
    shape = list(tiles.dims)
    if shape[axis] % minor:
        raise ShardingError(f"cannot split {shape[axis]} tiles by {minor}")
    return tiles.reshape(shape[:axis] + [shape[axis] // minor, minor] + shape[axis + 1:])


def unreduce_on_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """The tiles of data dims `dims` become partial values: they fold into the unreduced subgroup
    as its major part and those dims keep one tile (a local reduction over a tiled dim leaves
    partial sums). Non-tiled shardings are returned unchanged."""
    if not s.is_tiled:
        return s
    rank = s.data_rank
    dims = sorted({int(d) for d in dims})
    counts = s.tile_counts
    group = prod(counts[d] for d in dims)
    if group == 1:
        return s
    ta = s.tile_assignment
    kept = [d for d in range(rank) if d not in dims]
    moved = ta.transpose(kept + dims + list(range(rank, ta.ndim)))
    new_dims = [1 if d in dims else counts[d] for d in range(rank)] + [group] + \
        list(ta.dims[rank:])
    return _rebuild(s, moved.reshape(new_dims), ("unreduced",) + s.subgroup_types)


@cached
def insert_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """Insert untiled data dims at positions `dims` of the result (a broadcast's new dims).
    Non-tiled shardings are returned unchanged."""
    if not s.is_tiled or not len(dims):
        return s
    ta = s.tile_assignment
    new_dims = list(ta.dims)
    for d in sorted(int(d) for d in dims):
        new_dims.insert(d, 1)
    return _rebuild(s, ta.reshape(new_dims))


def partial_groups(s: HloSharding, rank: int, num_devices: int) -> np.ndarray:
    """`[G, u]`: the devices whose partial values sum to one value, by partial index."""
    tiles = device_tiles(s, rank, num_devices)
    return _groups(tiles, [tiles.ndim - 2])


def all_reduce_partials(s: HloSharding, rank: int, num_devices: int) -> HloSharding:
    """The sharding after all-reducing the partial values over `partial_groups`: the unreduced
    subgroup becomes the major part of the replication."""
    tiles = device_tiles(s, rank, num_devices)
    merged = _merge_axis(tiles, tiles.ndim - 2, tiles.ndim - 1, major=True)
    holders = tiles.dims[-2] * tiles.dims[-1]
    return sharding_of_devices(merged.reshape(tiles.dims[:-2] + (1, holders)))


def reduce_scatter_partials(s: HloSharding, dim: int, groups: np.ndarray, rank: int,
                            num_devices: int) -> HloSharding:
    """The sharding after reduce-scattering the partial values into data dim `dim`, where member
    j of each row of `groups` (a reordering of the rows of `partial_groups`) receives block j:
    the new tile index on `dim` is `old * u + j`."""
    array = device_array(s, rank, num_devices)
    u = array.shape[-2]
    n = array.size
    coords = np.empty((n, rank), dtype=np.int64)
    coords[array.ravel()] = np.indices(array.shape, dtype=np.int64).reshape(
        array.ndim, -1).T[:, :rank]
    position = np.empty(n, dtype=np.int64)
    position[groups] = np.arange(u)[None, :]
    coords[:, dim] = coords[:, dim] * u + position
    counts = list(array.shape[:rank])
    counts[dim] *= u
    key = np.ravel_multi_index(tuple(coords.T), counts)
    order = np.lexsort((np.arange(n), key))
    return sharding_of_devices(order.reshape(tuple(counts) + (1, -1)))


@cached
def gather_tiles(s: HloSharding, dim: int, factor: int, rank: int,
                 num_devices: int) -> tuple[HloSharding, np.ndarray]:
    """All-gather the minor `factor` part of data dim `dim`'s tiles into replication: `(the
    sharding after, [G, factor] groups in concatenation order)`."""
    split = _split_axis(device_tiles(s, rank, num_devices), dim, factor)
    groups = _groups(split, [dim + 1])
    return sharding_of_devices(_merge_axis(split, dim + 1, split.ndim - 1, major=True)), groups


@cached
def coarsen_tiles(s: HloSharding, factors: Sequence[int], rank: int,
                  num_devices: int) -> HloSharding:
    """The sharding in which every device holds the tile that contains its tile of `s` once the
    minor `factors[d]` part of each data dim d's tiles is gathered into replication (the
    sharding `gather_tiles` leads to, without the groups; partial values stay partial). Stays
    in iota form: comparing two coarsened shardings tells whether every device's tiles nest,
    at any device count."""
    tiles = device_tiles(s, rank, num_devices)
    for d, factor in enumerate(factors):
        if factor > 1:
            split = _split_axis(tiles, d, factor)
            tiles = _merge_axis(split, d + 1, split.ndim - 1, major=True)
    return sharding_of_devices(tiles)


def move_tiles(s: HloSharding, source: int, target: int, factor: int, rank: int,
               num_devices: int) -> tuple[HloSharding, np.ndarray]:
    """All-to-all: the minor `factor` part of data dim `source`'s tiles becomes the minor part of
    data dim `target`'s: `(the sharding after, [G, factor] groups)`."""
    split = _split_axis(device_tiles(s, rank, num_devices), source, factor)
    groups = _groups(split, [source + 1])
    moved = _merge_axis(split, source + 1, target + (1 if target > source else 0), major=False)
    return sharding_of_devices(moved), groups


def split_replication(s: HloSharding, factors: Sequence[int], rank: int,
                      num_devices: int) -> HloSharding:
    """Local slicing: each replication group splits into `factors[d]` parts on data dim d (the
    major parts of the replica index, in dim order), which become the minor parts of those
    dims' tiles."""
    tiles = device_tiles(s, rank, num_devices)
    replication = tiles.dims[-1]
    rest = replication // prod(factors)
    if rest * prod(factors) != replication:
        raise ShardingError(f"replication {replication} cannot split into {list(factors)}")
    tiles = tiles.reshape(tiles.dims[:-1] + tuple(factors) + (rest,))
    for d in range(rank - 1, -1, -1):
        tiles = _merge_axis(tiles, rank + 1 + d, d, major=False)
    return sharding_of_devices(tiles)


__all__ = [
    "cached", "clear_caches", "is_spatially_partitioned", "leaf_count", "single_tuple",
    "for_shape", "partially_replicate_on_dims", "replicate_all_except", "replicate_all_data_dims",
    "remove_dims", "transpose", "reverse", "move_and_merge", "transpose_with_collapsed_dims",
    "propagate_along_dims", "reshape_sharding", "propagate_through_reshape",
    "merge_if_compatible", "is_more_specific", "is_subtiling_or_equal", "merge_sharding",
    "find_common_sharding", "GroupedSharding", "group_on_dims", "ungroup", "device_tiles",
    "device_array",
    "sharding_of_devices", "unreduce_on_dims", "insert_dims", "partial_groups",
    "all_reduce_partials", "reduce_scatter_partials", "gather_tiles", "coarsen_tiles",
    "move_tiles",
    "split_replication",
]
