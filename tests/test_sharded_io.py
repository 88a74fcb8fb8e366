"""Splitting global inputs into shards and assembling global outputs: hand-computed shard layouts
(uneven tiles, explicit device orders, partial replication, maximal, tuples), padding modes,
round trips, the one-partition reader on memory-mapped files, and where global shapes come from."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gspmdc.errors import GspmdcError, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.parser import parse_module, parse_shape, parse_sharding
from gspmdc.ir.sharding import HloSharding
from gspmdc.runtime.npz_members import member_array, member_header, member_names
from gspmdc.runtime.sharded_io import (
    ShardedLeaf, assemble_leaf, assemble_outputs, shard_leaf, source_partitions, split_inputs,
    split_leaf, spmd_signature,
)


def leaf(global_text: str, sharding_text: str) -> ShardedLeaf:
    g = parse_shape(global_text)
    s = parse_sharding(sharding_text)
    return ShardedLeaf(g, s.shard_shape(g), s)


def test_uneven_tiles_are_padded_at_the_end():
    x = np.arange(10, dtype=np.float32)
    lf = leaf("f32[10]", "{devices=[4]<=[4]}")
    shards = split_leaf(x, lf, 4)
    assert [s.tolist() for s in shards] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 0]]
    garbage = split_leaf(x, lf, 4, padding="garbage")
    assert garbage[3][0] == 9 and np.isnan(garbage[3][1:]).all()
    assert not np.isnan(np.concatenate(garbage[:3])).any()
    ints = split_leaf(np.arange(10, dtype=np.int32), leaf("s32[10]", "{devices=[4]<=[4]}"), 4,
                      padding="garbage")
    assert ints[3].tolist() == [9, 2**31 - 1, 2**31 - 1]
    np.testing.assert_array_equal(assemble_leaf(garbage, lf), x)


def test_explicit_device_order_on_two_dims():
    x = np.arange(4 * 6, dtype=np.int32).reshape(4, 6)
    # tile (i, j) is on device T[i, j]: T = [[3, 1], [0, 2]]
    lf = leaf("s32[4,6]", "{devices=[2,2]3,1,0,2}")
    shards = split_leaf(x, lf, 4)
    np.testing.assert_array_equal(shards[3], x[:2, :3])
    np.testing.assert_array_equal(shards[1], x[:2, 3:])
    np.testing.assert_array_equal(shards[0], x[2:, :3])
    np.testing.assert_array_equal(shards[2], x[2:, 3:])
    assert source_partitions(lf, 4).tolist() == [3, 1, 0, 2]
    np.testing.assert_array_equal(assemble_leaf(shards, lf), x)


def test_partial_replication_reads_the_first_device_of_each_group():
    x = np.arange(8, dtype=np.int32).reshape(4, 2)
    lf = leaf("s32[4,2]", "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}")
    shards = split_leaf(x, lf, 4)
    for p, rows in ((0, x[:2]), (2, x[:2]), (1, x[2:]), (3, x[2:])):
        np.testing.assert_array_equal(shards[p], rows)
    assert source_partitions(lf, 4).tolist() == [0, 1]
    pieces = [shards[0], shards[1], None, None]    # only the sources are read
    np.testing.assert_array_equal(assemble_leaf(pieces, lf), x)


def test_replicated_and_maximal():
    x = np.arange(6, dtype=np.float32)
    rep = leaf("f32[6]", "{replicated}")
    assert all(s is x for s in split_leaf(x, rep, 3))
    np.testing.assert_array_equal(assemble_leaf([x, None, None], rep), x)
    mx = leaf("f32[6]", "{maximal device=2}")
    shards = split_leaf(x, mx, 3)
    assert shards[2] is x and not shards[0].any()
    assert np.isnan(split_leaf(x, mx, 3, padding="garbage")[1]).all()
    assert source_partitions(mx, 3).tolist() == [2]
    np.testing.assert_array_equal(assemble_leaf([None, None, x], mx), x)


@pytest.mark.parametrize("text", ["{manual}", "{unknown}", "{devices=[2,2]<=[4] last_tile_dims={manual}}"])
def test_per_device_shardings_cannot_be_split(text):
    lf = leaf("f32[4]", text)
    with pytest.raises(UnsupportedError, match="per-device data"):
        split_leaf(np.zeros(4, np.float32), lf, 4)
    with pytest.raises(UnsupportedError, match="per-device data"):
        assemble_leaf([np.zeros(lf.local_shape.dims, np.float32)] * 4, lf)


def test_unreduced_results_are_the_sum_of_their_parts():
    """`{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}`: row tile 0 is the sum of the parts
    of partitions 0 and 1, row tile 1 of partitions 2 and 3."""
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    lf = leaf("f32[4,2]", "{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}")
    assert source_partitions(lf, 4).tolist() == [0, 1, 2, 3]
    parts = [x[:2] - 1, np.ones((2, 2), np.float32), x[2:] + 5, np.full((2, 2), -5, np.float32)]
    np.testing.assert_array_equal(assemble_leaf(parts, lf), x)
    # unreduced and replicated subgroups: one replica of each unreduced member is read
    lf = leaf("f32[2]", "{devices=[2,2,2]<=[8] last_tile_dims={unreduced, replicated}}")
    assert source_partitions(lf, 8).tolist() == [0, 2, 4, 6]
    pieces = [np.array([1.0], np.float32), None, np.array([2.0], np.float32), None,
              np.array([10.0], np.float32), None, np.array([20.0], np.float32), None]
    np.testing.assert_array_equal(assemble_leaf(pieces, lf), [3.0, 30.0])
    whole = leaf("f32[3]", "{unreduced}")
    assert source_partitions(whole, 3).tolist() == [0, 1, 2]
    np.testing.assert_array_equal(
        assemble_leaf([np.full(3, k, np.float32) for k in (1, 2, 4)], whole), [7, 7, 7])
    with pytest.raises(UnsupportedError, match="per-device data"):     # not as an input
        split_leaf(x, leaf("f32[4,2]", "{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}"), 4)


CASES = [
    ("f32[7,5]", "{devices=[2,3]<=[6]}"),
    ("f32[7,5]", "{devices=[3,1,2]<=[2,3]T(1,0) last_tile_dim_replicate}"),
    ("s32[9,2,4]", "{devices=[1,2,3]5,4,3,2,1,0}"),
    ("pred[5,3]", "{devices=[6,1]<=[6]}"),
    ("bf16[3,8]", "{devices=[1,2,3]<=[3,2]T(1,0) last_tile_dim_replicate}"),
    ("f32[4]", "{maximal device=5}"),
]


@pytest.mark.parametrize("shape, sharding", CASES)
def test_round_trip_and_single_partition_reader_agree(shape, sharding, tmp_path):
    lf = leaf(shape, sharding)
    dtype = dtypes.numpy_dtype(lf.global_shape.element_type)
    x = (np.arange(np.prod(lf.global_shape.dims)) % 7).reshape(lf.global_shape.dims).astype(dtype)
    shards = split_leaf(x, lf, 6, padding="garbage")
    path = tmp_path / "x.npy"
    np.save(path, x)
    mapped = np.load(path, mmap_mode="r").view(dtype)   # bf16 is stored as raw 2-byte voids
    for p in range(6):
        mine = shard_leaf(mapped, lf, p, 6, padding="garbage")
        assert mine.shape == lf.local_shape.dims and mine.dtype == dtype
        np.testing.assert_array_equal(mine, shards[p])
        assert not isinstance(mine, np.memmap)
    np.testing.assert_array_equal(assemble_leaf(shards, lf), x)


SPMD = """HloModule spmd, num_partitions=4{signature}

ENTRY main {{
  a = f32[3,2] parameter(0), sharding={{devices=[4,1]<=[4]}}
  b = s32[5] parameter(1), sharding={{replicated}}
  n = f32[3,2] negate(a)
  ROOT t = (f32[3,2], s32[5]) tuple(n, b), sharding={{{{devices=[4,1]<=[4]}}, {{maximal device=1}}}}
}}
"""


def test_recorded_global_signature_gives_uneven_shapes():
    text = SPMD.format(signature=", spmd_global_signature={(f32[10,2], s32[5])->(f32[10,2], s32[5])}")
    sig = spmd_signature(parse_module(text))
    assert [str(p.global_shape) for p in sig.parameters] == ["f32[10,2]", "s32[5]"]
    assert str(sig.output.global_shape) == "(f32[10,2], s32[5])"
    a = np.arange(20, dtype=np.float32).reshape(10, 2)
    b = np.arange(5, dtype=np.int32)
    per_partition = split_inputs(sig, [a, b])
    assert per_partition[3][0].tolist() == [[18, 19], [0, 0], [0, 0]]
    results = [(-args[0], args[1]) for args in per_partition]
    out = assemble_outputs(sig, results)
    np.testing.assert_array_equal(out[0], -a)
    np.testing.assert_array_equal(out[1], b)


def test_without_a_signature_global_shapes_are_local_times_tiles():
    sig = spmd_signature(parse_module(SPMD.format(signature="")))
    assert str(sig.parameters[0].global_shape) == "f32[12,2]"


def test_a_layout_with_global_shapes_is_used_a_per_partition_one_is_not():
    layout = ", entry_computation_layout={(f32[10,2]{1,0}, s32[5]{0})->(f32[10,2]{1,0}, s32[5]{0})}"
    sig = spmd_signature(parse_module(SPMD.format(signature=layout)))
    assert str(sig.parameters[0].global_shape) == "f32[10,2]"
    per_partition = ", entry_computation_layout={(f32[3,2]{1,0}, s32[5]{0})->(f32[3,2]{1,0}, s32[5]{0})}"
    sig = spmd_signature(parse_module(SPMD.format(signature=per_partition)))
    assert str(sig.parameters[0].global_shape) == "f32[12,2]"


def test_inconsistent_signature_and_missing_root_sharding_are_errors():
    bad = ", spmd_global_signature={(f32[20,2], s32[5])->(f32[10,2], s32[5])}"
    with pytest.raises(GspmdcError, match="does not split into the partitioned shape"):
        spmd_signature(parse_module(SPMD.format(signature=bad)))
    text = SPMD.format(signature="").replace(
        ", sharding={{devices=[4,1]<=[4]}, {maximal device=1}}", "")
    with pytest.raises(GspmdcError, match="has no sharding"):
        spmd_signature(parse_module(text))
    override = HloSharding.tuple([parse_sharding("{devices=[4,1]<=[4]}"),
                                  parse_sharding("{replicated}")])
    sig = spmd_signature(parse_module(text), output_sharding=override)
    assert sig.output.leaves[1].sharding.is_replicated


def test_array_root_accepts_a_one_element_tuple_result():
    text = """HloModule m, num_partitions=2, spmd_global_signature={(f32[3])->(f32[3])}

ENTRY main {
  ROOT a = f32[2] parameter(0), sharding={devices=[2]<=[2]}
}
"""
    sig = spmd_signature(parse_module(text))
    assert str(sig.output.global_shape) == "f32[3]"


def test_npz_members_are_memory_mapped_when_stored(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    c = np.arange(3).astype(ml_dtypes.bfloat16)
    np.savez(tmp_path / "s.npz", a=a, b=b, c=c, s=np.float32(2), e=np.zeros((0, 2)))
    np.savez_compressed(tmp_path / "z.npz", a=a)
    assert sorted(member_names(tmp_path / "s.npz")) == ["a", "b", "c", "e", "s"]
    for name, want in (("a", a), ("b", b)):
        got = member_array(tmp_path / "s.npz", name)
        assert isinstance(got, np.memmap)
        np.testing.assert_array_equal(got, want)
    assert member_array(tmp_path / "s.npz", "c").view(ml_dtypes.bfloat16).tolist() == [0, 1, 2]
    assert member_array(tmp_path / "s.npz", "s") == 2
    assert member_array(tmp_path / "s.npz", "e").shape == (0, 2)
    compressed = member_array(tmp_path / "z.npz", "a")
    assert not isinstance(compressed, np.memmap)
    np.testing.assert_array_equal(compressed, a)
    assert member_header(tmp_path / "z.npz", "a").data_offset is None
    with pytest.raises(GspmdcError, match=r"no array 'x' \(the file has \['a'\]\)"):
        member_array(tmp_path / "z.npz", "x")
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(GspmdcError, match="cannot read as an npz file"):
        member_names(tmp_path / "bad.npz")
