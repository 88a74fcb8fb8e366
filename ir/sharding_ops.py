"""The algebra of derived shardings (reference §2.7; XLA's hlo_sharding_util).

Every function takes and returns immutable `HloSharding` values; non-tiled shardings (replicated,
maximal, manual, unknown, unreduced) pass through unchanged unless stated otherwise. Functions whose
transformation may be impossible (reshape, collapsed transpose, merge) return `None` then, exactly
where XLA returns `std::nullopt`/`false`. Tile-assignment arithmetic goes through `TileAssignment`
transpose/reshape, which stay in iota form, so the cost of most operations does not depend on the
number of devices; merging, reversing and grouping use vectorised numpy over the device array.

| §2.7 | function |
|------|----------|
| (a)  | `partially_replicate_on_dims(s, dims)` |
| (b)  | `replicate_all_except(s, keep)` |
| (c)  | `replicate_all_data_dims(s, data_rank=None)` |
| (d)  | `remove_dims(s, dims)` |
| (e)  | `transpose(s, perm)` |
| (f)  | `reverse(s, dims)` |
| (g)  | `move_and_merge(s, source_dim, target_dim)` |
| (h)  | `transpose_with_collapsed_dims(s, src_to_tgt, tgt_to_src)` |
| (i)  | `propagate_along_dims(s, source_dims, target_dims, target_rank)` |
| (j)  | `reshape_sharding(s, source_dims, target_dims)` |
| (k)  | `propagate_through_reshape(s, source_dims, target_dims)` |
| (l)  | `merge_if_compatible(to_merge, dst, minimum_tiles=0)` |
| (m)  | `is_more_specific(a, b)` |
| (n)  | `is_subtiling_or_equal(shape, a, b)` |
| (o)  | `group_on_dims(s, dims, shards=None)`, `ungroup(grouped)`, `GroupedSharding` |
| (p)  | `HloSharding.partition_groups_for_replication(dims)` |
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd, prod
from typing import Sequence

import numpy as np

from gspmdc.errors import ShardingError

from .sharding import SUBGROUP_TYPES, HloSharding
from .shapes import ArrayShape
from .tile_assignment import TileAssignment


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


# ---- (a), (b), (c), (d): replication and dim removal -------------------------------------------

def partially_replicate_on_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """(a) Stop tiling data dims `dims`: their tiles fold into the replication subgroup. Dims
    beyond the data rank are ignored (as in XLA)."""
    _leaf(s, "partially_replicate_on_dims")
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
    """(b) Replicate every data dim not in `keep`."""
    _leaf(s, "replicate_all_except")
    if not s.is_tiled:
        return s
    keep = set(int(d) for d in keep)
    return partially_replicate_on_dims(s, [d for d in range(s.data_rank) if d not in keep])


def replicate_all_data_dims(s: HloSharding, data_rank: int | None = None) -> HloSharding:
    """(c) `{replicated}`, except that manual subgroups survive (all data dims then have one tile,
    re-ranked to `data_rank` when given)."""
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


def remove_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """(d) Delete data dims `dims`, each of which must have a single tile."""
    _leaf(s, "remove_dims")
    if not s.is_tiled or not dims:
        return s
    dims = _data_dims(s, dims, "remove_dims")
    cut = [d for d in dims if s.tile_counts[d] != 1]
    if cut:
        raise ShardingError(f"remove_dims: dims {cut} of {s.to_text()} are tiled")
    ta = s.tile_assignment
    return _rebuild(s, ta.reshape([n for i, n in enumerate(ta.dims) if i not in dims] or [1]))


# ---- (e), (f), (g), (h), (i): moving tiles between dims ----------------------------------------

def transpose(s: HloSharding, perm: Sequence[int]) -> HloSharding:
    """(e) The sharding of `transpose(x, perm)` (output dim i = input dim `perm[i]`). `perm` covers
    the data dims (subgroup dims stay last) or all dims of `T` (subgroup dims must stay last)."""
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
    """(f) The sharding of `reverse(x, dims)`: `T` flipped along those dims."""
    _leaf(s, "reverse")
    if not s.is_tiled or not dims:
        return s
    dims = _data_dims(s, dims, "reverse")
    if all(s.tile_counts[d] == 1 for d in dims):
        return s
    return _rebuild(s, TileAssignment.from_array(np.flip(s.tile_assignment.array, axis=dims)))


def move_and_merge(s: HloSharding, source_dim: int, target_dim: int) -> HloSharding:
    """(g) Move the tiles of `source_dim` into `target_dim` (target count becomes
    `t_target * t_source`, source 1); source tiles become the minor part of the target's."""
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
    """(h) Map `s` from source data dims to target data dims (`src_to_tgt[i] = -1`: dim i
    disappears and must have one tile, else None; `tgt_to_src[j] = -1`: new dim with one tile)."""
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
    """(i) Keep the tiling of `source_dims[k]` on `target_dims[k]` of a rank-`target_rank` value and
    replicate every other source dim (gather/scatter passthrough and index dims)."""
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


# ---- (j), (k): reshape ---------------------------------------------------------------------------

def _reshape_tile_counts(source: Sequence[int], target: Sequence[int], counts: Sequence[int]):
    """The two-pointer scan of §2.7(j): `(target tile counts, source dims to replicate)`, or
    None."""
    src_rank, tgt_rank = len(source), len(target)
    out = [1] * tgt_rank
    marked: list[int] = []
    i = j = 0
    if src_rank == 0 or tgt_rank == 0:
        return None
    ss, st, ts = source[0], counts[0], target[0]
    ts_fresh = True

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
        while i < src_rank and st == 1:
            acc *= ss
            advance_i()
        while j < tgt_rank and acc != 1 and acc % ts == 0:
            acc //= ts
            advance_j()
        if i >= src_rank or j >= tgt_rank or acc != 1:
            break
        if ss == ts:
            if not ts_fresh and ss % st != 0:
                break       # an uneven minor part of a merged dim: no grouping of its shards
                # fills whole tiles of the merged dim (that needs cdiv(ss, st) * st == ss)
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


def reshape_sharding(s: HloSharding, source_dims, target_dims) -> HloSharding | None:
    """(j) The sharding of `reshape(x)` from shape `source_dims` to `target_dims` such that every
    device's elements lie inside its target tile, or None when no data dim can keep any tiling.
    Devices are only regrouped, never reordered; tiles that cannot follow become replication."""
    _leaf(s, "reshape_sharding")
    if not s.is_tiled:
        return s
    source, target = _dims_of(source_dims), _dims_of(target_dims)
    if s.data_rank != len(source) or prod(source) != prod(target):
        raise ShardingError(f"reshape_sharding: {s.to_text()} cannot map {list(source)} "
                            f"to {list(target)}")
    if source == target:
        return s
    scan = _reshape_tile_counts(source, target, s.tile_counts)
    if scan is None:
        return None
    out, marked = scan
    base = partially_replicate_on_dims(s, marked) if marked else s
    if not base.is_tiled:
        return None
    ta, rank = base.tile_assignment, base.data_rank
    quotient = base.num_tiles // prod(out)
    types = base.subgroup_types
    if quotient > 1:
        types = ("replicated",) + types
        dims = out + [quotient] + list(ta.dims[rank:])
    else:
        dims = out + list(ta.dims[rank:])
    return _rebuild(base, ta.reshape(dims), types)


def propagate_through_reshape(s: HloSharding, source_dims, target_dims) -> HloSharding:
    """(k) The best sharding for `reshape(x)` given `x`'s sharding: (j) on the whole tiling if it
    works, else piecewise on the longest runs of source dims that can follow, merged with (l);
    everything else replicated (manual subgroups kept)."""
    _leaf(s, "propagate_through_reshape")
    if not s.is_tiled:
        return s
    source, target = _dims_of(source_dims), _dims_of(target_dims)
    whole = reshape_sharding(s, source, target)
    if whole is not None:
        return whole
    ta, rank = s.tile_assignment, s.data_rank
    counts = s.tile_counts
    replicated_axis = s.subgroup_dim("replicated")
    manual_axis = s.subgroup_dim("manual")
    other_axes = [a for a in range(rank, ta.ndim) if a not in (replicated_axis, manual_axis)]
    if other_axes:
        raise ShardingError(f"propagate_through_reshape: unsupported subgroups in {s.to_text()}")
    result: HloSharding | None = None
    start = 0
    while start < rank:
        for end in range(rank, start, -1):
            piece_counts = [counts[d] if start <= d < end else 1 for d in range(rank)]
            if prod(piece_counts) == 1:
                continue
            reshaped = reshape_sharding(
                HloSharding.tiled(TileAssignment.iota(piece_counts)), source, target)
            if reshaped is None:
                continue
            piece = _place_piece(ta, reshaped, list(range(start, end)),
                                 [d for d in range(rank) if not start <= d < end], replicated_axis,
                                 manual_axis)
            if result is None:
                result = piece
            else:
                merged = merge_if_compatible(piece, result)
                if merged is not None:
                    result = merged
            start = end
            break
        else:
            start += 1
    if result is None:
        return replicate_all_data_dims(s, len(target)).with_metadata(s.metadata)
    return result.with_metadata(s.metadata)


def _place_piece(ta: TileAssignment, reshaped: HloSharding, run: list[int], rest: list[int],
                 replicated_axis: int, manual_axis: int) -> HloSharding:
    """Map a reshaped piece sharding, computed over the iota of the `run` dims' tiles, back onto
    the real devices of `ta`: piece device p is the set of devices with run coordinates p; the
    other data dims and the replication dim join the piece's replication."""
    rest = rest + ([replicated_axis] if replicated_axis >= 0 else [])
    manual = [manual_axis] if manual_axis >= 0 else []
    run_tiles = prod(ta.dims[d] for d in run)
    members = ta.transpose(run + rest + manual).array.reshape(
        run_tiles, -1, ta.dims[manual_axis] if manual else 1)
    piece_ids = reshaped.tile_assignment.array
    if not reshaped.has_partial_replication:
        piece_ids = piece_ids[..., None]
    devices = members[piece_ids]                         # [out..., q, R, M]
    dims = list(reshaped.tile_counts) + [-1] + ([members.shape[2]] if manual else [])
    types = ("replicated",) + (("manual",) if manual else ())
    return HloSharding.tiled(TileAssignment.from_array(devices.reshape(dims)), types)


# ---- (l), (m), (n): comparing and merging --------------------------------------------------------

def merge_if_compatible(to_merge: HloSharding, dst: HloSharding,
                        minimum_tiles: int = 0) -> HloSharding | None:
    """(l) Combine two shardings that tile different data dims (or the same dims equally) into one
    sharding refining both, with at least `minimum_tiles` tiles; None when incompatible. A
    tile-maximal `dst` is replaced by `to_merge`. Each merged tile takes, in ascending order, the
    devices that hold the corresponding tile in both inputs."""
    _leaf(to_merge, "merge_if_compatible")
    _leaf(dst, "merge_if_compatible")
    if to_merge.is_tile_maximal or not to_merge.is_tiled:
        return None
    if dst.is_tile_maximal:
        return to_merge
    if not dst.is_tiled or not dst.has_partial_replication or dst.data_rank != to_merge.data_rank:
        return None
    a_ta, b_ta = to_merge.tile_assignment, dst.tile_assignment
    manual = to_merge.subgroup_size("manual")
    if to_merge.has_manual_subgroup != dst.has_manual_subgroup or \
            manual != dst.subgroup_size("manual"):
        return None
    if a_ta.num_devices != b_ta.num_devices:
        return None
    merged = []
    for a, b in zip(to_merge.tile_counts, dst.tile_counts):
        if a != b and a != 1 and b != 1:
            return None
        merged.append(max(a, b))
    tiles = prod(merged)
    n = a_ta.num_devices
    if n % (tiles * manual) or tiles < minimum_tiles:
        return None
    replication = n // (tiles * manual)
    # Each device's merged index: to_merge's coordinate where it tiles a dim, dst's elsewhere;
    # coordinates on a dim both tile must agree, and manual coordinates must agree.
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
    metadata = dst.metadata + tuple(m for m in to_merge.metadata if m not in dst.metadata)
    return HloSharding.tiled(TileAssignment.from_array(devices[order], dims), types, metadata)


def is_more_specific(a: HloSharding, b: HloSharding) -> bool:
    """(m) Whether `a` carries strictly more sharding information than `b` (XLA's
    IsShardingMoreSpecific); tuples: no leaf less specific and at least one more. `{unknown}` counts
    as replicated."""
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


def is_subtiling_or_equal(shape, a: HloSharding, b: HloSharding) -> bool:
    """(n) Whether, on every device, the region of `shape` that `a` assigns lies inside the region
    `b` assigns (ignoring the padding overhang of last tiles)."""
    _leaf(a, "is_subtiling_or_equal")
    _leaf(b, "is_subtiling_or_equal")
    if a.kind == "manual" or b.kind == "manual":
        return False
    if b.is_tile_maximal:
        return True
    if a.is_tile_maximal or not a.is_tiled or not b.is_tiled:
        return False
    dims = _dims_of(shape)
    if a.data_rank != b.data_rank or a.data_rank != len(dims):
        return False
    if any(x < y for x, y in zip(a.tile_counts, b.tile_counts)):
        return False
    array_shape = ArrayShape("f32", dims)
    rows = max(a.tile_assignment.max_device, b.tile_assignment.max_device) + 1
    a_off, b_off = a.offset_table(array_shape, rows), b.offset_table(array_shape, rows)
    a_shard = np.asarray(a.shard_shape(array_shape).dims)
    b_shard = np.asarray(b.shard_shape(array_shape).dims)
    devices = a.tile_assignment.array.ravel()
    a_off, b_off = a_off[devices], b_off[devices]
    if (a_off < b_off).any():
        return False
    a_end = a_off + a_shard
    inside = (a_end > np.asarray(dims)) | (a_end <= b_off + b_shard)
    return bool(inside.all())


# ---- (o): grouping ------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class GroupedSharding:
    """A sharding split into device groups (§2.7(o)), the basis of nested partitioning.

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
    """(o) Group the devices of `s` by their coordinates on `T` dims `dims` (in that order; dim d
    splits into `t_d // shards[i]` groups of `shards[i]` tiles, default 1). The inner sharding is
    `s`'s tiling with those dims reduced to `shards`, over in-group ids."""
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
    """(o) Inverse of `group_on_dims`: expand in-group ids through the group rows and interleave
    the group coordinates (major) with the inner tile coordinates on each group dim."""
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


__all__ = [
    "partially_replicate_on_dims", "replicate_all_except", "replicate_all_data_dims", "remove_dims",
    "transpose", "reverse", "move_and_merge", "transpose_with_collapsed_dims",
    "propagate_along_dims", "reshape_sharding", "propagate_through_reshape", "merge_if_compatible",
    "is_more_specific", "is_subtiling_or_equal", "GroupedSharding", "group_on_dims", "ungroup",
]
