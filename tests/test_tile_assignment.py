"""TileAssignment: iota/explicit forms, canonical iota detection, transforms, errors."""
import itertools
import pickle
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gspmdc.errors import ShardingError
from gspmdc.ir.sharding_algebra import clear_caches
from gspmdc.ir.tile_assignment import TileAssignment, iota_replica_groups


def numpy_iota(dims, reshape, perm):
    return np.arange(prod(reshape)).reshape(reshape).transpose(perm).reshape(dims)


# ---- reference examples ------------------------------------------------------------------------

def test_reference_iota_examples():
    assert TileAssignment.iota([2, 2]).array.tolist() == [[0, 1], [2, 3]]
    assert TileAssignment.iota([2, 2], [2, 2], [1, 0]).array.tolist() == [[0, 2], [1, 3]]
    t = TileAssignment.iota([4, 4, 1], [4, 2, 2], [1, 0, 2])
    assert t.array.ravel().tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    assert t.to_text() == "[4,4,1]<=[4,2,2]T(1,0,2)"


def test_explicit_array_is_row_major():
    t = TileAssignment.explicit([2, 2], [3, 1, 2, 0])
    assert t.array.tolist() == [[3, 1], [2, 0]]
    assert t.iota_form() is None
    assert t.to_text() == "[2,2]3,1,2,0"


@pytest.mark.parametrize("reshape, perm, canonical", [
    ([3, 4, 5], [1, 2, 0], ((3, 20), (1, 0))),
    ([3, 4, 5], [0, 1, 2], ((60,), (0,))),
    ([1, 4, 1, 3], [3, 1, 0, 2], ((4, 3), (1, 0))),
    ([2, 2, 2], [2, 1, 0], ((2, 2, 2), (2, 1, 0))),
    ([4, 2, 2], [1, 0, 2], ((4, 2, 2), (1, 0, 2))),
])
def test_iota_canonical_parameters(reshape, perm, canonical):
    t = TileAssignment.iota([prod(reshape)], reshape, perm)
    assert t.iota_form() == canonical
    assert np.array_equal(t.array, numpy_iota([prod(reshape)], reshape, perm))


def test_explicit_detects_iota_and_prints_it():
    arr = numpy_iota([4, 4, 1], [4, 2, 2], [1, 0, 2])
    t = TileAssignment.explicit([4, 4, 1], arr.ravel().tolist())
    assert t.to_text() == "[4,4,1]<=[4,2,2]T(1,0,2)"
    assert t == TileAssignment.iota([4, 4, 1], [4, 2, 2], [1, 0, 2])
    assert hash(t) == hash(TileAssignment.iota([4, 4, 1], [4, 2, 2], [1, 0, 2]))
    assert TileAssignment.explicit([2, 2], [0, 1, 2, 3]).to_text() == "[2,2]<=[4]"


def test_equality_includes_dims():
    assert TileAssignment.iota([2, 2]) != TileAssignment.iota([4])
    assert TileAssignment.iota([2, 2]) != TileAssignment.iota([2, 2], [2, 2], [1, 0])
    assert TileAssignment.explicit([2, 2], [3, 1, 2, 0]) == TileAssignment.explicit([2, 2], [3, 1, 2, 0])
    assert TileAssignment.explicit([2, 2], [3, 1, 2, 0]) != TileAssignment.explicit([2, 2], [3, 1, 0, 2])


def test_non_range_ids_allowed_explicitly():
    t = TileAssignment.explicit([2], [4, 6])
    assert t.iota_form() is None and t.max_device == 6
    assert t.coordinates()[[4, 5, 6]].tolist() == [[0], [-1], [1]]


def test_array_is_read_only_and_object_immutable():
    t = TileAssignment.iota([2, 2])
    with pytest.raises(ValueError):
        t.array[0, 0] = 5
    with pytest.raises(AttributeError):
        t.dims = (4,)
    with pytest.raises(ValueError):
        t.coordinates()[0, 0] = 1


def test_pickle_round_trip():
    for t in (TileAssignment.iota([2, 4], [4, 2], [1, 0]), TileAssignment.explicit([2, 2], [3, 1, 2, 0])):
        assert pickle.loads(pickle.dumps(t)) == t


@pytest.mark.parametrize("make, fragment", [
    (lambda: TileAssignment.iota([2, 2], [8]), "reshape dims [8] have 8"),
    (lambda: TileAssignment.iota([4], [2, 2], [0, 0]), "perm [0, 0]"),
    (lambda: TileAssignment.iota([4], [2, 2], [0]), "perm [0]"),
    (lambda: TileAssignment.iota([0, 2]), "[0, 2]"),
    (lambda: TileAssignment.explicit([2, 2], [0, 1, 2]), "need 4 devices, got 3"),
    (lambda: TileAssignment.explicit([2, 2], [0, 1, 1, 3]), "duplicate device ids [1]"),
    (lambda: TileAssignment.explicit([2], [0, -1]), "negative device id -1"),
    (lambda: TileAssignment.explicit([1], [0]), "more than one device, got [0]"),
    (lambda: TileAssignment.iota([2, 2]).transpose([0, 2]), "perm [0, 2]"),
    (lambda: TileAssignment.iota([2, 2]).reshape([3]), "to [3]"),
])
def test_errors_name_values(make, fragment):
    with pytest.raises(ShardingError) as info:
        make()
    assert fragment in str(info.value)


# ---- exhaustive detection on small permutations ------------------------------------------------

def all_iota_arrays(n):
    """Every array arange(n).reshape(r).transpose(p).ravel() over ordered factorisations r > 1."""
    def factorisations(m):
        if m == 1:
            yield ()
            return
        for f in range(2, m + 1):
            if m % f == 0:
                for rest in factorisations(m // f):
                    yield (f,) + rest
    seen = set()
    for r in factorisations(n):
        for p in itertools.permutations(range(len(r))):
            seen.add(tuple(numpy_iota([n], r, p).tolist()))
    return seen


@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_detection_is_exact_on_all_permutations(n):
    iotas = all_iota_arrays(n)
    forms = {}
    for perm in itertools.permutations(range(n)):
        t = TileAssignment.explicit([n], perm)
        form = t.iota_form()
        assert (form is not None) == (perm in iotas), perm
        if form is not None:
            assert np.array_equal(numpy_iota([n], *form), perm)
            assert form not in forms, (form, perm, forms.get(form))
            forms[form] = perm


@pytest.mark.parametrize("n", [12, 16, 24, 30])
def test_every_iota_is_detected_with_unique_canonical_form(n):
    forms = set()
    for arr in all_iota_arrays(n):
        t = TileAssignment.explicit([n], arr)
        assert t.iota_form() is not None
        assert t == TileAssignment.iota([n], *t.iota_form())
        forms.add(t.iota_form())
    assert len(forms) == len(all_iota_arrays(n))


def test_replica_groups_iota():
    assert iota_replica_groups(np.array([[0, 1, 2, 3], [4, 5, 6, 7]])) == ((8,), (0,))
    groups = np.array([[0, 2, 4, 6], [1, 3, 5, 7]])
    assert iota_replica_groups(groups) == ((4, 2), (1, 0))
    assert np.array_equal(numpy_iota([2, 4], (4, 2), (1, 0)), groups)
    assert iota_replica_groups(np.array([[0, 4], [1, 5], [2, 6], [3, 7]])) == ((2, 4), (1, 0))
    assert iota_replica_groups(np.array([[0, 3], [1, 2]])) is None
    assert iota_replica_groups(np.array([[0, 1], [1, 2]])) is None


# ---- property tests against numpy --------------------------------------------------------------

@st.composite
def iota_cases(draw):
    reshape = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4))
    perm = draw(st.permutations(range(len(reshape))))
    n = prod(reshape)
    # dims: a random factorisation of n into up to 4 dims
    dims, rest = [], n
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    dims.append(rest)
    dims = draw(st.permutations(dims))
    return list(dims), reshape, list(perm)


@settings(max_examples=150, deadline=None)
@given(iota_cases(), st.data())
def test_iota_transforms_match_numpy(case, data):
    dims, reshape, perm = case
    expected = numpy_iota(dims, reshape, perm)
    t = TileAssignment.iota(dims, reshape, perm)
    assert np.array_equal(t.array, expected)
    if t.num_devices > 1:
        e = TileAssignment.explicit(dims, expected.ravel())
        assert e == t and hash(e) == hash(t) and e.iota_form() == t.iota_form()
    tperm = data.draw(st.permutations(range(len(dims))))
    transposed = t.transpose(tperm)
    assert np.array_equal(transposed.array, expected.transpose(tperm))
    assert transposed == TileAssignment.from_array(expected.transpose(tperm))
    new_dims = [t.num_devices]
    assert np.array_equal(t.reshape(new_dims).array, expected.reshape(new_dims))
    sorted_last = t.sort_last_dim()
    assert np.array_equal(sorted_last.array, np.sort(expected, axis=-1))
    coords = t.coordinates()
    assert all(expected[tuple(coords[d])] == d for d in range(t.num_devices))


@settings(max_examples=100, deadline=None)
@given(st.permutations(range(12)), st.sampled_from([[12], [3, 4], [2, 3, 2], [2, 2, 3]]),
       st.data())
def test_explicit_transforms_match_numpy(ids, dims, data):
    expected = np.asarray(ids).reshape(dims)
    t = TileAssignment.explicit(dims, ids)
    assert np.array_equal(t.array, expected)
    tperm = data.draw(st.permutations(range(len(dims))))
    assert np.array_equal(t.transpose(tperm).array, expected.transpose(tperm))
    assert np.array_equal(t.sort_last_dim().array, np.sort(expected, axis=-1))


def test_aligned_iota_transpose_stays_iota_at_scale():
    clear_caches()      # equal iota assignments are one interned object: start with none built
    t = TileAssignment.iota([64, 64], [64, 64], [1, 0])
    u = t.transpose([1, 0])
    assert u._array is None and u.iota_form() == ((4096,), (0,))
    assert t.reshape([4096])._array is None
    assert t == TileAssignment.iota([64, 64], [64, 64], [1, 0]) and t._array is None


def test_a_huge_device_id_is_checked_without_an_array_of_its_size():
    # found by fuzzing: duplicate detection counted ids in an array as long as the largest id
    # (`devices=[4]4294967296,1,2,3` asked for 32 GiB)
    t = TileAssignment.explicit([4], [2 ** 40, 1, 2, 3])
    assert t.max_device == 2 ** 40
    with pytest.raises(ShardingError, match=r"duplicate device ids \[1099511627776\]"):
        TileAssignment.explicit([3], [2 ** 40, 1, 2 ** 40])


def test_transforms_answered_from_the_interned_table_still_check_their_arguments():
    """`reshape` and `transpose` of an iota assignment answer a question asked before from the
    interned table without checking it again: a bad question is never in the table, so it
    still fails as it did, however often good ones were asked."""
    t = TileAssignment.iota([2, 4], [4, 2], [1, 0])
    for _ in range(2):
        assert t.reshape([8]) == TileAssignment.from_array(t.array.reshape(8))
        assert np.array_equal(t.transpose([1, 0]).array, t.array.T)
    with pytest.raises(ShardingError, match="cannot reshape"):
        t.reshape([3, 3])
    with pytest.raises(ShardingError, match="cannot reshape"):
        t.reshape([16])
    with pytest.raises(ShardingError, match="not a permutation"):
        t.transpose([1, 1])
    with pytest.raises(ShardingError, match="not a permutation"):
        t.transpose([0, 1, 2])
