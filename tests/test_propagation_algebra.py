"""The propagation-specific sharding algebra (passes/propagation/sharding_algebra.py), checked
against brute-force maps of which device holds which element and against hand-computed values."""
from math import prod

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from gspmdc.ir import sharding_ops as ops
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.tile_assignment import TileAssignment
from gspmdc.passes.propagation import sharding_algebra as alg

S = parse_sharding


def held(s: HloSharding, dims, device: int) -> np.ndarray:
    """Boolean mask of the elements of an array of `dims` that `device` holds under `s`."""
    mask = np.ones(dims, bool)
    if not s.is_tiled:
        return mask
    where = np.argwhere(s.tile_assignment.array == device)[0]
    for k, size in enumerate(dims):
        shard = -(-size // s.tile_counts[k])
        keep = np.arange(size) // shard == where[k]
        mask &= keep.reshape([-1 if e == k else 1 for e in range(len(dims))])
    return mask


# ---- reshape -----------------------------------------------------------------------------

@pytest.mark.parametrize("source, target, sharding, expected", [
    # split the sharded major dim: tiles follow
    ((24, 8), (4, 6, 8), "{devices=[4,1]<=[4]}", "{devices=[4,1,1]<=[4]}"),
    # merge where only the major dim is sharded
    ((4, 6), (24,), "{devices=[2,1]<=[2]}", "{devices=[2]<=[2]}"),
    # a split that does not divide the tile count: gcd tiles follow, the rest replicated
    ((24,), (6, 4), "{devices=[4]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"),
    # a sharded size-1 dim disappears: its tiles become (trailing) replication
    ((8, 1, 16), (8, 16), "{devices=[1,2,4]<=[8]}", "{devices=[1,4,2]<=[8] last_tile_dim_replicate}"),
    # dims unchanged
    ((3, 5), (3, 5), "{devices=[1,2]<=[2]}", "{devices=[1,2]<=[2]}"),
])
def test_reshape_sharding_examples(source, target, sharding, expected):
    assert alg.reshape_sharding(source, target, S(sharding)) == S(expected)


@pytest.mark.parametrize("source, target, sharding", [
    ((4, 6), (24,), "{devices=[1,2]<=[2]}"),          # merging under a sharded minor dim
    ((14,), (7, 2), "{devices=[4]<=[4]}"),             # 14 rows do not split 4 ways
])
def test_reshape_sharding_impossible(source, target, sharding):
    assert alg.reshape_sharding(source, target, S(sharding)) is None


def test_propagate_through_reshape_keeps_the_part_that_follows():
    # rows (14, cut 4 ways) cannot follow the reshape, columns (32, cut 4 ways) can: the column
    # tiles land on target dims 2 and 3, each piece replicated over the 4 row tiles (devices of
    # T transposed column-major)
    got = alg.propagate_through_reshape((14, 32), (7, 2, 2, 16), S("{devices=[4,4]<=[16]}"))
    t = np.arange(16).reshape(4, 4).T.reshape(1, 1, 2, 2, 4)
    assert got == HloSharding.tiled(TileAssignment.from_array(t), ["replicated"])


def test_propagate_through_reshape_with_manual_subgroup():
    s = S("{devices=[2,1,2]<=[4] last_tile_dims={manual}}")
    got = alg.propagate_through_reshape((4, 6), (4, 2, 3), s)
    assert got.has_manual_subgroup and got.tile_counts == (2, 1, 1)


@st.composite
def reshape_cases(draw):
    rank = draw(st.integers(1, 3))
    factors = [draw(st.sampled_from([1, 2, 3, 4])) for _ in range(rank)]
    tiles = [draw(st.sampled_from([t for t in (1, 2, 4) if t == 1 or (f * t) % t == 0]))
             for f in factors]
    dims = [f * t for f, t in zip(factors, tiles)]
    n = prod(tiles)
    assume(n > 1)
    perm = draw(st.permutations(range(n)))
    s = HloSharding.tiled(TileAssignment.from_array(np.array(perm).reshape(tiles)))
    flat = prod(dims)
    cut = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3))
    target, rest = [], flat
    for c in cut:
        if rest % c == 0 and c > 1:
            target.append(c)
            rest //= c
    target.append(rest)
    return tuple(dims), tuple(target), s


@settings(max_examples=150, deadline=None)
@given(reshape_cases())
def test_reshape_sharding_keeps_every_device_inside_its_tile(case):
    """Whenever a sharding is returned and no sharded source dim has size 1, every device's
    elements (flattened) lie inside the elements it holds after the reshape."""
    source, target, s = case
    assume(all(d > 1 or t == 1 for d, t in zip(source, s.tile_counts)))
    got = alg.reshape_sharding(source, target, s)
    assume(got is not None and got.is_tiled)
    for device in range(s.tile_assignment.num_devices):
        before = held(s, source, device).ravel()
        after = held(got, target, device).ravel()
        assert not (before & ~after).any(), (source, target, s, got, device)


# ---- merging -----------------------------------------------------------------------------

def test_merge_example_from_the_reference():
    dst = S("{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}")
    to_merge = S("{devices=[1,2,2]0,1,2,3 last_tile_dim_replicate}")
    assert alg.merge_if_compatible(to_merge, dst, 3) == S("{devices=[2,2]0,2,1,3}")


def test_merge_fails_when_no_device_holds_both_tiles():
    # rows on {0,1}/{2,3} x 2, columns on {0,1}/{2,3}: tile (0,1) would need a device in both
    a = S("{devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    b = S("{devices=[1,2,2]<=[4] last_tile_dim_replicate}")
    assert alg.merge_if_compatible(b, a) is None


def mesh_sharding(mesh: np.ndarray, dim_axes: list[list[int]]) -> HloSharding:
    """The sharding that cuts data dim k along mesh axes `dim_axes[k]` (major to minor) and
    replicates over the unused axes (§2.8)."""
    used = [a for axes in dim_axes for a in axes]
    unused = [a for a in range(mesh.ndim) if a not in used]
    tiles = [prod(mesh.shape[a] for a in axes) for axes in dim_axes]
    t = mesh.transpose(used + unused).reshape(tiles + [prod(mesh.shape[a] for a in unused)])
    return HloSharding.tiled(TileAssignment.from_array(t), ["replicated"])


@st.composite
def partial_pairs(draw):
    """Two partially replicated shardings of one rank over the same devices, built from one mesh
    (so that they often merge): each mesh axis cuts a dim of the first, of the second, of both,
    or of neither."""
    rank = draw(st.integers(1, 3))
    axes = draw(st.lists(st.sampled_from([2, 3]), min_size=2, max_size=4))
    n = prod(axes)
    mesh = np.array(draw(st.permutations(range(n)))).reshape(axes)
    a_axes, b_axes = [[] for _ in range(rank)], [[] for _ in range(rank)]
    for axis in range(len(axes)):
        role = draw(st.sampled_from(["a", "b", "both", "none"]))
        dim = draw(st.integers(0, rank - 1))
        if role in ("a", "both"):
            a_axes[dim].append(axis)
        if role in ("b", "both"):
            b_axes[dim].append(axis)
    return rank, mesh_sharding(mesh, a_axes), mesh_sharding(mesh, b_axes)


@st.composite
def split_shardings(draw):
    """A mesh sharding `c` (two or more dims cut, maybe some mesh axes unused) and two partial
    shardings: `c` with only the first cut dim kept, and with only the others kept."""
    rank = draw(st.integers(2, 3))
    axes = draw(st.lists(st.sampled_from([2, 3]), min_size=2, max_size=4))
    mesh = np.array(draw(st.permutations(range(prod(axes))))).reshape(axes)
    first = draw(st.integers(0, rank - 1))
    dims = [first, (first + 1 + draw(st.integers(0, rank - 2))) % rank]
    dims += [draw(st.integers(-1, rank - 1)) for _ in axes[2:]]
    dim_axes = [[a for a, d in enumerate(dims) if d == k] for k in range(rank)]
    c = mesh_sharding(mesh, dim_axes)
    return c, ops.replicate_all_except(c, [first]), \
        ops.replicate_all_except(c, [d for d in range(rank) if d != first])


@settings(max_examples=150, deadline=None)
@given(partial_pairs())
def test_merge_fast_path_agrees_with_device_set_construction(pair):
    _, a, b = pair
    assume(b.is_tiled and b.has_partial_replication)
    assert alg.merge_if_compatible(a, b, 0) == ops.merge_if_compatible(a, b, 0)


@settings(max_examples=100, deadline=None)
@given(split_shardings())
def test_merging_the_halves_of_a_sharding_gives_it_back(case):
    c, a, b = case
    assume(b.is_tiled and b.has_partial_replication and a.is_tiled)
    assert alg.merge_if_compatible(a, b, 0) == c


# ---- sub-tiling --------------------------------------------------------------------------

@pytest.mark.parametrize("dims, sub, sup, expected", [
    ((8, 8), "{devices=[2,2]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", True),
    ((8, 8), "{devices=[2,2]<=[4]}", "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}", False),
    ((8, 8), "{devices=[2,1]<=[2]}", "{devices=[1,2]<=[2]}", False),
    ((8, 8), "{devices=[2,1]<=[2]}", "{replicated}", True),
    ((8, 8), "{replicated}", "{devices=[2,1]<=[2]}", False),
])
def test_subtiling_examples(dims, sub, sup, expected):
    assert alg.is_subtiling_or_equal(dims, S(sub), S(sup)) is expected


@settings(max_examples=150, deadline=None)
@given(partial_pairs(), st.sampled_from([36, 72, 12]))
def test_subtiling_matches_brute_force(pair, size):
    rank, a, b = pair
    n = a.tile_assignment.num_devices if a.is_tiled else b.total_num_tiles
    dims = [size] * rank
    for sub, sup in ((a, b), (b, a)):
        truth = all(not (held(sub, dims, d) & ~held(sup, dims, d)).any() for d in range(n))
        assert alg.is_subtiling_or_equal(dims, sub, sup) == truth, (sub, sup)


# ---- the improve decision (§3.4) ---------------------------------------------------------

SHAPE = ArrayShape("f32", (8, 8))


def improve(candidate, current, may_combine=True, aggressive=False):
    return alg.improved_sharding(S(candidate), None if current is None else S(current), SHAPE,
                                 may_combine=may_combine, aggressive=aggressive)


def test_anything_beats_no_sharding_but_single_device_never_propagates():
    assert improve("{devices=[2,1]<=[2]}", None) == S("{devices=[2,1]<=[2]}")
    assert improve("{maximal device=1}", None) is None


def test_replicated_is_replaced_by_tiled():
    assert improve("{devices=[1,2]<=[2]}", "{replicated}") == S("{devices=[1,2]<=[2]}")


def test_same_tile_count_on_another_dim_is_not_a_refinement():
    assert improve("{devices=[1,2]<=[2]}", "{devices=[2,1]<=[2]}") is None
    # ... unless the single consumer pays for the reshard anyway
    assert improve("{devices=[1,4]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
                   aggressive=True) == S("{devices=[1,4]<=[4]}")


def test_partial_replication_is_refined_by_a_subtiling():
    assert improve("{devices=[2,2]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}") == \
        S("{devices=[2,2]<=[4]}")


def test_more_tiles_that_reshuffle_devices_are_rejected():
    # 4 tiles on dim 1, but device 1 would leave its row block
    assert improve("{devices=[1,4]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}") is None


def test_partial_shardings_on_different_dims_merge_only_when_allowed():
    rows = "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    cols = "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
    assert improve(cols, rows) == S("{devices=[2,2]<=[4]}")
    assert improve(cols, rows, may_combine=False) is None


def test_manual_beats_tile_maximal_and_is_never_replaced():
    assert improve("{manual}", "{replicated}") == S("{manual}")
    assert improve("{devices=[2,1]<=[2]}", "{manual}") is None


def test_find_common_sharding():
    rows = S("{devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    cols = S("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}")
    assert alg.find_common_sharding([rows, cols]) == S("{devices=[2,2]<=[4]}")
    other = S("{devices=[1,4]<=[4]}")
    assert alg.find_common_sharding([rows, other], cols) == cols
