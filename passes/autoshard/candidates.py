"""The shardings autoshard considers for a value: every way of splitting its dims along the axes
of the device mesh.

Each mesh axis splits one dim of the value or none (then it replicates); a dim split by several
axes takes them in mesh order (`(x, y)`, major to minor: the other device order moves the same
bytes in every reshard and costs the same everywhere, so it would only double the choices). A
dim is only split when it has at least as many elements as the split has shards (splitting a dim
of 3 elements 4 ways leaves a shard of pure padding). Scalars, tokens and empty arrays are
replicated. On a mesh `x=2, y=4` a matrix has 9 candidate shardings, a rank-3 array 16, a
rank-4 array 25.
"""
from __future__ import annotations

import itertools
from math import prod

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import cached
from gspmdc.ir.shapes import ArrayShape


def mesh_shardings(mesh: Mesh, shape: ArrayShape) -> tuple[HloSharding, ...]:
    """The candidate shardings of an array of `shape` on `mesh`, `{replicated}` first, then by
    the number of shards (fewest first), each once."""
    return tuple(_mesh_shardings(mesh, tuple(shape.dims)))


def mesh_axes(mesh: Mesh, shape: ArrayShape) -> dict[HloSharding, frozenset[str]]:
    """The mesh axes each candidate sharding of `shape` splits along."""
    return _mesh_shardings(mesh, tuple(shape.dims))


@cached
def _mesh_shardings(mesh: Mesh, dims: tuple[int, ...]) -> dict[HloSharding, frozenset[str]]:
    replicated = HloSharding.replicate()
    if not dims or prod(dims) == 0:
        return {replicated: frozenset()}
    names, sizes = mesh.axis_names, mesh.axis_sizes
    found: dict[HloSharding, frozenset[str]] = {replicated: frozenset()}
    # each axis: the dim it splits, or len(dims) for none
    for placement in itertools.product(range(len(dims) + 1), repeat=len(names)):
        per_dim = [[a for a, d in enumerate(placement) if d == dim] for dim in range(len(dims))]
        if any(prod(sizes[a] for a in axes) > size for axes, size in zip(per_dim, dims)):
            continue
        mapping = [tuple(names[a] for a in axes) or None for axes in per_dim]
        found.setdefault(mesh.sharding(mapping),
                         frozenset(names[a] for a in range(len(names)) if placement[a] < len(dims)))

    def shards(sharding):
        return prod(sizes[names.index(a)] for a in found[sharding])
    return {s: found[s] for s in sorted(found, key=shards)}


__all__ = ["mesh_shardings", "mesh_axes"]
