"""Sharding and device-group text: tiled/maximal/manual shardings, replica groups, named meshes.

`single_sharding` turns the items of one `{...}` sharding (kinds, `devices=` tile assignments
explicit or iota, `last_tile_dim_replicate` / `last_tile_dims={...}` subgroups, `metadata=`,
`shard_as`/`shard_like` groups, gspmdc's `mesh_split=[...]`) into an `HloSharding`, refusing
contradictory combinations; `lower_mesh_split` lowers the named-mesh form once the module's
`mesh=` header is known. `replica_groups` materialises XLA's three group notations (explicit
`{{0,1},{2,3}}`, iota `[2,2]<=[4]`, and mesh axes `mesh['a'=2,'b'=2] {'a'}`) as explicit groups.
Design notes: docs/design/hlo-text.md.
"""
from __future__ import annotations

from math import prod

import numpy as np
from lark import Token

from gspmdc.errors import ShardingError

from . import limits
from .attributes import ReplicaGroups
from .mesh import Mesh
from .parse_errors import problem_at
from .parse_records import MeshSplit, MeshTuple
from .sharding import HloSharding
from .sharding_algebra import cached
from .tile_assignment import TileAssignment

_SINGLE_KINDS = {"REPLICATED": "replicated", "MANUAL": "manual", "UNKNOWN": "unknown",
                 "UNREDUCED": "unreduced", "MAXIMAL": "maximal"}


def replica_groups(spec) -> ReplicaGroups:
    """Materialise explicit / iota / mesh-axes replica groups as explicit groups."""
    kind = spec[0]
    if kind == "explicit":
        if any(not 0 <= i <= limits.MAX_SIZE for group in spec[1] for i in group):
            raise ValueError("ids must be integers in [0, 2^63-1]")
        return ReplicaGroups(spec[1])
    if kind == "iota":
        _, dims, reshape_dims, perm = spec
        if len(dims) != 2:
            raise ValueError(f"iota replica groups need [num_groups,group_size], got {list(dims)}")
        ta = TileAssignment.iota(dims, reshape_dims, perm)
        return ReplicaGroups.from_array(ta.array)
    _, axes, ids, refs = spec
    return ReplicaGroups.from_array(_mesh_axes_groups(axes, ids, refs))


def _mesh_axes_groups(axes, ids, refs) -> np.ndarray:
    """XLA's mesh-axes replica groups `mesh['a'=4,'b'=2], device_ids=(...) {'a'}`: the devices of
    the mesh (iota or the given device order), grouped along the listed axes (in the listed order;
    `'a':(k)m` is the size-m sub-axis of `a` with k above it); groups ordered by the other axes."""
    names = [n for n, _ in axes]
    sizes = [s for _, s in axes]
    if len(set(names)) != len(names) or min(sizes, default=1) < 1:
        raise ValueError(f"mesh axes must be distinct with positive sizes, got {axes}")
    count = prod(sizes)
    if ids is None:
        devices = np.arange(count)
    elif ids[1] == "iota":
        devices = TileAssignment.iota((count,), ids[2], ids[3]).array
    else:
        devices = TileAssignment.from_array(np.asarray(ids[2], dtype=np.int64), (count,)).array
    expanded, grouped = [], []
    for name, size in axes:
        parts = [(pre, sub) for n, pre, sub in refs if n == name and pre is not None]
        whole = any(n == name and pre is None for n, pre, _ in refs)
        if not parts:
            expanded.append((name, None, size))
            continue
        if whole or len(parts) > 1:
            raise ValueError(f"axis '{name}' is named more than once in {refs}")
        pre, sub = parts[0]
        if size % (pre * sub):
            raise ValueError(f"sub-axis '{name}':({pre}){sub} does not divide axis size {size}")
        expanded += [(name, "major", pre), (name, (pre, sub), sub), (name, "minor", size // (pre * sub))]
    for name, pre, sub in refs:
        if name not in names:
            raise ValueError(f"axis '{name}' is not an axis of the mesh {names}")
        key = None if pre is None else (pre, sub)
        grouped.append(next(i for i, (n, k, _) in enumerate(expanded) if n == name and k == key))
    shape = [s for _, _, s in expanded]
    others = [i for i in range(len(expanded)) if i not in grouped]
    group_size = prod(shape[i] for i in grouped)
    return devices.reshape(shape).transpose(others + grouped).reshape(count // group_size, group_size)



def single_sharding(brace: Token, items: list):
    kinds, tiles, device, subgroups = [], None, None, ()
    metadata, shard_group, mesh_split = (), None, None
    seen = set()
    for item in items:
        if isinstance(item, Token):
            key, token = item.type, item
        else:
            key, token = item[0], item[-1]
        if key in seen:
            raise problem_at(token, f"'{token.value}' given twice in one sharding")
        seen.add(key)
        if isinstance(item, Token):
            if key == "LAST_TILE_DIM_REPLICATE":
                subgroups = ("replicated",)
            else:
                kinds.append(_SINGLE_KINDS[key])
        elif key == "device":
            device = item[1]
        elif key == "tiles":
            tiles = item[1]
        elif key == "subgroups":
            subgroups = item[1]
        elif key == "group":
            shard_group = item[1]
        elif key == "metadata":
            metadata = item[1]
        else:
            mesh_split = item
    if "LAST_TILE_DIM_REPLICATE" in seen and "subgroups" in seen:
        raise problem_at(brace, "last_tile_dim_replicate and last_tile_dims= exclude each other")
    if mesh_split is not None:
        if kinds or tiles is not None or device is not None or subgroups:
            raise problem_at(mesh_split[2], "mesh_split= cannot be combined with other sharding forms")
        return MeshSplit(mesh_split[1], metadata, shard_group, brace)
    if len(kinds) > 1:
        raise problem_at(brace, f"conflicting sharding kinds {' and '.join(kinds)}")
    kind = kinds[0] if kinds else None
    if kind == "maximal":
        if device is None or tiles is not None or subgroups:
            raise problem_at(brace, "a maximal sharding takes exactly 'device=N'")
        _check_device(brace, device)
        return HloSharding.maximal(device, metadata, shard_group)
    if device is not None:
        raise problem_at(brace, "'device=' belongs to a maximal sharding")
    if kind is not None:
        if tiles is not None or subgroups:
            raise problem_at(brace, f"a {kind} sharding takes no devices or subgroups")
        return getattr(HloSharding, "replicate" if kind == "replicated" else kind)(metadata, shard_group)
    if tiles is None:
        raise problem_at(brace, "expected a sharding: replicated, manual, maximal, unknown, unreduced, "
                         "devices=[...] or mesh_split=[...]")
    _check_device(brace, tiles.max_device)
    return _tiled_sharding(tiles, subgroups, metadata, shard_group)


def _check_device(brace: Token, device: int) -> None:
    if device >= limits.MAX_DEVICES:
        raise problem_at(brace, f"device id {device} is beyond the largest device id gspmdc "
                         f"accepts ({limits.MAX_DEVICES - 1})")


# Shardings repeat across a module: with the algebra's cache each distinct one costs a single
# construction.
explicit_tiles = cached(TileAssignment.explicit)
iota_tiles = cached(TileAssignment.iota)
_tiled_sharding = cached(HloSharding.tiled)


def lower_mesh_split(sharding, mesh: Mesh | None):
    """`sharding` with its named-mesh forms (`MeshSplit`, `MeshTuple`) lowered to the tiled
    shardings they stand for on `mesh` (`Mesh.sharding`); other shardings unchanged."""
    if isinstance(sharding, MeshTuple):
        return HloSharding.tuple(tuple(lower_mesh_split(e, mesh) for e in sharding.elements))
    if not isinstance(sharding, MeshSplit):
        return sharding
    if mesh is None:
        raise problem_at(sharding.token, "mesh_split= needs a mesh={...} header attribute")
    unknown = sorted({a for axes in sharding.dims for a in axes} - set(mesh.axis_names))
    if unknown:
        raise problem_at(sharding.token, f"unknown mesh axes {unknown} (the mesh has "
                         f"{list(mesh.axis_names)})")
    try:
        lowered = mesh.sharding(sharding.dims, len(sharding.dims))
    except ShardingError as e:
        raise problem_at(sharding.token, f"invalid sharding: {e}") from None
    lowered = lowered.with_metadata(sharding.metadata) if sharding.metadata else lowered
    if sharding.shard_group is not None:
        lowered = lowered.with_shard_group(sharding.shard_group)
    return lowered
