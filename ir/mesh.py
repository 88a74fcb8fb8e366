"""Named device meshes: our extension of the HLO text format
(docs/design/sharding-algebra.md#meshes).

A `Mesh` is the GSPMD paper's `device_mesh` with JAX-style axis names: an n-D array of device ids
whose axes are named. `mesh.sharding(dims_mapping)` is the paper's
`mesh_split(tensor, device_mesh, dims_mapping)`: each tensor dim is unsplit (`None`), split along
one axis (`"x"`) or along several axes major to minor (`("x", "y")`); unused axes replicate:

    T = devices.transpose(axes_of_dim[0] + axes_of_dim[1] + ... + unused)
    T = T.reshape([prod(sizes of axes_of_dim[d]) for d] + ([prod(unused sizes)] if unused else []))
    (last_tile_dim_replicate when there are unused axes)

The header text is `{x=2, y=4}` (devices in iota order) or `{x=2, y=4, devices=[0,2,4,6,1,3,5,7]}`
(the row-major device order).
"""
from __future__ import annotations

import re
from math import prod
from typing import Sequence

import numpy as np

from gspmdc.errors import ShardingError

from .sharding import HloSharding
from .tile_assignment import TileAssignment

_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Mesh:
    """An immutable named mesh; `device_ids` (row-major over `axis_sizes`) default to iota and must
    be a permutation of `range(prod(axis_sizes))`."""

    __slots__ = ("_names", "_sizes", "_devices")

    def __init__(self, axis_names: Sequence[str], axis_sizes: Sequence[int], device_ids=None):
        names = tuple(axis_names)
        sizes = tuple(axis_sizes)
        if not names or len(names) != len(sizes):
            raise ShardingError(f"mesh needs one size per axis name, got names {list(names)} and "
                                f"sizes {list(sizes)}")
        bad = [n for n in names if not isinstance(n, str) or not _AXIS_NAME.match(n)]
        if bad:
            raise ShardingError(f"mesh axis names must be identifiers, got {bad}")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ShardingError(f"duplicate mesh axis names {duplicates} in {list(names)}")
        if any(not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 1 for s in sizes):
            raise ShardingError(f"mesh axis sizes must be positive integers, got {list(sizes)}")
        sizes = tuple(int(s) for s in sizes)
        n = prod(sizes)
        if device_ids is None:
            devices = TileAssignment.iota(sizes)
        else:
            ids = np.asarray(device_ids).ravel()
            if ids.size != n or ids.dtype.kind not in "iu" or \
                    not np.array_equal(np.sort(ids), np.arange(n)):
                raise ShardingError(f"mesh device ids must be a permutation of range({n}) for axis "
                                    f"sizes {list(sizes)}, got {ids.tolist()[:64]}")
            devices = TileAssignment.from_array(ids, sizes)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_devices", devices)

    def __setattr__(self, name, value):
        raise AttributeError("Mesh is immutable")

    def __reduce__(self):
        """Pickled as its constructor's arguments (the job sent to MPI ranks carries meshes)."""
        return Mesh, (self._names, self._sizes, self.device_ids)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def num_devices(self) -> int:
        return prod(self._sizes)

    @property
    def device_ids(self) -> tuple[int, ...] | None:
        """The row-major device order, or None when it is the default `range(num_devices)`."""
        if self._devices.iota_form() == ((self.num_devices,), (0,)):
            return None
        return tuple(self._devices.array.ravel().tolist())

    @property
    def devices(self) -> TileAssignment:
        """The device-id array, shape `axis_sizes`."""
        return self._devices

    def axis_size(self, name: str) -> int:
        return self._sizes[self._axis(name)]

    def _axis(self, name: str) -> int:
        try:
            return self._names.index(name)
        except ValueError:
            raise ShardingError(
                f"unknown mesh axis {name!r} (mesh axes {list(self._names)})") from None

    def sharding(self, dims_mapping: Sequence, rank: int | None = None) -> HloSharding:
        """The sharding splitting tensor dim d along the axes `dims_mapping[d]` (None, a name or a
        tuple of names major to minor), replicated over the unused axes."""
        mapping = list(dims_mapping)
        if rank is not None and len(mapping) != rank:
            raise ShardingError(f"dims mapping {mapping} has {len(mapping)} entries for a "
                                f"rank-{rank} tensor")
        axes_of_dim: list[list[int]] = []
        used: dict[int, int] = {}
        for d, entry in enumerate(mapping):
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
                raise ShardingError(f"dims mapping entry {entry!r} for dim {d} must be None, an "
                                    f"axis name or a tuple of axis names")
            axes = []
            for name in names:
                axis = self._axis(name)
                if axis in used:
                    raise ShardingError(f"mesh axis {name!r} used twice in dims mapping {mapping} "
                                        f"(dims {used[axis]} and {d})")
                used[axis] = d
                axes.append(axis)
            axes_of_dim.append(axes)
        unused = [a for a in range(len(self._sizes)) if a not in used]
        order = [a for axes in axes_of_dim for a in axes] + unused
        dims = [prod(self._sizes[a] for a in axes) for axes in axes_of_dim]
        if unused:
            dims.append(prod(self._sizes[a] for a in unused))
        if not dims:
            return HloSharding.replicate()
        tile = self._devices.transpose(order).reshape(dims)
        return HloSharding.tiled(tile, ("replicated",) if unused else ())

    def to_text(self) -> str:
        """`{x=2, y=4}`, plus `, devices=[...]` when the device order is not the default."""
        items = [f"{n}={s}" for n, s in zip(self._names, self._sizes)]
        if self.device_ids is not None:
            items.append("devices=[" + ",".join(map(str, self.device_ids)) + "]")
        return "{" + ", ".join(items) + "}"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return (self._names, self._sizes, self._devices) == \
            (other._names, other._sizes, other._devices)

    def __hash__(self) -> int:
        return hash((self._names, self._sizes, self._devices))

    def __repr__(self) -> str:
        return f"Mesh({self.to_text()})"


__all__ = ["Mesh"]
