"""The sharding algebra (ir/sharding_algebra.py): worked examples, and property tests against a
brute-force map of which device holds which element. XLA's own answers on random cases are checked
in test_sharding_algebra_xla.py."""
import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from gspmdc.errors import ShardingError
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.sharding import HloSharding, TileAssignment
from gspmdc.ir.shapes import ArrayShape

H = HloSharding


def iota(dims, reshape=None, perm=None, types=()):
    return H.tiled(TileAssignment.iota(dims, reshape, perm), types)


def explicit(dims, ids, types=()):
    return H.tiled(TileAssignment.explicit(dims, ids), types)


def partial(dims, ids=None):
    return H.tiled(TileAssignment.iota(dims) if ids is None else TileAssignment.explicit(dims, ids),
                   ["replicated"])


# ---- brute-force truth ---------------------------------------------------------------------------

def holdings(s, shape, n, ignore_dims=()):
    """device -> (manual coordinate, boolean mask of the elements of `shape` it holds), computed
    from the definition: a device's tile index is its position in T (np.argwhere), the tile with
    index i on a dim of size S cut t ways holds elements x with x // cdiv(S, t) == i."""
    if s.kind == "replicated":
        return {d: (0, np.ones(shape, bool)) for d in range(n)}
    t = s.tile_assignment.array
    rank = len(shape)
    manual_dim = s.subgroup_dim("manual")
    out = {}
    for d in range(n):
        where = np.argwhere(t == d)
        assert len(where) == 1
        coords = where[0]
        mask = np.ones(shape, bool)
        for k in range(rank):
            if k in ignore_dims:
                continue
            shard = -(-shape[k] // t.shape[k])
            keep = np.arange(shape[k]) // shard == coords[k]
            mask &= keep.reshape([-1 if e == k else 1 for e in range(rank)])
        out[d] = (int(coords[manual_dim]) if manual_dim >= 0 else 0, mask)
    return out


@st.composite
def shardings(draw, rank=None, manual=False, max_tiles=3, types=None):
    rank = draw(st.integers(1, 3)) if rank is None else rank
    counts = draw(st.lists(st.integers(1, max_tiles), min_size=rank, max_size=rank))
    chosen = list(draw(st.sampled_from([[], ["replicated"]]))) if types is None else list(types)
    if manual and draw(st.booleans()):
        chosen = ["manual"] + chosen
    dims = counts + [draw(st.integers(2, 3)) for _ in chosen]
    ids = np.asarray(draw(st.permutations(range(prod(dims)))))
    s = H.tiled(TileAssignment.from_array(ids, dims), chosen)
    assume(s.is_tiled)
    return s


def sharding_on(data, rank, n):
    """A random tiled or partially replicated sharding of rank `rank` over devices 0..n-1."""
    counts, rest = [], n
    for _ in range(rank):
        c = data.draw(st.sampled_from([d for d in (1, 2, 3, 4) if rest % d == 0]))
        counts.append(c)
        rest //= c
    ids = data.draw(st.permutations(range(n)))
    return H.tiled(TileAssignment.from_array(np.asarray(ids), counts + [rest]), ["replicated"])


def even_shape(s, rank, draw_mult):
    counts = s.tile_counts_for_rank(rank)
    return tuple(c * m for c, m in zip(counts, draw_mult))


def devices_of(s):
    return s.tile_assignment.num_devices if s.is_tiled else None


# ---- (a), (b), (c), (d) --------------------------------------------------------------------------

def test_partially_replicate_reference_example():
    s = algebra.partially_replicate_on_dims(iota([2, 2]), [0])
    assert s == explicit([1, 2, 2], [0, 2, 1, 3], ["replicated"])
    assert s.to_text() == "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}"
    assert algebra.partially_replicate_on_dims(iota([2, 2]), [0, 1]) == H.replicate()
    assert algebra.partially_replicate_on_dims(iota([2, 1]), [1]) == iota([2, 1])
    # growing an existing replication dim
    grown = algebra.partially_replicate_on_dims(partial([2, 2, 2]), [1])
    assert grown == H.tiled(TileAssignment.iota([2, 1, 4]), ["replicated"])
    # manual subgroup stays after the new replicated group
    m = algebra.partially_replicate_on_dims(iota([2, 2, 2], types=["manual"]), [0])
    assert m.subgroup_types == ("manual", "replicated") and m.tile_counts == (1, 2)
    assert algebra.partially_replicate_on_dims(H.replicate(), [0]) == H.replicate()


@settings(max_examples=80, deadline=None)
@given(shardings(), st.data())
def test_partially_replicate_matches_projection(s, data):
    rank = s.data_rank
    dims = data.draw(st.lists(st.integers(0, rank - 1), unique=True))
    shape = tuple(data.draw(st.integers(1, 7)) for _ in range(rank))
    n = s.tile_assignment.num_devices
    expected = holdings(s, shape, n, ignore_dims=dims)
    after = holdings(algebra.partially_replicate_on_dims(s, dims), shape, n)
    for d in range(n):
        assert np.array_equal(after[d][1], expected[d][1])


def test_replicate_all_except_and_all_data_dims():
    s = iota([2, 3, 2])
    assert algebra.replicate_all_except(s, [1]) == algebra.partially_replicate_on_dims(s, [0, 2])
    assert algebra.replicate_all_data_dims(s) == H.replicate()
    assert algebra.replicate_all_data_dims(H.maximal(1)) == H.replicate()
    assert algebra.replicate_all_data_dims(H.manual()) == H.manual()
    m = iota([2, 2, 2], types=["manual"])
    kept = algebra.replicate_all_data_dims(m)
    assert kept.subgroup_types == ("manual", "replicated") and kept.tile_counts == (1, 1)
    # manual group m (last coordinate of the original T) keeps its devices
    assert kept.tile_assignment.array.reshape(2, 4).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    reranked = algebra.replicate_all_data_dims(m, data_rank=3)
    assert reranked.tile_counts == (1, 1, 1) and reranked.subgroup_types == ("manual", "replicated")


def test_remove_dims():
    s = iota([2, 1, 2, 1], types=["replicated"])
    assert algebra.remove_dims(s, [1]) == iota([2, 2, 1], types=["replicated"])
    with pytest.raises(ShardingError, match="dims \\[0\\] .* are tiled"):
        algebra.remove_dims(s, [0])


# ---- (e), (f), (g), (h), (i) ---------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(shardings(manual=True), st.data())
def test_transpose_matches_numpy(s, data):
    rank = s.data_rank
    perm = data.draw(st.permutations(range(rank)))
    shape = tuple(data.draw(st.integers(1, 6)) for _ in range(rank))
    n = s.tile_assignment.num_devices
    before, after = holdings(s, shape, n), holdings(algebra.transpose(s, perm), tuple(shape[p] for p in perm), n)
    for d in range(n):
        assert after[d][0] == before[d][0]
        assert np.array_equal(after[d][1], before[d][1].transpose(perm))


def test_transpose_stays_iota():
    # fresh tables: an earlier test in the process may have materialised this interned value
    algebra.clear_caches()
    s = iota([64, 64], types=[])
    t = algebra.transpose(s, [1, 0])
    assert t.tile_assignment.iota_form() == ((64, 64), (1, 0))
    assert t.tile_assignment._array is None


@settings(max_examples=60, deadline=None)
@given(shardings(), st.data())
def test_reverse_on_even_shapes(s, data):
    rank = s.data_rank
    dims = data.draw(st.lists(st.integers(0, rank - 1), unique=True))
    shape = even_shape(s, rank, [data.draw(st.integers(1, 3)) for _ in range(rank)])
    n = s.tile_assignment.num_devices
    before, after = holdings(s, shape, n), holdings(algebra.reverse(s, dims), shape, n)
    for d in range(n):
        assert np.array_equal(after[d][1], np.flip(before[d][1], axis=dims))


@settings(max_examples=60, deadline=None)
@given(shardings(rank=3), st.data())
def test_move_and_merge(s, data):
    src, tgt = data.draw(st.permutations(range(3)))[:2]
    merged = algebra.move_and_merge(s, src, tgt)
    counts = s.tile_counts
    assert merged.tile_counts[src] == 1 and merged.tile_counts[tgt] == counts[tgt] * counts[src]
    for d in range(s.tile_assignment.num_devices):
        old = np.argwhere(s.tile_assignment.array == d)[0]
        new = merged.tile_index_for_device(d)
        assert new[tgt] == old[tgt] * counts[src] + old[src]
        assert new[src] == 0


def test_collapsed_transpose():
    s = iota([2, 1, 3], types=[])
    # dim 1 disappears, a new dim appears at the front, dims 0 and 2 swap
    t = algebra.transpose_with_collapsed_dims(s, [2, -1, 1], [-1, 2, 0])
    assert t.tile_counts == (1, 3, 2)
    for d in range(6):
        i, _, k = s.tile_index_for_device(d)
        assert t.tile_index_for_device(d) == (0, k, i)
    assert algebra.transpose_with_collapsed_dims(s, [-1, 0, 1], [1, 2]) is None
    p = partial([2, 2, 2])
    q = algebra.transpose_with_collapsed_dims(p, [1, 0], [1, 0, -1])
    assert q == algebra.transpose(algebra.transpose_with_collapsed_dims(p, [0, 1], [0, 1, -1]), [1, 0, 2])
    with pytest.raises(ShardingError, match="inconsistent maps"):
        algebra.transpose_with_collapsed_dims(s, [0, 1, 2], [1, 0, 2])


@settings(max_examples=60, deadline=None)
@given(shardings(rank=3), st.data())
def test_propagate_along_dims(s, data):
    k = data.draw(st.integers(1, 3))
    source_dims = data.draw(st.permutations(range(3)))[:k]
    target_rank = data.draw(st.integers(k, 4))
    target_dims = data.draw(st.permutations(range(target_rank)))[:k]
    out = algebra.propagate_along_dims(s, source_dims, target_dims, target_rank)
    n = s.tile_assignment.num_devices
    counts = out.tile_counts_for_rank(target_rank)
    for j in range(target_rank):
        expected = s.tile_counts[source_dims[target_dims.index(j)]] if j in target_dims else 1
        assert counts[j] == expected
    if out.is_tiled:
        for d in range(n):
            old = s.tile_index_for_device(d)
            new = out.tile_index_for_device(d)
            assert all(new[td] == old[sd] for sd, td in zip(source_dims, target_dims))


# ---- (j), (k) ------------------------------------------------------------------------------------

def flat_holdings(s, shape, n):
    return {d: set(np.flatnonzero(mask).tolist()) for d, (_, mask) in holdings(s, shape, n).items()}


def test_reshape_reference_examples():
    assert algebra.reshape_sharding(iota([4]), [24], [6, 4]) == partial([2, 1, 2])
    assert algebra.reshape_sharding(iota([2, 1]), [4, 3], [12]) == iota([2])
    assert algebra.reshape_sharding(iota([1, 2]), [4, 3], [12]) is None
    assert algebra.reshape_sharding(iota([4]), [24], [8, 3]) == iota([4, 1])
    assert algebra.reshape_sharding(iota([4]), [10], [2, 5]) is None
    assert algebra.reshape_sharding(iota([2, 2]), [4, 6], [4, 2, 3]) == iota([2, 2, 1])
    assert algebra.reshape_sharding(iota([1, 2]), [6, 4], [2, 3, 4]) == iota([1, 1, 2])
    assert algebra.reshape_sharding(H.replicate(), [6], [2, 3]) == H.replicate()


def test_propagate_through_reshape_reference_example():
    out = algebra.propagate_through_reshape(iota([4, 4]), [14, 32], [7, 2, 2, 16])
    expected = explicit([1, 1, 2, 2, 4], [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15],
                        ["replicated"])
    assert out == expected
    assert out.to_text() == "{devices=[1,1,2,2,4]<=[4,4]T(1,0) last_tile_dim_replicate}"


def test_propagate_through_reshape_keeps_manual():
    s = iota([2, 2, 2], types=["manual"])
    out = algebra.propagate_through_reshape(s, [6, 8], [6, 2, 4])
    assert out.has_manual_subgroup and out.tile_counts == (2, 2, 1)
    fallback = algebra.propagate_through_reshape(iota([2, 2, 2], types=["manual"]), [3, 5], [15])
    assert fallback.subgroup_types == ("manual", "replicated") and fallback.tile_counts == (1,)


@st.composite
def reshape_cases(draw):
    factors = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=5))
    def group(fs):
        dims, i = [], 0
        while i < len(fs):
            k = draw(st.integers(1, len(fs) - i))
            dims.append(prod(fs[i:i + k]))
            i += k
        return dims
    source, target = group(factors), group(factors)
    counts = [draw(st.sampled_from([c for c in (1, 2, 3, 4) if c <= max(d, 1)] or [1])) for d in source]
    assume(prod(counts) > 1)
    replicate = draw(st.sampled_from([1, 2]))
    ids = draw(st.permutations(range(prod(counts) * replicate)))
    dims = counts + ([replicate] if replicate > 1 else [])
    s = H.tiled(TileAssignment.from_array(np.asarray(ids), dims), ["replicated"] if replicate > 1 else [])
    return s, source, target


@settings(max_examples=200, deadline=None)
@given(reshape_cases())
def test_reshape_sharding_is_sound_on_even_dims(case):
    """When every sharded source dim divides evenly, every device's elements (flattened) lie
    inside the elements it holds after the reshape, for both functions."""
    s, source, target = case
    assume(all(d % c == 0 for d, c in zip(source, s.tile_counts)))
    n = s.tile_assignment.num_devices
    out = algebra.reshape_sharding(s, source, target)
    results = [algebra.propagate_through_reshape(s, source, target)]
    if out is not None:
        results.append(out)
        assert out.num_tiles > 1
    before = flat_holdings(s, tuple(source), n)
    for r in results:
        assert r.tile_counts_for_rank(len(target)) is not None
        after = flat_holdings(r, tuple(target), n)
        for d in range(n):
            assert before[d] <= after[d], (s, r, d)


def test_reshape_sharding_exact_when_tiles_kept():
    # merge of major-sharded dims and split: every device keeps exactly its elements
    for s, source, target in [(iota([2, 1]), [4, 3], [12]), (iota([4]), [24], [8, 3]),
                              (iota([2, 3]), [4, 6], [2, 2, 3, 2])]:
        out = algebra.reshape_sharding(s, source, target)
        assert out.num_tiles == s.num_tiles
        assert flat_holdings(s, tuple(source), 6 if s.num_tiles == 6 else s.num_tiles) == \
            flat_holdings(out, tuple(target), s.num_tiles)


# ---- (l) ----------------------------------------------------------------------------------------

def greedy_merge(to_merge, dst, n):
    """XLA's general placement, written directly: for every merged index in row-major order, take
    the smallest device in (to_merge's set ∩ dst's set), removing it from both sets."""
    a, b = to_merge.tile_assignment.array, dst.tile_assignment.array
    rank = dst.data_rank
    merged = [max(x, y) for x, y in zip(to_merge.tile_counts, dst.tile_counts)]
    rep = n // prod(merged)
    sets_a = {idx: set(a[idx].ravel().tolist()) for idx in itertools.product(*map(range, a.shape[:rank]))}
    sets_b = {idx: set(b[idx].ravel().tolist()) for idx in itertools.product(*map(range, b.shape[:rank]))}
    out = []
    for idx in itertools.product(*map(range, merged)):
        ka = tuple(i if c > 1 else 0 for i, c in zip(idx, to_merge.tile_counts))
        kb = tuple(i if c > 1 else 0 for i, c in zip(idx, dst.tile_counts))
        for _ in range(rep):
            common = sets_a[ka] & sets_b[kb]
            if not common:
                return None
            d = min(common)
            out.append(d)
            sets_a[ka].discard(d)
            sets_b[kb].discard(d)
    return np.asarray(out).reshape(merged + ([rep] if rep > 1 else []))


def test_merge_reference_example():
    dst = explicit([2, 1, 2], [0, 2, 1, 3], ["replicated"])
    to_merge = explicit([1, 2, 2], [0, 1, 2, 3], ["replicated"])
    merged = algebra.merge_if_compatible(to_merge, dst)
    assert merged == explicit([2, 2], [0, 2, 1, 3])
    assert algebra.merge_if_compatible(to_merge, dst, minimum_tiles=5) is None
    assert algebra.merge_if_compatible(to_merge, H.replicate()) == to_merge
    assert algebra.merge_if_compatible(H.replicate(), dst) is None
    assert algebra.merge_if_compatible(to_merge, iota([2, 2])) is None     # dst not partial
    assert algebra.merge_if_compatible(partial([2, 1, 2]), partial([3, 1, 2], [0, 1, 2, 3, 4, 5])) is None


def test_merge_elementwise_example():
    # an elementwise op's two operands: [2,1,2] and [1,2,2] on the same 4 devices merge to
    # [2,2]<=[4]
    merged = algebra.merge_if_compatible(partial([1, 2, 2], [0, 2, 1, 3]), partial([2, 1, 2]))
    assert merged == iota([2, 2])


def test_merge_counts_an_unreduced_subgroup_as_replication():
    # a dot's result [1,2] with an unreduced pair and a replicated pair on 8 devices (column j
    # on 4j..4j+3) and the other operand's rows (row 0 on the even devices, row 1 on the odd):
    # tile (i, j) is held by row i's devices of column j, by hand: (0,0) 0,2  (0,1) 4,6
    # (1,0) 1,3  (1,1) 5,7; the merge is replicated only, as XLA's (its fast path has no pair)
    dst = iota([1, 2, 2, 2], types=("unreduced", "replicated"))
    to_merge = partial([2, 1, 4], [0, 2, 4, 6, 1, 3, 5, 7])
    assert algebra.merge_if_compatible(to_merge, dst) == \
        explicit([2, 2, 2], [0, 2, 4, 6, 1, 3, 5, 7], ["replicated"])
    # the unreduced side as `to_merge`: the same tiles
    assert algebra.merge_if_compatible(dst, to_merge) == \
        explicit([2, 2, 2], [0, 2, 4, 6, 1, 3, 5, 7], ["replicated"])
    # rows on the first and last four devices share no device with a column: no merge
    assert algebra.merge_if_compatible(partial([2, 1, 4]), dst) is None


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_merge_matches_greedy_and_intersects_holdings(data):
    rank = data.draw(st.integers(1, 3))
    n = data.draw(st.sampled_from([4, 6, 8, 12]))

    a, b = sharding_on(data, rank, n), sharding_on(data, rank, n)
    out = algebra.merge_if_compatible(a, b, 0)
    compatible = a.is_tiled and b.is_tiled and b.has_partial_replication and all(
        x == y or 1 in (x, y) for x, y in zip(a.tile_counts, b.tile_counts)) and \
        n % prod(max(x, y) for x, y in zip(a.tile_counts, b.tile_counts)) == 0
    if not b.is_tiled:
        assert out == (a if a.is_tiled else None)
        return
    if not (a.is_tiled and compatible):
        assert out is None
        return
    expected = greedy_merge(a, b, n)
    if expected is None:
        assert out is None
        return
    assert out is not None
    assert out == H.tiled(TileAssignment.from_array(expected),
                          ["replicated"] if expected.ndim > rank else [])
    shape = tuple(c * 2 for c in out.tile_counts)
    ha, hb, ho = holdings(a, shape, n), holdings(b, shape, n), holdings(out, shape, n)
    for d in range(n):
        assert np.array_equal(ho[d][1], ha[d][1] & hb[d][1])


# ---- (m), (n) ------------------------------------------------------------------------------------

def test_is_more_specific():
    r, m, t2, t4 = H.replicate(), H.maximal(0), iota([2, 1]), iota([2, 2])
    assert algebra.is_more_specific(t4, t2) and not algebra.is_more_specific(t2, t4)
    assert not algebra.is_more_specific(t2, partial([2, 1, 2]))    # same tile count
    assert algebra.is_more_specific(t2, r) and algebra.is_more_specific(m, r) and not algebra.is_more_specific(r, r)
    assert algebra.is_more_specific(t2, m) and not algebra.is_more_specific(r, m)
    assert algebra.is_more_specific(H.manual(), r) and algebra.is_more_specific(H.manual(), m)
    assert not algebra.is_more_specific(t2, H.manual()) and not algebra.is_more_specific(H.manual(), t2)
    assert algebra.is_more_specific(t2, H.unknown())
    assert algebra.is_more_specific(H.tuple([t4, r]), H.tuple([t2, r]))
    assert not algebra.is_more_specific(H.tuple([t4, r]), H.tuple([t2, m]))
    assert not algebra.is_more_specific(H.tuple([t2, r]), H.tuple([t2, r]))


def test_is_subtiling_examples():
    shape = ArrayShape("f32", (8, 8))
    assert algebra.is_subtiling_or_equal(iota([2, 2]), partial([2, 1, 2]), shape)
    assert not algebra.is_subtiling_or_equal(iota([2, 2]), partial([1, 2, 2]), shape)   # {0,1} hold cols apart
    assert algebra.is_subtiling_or_equal(iota([2, 2]), partial([1, 2, 2], [0, 2, 1, 3]), shape)
    assert algebra.is_subtiling_or_equal(iota([2, 2]), H.replicate(), shape)
    assert not algebra.is_subtiling_or_equal(H.replicate(), iota([2, 2]), shape)
    assert not algebra.is_subtiling_or_equal(H.manual(), H.manual(), shape)
    assert algebra.is_subtiling_or_equal(iota([2, 2]), iota([2, 2]), shape)
    # same tile count, different tiling
    assert not algebra.is_subtiling_or_equal(iota([4, 1]), iota([1, 4]), shape)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_is_subtiling_matches_holdings(data):
    n = data.draw(st.sampled_from([4, 6, 8]))
    a, b = sharding_on(data, 2, n), sharding_on(data, 2, n)
    shape = tuple(data.draw(st.integers(4, 9)) for _ in range(2))
    # only shapes where every tile of `a` holds real data (the padding-only case is XLA-specific)
    assume(all(-(-s // t) * (t - 1) < s for s, t in zip(shape, a.tile_counts_for_rank(2))))
    ha, hb = holdings(a, shape, n), holdings(b, shape, n)
    truth = all(not (ha[d][1] & ~hb[d][1]).any() for d in range(n))
    assert algebra.is_subtiling_or_equal(a, b, ArrayShape("f32", shape)) == truth


# ---- (o) ----------------------------------------------------------------------------------------

def test_group_reference_examples():
    g = algebra.group_on_dims(iota([2, 2]), [0])
    assert g.device_groups.tolist() == [[0, 1], [2, 3]] and g.sharding == iota([1, 2])
    assert g.in_group_ids().tolist() == [0, 1, 0, 1]
    g = algebra.group_on_dims(iota([2, 2]), [1])
    assert g.device_groups.tolist() == [[0, 2], [1, 3]] and g.sharding == iota([2, 1])
    assert g.group_dim_sizes == (2,) and g.num_groups == 2 and g.group_size == 2


def test_group_partial_shards():
    s = iota([4, 2])
    g = algebra.group_on_dims(s, [0], [2])
    assert g.group_dim_sizes == (2,) and g.sharding == iota([2, 2])
    assert g.device_groups.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert algebra.ungroup(g) == s


@settings(max_examples=100, deadline=None)
@given(shardings(manual=True), st.data())
def test_group_ungroup_round_trip(s, data):
    ta = s.tile_assignment
    dims = data.draw(st.lists(st.integers(0, ta.ndim - 1), unique=True, max_size=ta.ndim))
    shards = [data.draw(st.sampled_from([x for x in (1, 2, 3) if ta.dims[d] % x == 0])) for d in dims]
    g = algebra.group_on_dims(s, dims, shards)
    assert algebra.ungroup(g) == s
    # devices of one group share their group coordinates
    coords = ta.coordinates()
    for row in g.device_groups:
        c = coords[row]
        for d, x in zip(dims, shards):
            assert len(set((c[:, d] // x).tolist())) == 1


def test_ungroup_replicated_inner_and_rerank():
    g = algebra.group_on_dims(iota([2, 2]), [0])
    assert algebra.ungroup(g.with_sharding(H.replicate())) == partial([2, 1, 2])
    manual = iota([2, 2, 2], types=["manual"])
    gm = algebra.group_on_dims(manual, [2])
    assert gm.sharding == iota([2, 2])
    reshaped = gm.with_sharding(algebra.reshape_sharding(gm.sharding, [4, 6], [4, 2, 3]), data_rank=3)
    assert algebra.ungroup(reshaped) == algebra.reshape_sharding(manual, [4, 6], [4, 2, 3])


def test_reshape_merging_an_uneven_minor_dim_takes_the_gcd_as_xla_does():
    """[1,4,6] tiled [1,4,4] (the 6 in shards of 2, the last empty) merged into [1,24]: XLA keeps
    the major dim's 4 tiles and gcd(6, 4) = 2 of the minor dim's, the rest replicated. Shards
    [2,4) of the 6 then straddle the target tiles of 3: this is XLA's answer, and the partitioner
    checks containment itself before reshaping locally."""
    s = iota([1, 4, 4])
    expected = H.tiled(TileAssignment.iota([1, 8, 2]), ["replicated"])
    assert algebra.reshape_sharding(s, [1, 4, 6], [1, 24]) == expected
    assert algebra.propagate_through_reshape(s, [1, 4, 6], [1, 24]) == expected


def test_reshape_transposing_dims_keeps_the_gcd_tiles():
    """f32[6,4] -> f32[4,6] with rows in 2 tiles: gcd(2, 4) = 2 rows of the target follow (the
    example where the two former algebras disagreed; XLA gives [2,1])."""
    s = iota([2, 1])
    assert algebra.reshape_sharding(s, [6, 4], [4, 6]) == iota([2, 1])
    assert algebra.propagate_through_reshape(s, [6, 4], [4, 6]) == iota([2, 1])
    # XLA's own example in ReshapeSharding: 6 rows in 6 tiles -> gcd(6, 4) = 2, 3 replicated
    assert algebra.reshape_sharding(iota([6, 1]), [6, 4], [4, 6]) == partial([2, 1, 3])


def test_propagate_through_reshape_moves_only_tile_counts():
    """A sharded size-1 dim: XLA's PropagateShardingThroughReshape reshapes the tile counts of the
    run and keeps the devices of T in their order, so the size-1 dim's tiles become the major part
    of the replication groups rather than being folded as partially_replicate_on_dims would."""
    s = iota([2, 2])
    assert algebra.propagate_through_reshape(s, [1, 4], [4]) == partial([2, 2])
    assert algebra.reshape_sharding(s, [1, 4], [4]) == partial([2, 2], [0, 2, 1, 3])


# ---- merging and sub-tiling on mesh-derived shardings --------------------------------------------

def mesh_sharding(mesh: np.ndarray, dim_axes: list[list[int]]) -> HloSharding:
    """The sharding that cuts data dim k along mesh axes `dim_axes[k]` (major to minor) and
    replicates over the unused axes (docs/design/sharding-algebra.md, meshes)."""
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
    return c, algebra.replicate_all_except(c, [first]), \
        algebra.replicate_all_except(c, [d for d in range(rank) if d != first])



@settings(max_examples=150, deadline=None)
@given(partial_pairs())
def test_merge_of_mesh_shardings_matches_greedy(pair):
    """Shardings cut from one mesh are the cases the transpose/reshape fast path handles."""
    _, a, b = pair
    assume(a.is_tiled and b.is_tiled and b.has_partial_replication)
    n = b.tile_assignment.num_devices
    expected = greedy_merge(a, b, n) if all(
        x == y or 1 in (x, y) for x, y in zip(a.tile_counts, b.tile_counts)) else None
    out = algebra.merge_if_compatible(a, b, 0)
    if expected is None:
        assert out is None
    else:
        assert out == H.tiled(TileAssignment.from_array(expected),
                              ["replicated"] if expected.ndim > a.data_rank else [])


@settings(max_examples=100, deadline=None)
@given(split_shardings())
def test_merging_the_halves_of_a_sharding_gives_it_back(case):
    c, a, b = case
    assume(b.is_tiled and b.has_partial_replication and a.is_tiled)
    assert algebra.merge_if_compatible(a, b, 0) == c


@settings(max_examples=150, deadline=None)
@given(partial_pairs(), st.sampled_from([36, 72, 12]))
def test_subtiling_of_mesh_shardings_matches_holdings(pair, size):
    rank, a, b = pair
    n = a.tile_assignment.num_devices if a.is_tiled else b.total_num_tiles
    shape = (size,) * rank
    ha, hb = holdings(a, shape, n), holdings(b, shape, n)
    for (sub, hs), (sup, hp) in (((a, ha), (b, hb)), ((b, hb), (a, ha))):
        truth = all(not (hs[d][1] & ~hp[d][1]).any() for d in range(n))
        assert algebra.is_subtiling_or_equal(sub, sup, shape) == truth, (sub, sup)


# ---- device arrays and collective steps ------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(shardings(types=["replicated"]), st.data())
def test_device_array_round_trip(s, data):
    n = s.tile_assignment.num_devices
    array = algebra.device_array(s, s.data_rank, n)
    assert array.shape == s.tile_counts + (1, s.subgroup_size("replicated"))
    shuffled = np.take_along_axis(array, np.argsort(np.random.default_rng(
        data.draw(st.integers(0, 99))).random(array.shape), axis=-1), axis=-1)
    assert algebra.sharding_of_devices(shuffled) == s      # replica order does not matter


@settings(max_examples=60, deadline=None)
@given(shardings(rank=2, types=[]), st.data())
def test_gather_tiles_gives_each_member_the_union_of_its_group(s, data):
    n = s.tile_assignment.num_devices
    dim = data.draw(st.integers(0, 1))
    factor = data.draw(st.sampled_from([f for f in (1, 2, 3) if s.tile_counts[dim] % f == 0]))
    after, groups = algebra.gather_tiles(s, dim, factor, 2, n)
    shape = tuple(c * 6 for c in s.tile_counts)
    before, gathered = holdings(s, shape, n), holdings(after, shape, n)
    for group in groups:
        union = np.any([before[d][1] for d in group], axis=0)
        for d in group:
            assert np.array_equal(gathered[d][1], union)


@settings(max_examples=60, deadline=None)
@given(shardings(rank=2, types=[]), st.data())
def test_move_tiles_keeps_every_group_holding_the_same_elements(s, data):
    n = s.tile_assignment.num_devices
    factor = data.draw(st.sampled_from([f for f in (1, 2, 3) if s.tile_counts[0] % f == 0]))
    after, groups = algebra.move_tiles(s, 0, 1, factor, 2, n)
    assert after.tile_counts_for_rank(2) == (s.tile_counts[0] // factor, s.tile_counts[1] * factor)
    shape = tuple(c * 6 for c in after.tile_counts_for_rank(2))
    before, moved = holdings(s, shape, n), holdings(after, shape, n)
    for group in groups:
        held = [np.any([h[d][1] for d in group], axis=0) for h in (before, moved)]
        assert np.array_equal(held[0], held[1])


def test_partial_steps():
    # 2 row tiles, each the sum of 2 partial values: devices (0,1) and (2,3) sum
    s = H.tiled(TileAssignment.iota([2, 1, 2]), ["unreduced"])
    assert algebra.partial_groups(s, 2, 4).tolist() == [[0, 1], [2, 3]]
    assert algebra.all_reduce_partials(s, 2, 4) == partial([2, 1, 2])
    # reduce-scattered into dim 1: member j of a group gets column block j
    assert algebra.reduce_scatter_partials(s, 1, np.array([[0, 1], [2, 3]]), 2, 4) == iota([2, 2])
    assert algebra.reduce_scatter_partials(s, 1, np.array([[1, 0], [2, 3]]), 2, 4) == \
        explicit([2, 2], [1, 0, 2, 3])
    assert algebra.unreduce_on_dims(iota([2, 2]), [1]) == H.tiled(TileAssignment.iota([2, 1, 2]),
                                                                   ["unreduced"])


def test_split_replication_nests_new_tiles_in_old_ones():
    s = partial([2, 1, 4])
    out = algebra.split_replication(s, [1, 2], 2, 8)
    assert out.tile_counts == (2, 2) and out.subgroup_size("replicated") == 2
    shape = (4, 4)
    before, after = holdings(s, shape, 8), holdings(out, shape, 8)
    for d in range(8):
        assert not (after[d][1] & ~before[d][1]).any()


def test_the_compiler_has_one_cache():
    """`sharding_algebra.cached` is the compiler's one memo of derived values (`clear_caches`
    empties every table): no module of `ir/` or `passes/` keeps a functools cache of its own."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    functools_cache = re.compile(r"\blru_cache\b|\bfunctools\.cache\b|@cache\b")
    own = [f"{p.relative_to(root)}:{n}" for folder in ("ir", "passes")
           for p in sorted((root / folder).rglob("*.py"))
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if functools_cache.search(line)]
    assert own == []


def test_reshape_between_equal_shapes_scans_like_xla():
    """Equal source and target dims are scanned too (XLA's ReshapeSharding has no shortcut): the
    untiled size-1 dim 0 merges away, so the size-1 dim 1's 2 tiles land on target dim 0; without
    a tiled size-1 dim the scan maps every dim to itself."""
    assert algebra.reshape_sharding(iota([1, 2, 4]), [1, 1, 4], [1, 1, 4]) == iota([2, 1, 4])
    assert algebra.propagate_through_reshape(iota([1, 2, 4]), [1, 1, 4], [1, 1, 4]) == \
        iota([2, 1, 4])
    assert algebra.reshape_sharding(iota([1, 2]), [1, 4], [1, 4]) == iota([1, 2])


def test_dims_removed_inserted_or_gathered_are_worked_out_once_per_question(monkeypatch):
    """`remove_dims` and `insert_dims` (asked for every broadcast and reduce of each layer of a
    model, by propagation and by the partitioner), `gather_tiles` and `coarsen_tiles` (asked by
    several variants of a reshard plan, and by plans of other shapes) are memoized by the
    algebra's cache: asked again, they reshape no tile assignment; each answer keeps the
    metadata of the sharding asked about."""
    from gspmdc.ir.attributes import KeyValueList
    reshapes = []
    original = TileAssignment.reshape
    monkeypatch.setattr(TileAssignment, "reshape",
                        lambda self, dims: reshapes.append(dims) or original(self, dims))
    algebra.clear_caches()
    s = iota([2, 1, 4])
    tagged = s.with_metadata((KeyValueList((("op_name", "a"),)),))
    assert algebra.remove_dims(s, [1]) == iota([2, 4])
    assert algebra.insert_dims(iota([2, 4]), [1]) == s
    gathered, groups = algebra.gather_tiles(s, 2, 2, 3, 8)
    coarse = algebra.coarsen_tiles(s, [2, 1, 2], 3, 8)
    # tile a = the major half of dim 2's index: devices 4 i0 + 2 a + b for every i0, b
    assert coarse == iota([1, 1, 2, 4], [2, 2, 2], [1, 0, 2], ("replicated",))
    first = len(reshapes)
    assert algebra.remove_dims(s, [1]) == iota([2, 4])
    assert algebra.insert_dims(iota([2, 4]), (1,)) == s
    again, same_groups = algebra.gather_tiles(s, 2, 2, 3, 8)
    assert again == gathered and np.array_equal(same_groups, groups)
    assert algebra.coarsen_tiles(s, (2, 1, 2), 3, 8) == coarse
    assert len(reshapes) == first
    assert algebra.remove_dims(tagged, [1]).metadata == tagged.metadata
    assert algebra.remove_dims(s, [1]).metadata == ()
