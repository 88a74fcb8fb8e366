"""Tilings: the partitioner's working form of a sharding, a device array with explicit partial-sum
and replication axes.

A `Tiling` of a rank-r array over N devices is an int array `devices` of shape
`counts + (u, r)`: element `[i_0..i_{r-1}, k, j]` is the j-th device holding partial value k of
the tile with index `(i_0..i_{r-1})`. `u > 1` means the tile's value is the *sum* (under the
producer's reducer) of the `u` partial values (XLA's `unreduced` subgroup); `r > 1` means each
partial value is held by `r` devices (the `replicated` subgroup). Every device appears once.

`{replicated}` is `counts = (1,)*r, u = 1, r = N`; `{unreduced}` is `u = N, r = 1`; tiled shardings
map their tile assignment's data dims to `counts` and their unreduced/replicated subgroup dims to
`u`/`r`. Maximal and manual shardings have no tiling.

Tiles follow §2.3 of the reference: dim d of size S cut into t pieces has shard size
`cdiv(S, t)`; tile `o` starts at `o * cdiv(S, t)` in the padded array. Every operation here is a
reshape/transpose of the device array or a vectorised table over device ids (no per-device
loops), so its cost is linear in N and independent of the program.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np

from gspmdc.errors import ShardingError, UnsupportedError
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Tiling:
    """An immutable device array `counts + (u, r)` (see the module docstring)."""

    __slots__ = ("devices", "_coords", "_hash")

    def __init__(self, devices: np.ndarray):
        devices = np.array(devices, dtype=np.int64)
        if devices.ndim < 2:
            raise ShardingError(f"a tiling needs partial and replica axes, got {devices.shape}")
        devices.setflags(write=False)
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "_coords", None)
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name, value):
        raise AttributeError("Tiling is immutable")

    # ---- construction and conversion ----------------------------------------------------------

    @classmethod
    def replicated(cls, rank: int, num_devices: int) -> "Tiling":
        return cls(np.arange(num_devices).reshape((1,) * rank + (1, num_devices)))

    @classmethod
    def from_sharding(cls, sharding: HloSharding, rank: int, num_devices: int) -> "Tiling":
        """The tiling of a replicated, unreduced or tiled (unreduced/replicated subgroups) leaf
        sharding; `UnsupportedError` for manual ones (per-device data has no tiling),
        `ShardingError` for maximal."""
        kind = sharding.kind
        if kind in ("replicated", "unknown"):
            return cls.replicated(rank, num_devices)
        if kind == "unreduced":
            return cls(np.arange(num_devices).reshape((1,) * rank + (num_devices, 1)))
        if kind == "manual" or (kind == "tiled" and sharding.has_manual_subgroup):
            raise UnsupportedError(f"manual sharding {sharding.to_text(False)}: manual values are "
                                   "per-device data and are not resharded (enter and leave "
                                   "manual regions through SPMDFullToShardShape / "
                                   "SPMDShardToFullShape)")
        if kind != "tiled":
            raise ShardingError(f"sharding {sharding.to_text(False)} has no tiling")
        counts = sharding.tile_counts_for_rank(rank)
        u = sharding.subgroup_size("unreduced")
        r = sharding.subgroup_size("replicated")
        array = sharding.tile_assignment.array
        if array.size != num_devices:
            raise ShardingError(f"sharding {sharding.to_text(False)} covers {array.size} devices, "
                                f"expected {num_devices}")
        return cls(array.reshape(tuple(counts) + (u, r)))

    def to_sharding(self) -> HloSharding:
        """The canonical `HloSharding` (replication groups sorted, size-1 subgroups dropped)."""
        if self.devices.size == 1:
            return HloSharding.replicate()
        return HloSharding.tiled(TileAssignment.from_array(self.devices),
                                 ("unreduced", "replicated"))

    # ---- queries ------------------------------------------------------------------------------

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(self.devices.shape[:-2])

    @property
    def rank(self) -> int:
        return self.devices.ndim - 2

    @property
    def unreduced(self) -> int:
        return self.devices.shape[-2]

    @property
    def replication(self) -> int:
        return self.devices.shape[-1]

    @property
    def num_devices(self) -> int:
        return self.devices.size

    def coordinates(self) -> np.ndarray:
        """`[N, rank + 1]`: per device id, its tile index and its partial-value index."""
        if self._coords is None:
            shape = self.devices.shape
            index = np.indices(shape, dtype=np.int64).reshape(len(shape), -1).T
            table = np.empty((self.num_devices, self.rank + 1), dtype=np.int64)
            table[self.devices.ravel()] = index[:, :-1]
            table.setflags(write=False)
            object.__setattr__(self, "_coords", table)
        return self._coords

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

    def same_tiles(self, other: "Tiling") -> bool:
        """Whether every device holds the same tile (and partial index) in both."""
        return self.devices.shape == other.devices.shape and \
            bool(np.array_equal(self.coordinates(), other.coordinates()))

    __hash__ = None

    def __eq__(self, other) -> bool:
        """Equal as shardings: same shape and every device in the same cell up to the order of
        replicas."""
        if not isinstance(other, Tiling):
            return NotImplemented
        return self.same_tiles(other)

    def __repr__(self) -> str:
        return f"Tiling({self.to_sharding().to_text(False)})"

    # ---- axis arithmetic ----------------------------------------------------------------------

    def _split(self, axis: int, minor: int) -> np.ndarray:
        """The device array with `axis` split into `(size // minor, minor)`."""
        shape = list(self.devices.shape)
        if shape[axis] % minor:
            raise ShardingError(f"cannot split axis {axis} of size {shape[axis]} by {minor}")
        return self.devices.reshape(shape[:axis] + [shape[axis] // minor, minor] +
                                    shape[axis + 1:])

    @staticmethod
    def _groups(array: np.ndarray, axes: Sequence[int]) -> np.ndarray:
        """`[G, S]`: devices that differ only in `axes` (row-major in them), groups ordered by
        the other coordinates."""
        axes = list(axes)
        others = [a for a in range(array.ndim) if a not in axes]
        size = prod(array.shape[a] for a in axes)
        return array.transpose(others + axes).reshape(-1, size)

    @staticmethod
    def _move_into(array: np.ndarray, source: int, target: int, major: bool) -> np.ndarray:
        """Merge axis `source` into axis `target` (as its major or minor part)."""
        order = [a for a in range(array.ndim) if a != source]
        at = order.index(target)
        order.insert(at if major else at + 1, source)
        moved = array.transpose(order)
        shape = list(moved.shape)
        p = min(order.index(source), order.index(target))
        shape[p:p + 2] = [shape[p] * shape[p + 1]]
        return moved.reshape(shape)

    def _partial_axis(self) -> int:
        return self.devices.ndim - 2

    def _replica_axis(self) -> int:
        return self.devices.ndim - 1

    # ---- transformations (each returns the new tiling and, where a collective is needed, its
    # groups) -----------------------------------------------------------------------------------

    def reduce_all(self) -> tuple["Tiling", np.ndarray]:
        """All-reduce the partial values: `(tiling with u folded into replication, groups)`."""
        array = self._move_into(self.devices, self._partial_axis(), self._replica_axis(),
                                major=True)
        return Tiling(array.reshape(self.counts + (1, -1))), self.partial_groups()

    def partial_groups(self) -> np.ndarray:
        """`[G, u]`: the devices whose partial values sum to one value, by partial index."""
        return self._groups(self.devices, [self._partial_axis()])

    def reduce_scatter(self, dim: int, groups: np.ndarray) -> "Tiling":
        """The tiling after reduce-scattering the partial values into dim `dim`, where member j
        of each row of `groups` (a reordering of `partial_groups()` rows) receives block j: the
        new tile index on `dim` is `old * u + j`."""
        u = self.unreduced
        coords = self.coordinates()
        n = self.num_devices
        position = np.empty(n, dtype=np.int64)
        position[groups] = np.arange(u)[None, :]
        columns = coords[:, :self.rank].copy()
        columns[:, dim] = columns[:, dim] * u + position
        counts = list(self.counts)
        counts[dim] *= u
        key = np.ravel_multi_index(tuple(columns.T), counts)
        order = np.lexsort((np.arange(n), key))
        return Tiling(order.reshape(tuple(counts) + (1, -1)))

    def gather(self, dim: int, factor: int) -> tuple["Tiling", np.ndarray]:
        """All-gather the minor `factor` part of dim `dim`'s tiles into replication."""
        split = self._split(dim, factor)
        groups = self._groups(split, [dim + 1])
        array = self._move_into(split, dim + 1, split.ndim - 1, major=True)
        return Tiling(array), groups

    def move(self, source: int, target: int, factor: int) -> tuple["Tiling", np.ndarray]:
        """All-to-all: the minor `factor` part of `source`'s tiles becomes the minor part of
        `target`'s."""
        split = self._split(source, factor)
        groups = self._groups(split, [source + 1])
        array = self._move_into(split, source + 1, target + (1 if target > source else 0),
                                major=False)
        return Tiling(array), groups

    def split_replication(self, factors: Sequence[int]) -> "Tiling":
        """Local slicing: each replication group splits into `factors[d]` parts on dim d (the
        replica index's major parts, dim order), which become the minor parts of those dims."""
        array = self.devices
        rank = self.rank
        rest = self.replication // prod(factors)
        if rest * prod(factors) != self.replication:
            raise ShardingError(f"replication {self.replication} cannot split into {factors}")
        shape = list(array.shape[:-1]) + list(factors) + [rest]
        array = array.reshape(shape)
        for d in range(rank - 1, -1, -1):
            array = self._move_into(array, rank + 1 + d, d, major=False)
        return Tiling(array)

    def fold_dims(self, dims: Sequence[int], into: str) -> "Tiling":
        """The tiles of data dims `dims` become partial values (`into="unreduced"`) or replicas
        (`into="replicated"`); those dims keep a count of 1."""
        array = self.devices
        for d in sorted(dims, reverse=True):
            array = np.expand_dims(array, d + 1)
            axis = array.ndim - (2 if into == "unreduced" else 1)
            array = self._move_into(array, d, axis, major=True)
        return Tiling(array)

    def remove_dims(self, dims: Sequence[int]) -> "Tiling":
        """Drop data dims `dims` (each must have one tile)."""
        if any(self.counts[d] != 1 for d in dims):
            raise ShardingError(f"cannot remove tiled dims {list(dims)} of {self!r}")
        keep = [n for d, n in enumerate(self.devices.shape) if d not in dims]
        return Tiling(self.devices.reshape(keep))

    def insert_dims(self, dims: Sequence[int]) -> "Tiling":
        """Insert untiled data dims at the given positions of the result."""
        array = self.devices
        for d in sorted(dims):
            array = np.expand_dims(array, d)
        return Tiling(array)

    def remap(self, destination: Sequence[int], rank: int) -> "Tiling":
        """The tiling of a rank-`rank` value whose dim `destination[d]` corresponds to data dim d
        of this one (`-1`: d has no counterpart and its tiles become replicas); the other dims of
        the result are untiled."""
        dropped = [d for d, t in enumerate(destination) if t < 0]
        kept = [t for t in destination if t >= 0]
        tiling = self.fold_dims(dropped, "replicated").remove_dims(dropped)
        tiling = tiling.transpose([int(i) for i in np.argsort(kept)])
        return tiling.insert_dims([d for d in range(rank) if d not in kept])

    def transpose(self, perm: Sequence[int]) -> "Tiling":
        """Data dim i of the result is data dim `perm[i]` of this tiling."""
        rank = self.rank
        return Tiling(self.devices.transpose(list(perm) + [rank, rank + 1]))


__all__ = ["Tiling", "cdiv"]
