"""Both sides of a manual boundary pair, device by device.

A `Sharding` constraint feeding `SPMDFullToShardShape` (or fed by `SPMDShardToFullShape`) and the
boundary form a pair: an *auto side* A (full shape) and a *manual side* S (partially manual: one
manual group per position along its manual subgroup). Each device d has a tile index a(d) in A, a
free tile index f(d) and a manual group m(d) in S. The pair is consistent when every dim's
tiling in A is the manual part on the outside and S's free tiling inside:
`a(d) = a0(d) * k + f(d)`, with k S's tile counts and a0(d) the same for all devices of a group.

JAX's GSPMD form of a partially manual shard_map leaves every dim of the pair unspecified and
names the manual axes by the boundary's manual subgroup alone, so which tiles of A are manual is
read off the current pair, not off the specified dims. `manual_side` and `auto_side` translate a
refined sharding of one side to the other keeping the pair's manual part (a0 and the groups);
None when the refined sharding does not nest that way.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment


def _is_pair(auto: HloSharding, manual: HloSharding) -> bool:
    return auto.is_tiled and manual.is_tiled and manual.has_manual_subgroup and \
        auto.data_rank == manual.data_rank and \
        set(auto.subgroup_types) <= {"replicated"} and \
        set(manual.subgroup_types) <= {"manual", "replicated"}


def _manual_part(auto: HloSharding, manual: HloSharding):
    """(a0 per device, manual tile counts c0, manual group per device), or None when the pair is
    inconsistent."""
    k = np.asarray(manual.tile_counts)
    counts = np.asarray(auto.tile_counts)
    if np.any(counts % k):
        return None
    a = auto.tile_indices()
    f = manual.tile_indices()
    group = manual.tile_assignment.coordinates()[:, manual.subgroup_dim("manual")]
    devices = [d for d in range(a.shape[0]) if a[d, 0] >= 0]
    a0 = {d: tuple(a[d] // k) for d in devices}
    if any(tuple(a[d] % k) != tuple(f[d]) for d in devices):
        return None
    by_group = defaultdict(set)
    for d in devices:
        by_group[int(group[d])].add(a0[d])
    if any(len(tiles) != 1 for tiles in by_group.values()):
        return None
    return a0, counts // k, {d: int(group[d]) for d in devices}


def _tiled(slots: dict[tuple, list[int]], dims: list[int], types: tuple[str, ...]):
    """The sharding putting each slot's devices (sorted) at that index of a `dims + [R]` array;
    None when the slots hold different numbers of devices or leave one empty."""
    sizes = {len(v) for v in slots.values()}
    if len(sizes) != 1 or len(slots) != int(np.prod(dims)):
        return None
    size = sizes.pop()
    array = np.zeros(dims + [size], dtype=np.int64)
    for index, devices in slots.items():
        array[index] = sorted(devices)
    return HloSharding.tiled(TileAssignment.from_array(array), types)


def manual_side(refined_auto: HloSharding, auto: HloSharding,
                manual: HloSharding) -> HloSharding | None:
    """The manual side matching `refined_auto`, keeping the pair (`auto`, `manual`)'s manual
    part."""
    if not _is_pair(auto, manual) or not refined_auto.is_tiled or \
            set(refined_auto.subgroup_types) - {"replicated"} or \
            refined_auto.data_rank != auto.data_rank:
        return None
    part = _manual_part(auto, manual)
    if part is None:
        return None
    a0, c0, group = part
    counts = np.asarray(refined_auto.tile_counts)
    if np.any(counts % c0):
        return None
    k = counts // c0
    a = refined_auto.tile_indices()
    slots: dict[tuple, list[int]] = defaultdict(list)
    for d, tile in a0.items():
        if tuple(a[d] // k) != tile:
            return None
        slots[tuple(a[d] % k) + (group[d],)].append(d)
    return _tiled(slots, k.tolist() + [manual.subgroup_size("manual")], ("manual", "replicated"))


def auto_side(refined_manual: HloSharding, auto: HloSharding,
              manual: HloSharding) -> HloSharding | None:
    """The auto side matching `refined_manual` (same manual groups), keeping the pair's manual
    part."""
    if not _is_pair(auto, manual) or not _is_pair(auto, refined_manual):
        return None
    part = _manual_part(auto, manual)
    if part is None:
        return None
    a0, c0, group = part
    k = np.asarray(refined_manual.tile_counts)
    f = refined_manual.tile_indices()
    new_group = refined_manual.tile_assignment.coordinates()[
        :, refined_manual.subgroup_dim("manual")]
    members = defaultdict(set)
    for d in a0:
        members[int(new_group[d])].add(group[d])
    if any(len(g) != 1 for g in members.values()):
        return None         # the groups differ
    slots: dict[tuple, list[int]] = defaultdict(list)
    for d, tile in a0.items():
        slots[tuple(np.asarray(tile) * k + f[d])].append(d)
    return _tiled(slots, (c0 * k).tolist(), ("replicated",))


__all__ = ["manual_side", "auto_side"]
