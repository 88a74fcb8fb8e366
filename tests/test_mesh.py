"""Named meshes and their conversion to tile assignments
(docs/design/sharding-algebra.md#meshes)."""
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gspmdc.errors import ShardingError
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sharding import HloSharding, TileAssignment


@pytest.fixture
def mesh():
    return Mesh(["x", "y"], [2, 4])


def test_reference_examples(mesh):
    assert mesh.sharding(["x", None], 2).to_text() == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    assert mesh.sharding(["y", "x"], 2).to_text() == "{devices=[4,2]<=[2,4]T(1,0)}"
    assert mesh.sharding([("x", "y"), None], 2).to_text() == "{devices=[8,1]<=[8]}"


def test_unsplit_and_replicated(mesh):
    assert mesh.sharding([None, None], 2) == HloSharding.replicate()
    assert mesh.sharding([], 0) == HloSharding.replicate()
    assert mesh.sharding([None, "y"]).to_text() == \
        "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"


def test_custom_device_order():
    ids = [7, 6, 5, 4, 3, 2, 1, 0]
    m = Mesh(["x", "y"], [2, 4], ids)
    s = m.sharding(["x", "y"])
    assert s.tile_assignment.array.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert m.to_text() == "{x=2, y=4, devices=[7,6,5,4,3,2,1,0]}"
    assert m.device_ids == (7, 6, 5, 4, 3, 2, 1, 0)
    assert Mesh(["x", "y"], [2, 4]).to_text() == "{x=2, y=4}"
    assert Mesh(["x", "y"], [2, 4], range(8)).device_ids is None
    transposed = Mesh(["x", "y"], [2, 4], np.arange(8).reshape(4, 2).T)
    assert transposed.to_text() == "{x=2, y=4, devices=[0,2,4,6,1,3,5,7]}"
    assert transposed == Mesh(["x", "y"], [2, 4], [0, 2, 4, 6, 1, 3, 5, 7])
    assert transposed != Mesh(["x", "y"], [2, 4])


@pytest.mark.parametrize("call, fragment", [
    (lambda m: m.sharding(["z", None], 2), "unknown mesh axis 'z' (mesh axes ['x', 'y'])"),
    (lambda m: m.sharding(["x", "x"], 2), "mesh axis 'x' used twice"),
    (lambda m: m.sharding([("x", "y"), "y"], 2), "mesh axis 'y' used twice"),
    (lambda m: m.sharding(["x"], 2), "1 entries for a rank-2 tensor"),
    (lambda m: m.sharding([3, None], 2), "must be None, an axis name"),
])
def test_sharding_errors(mesh, call, fragment):
    with pytest.raises(ShardingError) as info:
        call(mesh)
    assert fragment in str(info.value)


@pytest.mark.parametrize("args, fragment", [
    ((["x", "x"], [2, 2]), "duplicate mesh axis names ['x']"),
    ((["x"], [0]), "positive integers, got [0]"),
    ((["x", "y"], [2]), "one size per axis name"),
    ((["x"], [4], [0, 1, 2, 2]), "permutation of range(4)"),
    ((["x"], [4], [0, 1, 2]), "permutation of range(4)"),
    ((["1x"], [4]), "identifiers, got ['1x']"),
])
def test_mesh_errors(args, fragment):
    with pytest.raises(ShardingError) as info:
        Mesh(*args)
    assert fragment in str(info.value)


def test_immutable(mesh):
    with pytest.raises(AttributeError):
        mesh._sizes = (8,)
    assert hash(mesh) == hash(Mesh(["x", "y"], [2, 4]))
    assert mesh.axis_size("y") == 4 and mesh.num_devices == 8


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_matches_numpy_formula(data):
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    names = [f"a{i}" for i in range(len(sizes))]
    ids = np.asarray(data.draw(st.permutations(range(prod(sizes))))).reshape(sizes)
    mesh = Mesh(names, sizes, ids)
    rank = data.draw(st.integers(0, 3))
    pool = data.draw(st.permutations(range(len(sizes))))
    mapping, axes_of_dim, k = [], [], 0
    for _ in range(rank):
        take = data.draw(st.integers(0, len(pool) - k))
        axes = list(pool[k:k + take])
        k += take
        axes_of_dim.append(axes)
        mapping.append(None if not axes else names[axes[0]] if len(axes) == 1 else
                       tuple(names[a] for a in axes))
    unused = [a for a in range(len(sizes)) if a not in pool[:k]]
    t = ids.transpose([a for axes in axes_of_dim for a in axes] + unused)
    dims = [prod(sizes[a] for a in axes) for axes in axes_of_dim] + \
        ([prod(sizes[a] for a in unused)] if unused else [])
    if not dims:
        assert mesh.sharding(mapping, rank) == HloSharding.replicate()
        return
    expected = HloSharding.tiled(TileAssignment.from_array(t.reshape(dims)),
                                 ["replicated"] if unused else [])
    assert mesh.sharding(mapping, rank) == expected
