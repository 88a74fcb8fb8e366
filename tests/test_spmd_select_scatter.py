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
from conformance.differential import program_bytes
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


def _bytes(spmd, n: int) -> tuple[int, float]:
    """The busiest device's bytes and the mean per device (the oracle's measure)."""
    sent = program_bytes(api.to_text(spmd), n)
    return sent.busiest, sent.mean


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
    """MIXED, per dim tiled in two: the first window reaching into shard i's data (XLA's
    `(I*i + pad_low - W + stride) // stride`, negative before the first shard's data) and the
    most windows any shard runs, and what the operand and source halos then cover."""
    r = _root(MIXED)
    window = r.attr("window").dims
    data, source = _overlapping_windows(6, 5, window[0], 2)   # window 2 stride 1: [0,3), [3,6)
    assert (data.firsts, data.per_shard) == ((-1, 2), 4)         # windows -1-2 and 2-5
    plan = plan_halo(data)
    assert plan.start.tolist() == [-1, 2] and plan.window_input == 5
    assert (plan.from_left, plan.from_right) == (1, 1)            # rows 2 / 3 of the other
    plan = plan_halo(source)                                      # source shards [0,3), [3,5)
    assert plan.left.tolist() == [1, 1] and plan.right.tolist() == [0, 0]
    assert (plan.from_left, plan.from_right) == (1, 0)            # window 2 to shard 1
    data, source = _overlapping_windows(4, 2, window[1], 2)   # window 4 stride 2 pad 2: [0,2), [2,4)
    assert (data.firsts, data.per_shard) == ((0, 1), 2)          # windows 0-1 and 1-2
    plan = plan_halo(data)
    assert plan.start.tolist() == [-2, 0] and plan.window_input == 6
    assert plan.left.tolist() == [2, 2] and plan.right.tolist() == [2, 2] and plan.mask
    # each partition's operand halos + source halos + returned halos, per choice of
    # overlapping dims (priced on one partition: halos in and back leave from different
    # ones): both 116 at most, dim 0 100, dim 1 92, none 80 from every partition
    assert _overlapping_dims(r, Tiling(r.sharding, 3, 4)) == set()


def test_mixed_dims_bytes_by_hand():
    """MIXED on 4 devices, every dim running its own windows: dim 0's halo (row 3, a f32[1,2,2]
    row of the shard: 16 B from the devices of shard 1 to those of shard 0), then dim 1's (the
    window of shard 1 reads columns 0-3: two columns of the widened f32[4,2,2] shard, 64 B from
    shard 0's devices); the scattered results go back in the reverse order (dim 1: 64 B from
    shard 1's devices, dim 0: 16 B from shard 0's): every partition sends 80 B (XLA's
    program: 106 on average)."""
    spmd = check_equivalent(MIXED, 4)
    assert collectives(spmd) == [("collective-permute", [(2, 0), (3, 1)]),
                                 ("collective-permute", [(0, 1), (2, 3)]),
                                 ("collective-permute", [(1, 0), (3, 2)]),
                                 ("collective-permute", [(0, 2), (1, 3)])]
    assert _bytes(spmd, 4) == (80, 80)


#: fuzz/11600002307's select-and-scatter (on): its operand and result tiled on the windowed
#: dim 0 (window 2, stride 1), the result wanted tiled on dim 1
RESHARDED = module("""
  x = f32[6,2,4,6] parameter(0), sharding={devices=[2,1,1,1]<=[2]}
  c = f32[] constant(-1.5)
  g = f32[5,4,1,4] broadcast(c), dimensions={}
  z = f32[] constant(0)
  s = f32[6,2,4,6] select-and-scatter(x, g, z), window={size=2x1x3x2 stride=1x1x2x2 pad=0_0x2_0x0_0x0_2},
    select=ge, scatter=add, sharding={devices=[2,1,1,1]<=[2]}
  ROOT r = f32[6,2,4,6] negate(s), sharding={devices=[1,2,1,1]<=[2]}""")


def test_own_windows_priced_on_one_partition_by_hand():
    """RESHARDED: each shard runs the windows of its own source rows (shard 0 windows 0-2,
    rows 0-3; shard 1 windows 3-4, rows 3-5): row 3 (a f32[1,2,4,6] row, 192 B) goes from
    device 1 to 0 and the part of shard 0's result on it back from 0 to 1, so each device
    sends 192 B (the halos in and back were priced 384, each one's busiest device added,
    and the operand was gathered: 576 B); then the all-to-all to dim 1 (half of a
    f32[3,2,4,6] shard, 288 B): 480 B from each device. XLA's program sends 544 B from its
    busiest device (its overlapping windows: a row each way and a source row, 256 B)."""
    spmd = check_equivalent(RESHARDED, 2)
    assert [c[:2] for c in collectives(spmd)] == [("collective-permute", [(1, 0)]),
                                                  ("collective-permute", [(0, 1)]),
                                                  ("all-to-all", [[0, 1]])]
    assert _bytes(spmd, 2) == (480, 480)


#: windows reaching before both shards' data: f32[4,8] tiled in two, window 5 stride 1 pad
#: 1_3 (4 windows; the second dim's window 4 stride 4 makes the source rows 2 wide)
BEFORE_DATA = module("""
  x = f32[4,8] parameter(0), sharding={devices=[2,1]<=[2]}
  g = f32[4,2] parameter(1), sharding={devices=[2,1]<=[2]}
  z = f32[] constant(0)
  ROOT r = f32[4,8] select-and-scatter(x, g, z), window={size=5x4 stride=1x4 pad=1_3x0_0},
    select=ge, scatter=add, sharding={devices=[2,1]<=[2]}""")


def test_first_windows_before_the_data_by_hand():
    """BEFORE_DATA: window j covers rows [j - 1, j + 4); XLA's first windows reaching into the
    shards' data are -3 and -1 (not clamped to 0), each shard running 6 (to 3 and 5): shard 0's
    real windows 0-2 read all 4 rows, so do shard 1's 0-3: each receives the other's two rows
    (f32[2,8], 64 B), and shard 0 the source row of window 2 (8 B), shard 1 those of windows
    0-1 (16 B): 80 B from device 0, 72 from device 1. Windows -3..-1 and 4 do not exist and
    scatter nothing. With the first windows clamped to 0, shard 0 ran windows 0-5, which
    made the halos dearer than gathering both operands (80 B from each device)."""
    r = _root(BEFORE_DATA)
    data, source = _overlapping_windows(4, 4, r.attr("window").dims[0], 2)
    assert (data.firsts, data.per_shard) == ((-3, -1), 6)
    spmd = check_equivalent(BEFORE_DATA, 2)
    assert collectives(spmd) == [("collective-permute", [(0, 1)]),
                                 ("collective-permute", [(1, 0)]),
                                 ("collective-permute", [(0, 1)]),
                                 ("collective-permute", [(1, 0)])]
    assert _bytes(spmd, 2) == (80, 76)


#: (operand dims, source dims, window, tiling, devices): windows reaching before the first
#: shard's data run (overlapping windows): strides, padding, uneven dims, two dims tiled
BEFORE_FIRST_SHARD = [
    ("7,8", "5,2", "size=5x4 stride=1x4 pad=2_0x0_0", "[3,1]", 3),      # uneven
    ("9,8", "4,2", "size=3x4 stride=2x4 pad=0_1x0_0", "[3,1]", 3),      # stride, uneven source
    ("9,8", "3,2", "size=5x4 stride=2x4 pad=1_0x0_0", "[4,1]", 4),      # a shard without windows
    ("10,8", "11,2", "size=5x4 stride=1x4 pad=3_2x0_0", "[4,1]", 4),
    ("3,8", "3,2", "size=4x4 stride=1x4 pad=2_1x0_0", "[2,1]", 2),      # padding at both ends
    ("5,6,8", "7,3,2", "size=5x2x4 stride=1x2x4 pad=3_3x1_0x0_0", "[2,2,1]", 4),
    ("9,7,8", "5,2,2", "size=2x5x4 stride=2x2x4 pad=1_1x1_0x0_0", "[2,2,1]", 4),
    ("4,7,8", "3,3,2", "size=5x2x4 stride=1x2x4 pad=2_1x0_0x0_0", "[2,2,1]", 4),
]


@pytest.mark.parametrize("dims,source,window,tiles,n", BEFORE_FIRST_SHARD)
def test_windows_before_the_first_shard_values(dims, source, window, tiles, n):
    """Overlapping windows whose first shard starts before its data (XLA's first window):
    the windows that do not exist scatter nothing, the padding they read is never selected;
    the same values as the unpartitioned program with garbage padding."""
    s = "{devices=" + tiles + f"<=[{n}]}}"
    text = module(f"""
  x = f32[{dims}] parameter(0), sharding={s}
  g = f32[{source}] parameter(1), sharding={s}
  z = f32[] constant(0.5)
  ROOT r = f32[{dims}] select-and-scatter(x, g, z), window={{{window}}}, select=ge,
    scatter=add, sharding={s}""")
    r = _root(text)
    tiling = Tiling(r.sharding, r.shape.rank, n)
    overlapping = _overlapping_dims(r, tiling)
    assert overlapping and any(
        _overlapping_windows(r.shape.dims[d], r.operands[1].shape.dims[d],
                             r.attr("window").dims[d], tiling.counts[d])[0].firsts[0] < 0
        for d in overlapping)
    halo_only(check_equivalent(text, n, rtol=1e-4, atol=1e-4))


@needs_xla
@pytest.mark.parametrize("text,n", [(SOURCE_HALO, 8), (MIXED, 4), (RESHARDED, 2)],
                         ids=["source-halo", "mixed", "resharded"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device (2 against 6, 80
    against 106, 480 against 512) and computes the reference's values (XLA's program for
    MIXED does not: 4 of its 48 elements differ)."""
    compared_with_xla(text, n)
