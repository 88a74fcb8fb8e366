"""The dot's result sharding decided on the digits of iota device ids (`_dot_result_of_axes`,
the same at any device count) against the per-device tables (`_dot_result_by_devices`, which
explicit device orders use), on random iota operand pairs: compatible ones (both operands cut
from one mesh), incompatible ones (the rhs from another device order) and operands whose tiles
read overlapping parts of the device ids."""
from __future__ import annotations

import random

import numpy as np
import pytest

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment, atomic_axes, from_axes
from gspmdc.passes.spmd.op_rules_dot import (
    DotDims, _dot_result_by_devices, _dot_result_of_axes, dot_result,
)
from gspmdc.passes.spmd.tiling import Tiling

#: lhs [b, m, k] x rhs [b, k, n] -> [b, m, n]
DIMS = DotDims((0,), (0,), (2,), (1,), (1,), (2,))


def _factor(n: int, parts: int, rng: random.Random) -> list[int]:
    """A random ordered factorisation of n into `parts` factors."""
    out = [1] * parts
    for p in (2, 3, 5):
        while n % p == 0:
            out[rng.randrange(parts)] *= p
            n //= p
    out[rng.randrange(parts)] *= n
    return out


def _mesh(n: int, rng: random.Random) -> TileAssignment:
    """A random iota assignment of dims (b, m, k, n, rest)."""
    reshape = _factor(n, rng.randint(1, 4), rng)
    perm = list(range(len(reshape)))
    rng.shuffle(perm)
    return TileAssignment.iota(_factor(n, 5, rng), reshape, perm)


def _operand(mesh: TileAssignment, axes: list[int], rank: int) -> Tiling:
    """The operand whose data dims are mesh axes `axes` (b/m/k/n: 0..3), replicated over the
    others."""
    others = [a for a in range(5) if a not in axes]
    moved = mesh.transpose(axes + others)
    dims = list(moved.dims[:len(axes)]) + [int(np.prod(moved.dims[len(axes):]))]
    sharding = HloSharding.tiled(moved.reshape(dims), ("replicated",))
    return Tiling(sharding, rank, mesh.num_devices)


@pytest.mark.parametrize("seed", range(40))
def test_axes_agree_with_devices(seed):
    rng = random.Random(seed)
    decided = 0
    for _ in range(12):
        n = rng.choice([4, 8, 12, 16, 24, 32, 64])
        mesh = _mesh(n, rng)
        lhs = _operand(mesh, [0, 1, 2], 3)
        other = mesh if rng.random() < 0.6 else _mesh(n, rng)
        rhs = _operand(other, rng.choice([[0, 2, 3], [0, 2, 1], [0, 2, 3]]), 3)
        axes = atomic_axes(lhs.tiles, rhs.tiles)
        if axes is None:
            continue
        decided += 1
        by_axes = _dot_result_of_axes(lhs, rhs, DIMS, *axes)
        by_devices = _dot_result_by_devices(lhs, rhs, DIMS)
        assert (by_axes is None) == (by_devices is None), (lhs, rhs)
        if by_axes is not None:
            assert by_axes.sharding == by_devices.sharding, (lhs, rhs)
            assert by_axes.sharding.to_text() == by_devices.sharding.to_text()
    assert decided


def test_compatible_pair_gives_the_hand_computed_result():
    # 2 x 4 mesh (data, model): lhs [b, m, k] tiles b by data, k by model; rhs [b, k, n] the
    # same k tiles; the local dots are partial sums over model: result b by data, partial model
    mesh = TileAssignment.iota((2, 1, 4, 1, 1))
    lhs, rhs = _operand(mesh, [0, 1, 2], 3), _operand(mesh, [0, 2, 3], 3)
    result = dot_result(lhs, rhs, DIMS)
    expected = np.arange(8).reshape(2, 1, 1, 4, 1)
    assert np.array_equal(result.devices, expected)


def test_overlapping_free_tiles_are_incompatible():
    # both free dims read the same digit of the device id: output blocks (m, n) = (i, i) only
    mesh = TileAssignment.iota((1, 4, 1, 1, 1))
    lhs = _operand(mesh, [0, 1, 2], 3)
    rhs = Tiling(HloSharding.iota_tiled((1, 1, 4)), 3, 4)
    assert _dot_result_by_devices(lhs, rhs, DIMS) is None
    assert dot_result(lhs, rhs, DIMS) is None


def test_atomic_axes_cut_both_assignments_alike():
    a = TileAssignment.iota((4, 2))               # digits (4, 2), (2, 1)
    b = TileAssignment.iota((2, 4), (4, 2), (1, 0))
    axes_a, axes_b = atomic_axes(a, b)
    for axes, ta in ((axes_a, a), (axes_b, b)):
        assert from_axes(ta.dims, axes) == ta
        ids = np.arange(8)
        for k, axis in enumerate(axes):
            index = np.zeros(8, dtype=np.int64)
            for radix, stride in axis:
                index = index * radix + (ids // stride) % radix
            coordinates = np.argwhere(ta.array == ids[:, None, None])[:, 1:]
            assert np.array_equal(index, coordinates[:, k])
    assert atomic_axes(TileAssignment.explicit((2, 2), [3, 1, 2, 0])) is None
