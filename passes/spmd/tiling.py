"""Tilings: a read-only view of a sharding as the partitioner reads it, its device array with
explicit partial-sum and replication axes.

`Tiling(sharding, rank, num_devices)` views a replicated, unreduced or tiled (unreduced and
replicated subgroups) leaf sharding of a rank-`rank` array. Its `devices` array has shape
`counts + (u, r)`: element `[i_0..i_{r-1}, k, j]` is the j-th device holding partial value k of
the tile with index `(i_0..i_{r-1})` (`u > 1`: the tile is the sum of the `u` partial values under
the producer's reducer; `r > 1`: each partial value is held by `r` devices). Maximal and manual
shardings have no tiling.

Everything here is derived from the sharding: the view computes per-device tables (tile index,
padded offsets) and never transforms a sharding. Transformations, including the collective steps
of resharding, are functions of `gspmdc.ir.sharding_algebra` on `HloSharding` values
(docs/design/sharding-algebra.md). Tiles follow the shard arithmetic of `HloSharding`: dim d of
size S cut into t pieces has shard size `cdiv(S, t)`; tile `o` starts at `o * cdiv(S, t)`.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment
from gspmdc.ir.sharding_algebra import (
    device_tiles, partial_groups, propagate_along_dims, sharding_of_devices,
)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _plain(s: HloSharding) -> HloSharding:
    """`s` without metadata and shard group (`{unknown}` read as `{replicated}`)."""
    if not s.metadata and s.shard_group is None and s.kind != "unknown":
        return s
    if s.kind in ("replicated", "unknown"):
        return HloSharding.replicate()
    if s.kind == "tiled":
        return HloSharding("tiled", s.tile_assignment, s.subgroup_types)
    return HloSharding(s.kind, device=s.device)


class Tiling:
    """The view of one sharding (see the module docstring); `sharding` is the viewed sharding
    without metadata."""

    __slots__ = ("sharding", "_tiles")

    def __init__(self, sharding: HloSharding, rank: int, num_devices: int):
        tiles = device_tiles(sharding, rank, num_devices)
        object.__setattr__(self, "sharding", _plain(sharding))
        object.__setattr__(self, "_tiles", tiles)

    def __setattr__(self, name, value):
        raise AttributeError("Tiling is immutable")

    @classmethod
    def replicated(cls, rank: int, num_devices: int) -> "Tiling":
        return cls(HloSharding.replicate(), rank, num_devices)

    @classmethod
    def of_devices(cls, devices: np.ndarray) -> "Tiling":
        """The view of the sharding whose device array is `devices` (`counts + (u, r)`)."""
        devices = np.asarray(devices)
        return cls(sharding_of_devices(devices), devices.ndim - 2, devices.size)

    # ---- queries ------------------------------------------------------------------------------

    @property
    def tiles(self) -> TileAssignment:
        """`devices` as a tile assignment (iota where the sharding is: arithmetic on it costs the
        same at any device count)."""
        return self._tiles

    @property
    def devices(self) -> np.ndarray:
        """The device array `counts + (u, r)` (read-only; built on first use, once per tile
        assignment)."""
        return self._tiles.array

    @property
    def counts(self) -> tuple[int, ...]:
        return self._tiles.dims[:-2]

    @property
    def rank(self) -> int:
        return self._tiles.ndim - 2

    @property
    def unreduced(self) -> int:
        return self._tiles.dims[-2]

    @property
    def replication(self) -> int:
        return self._tiles.dims[-1]

    @property
    def num_devices(self) -> int:
        return self._tiles.num_devices

    def coordinates(self) -> np.ndarray:
        """`[N, rank + 1]`: per device id, its tile index and its partial-value index (read-only;
        built once per device array: equal iota arrays are one tile assignment)."""
        return self._tiles.coordinates()[:, :-1]

    def tile_keys(self) -> np.ndarray:
        """`[N]`: per device id, the flat index of its tile (row-major over `counts`)."""
        coords = self.coordinates()[:, :self.rank]
        if self.rank == 0:
            return np.zeros(self.num_devices, dtype=np.int64)
        return np.ravel_multi_index(tuple(coords.T), self.counts)

    def shard_dims(self, dims: Sequence[int]) -> tuple[int, ...]:
        return tuple(cdiv(s, t) for s, t in zip(dims, self.counts))

    def offsets(self, dims: Sequence[int]) -> np.ndarray:
        """`[N, rank]`: per device id, the padded start `ordinal * shard` of its tile."""
        shard = np.asarray(self.shard_dims(dims), dtype=np.int64)
        return self.coordinates()[:, :self.rank] * shard

    def partial_groups(self) -> np.ndarray:
        """`[G, u]`: the devices whose partial values sum to one value, by partial index."""
        return partial_groups(self.sharding, self.rank, self.num_devices)

    __hash__ = None

    def __eq__(self, other) -> bool:
        """Equal as shardings (every device in the same tile with the same partial index)."""
        if not isinstance(other, Tiling):
            return NotImplemented
        return self.sharding == other.sharding and self.rank == other.rank

    def __repr__(self) -> str:
        return f"Tiling({self.sharding.to_text(False)})"


def remap(s: HloSharding, destination: Sequence[int], rank: int) -> HloSharding:
    """`propagate_along_dims` with the dims given per source dim, as the op rules read them: data
    dim d of `s` goes to dim `destination[d]` of a rank-`rank` value (-1: it has no counterpart
    and its tiles become replicas); the other dims of the result are untiled."""
    source = [d for d, target in enumerate(destination) if target >= 0]
    return propagate_along_dims(s, source, [destination[d] for d in source], rank)


def tiling_from_coordinates(coords: np.ndarray, counts: tuple[int, ...]) -> Tiling | None:
    """The tiling in which device `k` holds tile `coords[k]` (`[N, rank]`, each within `counts`),
    devices of one tile being replicas (by device id); None unless every tile has the same
    number of devices."""
    keys = tile_keys(coords, counts)
    if keys is None:
        return None
    n = coords.shape[0]
    order = np.lexsort((np.arange(n), keys))
    return Tiling.of_devices(order.reshape(tuple(counts) + (1, n // prod(counts))))


def tile_keys(coords: np.ndarray, counts: Sequence[int]) -> np.ndarray | None:
    """Per device, the row-major index of its tile (`coords`: per device, its tile index on
    each dim of `counts`), where every tile is held by the same number of devices; else None."""
    n, tiles = coords.shape[0], prod(counts)
    if n % tiles:
        return None
    keys = np.ravel_multi_index(tuple(coords[:, e] for e in range(len(counts))), tuple(counts)) \
        if len(counts) else np.zeros(n, np.int64)
    if not np.array_equal(np.bincount(keys, minlength=tiles), np.full(tiles, n // tiles)):
        return None
    return keys


__all__ = ["Tiling", "cdiv", "remap", "tiling_from_coordinates", "tile_keys"]
