"""Partitioner decisions taken on the digits of iota device ids (the same at any device count)
against the per-device tables that explicit device orders use, on random iota layouts: the dot's
result sharding (`_dot_result_of_axes` / `_dot_result_by_devices`: compatible operand pairs cut
from one mesh, incompatible ones from another device order, tiles that read overlapping parts of
the device ids) and the groups of a reduce-scatter of partial values (`_scatter_by_axes` /
`_scatter_by_devices`: targets whose blocks follow the partial index or not) and whether a
reshard target's tiles nest in the held ones (`_nested`, on coarsened shardings, against the
planner's per-device match), a dot operand's replicas split into the output's tiles
(`_split_by_axes` / `_split_by_devices`) and partial sums sliced to a target's tiles before
summing (`_sliced_by_axes` / `_sliced_by_devices`)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment, atomic_axes, from_axes
from gspmdc.passes.spmd.op_rules_dot import (
    DotDims, _dot_result_by_devices, _dot_result_of_axes, _split_by_axes, _split_by_devices,
    dot_result,
)
from gspmdc.passes.spmd.reshard_plan import (
    _keys, _match, _nested, _scatter_by_axes, _scatter_by_devices, _sliced_by_axes,
    _sliced_by_devices, compatible_subtiling,
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


# ---- reduce-scatter groups of partial values ----------------------------------------------------

def _partial_state(mesh: TileAssignment) -> Tiling:
    """A rank-2 value tiled by mesh axes 0 and 1, partial over axis 2, replicated over 3, 4."""
    moved = mesh.reshape(mesh.dims[:3] + (mesh.dims[3] * mesh.dims[4],))
    sharding = HloSharding.tiled(moved, ("unreduced", "replicated"))
    return Tiling(sharding, 2, mesh.num_devices)


def _scatter_target(mesh: TileAssignment, d: int, order: list[int]) -> Tiling:
    """Dim d tiled by the mesh axes d and 2 (in `order`), the other dim by its axis, replicated
    over axes 3 and 4."""
    other = 1 - d
    moved = mesh.transpose(order + [other, 3, 4] if d == 0 else [0] + order + [3, 4])
    c = moved.dims
    dims = [c[0] * c[1], c[2], c[3] * c[4]] if d == 0 else [c[0], c[1] * c[2], c[3] * c[4]]
    return Tiling(HloSharding.tiled(moved.reshape(dims), ("replicated",)), 2, mesh.num_devices)


@pytest.mark.parametrize("seed", range(30))
def test_scatter_groups_by_axes_agree_with_devices(seed):
    rng = random.Random(1000 + seed)
    decided = 0
    for _ in range(16):
        n = rng.choice([8, 16, 24, 32, 64])
        mesh = _mesh(n, rng)
        state = _partial_state(mesh)
        if state.unreduced == 1:
            continue
        d = rng.randrange(2)
        order = [d, 2] if rng.random() < 0.5 else [2, d]
        target = _scatter_target(mesh if rng.random() < 0.7 else _mesh(n, rng), d, order)
        if target.counts[d] % (state.counts[d] * state.unreduced):
            continue
        found = _scatter_by_axes(state, target, d)
        if found is None:
            continue
        decided += 1
        groups, after = found
        expected_groups, expected_after = _scatter_by_devices(state, target, d)
        assert np.array_equal(groups, expected_groups), (state, target, d)
        assert after == expected_after and after.to_text() == expected_after.to_text()
    assert decided


# ---- reshard targets whose tiles already nest ----------------------------------------------------

def _tiled(mesh: TileAssignment, axes: list[int]) -> Tiling:
    """A rank-2 value tiled by mesh axes `axes[0]` and `axes[1]` (each a list of axes, major
    first), replicated over the others."""
    data = [a for group in axes for a in group]
    rest = [a for a in range(5) if a not in data]
    moved = mesh.transpose(data + rest)
    c = moved.dims
    dims = [int(np.prod(c[:len(axes[0])])), int(np.prod(c[len(axes[0]):len(data)])),
            int(np.prod(c[len(data):]))]
    return Tiling(HloSharding.tiled(moved.reshape(dims), ("replicated",)), 2, mesh.num_devices)


def test_nesting_decided_on_shardings_agrees_with_the_device_match():
    rng = random.Random(2000)
    nested = moved = 0
    for _ in range(300):
        n = rng.choice([8, 16, 24, 32, 64])
        mesh = _mesh(n, rng)
        # state tiles dim 0 by axis 0 and dim 1 by axis 1; the target refines them with axes
        # from the replication (nesting), or comes from another device order
        state = _tiled(mesh, [[0], [1]])
        extra = [[0, 2], [1]] if rng.random() < 0.5 else [[0], [1, 3]]
        target = _tiled(mesh if rng.random() < 0.6 else _mesh(n, rng), extra)
        if any(b % a for a, b in zip(state.counts, target.counts)):
            continue
        up = tuple(b // a for a, b in zip(state.counts, target.counts))
        slots = target.devices.reshape(-1)
        index = np.indices(target.devices.shape).reshape(target.devices.ndim, -1).T[:, :2]
        holders = _match(_keys(index // np.asarray(up), state.counts), slots, state.tile_keys())
        keeps_all = bool(np.array_equal(holders, slots))
        decided = _nested(state.sharding, (1, 1), target.sharding, up, 2, n)
        assert decided == keeps_all, (state, target)
        compatible, pairs = compatible_subtiling(state, target)
        if decided:
            nested += 1
            assert pairs is None and compatible == target
        else:
            moved += 1
            assert np.array_equal(pairs[:, 0], holders)
    assert nested and moved


# ---- a dot operand's replicas split into the output's tiles --------------------------------------

def _split_cases(seed: int) -> tuple[int, int]:
    """(splits, pairs that do not split) decided alike on digits and on devices, from `seed`."""
    rng = random.Random(3000 + seed)
    split = unsplit = 0
    for _ in range(24):
        n = rng.choice([8, 16, 24, 32, 64])
        mesh = _mesh(n, rng)
        # the operand tiles dim 0 (or nothing) and leaves its free dim 1 whole; the output
        # tiles both its dims, from the same mesh or from another device order
        operand = _tiled(mesh, [rng.choice([[0], [], [0, 3]]), []])
        out_mesh = mesh if rng.random() < 0.6 else _mesh(n, rng)
        first = rng.choice([[0], [4]])
        out = _tiled(out_mesh, [first, rng.choice([a for a in ([1], [2, 1], [0], [3])
                                                   if a != first])])
        dims = [d for d in (1,) if operand.counts[d] == 1 and out.counts[d] > 1]
        axes = atomic_axes(operand.tiles, out.tiles)
        if not dims or axes is None:
            continue
        by_axes = _split_by_axes(operand, out, dims, (0, 1), *axes)
        by_devices = _split_by_devices(operand, out, dims, (0, 1))
        assert (by_axes is None) == (by_devices is None), (operand, out)
        if by_axes is None:
            unsplit += 1
            continue
        split += 1
        assert by_axes == by_devices and by_axes.to_text() == by_devices.to_text()
    return split, unsplit


def test_split_as_output_by_axes_agrees_with_devices():
    split, unsplit = np.sum([_split_cases(seed) for seed in range(20)], axis=0)
    assert split > 50 and unsplit > 10


def test_replicas_split_as_the_output_by_hand():
    # 2 x 4 mesh: the operand [m, k] tiles m by the 2, replicated over the 4; the output [m, n]
    # tiles n by the 4: device 4i+j then holds operand tile (i, j) of the split
    mesh = TileAssignment.iota((2, 4, 1, 1, 1))
    operand, out = _tiled(mesh, [[0], []]), _tiled(mesh, [[0], [1]])
    split = _split_by_axes(operand, out, [1], (0, 1), *atomic_axes(operand.tiles, out.tiles))
    assert split == HloSharding.iota_tiled((2, 4))
    # the output tiling n by the 2 that tiles the operand's m: the tiles (i, i) only
    out = _tiled(mesh, [[1], [0]])
    assert _split_by_axes(operand, out, [1], (0, 1),
                          *atomic_axes(operand.tiles, out.tiles)) is None
    assert _split_by_devices(operand, out, [1], (0, 1)) is None


# ---- partial sums sliced to the target's tiles before summing ------------------------------------

def _partials(mesh: TileAssignment, tiles: list[list[int]], partial: list[int]) -> Tiling:
    """A rank-2 value whose dims are tiled by the mesh axes `tiles[0]` and `tiles[1]`, partial
    over the axes `partial`, replicated over the others."""
    data = [a for group in tiles for a in group]
    rest = [a for a in range(5) if a not in data and a not in partial]
    moved = mesh.transpose(data + partial + rest)
    c = moved.dims
    sizes = [len(tiles[0]), len(tiles[1]), len(partial), len(rest)]
    ends = np.cumsum([0] + sizes)
    dims = [int(np.prod(c[ends[k]:ends[k + 1]])) for k in range(4)]
    sharding = HloSharding.tiled(moved.reshape(dims), ("unreduced", "replicated"))
    return Tiling(sharding, 2, mesh.num_devices)


def _sliced_cases(seed: int) -> tuple[int, int]:
    """(slicings, pairs that do not slice) decided alike on digits and on devices, from
    `seed`."""
    rng = random.Random(4000 + seed)
    sliced = unsliced = 0
    for _ in range(24):
        n = rng.choice([8, 16, 24, 32, 64])
        mesh = _mesh(n, rng)
        src = _partials(mesh, [[0], []], rng.choice([[2], [2, 3], [3]]))
        if src.unreduced == 1:
            continue
        # the target refines dim 0 and tiles dim 1 from replicas, partial digits or another
        # device order
        target_mesh = mesh if rng.random() < 0.7 else _mesh(n, rng)
        first = rng.choice([[0], [0, 4], [0, 2], [4]])
        dst = _tiled(target_mesh, [first, rng.choice([a for a in ([], [1], [3], [2])
                                                      if not set(a) & set(first)])])
        dims = rng.choice([(60, 60), (64, 48), (7, 5)])
        axes = atomic_axes(src.tiles, dst.tiles)
        if axes is None:
            continue
        by_axes = _sliced_by_axes(dims, src, dst, *axes)
        by_devices = _sliced_by_devices(dims, src, dst)
        assert (by_axes is None) == (by_devices is None), (src, dst, dims)
        if by_axes is None:
            unsliced += 1
            continue
        sliced += 1
        assert by_axes.sharding == by_devices.sharding
        assert by_axes.sharding.to_text() == by_devices.sharding.to_text()
    return sliced, unsliced


def test_sliced_partials_by_axes_agree_with_devices():
    sliced, unsliced = np.sum([_sliced_cases(seed) for seed in range(20)], axis=0)
    assert sliced > 50 and unsliced > 10
