"""`dot` inside a partially manual region: partitioned inside every manual group like an
ordinary dot (operands kept in their tiling where that is a local dot), never gathering the
group's whole operands.

The region sits between shard_map boundaries on 4 devices: rows are split by the free axis
(tile `d // 2`), columns by the manual axis (group `d % 2` holds global columns
`[8m, 8m + 8)`). Values are checked against numpy on the global arrays."""
from __future__ import annotations

import numpy as np

from gspmdc.ir.parser import parse_sharding
from gspmdc.passes.spmd.manual_dot import within_groups
from gspmdc.passes.spmd.traffic import sent_per_device

from spmd_partition_helpers import partition, run_global

MANUAL = "{devices=[2,1,2]<=[4] last_tile_dims={manual}}"

ROWS = f"""
HloModule manual_dot

ENTRY entry {{
  x = f32[8,16] parameter(0), sharding={{devices=[2,2]<=[4]}}
  w = f32[8,4] parameter(1), sharding={{replicated}}
  xm = f32[8,8] custom-call(x), custom_call_target="SPMDFullToShardShape", sharding={MANUAL}
  y = f32[8,4] dot(xm, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}},
    sharding={MANUAL}
  ROOT out = f32[8,8] custom-call(y), custom_call_target="SPMDShardToFullShape",
    sharding={{devices=[2,2]<=[4]}}
}}
"""


def test_dot_of_row_tiles_inside_partially_manual_region_is_local():
    spmd = partition(ROWS, 4)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    want = np.concatenate([x[:, :8] @ w, x[:, 8:] @ w], axis=1)
    np.testing.assert_allclose(run_global(spmd, [x, w], 4), want, rtol=1e-5, atol=1e-5)
    # each device multiplies its own rows by the whole weight: nothing moves (the group's
    # whole operands sent each device's f32[4,8] rows, 128 B)
    assert list(sent_per_device(spmd, 4)) == [0] * 4
    local = {i.name: i.shape.dims for i in spmd.entry.instructions}
    assert local["y"] == (4, 4)


def test_dot_result_tiled_like_its_rows_inside_groups_keeps_the_output_tiling():
    # the annotation tiles the result's columns inside each group instead: the result is
    # resharded inside the groups, never across them
    text = ROWS.replace("""y = f32[8,4] dot(xm, w), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}""",
                        """y = f32[8,4] dot(xm, w), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[1,2,2]<=[4] last_tile_dims={manual}}""")
    text = text.replace("""ROOT out = f32[8,8] custom-call(y), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,2]<=[4]}""", """ROOT out = f32[8,8] custom-call(y), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[1,4]<=[4]}""")
    spmd = partition(text, 4)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    y0, y1 = x[:, :8] @ w, x[:, 8:] @ w
    # device d holds global column block d: its group's (d % 2) column tile d // 2
    want = np.concatenate([y0[:, :2], y1[:, :2], y0[:, 2:], y1[:, 2:]], axis=1)
    np.testing.assert_allclose(run_global(spmd, [x, w], 4), want, rtol=1e-5, atol=1e-5)
    for inst in spmd.entry.instructions:
        if "replica_groups" in inst.attrs:
            assert {tuple(sorted(g)) for g in inst.attrs["replica_groups"].groups} <= \
                {(0, 2), (1, 3)}, inst.name


def test_only_tilings_every_group_holds_alike_are_written_back():
    groups = [frozenset({0, 2}), frozenset({1, 3})]
    # rows on the free axis, replicas one per group: the group's tiling
    rows = within_groups(parse_sharding("{devices=[2,1,2]<=[4] last_tile_dim_replicate}"), 2,
                         groups, 4)
    assert rows == parse_sharding("{devices=[2,1,2]<=[4] last_tile_dims={manual}}")
    # rows on the manual axis: a tile held by one group only
    assert within_groups(parse_sharding("{devices=[2,1,2]<=[2,2]T(1,0) "
                                        "last_tile_dim_replicate}"), 2, groups, 4) is None
    # replicated: every group's whole value
    assert within_groups(parse_sharding("{replicated}"), 2, groups, 4) == parse_sharding(
        "{devices=[1,1,2,2]<=[2,2]T(1,0) last_tile_dims={manual, replicated}}")


BATCH = """
HloModule manual_batch_dot

ENTRY entry {
  x = f32[4,16,16] parameter(0), sharding={devices=[2,1,2]<=[4]}
  w = f32[4,8,32] parameter(1), sharding={replicated}
  xm = f32[4,16,8] custom-call(x), custom_call_target="SPMDFullToShardShape",
    sharding={devices=[2,1,1,2]<=[4] last_tile_dims={manual}}
  y = f32[4,16,32] dot(xm, w), lhs_batch_dims={0}, rhs_batch_dims={0},
    lhs_contracting_dims={2}, rhs_contracting_dims={1},
    sharding={devices=[2,1,1,2]<=[4] last_tile_dims={manual}}
  ROOT out = f32[4,16,64] custom-call(y), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,1,2]<=[4]}
}
"""


def test_batched_dot_inside_partially_manual_region_slices_the_whole_weight_locally():
    """Batch dim tiled by the free axis: each device takes its batch block of the replicated
    weight (a local slice) and multiplies its own block; nothing moves, where gathering the
    group's batch blocks first sent each device's f32[2,16,8], 1,024 B."""
    spmd = partition(BATCH, 4)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16, 16)).astype(np.float32)
    w = rng.standard_normal((4, 8, 32)).astype(np.float32)
    want = np.concatenate([np.einsum("bij,bjk->bik", x[:, :, 8 * m:8 * m + 8], w)
                           for m in (0, 1)], axis=2)
    np.testing.assert_allclose(run_global(spmd, [x, w], 4), want, rtol=1e-4, atol=1e-4)
    assert list(sent_per_device(spmd, 4)) == [0] * 4
