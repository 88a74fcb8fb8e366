"""Manual regions: code partitioned by hand runs per device unchanged; the region boundaries
(SPMDFullToShardShape / SPMDShardToFullShape) hand shards in and out of it.

Fully manual programs are checked device by device against the unpartitioned program run on
that device's own inputs; programs with boundaries against numpy on the global arrays."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.errors import ShardingError, UnsupportedError
from gspmdc.ir.sharding import HloSharding
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.propagation import propagate
from gspmdc.runtime.backends.local import run_local

from spmd_partition_helpers import partition, run_global
from hlo_text import reducer

MANUAL_LOOP_AND_BRANCH = """
HloModule manual

cond {
  p = (s32[], f32[4,5]) parameter(0), sharding={{manual}, {manual}}
  i = s32[] get-tuple-element(p), index=0, sharding={manual}
  n = s32[] constant(3), sharding={manual}
  ROOT lt = pred[] compare(i, n), direction=LT, sharding={manual}
}

body {
  p = (s32[], f32[4,5]) parameter(0), sharding={{manual}, {manual}}
  i = s32[] get-tuple-element(p), index=0, sharding={manual}
  x = f32[4,5] get-tuple-element(p), index=1, sharding={manual}
  one = s32[] constant(1), sharding={manual}
  i1 = s32[] add(i, one), sharding={manual}
  y = f32[4,5] sine(x), sharding={manual}
  ROOT t = (s32[], f32[4,5]) tuple(i1, y), sharding={{manual}, {manual}}
}

Negate {
  x = f32[4,5] parameter(0), sharding={manual}
  ROOT negate = f32[4,5] negate(x), sharding={manual}
}

Identity {
  y = f32[4,5] parameter(0), sharding={manual}
  ROOT copy = f32[4,5] copy(y), sharding={manual}
}

ENTRY entry {
  flag = pred[] parameter(0), sharding={manual}
  start = s32[] parameter(1), sharding={manual}
  a = f32[4,5] parameter(2), sharding={manual}
  b = f32[4,5] parameter(3), sharding={manual}
  c = f32[4,5] conditional(flag, a, b), true_computation=Negate,
    false_computation=Identity, sharding={manual}
  t = (s32[], f32[4,5]) tuple(start, c), sharding={{manual}, {manual}}
  ROOT loop = (s32[], f32[4,5]) while(t), condition=cond, body=body,
    sharding={{manual}, {manual}}
}
"""


def test_fully_manual_control_flow_runs_per_device():
    # every device takes its own branch and its own trip count: per-device data throughout
    n = 2
    spmd = partition(MANUAL_LOOP_AND_BRANCH, n)
    assert not any(i.opcode in ("all-reduce", "all-gather", "collective-permute")
                   for _, i in spmd.all_instructions())
    rng = np.random.default_rng(0)
    per_device = [[np.array(d == 0), np.array(d, dtype=np.int32),
                   rng.standard_normal((4, 5)).astype(np.float32),
                   rng.standard_normal((4, 5)).astype(np.float32)] for d in range(n)]
    results = run_local(spmd, per_device, n, timeout=60)
    original = api.parse(MANUAL_LOOP_AND_BRANCH)
    for d in range(n):
        want = api.evaluate(original, per_device[d])
        assert int(results[d][0]) == 3
        np.testing.assert_allclose(results[d][1], want[1], rtol=1e-6)
    # device 0 negated its input and looped 3 times, device 1 copied and looped twice
    np.testing.assert_allclose(results[0][1], np.sin(np.sin(np.sin(-per_device[0][2]))),
                               rtol=1e-5)
    np.testing.assert_allclose(results[1][1], np.sin(np.sin(per_device[1][3])), rtol=1e-5)


BOUNDARIES = """
HloModule boundaries

""" + reducer("sum", "add") + """
ENTRY entry {
  p = f32[8,2] parameter(0), sharding={devices=[2,1]0,1}
  to_shard = f32[4,2] custom-call(p), custom_call_target="SPMDFullToShardShape",
    sharding={manual}
  id = u32[] partition-id(), sharding={manual}
  idf = f32[] convert(id), sharding={manual}
  idb = f32[4,2] broadcast(idf), dimensions={}, sharding={manual}
  both = f32[4,2] all-reduce(to_shard), to_apply=sum, replica_groups={{0,1}},
    use_global_device_ids=true, channel_id=1, sharding={manual}
  mine = f32[4,2] add(both, idb), sharding={manual}
  to_full = f32[8,2] custom-call(mine), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,1]0,1}
  ROOT mul = f32[8,2] multiply(to_full, p), sharding={devices=[2,1]0,1}
}
"""


@pytest.mark.parametrize("enter, leave", [
    ("SPMDFullToShardShape", "SPMDShardToFullShape"),
    ("xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape"),
])
def test_manual_region_between_boundaries_uses_global_partition_ids(enter, leave):
    text = BOUNDARIES.replace("SPMDFullToShardShape", enter).replace("SPMDShardToFullShape", leave)
    spmd = partition(text, 2)
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    got = run_global(spmd, [x], 2)
    halves = x[:4] + x[4:]                       # the user's all-reduce over both devices
    want = np.concatenate([halves + 0, halves + 1]) * x
    np.testing.assert_array_equal(got, want)
    opcodes = [i.opcode for i in spmd.entry.instructions]
    assert "custom-call" not in opcodes and opcodes.count("all-reduce") == 1


def test_nested_manual_boundaries_keep_every_device_on_its_data():
    text = """
HloModule nested
ENTRY entry {
  p.0 = s32[16,16,16] parameter(0), sharding={devices=[2,2,2]<=[8]}
  m.0 = s32[8,8,8] custom-call(p.0), custom_call_target="SPMDFullToShardShape",
    sharding={manual}
  m.1 = s32[16,8,8] custom-call(m.0), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,1,1,4]<=[8] last_tile_dims={manual}}
  m.2 = s32[16,16,8] custom-call(m.1), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,2,1,2]<=[8] last_tile_dims={manual}}
  ROOT out.0 = s32[16,16,16] custom-call(m.2), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,2,2]<=[8]}
}
"""
    spmd = partition(text, 8)
    x = np.arange(16 ** 3, dtype=np.int32).reshape(16, 16, 16)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)
    assert all(i.opcode in ("parameter", "copy") for i in spmd.entry.instructions)


PARTIAL = """
HloModule partial

ENTRY entry {
  p = f32[8,4] parameter(0), sharding={devices=[2,2]<=[4]}
  x = f32[8,2] custom-call(p), custom_call_target="SPMDFullToShardShape",
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  sq = f32[8,2] multiply(x, x), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  rows = f32[8,2] iota(), iota_dimension=0, sharding={replicated}
  one = f32[] constant(1), sharding={replicated}
  ones = f32[8,2] broadcast(one), dimensions={},
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  shifted = f32[8,2] add(sq, rows), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  y = f32[8,2] add(shifted, ones), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  ROOT out = f32[8,4] custom-call(y), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,2]<=[4]}
}
"""


def test_partially_manual_region_is_partitioned_inside_each_manual_group():
    # columns are manual (two groups), rows are tiled inside each group: the replicated iota
    # is sliced to each device's rows, the region itself needs no communication
    spmd = partition(PARTIAL, 4)
    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 7
    rows = np.repeat(np.arange(8, dtype=np.float32)[:, None], 4, axis=1)
    np.testing.assert_allclose(run_global(spmd, [x], 4), x * x + rows + 1, rtol=1e-6)
    assert not any(i.opcode in ("all-reduce", "all-gather", "collective-permute", "all-to-all")
                   for i in spmd.entry.instructions)
    local = {i.name: i.shape.dims for i in spmd.entry.instructions}
    assert local["sq"] == (4, 2) and local["out"] == (4, 2)


def test_collective_inside_partially_manual_region_is_rejected():
    text = """
HloModule illegal
""" + reducer("sum", "add") + """
ENTRY entry {
  param = f32[2,2] parameter(0), sharding={devices=[2,1,2]0,2,1,3 last_tile_dims={manual}}
  ROOT all-reduce = f32[2,2]{1,0} all-reduce(param), to_apply=sum,
    replica_groups={{1,0},{2,3}}, use_global_device_ids=true, channel_id=1,
    sharding={devices=[2,1,2]0,2,1,3 last_tile_dims={manual}}
}
"""
    with pytest.raises(UnsupportedError, match="partially manual"):
        partition(text, 4)


def test_collective_over_manual_groups_runs_inside_partially_manual_region():
    # rows are tiled by the free axis, columns manual: the all-reduce joins the two devices of
    # each row tile (a shard_map's psum over its manual axis) and runs as written
    text = """
HloModule psum_in_partial
""" + reducer("sum", "add") + """
ENTRY entry {
  p = f32[8,4] parameter(0), sharding={devices=[2,2]<=[4]}
  x = f32[8,2] custom-call(p), custom_call_target="SPMDFullToShardShape",
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  s = f32[8,2] all-reduce(x), to_apply=sum, replica_groups={{0,1},{2,3}},
    use_global_device_ids=true, channel_id=1,
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  ROOT out = f32[8,4] custom-call(s), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,2]<=[4]}
}
"""
    spmd = partition(text, 4)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    halves = x[:, :2] + x[:, 2:]
    np.testing.assert_allclose(run_global(spmd, [x], 4), np.concatenate([halves, halves], 1))
    # the same groups across row tiles are not the shard_map's: rejected
    with pytest.raises(UnsupportedError, match="partially manual"):
        partition(text.replace("{{0,1},{2,3}}", "{{0,2},{1,3}}"), 4)


PARTIAL_TRANSPOSE = """
HloModule partial_transpose

ENTRY entry {
  p = f32[8,8] parameter(0), sharding={devices=[2,2]<=[4]}
  x = f32[8,4] custom-call(p), custom_call_target="SPMDFullToShardShape",
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  t = f32[4,8] transpose(x), dimensions={1,0},
    sharding={devices=[1,2,2]<=[4] last_tile_dims={manual}}
  r = f32[4,8] custom-call(t), custom_call_target="Sharding",
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  n = f32[4,8] negate(r), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  i = s32[4,8] iota(), iota_dimension=1,
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  f = f32[4,8] convert(i), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  y = f32[4,8] add(n, f), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  ROOT out = f32[4,16] custom-call(y), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,2]<=[4]}
}
"""


def test_partially_manual_region_reshards_inside_each_manual_group():
    """Columns are manual (two groups), rows tiled by the free axis inside each group. The
    transpose runs on each group's whole value, the annotation reshards inside the group (an
    all-to-all of the group's two devices, never across groups), the iota counts the group's
    own columns; the result is each group's block, side by side."""
    spmd = partition(PARTIAL_TRANSPOSE, 4)
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    columns = np.tile(np.arange(8, dtype=np.float32), (4, 1))
    want = np.concatenate([-x[:, :4].T + columns, -x[:, 4:].T + columns], axis=1)
    np.testing.assert_allclose(run_global(spmd, [x], 4), want)
    collectives = [i for i in spmd.entry.instructions if "replica_groups" in i.attrs]
    assert collectives
    for inst in collectives:
        assert {tuple(sorted(g)) for g in inst.attrs["replica_groups"].groups} <= \
            {(0, 2), (1, 3)}, inst.name


UNEVEN_ENTRY = """
HloModule uneven_entry
""" + reducer("add") + """
ENTRY e {
  p = f32[5,2] parameter(0), sharding={devices=[2,1]0,1}
  m = f32[3,2] custom-call(p), custom_call_target="SPMDFullToShardShape", sharding={manual}
  z = f32[] constant(0), sharding={manual}
  s = f32[2] reduce(m, z), dimensions={0}, to_apply=add, sharding={manual}
  r = f32[1,2] reshape(s), sharding={manual}
  ROOT o = f32[2,2] custom-call(r), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,1]0,1}
}
"""


def test_uneven_padding_enters_a_manual_region_as_zeros():
    """`p`'s 5 rows in 2 tiles of 3: the second tile's third row is padding (garbage in these
    runs). The region reads its tile as data, so that row enters as zeros, as in XLA's
    partitioner: each device sums its real rows (rows 0-2, then rows 3-4)."""
    x = np.arange(10, dtype=np.float32).reshape(5, 2) + 1
    got = run_global(partition(UNEVEN_ENTRY, 2), [x], 2)
    np.testing.assert_array_equal(got, np.stack([x[:3].sum(0), x[3:].sum(0)]))


def test_boundary_whose_shard_shape_disagrees_is_rejected():
    text = BOUNDARIES.replace("p = f32[8,2] parameter(0), sharding={devices=[2,1]0,1}",
                              "p = f32[8,2] parameter(0), sharding={replicated}")
    with pytest.raises(ShardingError, match="per-device shapes must agree"):
        partition(text, 2)


def test_resharding_a_manual_value_is_rejected():
    text = """
HloModule bad
ENTRY entry {
  p = f32[8,2] parameter(0), sharding={devices=[2,1]0,1}
  m = f32[4,2] custom-call(p), custom_call_target="SPMDFullToShardShape", sharding={manual}
  ROOT r = f32[4,2] negate(m), sharding={replicated}
}
"""
    with pytest.raises(UnsupportedError):
        partition(text, 2)


def test_manual_constant_feeding_an_ordinary_op_is_taken_as_replicated():
    # XLA's CSE can leave one {manual} constant shared by a manual region and a tiled op: a
    # constant is the same on every device, so the tiled op takes it as its replicated value
    text = """
HloModule shared_constant
ENTRY entry {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  lo = f32[] constant(-1)
  c = f32[] constant(0.5), sharding={manual}
  b = f32[8] broadcast(c), dimensions={}, sharding={devices=[4]<=[4]}
  m = f32[] multiply(c, c), sharding={manual}
  r = f32[8] rng(lo, c), distribution=rng_uniform, sharding={devices=[4]<=[4]}
  ROOT a = f32[8] add(p, b), sharding={devices=[4]<=[4]}
}
"""
    spmd = partition(text, 4)
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x + 0.5)
    assert not any(i.opcode in ("all-gather", "all-reduce") for i in spmd.entry.instructions)


def test_shard_map_form_with_sharding_annotations_inside_the_region():
    # JAX's shard_map: Sharding annotations around the boundaries, {manual} inside
    text = """
HloModule shard_map

""" + reducer("sum", "add") + """
ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  s0 = f32[8,4] custom-call(x), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}
  m0 = f32[2,4] custom-call(s0), custom_call_target="SPMDFullToShardShape", sharding={manual}
  y = f32[2,4] multiply(m0, m0), sharding={manual}
  r = f32[2,4] all-reduce(y), to_apply=sum, replica_groups={{0,1,2,3}}, channel_id=1,
    use_global_device_ids=true, sharding={manual}
  s1 = f32[2,4] custom-call(r), custom_call_target="Sharding", sharding={manual}
  ROOT out = f32[8,4] custom-call(s1), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[4,1]<=[4]}
}
"""
    spmd = partition(text, 4)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    squares = (x.reshape(4, 2, 4) ** 2).sum(axis=0)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), np.tile(squares, (4, 1)))
    assert [i.opcode for i in spmd.entry.instructions] == \
        ["parameter", "copy", "multiply", "all-reduce", "copy", "copy"]


def test_outfeed_token_read_by_a_tuple_takes_the_token_part_of_the_annotation():
    # an outfeed's sharding describes what it sends, then (last) its token (XLA's
    # GetOutputSharding): a tuple holding the token reads the last element, and the partitioner
    # checks the annotation against the data operand and the token, not the token alone
    text = """
HloModule outfeeds

ENTRY e {
  q = f32[2] parameter(1), sharding={replicated}
  p = f32[4] parameter(0), sharding={manual}
  data = (f32[4]) tuple(p)
  c = u32[3] constant({5, 7, 9})
  first = (u32[3]) tuple(c)
  t0 = token[] after-all()
  out0 = token[] outfeed(first, t0), outfeed_shape=(u32[3]), sharding={{manual}, {manual}}
  out1 = token[] outfeed(data, out0), outfeed_shape=(f32[4]), sharding={{manual}, {manual}}
  ROOT r = (f32[2], token[]) tuple(q, out1), sharding={{replicated}, {manual}}
}
"""
    module = api.parse(text)
    propagate(module, propagate_to_output=True, propagate_to_parameters=True)
    assert module.entry.root.sharding == HloSharding.tuple(
        [HloSharding.replicate(), HloSharding.manual()])
    assert module.entry.instruction("c").sharding == HloSharding.manual()
    spmd = compile_spmd(module, 2, propagate=False, verify_each=True)
    outfeeds = [i for i in spmd.entry.instructions if i.opcode == "outfeed"]
    assert [i.sharding for i in outfeeds] == [HloSharding.tuple([HloSharding.manual()] * 2)] * 2
