"""select-and-scatter partitioned along its windowed dims (op_rules_window.py): per tiled
windowed dim, either every shard runs the windows overlapping its data (operand and source
halos in, XLA's way) or the windows of its own source elements (operand halos in, scattered
contributions back to their owners: halo.return_halo), whichever sends fewer bytes; compared
with the unpartitioned program with garbage padding."""
from __future__ import annotations

import pytest

from gspmdc import api
from gspmdc.passes.spmd.halo import plan_halo
from gspmdc.passes.spmd.op_rules_window import _overlapping_dims, _overlapping_windows
from gspmdc.passes.spmd.tiling import Tiling

from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes
from test_spmd_window_ops import halo_only, module, tiled

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

# (operand rows, window spec on dim 0, source rows)
SCATTER_WINDOWS = [
    (16, "size=3x1 stride=2x1 pad=1_1x0_0", 8),      # overlapping windows, padding
    (10, "size=3x1 stride=1x1 pad=1_1x0_0", 10),     # uneven, stride 1
    (10, "size=3x1 stride=2x1 pad=1_1x0_0", 5),      # uneven source too
    (20, "size=5x1 pad=2_2x0_0", 20),                # two elements each side
    (9, "size=3x1 stride=2x1", 4),
]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("rows,window,out", SCATTER_WINDOWS)
def test_select_and_scatter_exchanges_halos(n, rows, window, out):
    """Max-pool gradient: operand (and source) halos in, scattered contributions kept where
    they belong or sent back by the reverse permutes; padding (-inf) never selected, windows
    that do not exist (uneven source, ranges past the edges) scatter nothing."""
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},32] parameter(0), sharding={s}
  g = f32[{out},32] parameter(1), sharding={s}
  z = f32[] constant(0.5)
  ROOT r = f32[{rows},32] select-and-scatter(x, g, z), window={{{window}}}, select=ge,
    scatter=add, sharding={s}"""), n, rtol=1e-4, atol=1e-4)
    halo_only(spmd, required=False)


def test_select_and_scatter_without_halos_masks_the_padding_of_an_uneven_source():
    """Window 1 with stride 3 on a dim of 2 tiled in two: each shard's window input is its own
    element (no halo), but the source dim (1 element) is uneven: the second shard's source
    element is padding and must scatter nothing (it scattered the first shard's value again;
    found by fuzzing)."""
    check_equivalent(module("""
  x = f32[5,2,5] parameter(0), sharding={devices=[1,2,1,3]<=[6] last_tile_dim_replicate}
  g = f32[2,1,4] parameter(1), sharding={replicated}
  z = f32[] constant(0)
  ROOT r = f32[5,2,5] select-and-scatter(x, g, z), window={size=3x1x2 stride=2x3x1},
    select=ge, scatter=add, sharding={devices=[3,1,2]<=[2,3]T(1,0)}"""), 6)


# ---- overlapping windows: XLA's partitioning, chosen per dim on bytes -------------------------

#: fuzz/10100000603's select-and-scatter, tiled alike everywhere: on dim 1 (8 tiled 4, shards of
#: 2) window j covers [2j - 2, 2j), so shard i's data is window i + 1's alone, but the source
#: (5 windows tiled 4, shards of 2) holds windows 2i, 2i + 1
SOURCE_HALO = module("""
  x = f32[2,8] parameter(0), sharding={devices=[2,4]<=[8]}
  g = f32[2,5] parameter(1), sharding={devices=[2,4]<=[8]}
  z = f32[] constant(0)
  ROOT r = f32[2,8] select-and-scatter(x, g, z), window={size=1x2 stride=3x2 pad=2_1x2_1},
    select=ge, scatter=add, sharding={devices=[2,4]<=[8]}""")

#: fuzz/10600002995's first select-and-scatter: dim 0 (6 tiled 2) runs its own windows, dim 1
#: (4 tiled 2, window 4 stride 2 pad 2_0) the overlapping ones
MIXED = module("""
  x = f32[6,4,2] parameter(0), sharding={devices=[2,2,1]<=[4]}
  g = f32[5,2,1] parameter(1), sharding={devices=[2,2,1]<=[4]}
  z = f32[] constant(0)
  ROOT r = f32[6,4,2] select-and-scatter(x, g, z), window={size=2x4x2 stride=1x2x1 pad=0_0x2_0x0_0},
    select=ge, scatter=add, sharding={devices=[2,2,1]<=[4]}""")


def _root(text: str):
    return api.parse(text, "<test>").entry.root


def test_overlapping_windows_move_only_the_source_elements_they_lack():
    """SOURCE_HALO: shard i of dim 1 runs window i + 1 on its own data (no operand halo); the
    windows 3 and 4 that shards 2 and 3 run lie on shards 1 and 2 of the source (its second /
    first element): one f32 each, from devices 1, 5 to 2, 6 and 2, 6 to 3, 7: 4 sends of 4 B,
    2 B per device on average (the own windows sent 10; XLA permutes whole source shards: 6)."""
    spmd = check_equivalent(SOURCE_HALO, 8)
    assert collectives(spmd) == [("collective-permute", [(2, 3), (6, 7)]),
                                 ("collective-permute", [(1, 2), (5, 6)])]
    assert sent_bytes(spmd, 8) == 2


def test_window_ranges_of_overlapping_shards_by_hand():
    """MIXED, per dim tiled in two: the first window reaching into shard i's data and the most
    windows any shard runs, and what the operand and source halos then cover."""
    r = _root(MIXED)
    window = r.attr("window").dims
    data, source = _overlapping_windows(6, 5, window[0], 2)   # window 2 stride 1: [0,3), [3,6)
    assert (data.firsts, data.per_shard) == ((0, 2), 4)          # windows 0-3 and 2-5
    plan = plan_halo(data)
    assert plan.start.tolist() == [0, 2] and plan.window_input == 5
    assert (plan.from_left, plan.from_right) == (1, 2)            # rows 2 / 3-4 of the other
    plan = plan_halo(source)                                      # source shards [0,3), [3,5)
    assert plan.left.tolist() == [0, 1] and plan.right.tolist() == [1, 0]
    data, source = _overlapping_windows(4, 2, window[1], 2)   # window 4 stride 2 pad 2: [0,2), [2,4)
    assert (data.firsts, data.per_shard) == ((0, 1), 2)          # windows 0-1 and 1-2
    plan = plan_halo(data)
    assert plan.start.tolist() == [-2, 0] and plan.window_input == 6
    assert plan.left.tolist() == [2, 2] and plan.right.tolist() == [2, 2] and plan.mask
    # the busiest partition's operand halos + source halos + returned halos, per choice of
    # overlapping dims: both 112 + 20 + 0, dim 0 112 + 4 + 48, dim 1 80 + 12 + 16, none
    # 80 + 0 + 80
    assert _overlapping_dims(r, Tiling(r.sharding, 3, 4)) == {1}


def test_mixed_dims_bytes_by_hand():
    """MIXED on 4 devices: dim 0's own-window halo (a row of the f32[3,2,2] shard, 16 B from
    the 2 devices of shard 1: 8 per device on average) and its return (8); then dim 1's
    overlapping halos on the widened f32[4,2,2] shard (two columns each way: 64 B from 2
    devices each way, 64) and the source's one element column (f32[3,1,1], 12 B from 2: 6):
    86 B (XLA's program: 106)."""
    spmd = check_equivalent(MIXED, 4)
    assert sent_bytes(spmd, 4) == 86
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"] * 5


@needs_xla
@pytest.mark.parametrize("text,n", [(SOURCE_HALO, 8), (MIXED, 4)], ids=["source-halo", "mixed"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device (2 against 6, 86
    against 106) and computes the reference's values (XLA's program for MIXED does not: 4 of
    its 48 elements differ)."""
    compared_with_xla(text, n)
