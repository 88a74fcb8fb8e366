"""Shardy shardings <-> HloShardings over a named mesh.

`to_hlo(sharding, mesh)`: each mesh axis is cut at the boundaries of the sub-axes the sharding
names (axis x of size 8 named as `"x":(2)2` is cut into sub-axes of sizes 2, 2, 2), the mesh's
device array is reshaped to those sub-axes, transposed so that the sub-axes of dimension 0 come
first (in the order the sharding lists them), then those of dimension 1, ..., then manual axes,
unreduced axes, and the rest (replicated), and reshaped to one tile dimension per tensor dimension
plus one subgroup dimension per kind. This is `Mesh.sharding` generalised to sub-axes, manual and
unreduced axes.

`from_hlo(hlo, mesh)` inverts it: the mesh axes are cut into prime sub-axes, the tile assignment
is matched against a transposition of them (minor-most digit first), and runs of sub-axes of one
axis that end up in the same tensor dimension are merged back. None when the HloSharding is not
expressible over the mesh (another device order, maximal, tuple).
"""
from __future__ import annotations

from math import prod

import numpy as np

from .mesh import Mesh
from .sdy import AxisRef, DimSharding, MaximalMesh, TensorSharding
from .sharding import HloSharding

__all__ = ["to_hlo", "from_hlo", "axis_boundaries", "named_text"]


def axis_boundaries(mesh: Mesh, refs) -> dict[str, list[int]]:
    """Per mesh axis, the sorted pre-sizes at which the given (sub-)axes cut it (always 1 and
    the axis size)."""
    cuts = {n: {1, s} for n, s in zip(mesh.axis_names, mesh.axis_sizes)}
    for ref in refs:
        lo, hi = ref.span(mesh)
        cuts[ref.name] |= {lo, hi}
    return {n: sorted(c) for n, c in cuts.items()}


def to_hlo(sharding: TensorSharding, mesh: Mesh | MaximalMesh,
           manual_axes: tuple[str, ...] = ()) -> HloSharding:
    """The HloSharding of `sharding` over `mesh` (already resolved); `manual_axes` are full mesh
    axes the value is manual over (inside a shard_map body), a manual subgroup."""
    if isinstance(mesh, MaximalMesh):
        return HloSharding.maximal(mesh.device)
    manual = tuple(AxisRef(a) for a in manual_axes)
    refs = sharding.used_axes() + manual
    cuts = axis_boundaries(mesh, refs)
    pieces: list[tuple[str, int, int]] = []     # (axis, lo, hi) of every sub-axis, mesh order
    for name in mesh.axis_names:
        bounds = cuts[name]
        pieces += [(name, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    sizes = [hi // lo for _, lo, hi in pieces]

    def dims_of(ref: AxisRef) -> list[int]:
        lo, hi = ref.span(mesh)
        return [i for i, (n, a, b) in enumerate(pieces) if n == ref.name and a >= lo and b <= hi]

    order: list[int] = []
    tile_dims: list[int] = []
    for dim in sharding.dims:
        run = [i for ref in dim.axes for i in dims_of(ref)]
        order += run
        tile_dims.append(prod(sizes[i] for i in run))
    types: list[str] = []
    for kind, group in (("manual", manual), ("unreduced", sharding.unreduced)):
        run = [i for ref in group for i in dims_of(ref)]
        if run:
            order += run
            tile_dims.append(prod(sizes[i] for i in run))
            types.append(kind)
    rest = [i for i in range(len(pieces)) if i not in order]
    if rest:
        order += rest
        tile_dims.append(prod(sizes[i] for i in rest))
        types.append("replicated")
    if not tile_dims:
        return HloSharding.replicate()
    tile = mesh.devices.reshape(sizes).transpose(order).reshape(tile_dims)
    return HloSharding.tiled(tile, types)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def from_hlo(hlo: HloSharding, mesh: Mesh, rank: int, mesh_name: str) -> TensorSharding | None:
    """The closed Shardy sharding over `mesh` (called `mesh_name`) equal to `hlo` for a
    rank-`rank` value, or None."""
    if hlo.is_replicated:
        return TensorSharding(mesh_name, tuple(DimSharding() for _ in range(rank)))
    if hlo.is_unreduced:
        return TensorSharding(mesh_name, tuple(DimSharding() for _ in range(rank)),
                              unreduced=tuple(AxisRef(a) for a in mesh.axis_names))
    if not hlo.is_tiled or hlo.has_manual_subgroup or hlo.tile_assignment.num_devices != \
            mesh.num_devices:
        return None
    primes: list[tuple[str, int, int]] = []     # (axis, pre-size, prime), major to minor
    for name, size in zip(mesh.axis_names, mesh.axis_sizes):
        pre = 1
        for p in _prime_factors(size):
            primes.append((name, pre, p))
            pre *= p
    radices = [p for _, _, p in primes]
    coords = np.zeros((mesh.num_devices, len(primes)), dtype=np.int64)
    flat_mesh = np.asarray(mesh.devices.array).ravel()
    coords[flat_mesh] = np.stack(np.unravel_index(np.arange(flat_mesh.size), radices or [1]),
                                 axis=1) if primes else 0
    flat = np.asarray(hlo.tile_assignment.array).ravel()
    minor_first: list[int] = []
    step = 1
    while step < flat.size:
        delta = coords[flat[step]] - coords[flat[0]]
        changed = np.flatnonzero(delta)
        if len(changed) != 1 or delta[changed[0]] != 1 or coords[flat[0]][changed[0]] != 0 or \
                changed[0] in minor_first:
            return None
        minor_first.append(int(changed[0]))
        step *= radices[changed[0]]
    order = minor_first[::-1]
    if step != flat.size or len(order) != len(primes):
        return None
    expected = flat_mesh.reshape(radices).transpose(order).ravel() if primes else flat_mesh
    if not np.array_equal(expected, flat):
        return None
    # group the ordered prime sub-axes into the tile dimensions
    groups, k = [], 0
    for size in hlo.tile_assignment.dims:
        run, total = [], 1
        while total < size:
            run.append(order[k])
            total *= radices[order[k]]
            k += 1
        if total != size:
            return None
        groups.append(run)
    data, subgroups = groups[:rank], groups[rank:]
    dims = tuple(DimSharding(_merge([primes[i] for i in run], mesh)) for run in data)
    unreduced = ()
    for kind, run in zip(hlo.subgroup_types, subgroups):
        if kind == "unreduced":
            unreduced = _merge(sorted((primes[i] for i in run), key=lambda p: (
                mesh.axis_names.index(p[0]), p[1])), mesh)
    return TensorSharding(mesh_name, dims, (), unreduced)


def _merge(run, mesh: Mesh) -> tuple[AxisRef, ...]:
    """Consecutive prime sub-axes of one axis, major to minor, as the fewest AxisRefs."""
    refs: list[list] = []
    for name, pre, p in run:
        if refs and refs[-1][0] == name and refs[-1][1] * refs[-1][2] == pre:
            refs[-1][2] *= p
        else:
            refs.append([name, pre, p])
    return tuple(AxisRef(n) if pre == 1 and size == mesh.axis_size(n) else AxisRef(n, pre, size)
                 for n, pre, size in refs)


def named_text(hlo: HloSharding, rank: int, module) -> str | None:
    """`hlo` in the module's named-axes notation, or None when the module has no mesh or the
    sharding is not over it: the Shardy dims (`[{"x"}, {}]`, `@mesh` named when the module has
    several meshes) for a module in Shardy form, `{mesh_split=[x, _]}` for one with a `mesh=`
    header."""
    from .sdy import module_meshes
    meshes = module_meshes(module)
    if meshes is not None:
        named = [(n, m) for n, m in meshes.meshes if isinstance(m, Mesh)]
        for name, mesh in named:
            sharding = _leaf_from_hlo(hlo, mesh, rank, name)
            if sharding is not None:
                text = sharding.body_text()
                return text[len(f"@{name}, "):] if len(named) == 1 else text
        return None
    mesh = module.attrs.get("mesh")
    if not isinstance(mesh, Mesh):
        return None
    sharding = _leaf_from_hlo(hlo, mesh, rank, "")
    if sharding is None or sharding.unreduced or any(a.size is not None for a in
                                                     sharding.used_axes()):
        return None
    dims = ["_" if not d.axes else d.axes[0].name if len(d.axes) == 1 else
            "(" + ",".join(a.name for a in d.axes) + ")" for d in sharding.dims]
    return "{mesh_split=[" + ", ".join(dims) + "]}"


def _leaf_from_hlo(hlo: HloSharding, mesh: Mesh, rank: int, name: str):
    if hlo.is_tuple or hlo.is_maximal or hlo.is_manual or hlo.is_unknown:
        return None
    return from_hlo(hlo, mesh, rank, name)
