"""HloSharding: constructors, canonical forms, text, equality, predicates, tables, validation."""
import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gspmdc.errors import ShardingError
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.sharding import HloSharding, ShardGroup, TileAssignment
from gspmdc.ir.shapes import ArrayShape, TupleShape

H = HloSharding


def iota(dims, reshape=None, perm=None, types=()):
    return H.tiled(TileAssignment.iota(dims, reshape, perm), types)


def explicit(dims, ids, types=()):
    return H.tiled(TileAssignment.explicit(dims, ids), types)


def f32(*dims):
    return ArrayShape("f32", tuple(dims))


# ---- text ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sharding, text", [
    (H.replicate(), "{replicated}"),
    (H.manual(), "{manual}"),
    (H.unknown(), "{unknown}"),
    (H.unreduced(), "{unreduced}"),
    (H.maximal(3), "{maximal device=3}"),
    (explicit([2, 1], [0, 1]), "{devices=[2,1]<=[2]}"),
    (explicit([2, 2], [3, 1, 2, 0]), "{devices=[2,2]3,1,2,0}"),
    (iota([2, 2], [2, 2], [1, 0]), "{devices=[2,2]<=[2,2]T(1,0)}"),
    (iota([4, 4, 1], [4, 2, 2], [1, 0, 2]), "{devices=[4,4,1]<=[4,2,2]T(1,0,2)}"),
    (iota([2, 1, 2], types=["replicated"]), "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"),
    (explicit([1, 2, 2], [0, 2, 1, 3], ["replicated"]),
     "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}"),
    (iota([2, 1, 2], types=["manual"]), "{devices=[2,1,2]<=[4] last_tile_dims={manual}}"),
    (iota([2, 2, 2], types=["manual", "replicated"]),
     "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}"),
    (H.tiled(TileAssignment.iota([4]), shard_group=ShardGroup("as", 0)), "{devices=[4]<=[4] shard_as 0}"),
    (H.replicate(shard_group=ShardGroup("like", 1)), "{replicated shard_like 1}"),
    (H.tuple([explicit([2, 1], [0, 1]), H.maximal(0), H.replicate()]),
     "{{devices=[2,1]<=[2]}, {maximal device=0}, {replicated}}"),
    (H.tuple([]), "{}"),
])
def test_text(sharding, text):
    assert sharding.to_text() == text
    assert repr(sharding) == f"HloSharding({text})"


def test_metadata_text_and_equality_ignores_it():
    a = KeyValueList((("op_name", "a"),))
    b = KeyValueList((("op_type", "Add"), ("op_name", 'x"y'), ("source_line", 3)))
    single = explicit([2, 1], [0, 1]).with_metadata([a])
    assert single.to_text() == '{devices=[2,1]<=[2] metadata={op_name="a"}}'
    several = H.replicate([a, b])
    assert several.to_text() == \
        '{replicated metadata={{op_name="a"}, {op_type="Add" op_name="x\\"y" source_line=3}}}'
    assert several == H.replicate() and hash(several) == hash(H.replicate())
    assert several.to_text(include_metadata=False) == "{replicated}"
    assert H.tuple([H.replicate()], metadata=[a]).elements[0].metadata == (a,)


def test_shard_group_takes_part_in_equality():
    assert H.replicate(shard_group=ShardGroup("as", 0)) != H.replicate()
    assert H.replicate(shard_group=ShardGroup("as", 0)) != H.replicate(shard_group=ShardGroup("like", 0))
    assert H.replicate(shard_group=ShardGroup("as", 0)) == H.replicate(shard_group=ShardGroup("as", 0))


# ---- canonical forms (docs/design/sharding-algebra.md) -------------------------------------------

def test_partial_tile_canonicalisation():
    assert iota([4], types=["replicated"]) == H.replicate()
    assert iota([1, 1, 4], types=["replicated"]) == H.replicate()
    assert iota([2, 2, 1], types=["replicated"]) == iota([2, 2])
    sorted_groups = explicit([2, 2], [3, 2, 1, 0], ["replicated"])
    assert sorted_groups.tile_assignment.array.tolist() == [[2, 3], [0, 1]]
    assert sorted_groups.to_text() == "{devices=[2,2]2,3,0,1 last_tile_dim_replicate}"
    assert explicit([2, 2], [3, 2, 1, 0], ["replicated"]) == explicit([2, 2], [2, 3, 0, 1], ["replicated"])


def test_subgroup_canonicalisation():
    # single type, no data tiling: collapse
    assert iota([1, 4], types=["manual"]) == H.manual()
    assert iota([1, 2, 2], types=["manual", "manual"]) == H.manual()
    assert iota([1, 4], types=["unreduced"]) == H.unreduced()
    # size-1 subgroup dims dropped
    assert iota([2, 1, 2], types=["replicated", "manual"]) == iota([2, 2], types=["manual"])
    assert iota([2, 2, 1], types=["manual", "replicated"]) == iota([2, 2], types=["manual"])
    # no types left
    assert iota([4, 1], types=["manual"]) == iota([4])
    # merge same-typed dims: [2, R2, M2, R2] -> transpose (0, 2, 1, 3) -> [2, M2, R4]
    merged = iota([2, 2, 2, 2], types=["replicated", "manual", "replicated"])
    expected = np.arange(16).reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(2, 2, 4)
    assert merged.subgroup_types == ("manual", "replicated")
    assert np.array_equal(merged.tile_assignment.array, np.sort(expected, axis=-1))
    # order: manual, unreduced, replicated
    ordered = iota([2, 2, 2], types=["replicated", "manual"])
    assert ordered.subgroup_types == ("manual", "replicated")
    assert np.array_equal(ordered.tile_assignment.array,
                          np.arange(8).reshape(2, 2, 2).transpose(0, 2, 1))
    assert iota([2, 2, 2, 2], types=["replicated", "unreduced", "manual"]).subgroup_types == \
        ("manual", "unreduced", "replicated")


def test_single_device_tiled_becomes_replicated():
    assert H.tiled(TileAssignment.iota([1, 1])) == H.replicate()
    assert H.tiled(TileAssignment.from_array(np.array([[5]]))) == H.replicate()


def test_equal_values_made_from_different_tile_assignments_are_one_object():
    # [2,4] with the 4 as a replicated subgroup, and the same written with size-1 and split
    # subgroup dims; a degenerate tiling is the one `{replicated}` value
    plain = H.tiled(TileAssignment.iota([2, 4]), ["replicated"])
    split = H.tiled(TileAssignment.iota([2, 1, 2, 2]), ["manual", "replicated", "replicated"])
    assert split == plain and split is plain
    assert np.array_equal(split.tile_assignment.array, np.arange(8).reshape(2, 4))
    assert H.tiled(TileAssignment.iota([1, 8]), ["replicated"]) is H.replicate()
    metadata = (KeyValueList((("op_name", "a"),)),)
    with_metadata = H.tiled(TileAssignment.iota([2, 4]), ["replicated"], metadata)
    assert with_metadata == plain and with_metadata is not plain
    assert with_metadata.metadata == metadata


# ---- predicates and counts ----------------------------------------------------------------------

def test_predicates():
    t = iota([2, 1, 2], types=["replicated"])
    assert t.is_tiled and not t.is_tile_maximal and t.replicate_on_last_tile_dim
    assert t.has_partial_replication and not t.has_manual_subgroup
    assert t.data_rank == 2 and t.tile_counts == (2, 1) and t.num_tiles == 2 and t.total_num_tiles == 4
    assert t.subgroup_dim("replicated") == 2 and t.subgroup_dim("manual") == -1
    m = iota([2, 2, 2], types=["manual", "replicated"])
    assert m.has_manual_subgroup and m.data_rank == 1 and m.subgroup_size("manual") == 2
    assert H.replicate().is_replicated and H.replicate().is_tile_maximal and not H.replicate().is_tiled
    assert H.maximal(2).is_maximal and H.maximal(2).is_tile_maximal and H.maximal(2).unique_device == 2
    assert H.manual().is_manual and not H.manual().is_tile_maximal
    assert H.unknown().is_unknown and not H.unknown().is_tile_maximal
    assert H.replicate().num_tiles == 1 and H.replicate().tile_counts_for_rank(3) == (1, 1, 1)
    tup = H.tuple([H.maximal(1), H.maximal(1)])
    assert tup.is_tuple and tup.is_maximal and tup.unique_device == 1 and not tup.is_tiled
    assert H.tuple([H.maximal(1), H.maximal(0)]).unique_device is None
    assert H.tuple([]).is_replicated
    with pytest.raises(ShardingError, match="data_rank needs a tiled sharding"):
        H.replicate().data_rank


# ---- worked examples of shard arithmetic (docs/design/sharding-algebra.md#shard-arithmetic) ----

def tables(sharding, shape, num_devices=None):
    start, limit = sharding.valid_range_table(shape, num_devices)
    return sharding.offset_table(shape, num_devices).tolist(), start.tolist(), limit.tolist()


def test_example_1_even_2x2():
    s, shape = iota([2, 2]), f32(10, 8)
    assert s.shard_shape(shape) == f32(5, 4)
    assert [s.tile_index_for_device(d) for d in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    offsets, start, limit = tables(s, shape)
    assert offsets == [[0, 0], [0, 4], [5, 0], [5, 4]] == start
    assert limit == [[5, 4], [5, 8], [10, 4], [10, 8]]


def test_example_2_uneven_rows():
    s, shape = iota([4, 1]), f32(10, 8)
    assert s.shard_shape(shape) == f32(3, 8)
    offsets, start, limit = tables(s, shape)
    assert [o[0] for o in offsets] == [0, 3, 6, 9]
    assert [(a[0], b[0]) for a, b in zip(start, limit)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert s.valid_extent_table(shape)[:, 0].tolist() == [3, 3, 3, 1]
    assert s.non_padded_shape(shape, 3) == (1, 8)


def test_example_3_empty_shard():
    s, shape = iota([4]), f32(5)
    assert s.shard_shape(shape) == f32(2)
    offsets, start, limit = tables(s, shape)
    assert offsets == [[0], [2], [4], [6]]
    assert list(zip(start, limit)) == [([0], [2]), ([2], [4]), ([4], [5]), ([5], [5])]
    assert s.non_padded_shape(shape, 3) == (0,)


def test_example_4_padding_column():
    s, shape = iota([2, 2]), f32(10, 7)
    assert s.shard_shape(shape) == f32(5, 4)
    assert s.valid_extent_table(shape).tolist() == [[5, 4], [5, 3], [5, 4], [5, 3]]


def test_example_5_partial_replication():
    s, shape = iota([2, 1, 2], types=["replicated"]), f32(10, 8)
    assert s.tile_assignment.array.tolist() == [[[0, 1]], [[2, 3]]]
    assert s.shard_shape(shape) == f32(5, 8)
    _, start, limit = tables(s, shape)
    assert start == [[0, 0], [0, 0], [5, 0], [5, 0]] and limit == [[5, 8], [5, 8], [10, 8], [10, 8]]
    assert s.num_tiles == 2 and s.total_num_tiles == 4
    assert s.replication_groups().tolist() == [[0, 1], [2, 3]]
    assert s.devices_for_tile((1, 0)).tolist() == [2, 3]


def test_example_6_transposed_iota():
    s, shape = iota([2, 2], [2, 2], [1, 0]), f32(10, 8)
    assert s.tile_index_for_device(1) == (1, 0) and s.tile_index_for_device(2) == (0, 1)
    _, start, limit = tables(s, shape)
    assert (start[1], limit[1]) == ([5, 0], [10, 4])


def test_example_7_manual_subgroup():
    s, shape = iota([2, 2], types=["manual"]), f32(8)
    assert s.tile_assignment.array.tolist() == [[0, 1], [2, 3]]
    assert s.shard_shape(shape) == f32(4)
    _, start, limit = tables(s, shape)
    assert [(a[0], b[0]) for a, b in zip(start, limit)] == [(0, 4), (0, 4), (4, 8), (4, 8)]
    # manual group = second coordinate: {0, 2} and {1, 3}
    assert s.partition_groups_for_replication([0]).tolist() == [[0, 2], [1, 3]]


def test_tables_for_non_tiled_need_device_count():
    shape = f32(4, 6)
    assert H.replicate().offset_table(shape, 3).tolist() == [[0, 0]] * 3
    assert H.maximal(1).valid_extent_table(shape, 2).tolist() == [[4, 6]] * 2
    with pytest.raises(ShardingError, match="need num_devices"):
        H.replicate().offset_table(shape)


def test_absent_devices_have_empty_ranges():
    s = explicit([2], [1, 3])
    offsets, start, limit = tables(s, f32(8), 5)
    assert offsets == [[0], [0], [0], [4], [0]]
    assert [b[0] - a[0] for a, b in zip(start, limit)] == [0, 4, 0, 4, 0]
    assert s.non_padded_shape(f32(8), 2) == (0,)
    with pytest.raises(ShardingError, match="device 2 is not in"):
        s.tile_index_for_device(2)


def test_tuple_shard_shape_and_subsharding():
    shape = TupleShape((f32(8, 4), TupleShape((f32(6), ArrayShape("s32", ())))))
    s = H.tuple([iota([2, 1]), iota([4]), H.replicate()])
    assert s.shard_shape(shape) == TupleShape((f32(4, 4), TupleShape((f32(2), ArrayShape("s32", ())))))
    assert s.subsharding(shape, [0]) == iota([2, 1])
    assert s.subsharding(shape, [1]) == H.tuple([iota([4]), H.replicate()])
    assert s.subsharding(shape, [1, 1]) == H.replicate()
    assert H.replicate().shard_shape(shape) == shape
    assert len(H.replicate().leaf_shardings(shape)) == 3


def test_partition_groups_for_replication():
    s = iota([2, 2])
    assert s.partition_groups_for_replication([1]).tolist() == [[0, 1], [2, 3]]
    assert s.partition_groups_for_replication([0]).tolist() == [[0, 2], [1, 3]]
    t = iota([2, 4], [4, 2], [1, 0])
    assert t.tile_assignment.array.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert t.partition_groups_for_replication([1]).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert t.partition_groups_for_replication([0]).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert t.partition_groups_for_replication([0, 1]).tolist() == [[0, 2, 4, 6, 1, 3, 5, 7]]


# ---- validation ---------------------------------------------------------------------------------

def test_validate_accepts_good_shardings():
    iota([2, 1, 2], types=["replicated"]).validate(f32(10, 8), 4)
    H.maximal(3).validate(f32(2), 4)
    H.tuple([iota([2]), H.replicate()]).validate(TupleShape((f32(4), f32(3))), 2)
    iota([2]).validate(TupleShape((f32(4), f32(3))), 2)


@pytest.mark.parametrize("sharding, shape, n, fragment", [
    (iota([2, 2]), f32(8), 4, "data rank 2 but shape f32[8] has rank 1"),
    (iota([2, 2]), f32(8, 8), 8, "covers 4 devices, expected all 8"),
    (explicit([2], [0, 5]), f32(8), 4, "names device 5 but there are 4 devices"),
    (H.maximal(4), f32(8), 4, "names device 4"),
    (H.tuple([iota([2])]), TupleShape((f32(4), f32(4))), 2, "1 elements for shape"),
    (H.tuple([iota([2])]), f32(4), 2, "tuple sharding {{devices=[2]<=[2]}} for non-tuple shape"),
    (iota([2]), ArrayShape("token", ()), 2, "token"),
])
def test_validate_errors(sharding, shape, n, fragment):
    with pytest.raises(ShardingError) as info:
        sharding.validate(shape, n)
    assert fragment in str(info.value)


@pytest.mark.parametrize("make, fragment", [
    (lambda: H.tiled(TileAssignment.iota([2, 2]), ["partial"]), "unknown subgroup types ['partial']"),
    (lambda: H.tiled(TileAssignment.iota([2]), ["manual", "replicated"]), "2 subgroup types"),
    (lambda: H.maximal(-1), "non-negative integer, got -1"),
    (lambda: H("tiled"), "needs tile assignment"),
    (lambda: H("replicated", tile_assignment=TileAssignment.iota([2])), "takes no tile assignment"),
    (lambda: H.tuple([H.tuple([])]), "leaf shardings"),
    (lambda: ShardGroup("with", 1), "'with'"),
    (lambda: H("tiled", tile_assignment=TileAssignment.iota([2, 2]),
               subgroup_types=("replicated", "manual")), "in the order"),
])
def test_construction_errors(make, fragment):
    with pytest.raises(ShardingError) as info:
        make()
    assert fragment in str(info.value)


def test_immutable():
    s = iota([2])
    with pytest.raises(AttributeError):
        s.kind = "replicated"


# ---- brute force: which device holds which element ----------------------------------------------

def owner_map(sharding, shape):
    """For each device, the boolean mask of elements it holds, from the definition: element x
    belongs to the tile with index x // shard_size on every dim; T lists the tile's devices."""
    t = sharding.tile_assignment.array
    rank = len(shape)
    counts = t.shape[:rank]
    shard = [-(-s // c) for s, c in zip(shape, counts)]
    masks = {}
    for tile in itertools.product(*[range(c) for c in counts]):
        mask = np.ones(shape, dtype=bool)
        for d in range(rank):
            idx = np.arange(shape[d]) // shard[d] == tile[d]
            mask &= idx.reshape([-1 if e == d else 1 for e in range(rank)])
        for device in t[tile].ravel():
            masks[int(device)] = mask
    return masks


@st.composite
def tiled_cases(draw):
    rank = draw(st.integers(1, 3))
    counts = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    rep = draw(st.sampled_from([1, 2]))
    dims = counts + [rep]
    n = prod(dims)
    perm = draw(st.permutations(range(n)))
    shape = [draw(st.integers(0, 7)) for _ in range(rank)]
    return dims, list(perm), shape


@settings(max_examples=120, deadline=None)
@given(tiled_cases())
def test_tables_match_owner_map(case):
    dims, ids, shape = case
    ta = TileAssignment.from_array(np.asarray(ids), dims)
    s = H.tiled(ta, ["replicated"])
    if not s.is_tiled:
        return
    masks = owner_map(s, shape)
    arr_shape = f32(*shape)
    start, limit = s.valid_range_table(arr_shape)
    offsets = s.offset_table(arr_shape)
    shard = s.shard_shape(arr_shape).dims
    for device, mask in masks.items():
        region = np.zeros(shape, dtype=bool)
        region[tuple(slice(a, b) for a, b in zip(start[device], limit[device]))] = True
        assert np.array_equal(region, mask)
        # the padded shard starting at the offset covers exactly the owned elements + padding
        padded = np.zeros([a + b for a, b in zip(shape, shard)], dtype=bool)
        padded[tuple(slice(o, o + z) for o, z in zip(offsets[device], shard))] = True
        assert np.array_equal(padded[tuple(slice(0, x) for x in shape)], mask)
        extent = s.non_padded_shape(arr_shape, device)
        assert extent == tuple(int(b - a) for a, b in zip(start[device], limit[device]))
        assert prod(extent) == mask.sum()
    groups = s.replication_groups()
    for row in groups:
        assert all(np.array_equal(masks[int(row[0])], masks[int(d)]) for d in row)
    assert sorted(groups.ravel().tolist()) == sorted(masks)


# ---- text round trip through the parser ---------------------------------------------------------

def test_metadata_value_forms():
    entry = KeyValueList((("op_name", "a\tb\x01"), ("preserve_layout", True), ("source_line", 7)))
    assert H.replicate([entry]).to_text() == \
        '{replicated metadata={op_name="a\\tb\\001" preserve_layout=true source_line=7}}'


@st.composite
def any_sharding(draw):
    kind = draw(st.sampled_from(["replicated", "manual", "unknown", "maximal", "tiled", "tiled"]))
    group = draw(st.sampled_from([None, ShardGroup("as", 0), ShardGroup("like", 3)]))
    metadata = draw(st.sampled_from([(), (KeyValueList((("op_name", 'q"x'),)),),
                                     (KeyValueList((("op_name", "a"),)),
                                      KeyValueList((("op_type", "Dot"), ("source_line", 2))))]))
    if kind == "maximal":
        return H.maximal(draw(st.integers(0, 7)), metadata, group)
    if kind != "tiled":
        return getattr(H, "replicate" if kind == "replicated" else kind)(metadata, group)
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    types = draw(st.lists(st.sampled_from(["manual", "replicated", "unreduced"]),
                          max_size=min(2, len(dims) - 1)))
    if draw(st.booleans()):
        reshape = draw(st.permutations(dims))
        ta = TileAssignment.iota(dims, reshape, draw(st.permutations(range(len(dims)))))
    else:
        ta = TileAssignment.from_array(np.asarray(draw(st.permutations(range(prod(dims))))), dims)
    return H.tiled(ta, types, metadata, group)


@settings(max_examples=150, deadline=None)
@given(any_sharding(), st.integers(0, 2))
def test_text_round_trips_through_parser(s, wrap):
    parser = pytest.importorskip("gspmdc.ir.parser")
    if wrap:
        s = H.tuple([s] * wrap + [H.replicate()])
    parsed = parser.parse_sharding(s.to_text())
    assert parsed == s
    assert parsed.to_text() == s.to_text()
    assert [e.metadata for e in parsed.leaves()] == [e.metadata for e in s.leaves()]
