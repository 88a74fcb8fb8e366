"""`reduce` inside a partially manual region: partitioned inside every manual group like an
ordinary reduce (local reduce, partial results combined over the group's devices holding the
other tiles of the reduced dim), never gathering the group's whole operands.

The regions below sit between shard_map boundaries on 4 devices: columns are split by the free
axis (tile `d // 2`) and the manual axis (group `d % 2`), so group m holds global column blocks
m and m + 2 (4 columns each). Values are checked against numpy on the global arrays, bytes
against hand-computed figures."""
from __future__ import annotations

import numpy as np

from gspmdc.passes.spmd.traffic import sent_per_device

from hlo_text import reducer
from spmd_partition_helpers import partition, run_global

MANUAL = "{devices=[1,2,2]<=[4] last_tile_dims={manual}}"
RESULT = "{devices=[1,2,2]<=[4] last_tile_dims={replicated, manual}}"
SCALAR = "{devices=[2,2]<=[4] last_tile_dims={replicated, manual}}"
#: a group's [4] result as a [4,1] column, column m of the global [4,2] output
OUT = "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}"

SUM = """
HloModule manual_sum
""" + reducer("sum", "add") + f"""
ENTRY entry {{
  p = f32[4,16] parameter(0), sharding={{devices=[1,4]<=[4]}}
  x = f32[4,8] custom-call(p), custom_call_target="SPMDFullToShardShape", sharding={MANUAL}
  zero = f32[] constant(0), sharding={SCALAR}
  r = f32[4] reduce(x, zero), dimensions={{1}}, to_apply=sum, sharding={RESULT}
  c = f32[4,1] reshape(r), sharding={RESULT.replace("[1,2,2]", "[1,1,2,2]")}
  ROOT out = f32[4,2] custom-call(c), custom_call_target="SPMDShardToFullShape",
    sharding={OUT}
}}
"""

ARGMAX = """
HloModule manual_argmax

argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  v = f32[] select(gt, a, b)
  k = s32[] select(gt, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}
""" + f"""
ENTRY entry {{
  p = f32[4,16] parameter(0), sharding={{devices=[1,4]<=[4]}}
  x = f32[4,8] custom-call(p), custom_call_target="SPMDFullToShardShape", sharding={MANUAL}
  i = s32[4,8] iota(), iota_dimension=1, sharding={MANUAL}
  low = f32[] constant(-inf), sharding={SCALAR}
  none = s32[] constant(-1), sharding={SCALAR}
  r = (f32[4], s32[4]) reduce(x, i, low, none), dimensions={{1}}, to_apply=argmax,
    sharding={{{RESULT}, {RESULT}}}
  k = s32[4] get-tuple-element(r), index=1, sharding={RESULT}
  c = s32[4,1] reshape(k), sharding={RESULT.replace("[1,2,2]", "[1,1,2,2]")}
  ROOT out = s32[4,2] custom-call(c), custom_call_target="SPMDShardToFullShape",
    sharding={OUT}
}}
"""


def _group_columns(x: np.ndarray, m: int) -> np.ndarray:
    """Manual group m's [4,8] value: global column blocks m and m + 2."""
    return np.concatenate([x[:, 4 * m:4 * m + 4], x[:, 8 + 4 * m:12 + 4 * m]], axis=1)


def _collectives(spmd):
    return [i for i in spmd.entry.instructions if "replica_groups" in i.attrs]


def test_sum_inside_partially_manual_region_all_reduces_partial_sums_in_each_group():
    spmd = partition(SUM, 4)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    want = np.stack([_group_columns(x, m).sum(axis=1) for m in (0, 1)], axis=1)
    np.testing.assert_allclose(run_global(spmd, [x], 4), want, rtol=1e-5)
    # one all-reduce of the local f32[4] partial sums over the two devices of each group
    collectives = _collectives(spmd)
    assert [i.opcode for i in collectives] == ["all-reduce"]
    assert {tuple(sorted(g)) for g in collectives[0].attrs["replica_groups"].groups} == \
        {(0, 2), (1, 3)}
    # a ring all-reduce of 16 B over 2 devices: each sends its half twice, 16 B
    assert list(sent_per_device(spmd, 4)) == [16] * 4


def test_argmax_inside_partially_manual_region_gathers_partial_results_in_each_group():
    spmd = partition(ARGMAX, 4)
    x = np.random.default_rng(1).permutation(64).reshape(4, 16).astype(np.float32)
    want = np.stack([_group_columns(x, m).argmax(axis=1) for m in (0, 1)], axis=1)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), want.astype(np.int32))
    collectives = _collectives(spmd)
    assert [i.opcode for i in collectives] == ["all-gather", "all-gather"]
    for inst in collectives:
        assert {tuple(sorted(g)) for g in inst.attrs["replica_groups"].groups} == \
            {(0, 2), (1, 3)}
    # each device sends its partial f32[4] values and s32[4] indices to the other: 32 B
    assert list(sent_per_device(spmd, 4)) == [32] * 4


def test_reduce_over_an_untiled_dim_of_a_partially_manual_value_is_local():
    # rows reduced, columns kept in their tiling: no communication at all
    text = SUM.replace("dimensions={1}", "dimensions={0}").replace(
        "r = f32[4] reduce", "r = f32[8] reduce").replace(
        f"sharding={RESULT}\n  c = f32[4,1]", "sharding={devices=[2,2]<=[4] "
        "last_tile_dims={manual}}\n  c = f32[8,1]")
    text = text.split("  c = f32[8,1]")[0] + "  ROOT s = f32[8] copy(r), " \
        "sharding={devices=[2,2]<=[4] last_tile_dims={manual}}\n}\n"
    spmd = partition(text, 4)
    assert not _collectives(spmd)
    assert spmd.entry.root.shape.dims == (4,)
