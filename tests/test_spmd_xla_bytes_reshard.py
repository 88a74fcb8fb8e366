"""No more collective bytes than XLA (issue 13) in the reshard planner's choices and the halo
exchanges, class by class as the XLA oracle found them on random modules
(`make conformance-xla`). Bytes are worked
out by hand from the cost model's formulas (`gspmdc.ir.cost`: all-to-all = every block but the
device's own, collective-permute = the buffer when the device sends to another); values against
numpy; with the `[xla]` extra, against XLA's own partitioned program (skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_staged
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from hlo_text import reducer
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, run_global

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def _copy_module(dtype: str, dims: str, source: str, target: str, n: int) -> str:
    return (f"HloModule m, num_partitions={n}\n\nENTRY e {{\n"
            f"  p = {dtype}[{dims}] parameter(0), sharding={source}\n"
            f"  ROOT c = {dtype}[{dims}] copy(p), sharding={target}\n}}\n")


SLICE_FIRST = _copy_module("f64", "7,7,1", "{devices=[1,2,2,2]<=[8] last_tile_dim_replicate}",
                           "{devices=[2,4,1]<=[2,4]T(1,0)}", 8)


def test_replicas_are_sliced_before_the_all_to_all():
    """f64[7,7,1] in [1,2,2] tiles held twice, to [2,4,1]: dim 2's two tiles move to another dim
    in an all-to-all and one dim doubles its tiles from the replicas. Sliced first, the shard is
    [4,4,1] (dim 0 halved): the all-to-all sends half of its 16 elements (64 B), then a permute
    of the [4,2,1] result (64 B): 128 B. Sliced after, the all-to-all moved the [8,4,1] padded
    shard (128 B) before the same permute: 192 B. The exchange of the pieces sends less still
    (the program's): devices 0 and 5 hold their tiles; device 4 lacks rows 0-3 of columns 2-3
    and device 1 rows 0-3 of columns 4-5 (f64[4,2,1], 64 B each), devices 2, 6 and 3 rows 4-6
    of two columns (48 B), device 7 rows 4-6 of column 6 (24 B). Filled largest piece first,
    each round sends pieces of one size: devices 0 and 4 send 64 B, device 1 two pieces of
    48 (96 B), device 5 48 + 24 (72 B): 96 B from the busiest device, 296 B over all, each
    piece at its own size (filled tile by tile, two rounds of [4,2,1] buffers sent 112 / 352;
    the rounds' busiest sums to 184, more, but no device sends in all four)."""
    source = parse_sharding("{devices=[1,2,2,2]<=[8] last_tile_dim_replicate}")
    target = parse_sharding("{devices=[2,4,1]<=[2,4]T(1,0)}")
    plan = plan_staged(ArrayShape("f64", (7, 7, 1)), source, target, 8)
    assert plan.collectives == ["all-to-all", "collective-permute"]
    assert plan.cost == 128
    exchange = plan_reshard(ArrayShape("f64", (7, 7, 1)), source, target, 8)
    assert (exchange.cost, exchange.total) == (96, 296)
    spmd = check_equivalent(SLICE_FIRST, 8)
    assert sent_per_device(spmd, 8).tolist() == [64, 96, 0, 0, 64, 72, 0, 0]
    x = np.arange(49, dtype=np.float64).reshape(7, 7, 1)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


def padded_all_to_all(rows: int = 5) -> str:
    return _copy_module("f32", f"{rows},1,8", "{devices=[1,1,4,2]<=[8] last_tile_dim_replicate}",
                        "{devices=[4,1,2]<=[2,2,2]T(2,1,0)}", 8)


def test_uneven_dims_are_padded_for_the_all_to_all():
    """f32[5,1,8] from [1,1,4] tiles held twice to [4,1,2]: dim 2 gives two of its tiles to
    dim 0, which also takes two from the replicas. Tiles of 5 rows in 2 (3 rows) do not nest
    in tiles in 4 (2 rows), so without padding the plan gathered dim 2 in pairs and sliced
    (each device sends its [5,1,2] shard: 40 B). As XLA does, the plan works on dim 0 padded
    to 8 rows: the replicas slice their half ([4,1,2]) and one all-to-all over pairs sends half
    of it (16 B); the shard is cut back to the target's [2,1,4]. (The exchange of the real
    pieces ties on the busiest device: the staged plan stays.)"""
    plan = plan_staged(ArrayShape("f32", (5, 1, 8)),
                       parse_sharding("{devices=[1,1,4,2]<=[8] last_tile_dim_replicate}"),
                       parse_sharding("{devices=[4,1,2]<=[2,2,2]T(2,1,0)}"), 8)
    assert plan.padded == (8, 1, 8)
    assert plan.collectives == ["all-to-all"]
    assert (plan.cost, plan.total) == (16, 128)
    kept = plan_reshard(ArrayShape("f32", (5, 1, 8)),
                        parse_sharding("{devices=[1,1,4,2]<=[8] last_tile_dim_replicate}"),
                        parse_sharding("{devices=[4,1,2]<=[2,2,2]T(2,1,0)}"), 8)
    assert (kept.collectives, kept.cost, kept.total) == (["all-to-all"], 16, 128)
    spmd = check_equivalent(padded_all_to_all(), 8)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all"]
    x = np.arange(40, dtype=np.float32).reshape(5, 1, 8)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


@pytest.mark.parametrize("rows", [1, 3, 6, 7, 9])
def test_padded_all_to_all_uneven(rows):
    x = np.arange(rows * 8, dtype=np.float32).reshape(rows, 1, 8)
    spmd = check_equivalent(padded_all_to_all(rows), 8)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


HALO_TRIMMED = """HloModule m, num_partitions=8

""" + reducer("add") + """
ENTRY e {
  x = f32[10] parameter(0), sharding={devices=[8]<=[8]}
  z = f32[] constant(0)
  ROOT r = f32[10] reduce-window(x, z), window={size=3 pad=1_1}, to_apply=add,
    sharding={devices=[8]<=[8]}
}
"""


def test_halos_go_only_to_shards_whose_outputs_read_them():
    """f32[10] in 8 shards of 2: shards 5-7 hold only padding and have no real output, and
    shard 4's outputs (8, 9) read nothing right of element 9. One element travels from each
    neighbour: the permute from the left has pairs into shards 1-4 only, the one from the
    right into shards 0-3 (4 senders x 4 B each, 4 B per device on average; to every
    neighbour it was 7 senders each way, 7 B per device)."""
    spmd = check_equivalent(HALO_TRIMMED, 8)
    assert collectives(spmd) == [
        ("collective-permute", [(0, 1), (1, 2), (2, 3), (3, 4)]),
        ("collective-permute", [(1, 0), (2, 1), (3, 2), (4, 3)])]
    x = np.arange(10, dtype=np.float32)
    want = np.convolve(x, np.ones(3, np.float32), mode="same")
    np.testing.assert_array_equal(run_global(spmd, [x], 8), want)


HALO_ONE_WAY = """HloModule m, num_partitions=2

""" + reducer("add") + """
ENTRY e {
  x = f32[4,4] parameter(0), sharding={devices=[1,2]<=[2]}
  z = f32[] constant(0)
  ROOT r = f32[4,1] reduce-window(x, z), window={size=1x4 stride=1x4}, to_apply=add,
    sharding={devices=[1,2]<=[2]}
}
"""


def test_a_halo_only_one_shard_needs_beats_an_equal_gather():
    """The one output column lives on shard 0 and reads all 4 columns: device 1 sends its
    [4,2] shard (32 B) to device 0 and device 0 sends nothing; gathering the operand costs
    each device 32 B too. On equal bytes for the busiest device the plan all devices together
    send fewer bytes with wins: the halo (32 B in all, against 64 B)."""
    spmd = check_equivalent(HALO_ONE_WAY, 2)
    assert collectives(spmd) == [("collective-permute", [(1, 0)])]
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(run_global(spmd, [x], 2)[:, :1], x.sum(axis=1, keepdims=True))


HALO_TWO_DIMS = """HloModule m, num_partitions=4

""" + reducer("add", element_type="u64") + """
ENTRY e {
  p = u64[5,4,4,7] parameter(0), sharding={devices=[2,1,2,1]1,0,2,3}
  z = u64[] constant(0)
  ROOT r = u64[3,2,3,4] reduce-window(p, z), window={size=3x2x4x2 stride=2x3x1x2
    pad=2_0x0_0x1_1x1_1 lhs_dilate=1x2x1x1 rhs_dilate=1x2x1x2}, to_apply=add,
    sharding={devices=[2,1,2,1]1,0,2,3}
}
"""


def test_halo_bytes_count_what_each_device_sends():
    """Halos on dims 0 and 2, two shards each: on dim 0 only ordinal 1 reads a row from the
    left ([1,4,2,7] u64 = 448 B, sent by ordinal 0); on dim 2 (dim 0 widened to its window of
    5) ordinal 1 reads one column from the left (1120 B, sent by ordinal 0) and ordinal 0 two
    columns from the right (2240 B, sent by ordinal 1). The busiest device (ordinal 0 on
    dim 0, ordinal 1 on dim 2) sends 448 + 2240 = 2688 B, less than gathering both dims
    (3584 B); counting every halo on every device (3808 B) chose the gather. On average
    (448 + 1120 + 2240) / 2 = 1904 B per device, as XLA."""
    from gspmdc import api
    from conformance.differential import collective_bytes
    spmd = check_equivalent(HALO_TWO_DIMS, 4)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"] * 3
    assert collective_bytes(api.to_text(spmd), 4) == 1904


SPLIT_ACROSS = _copy_module("f32", "14", "{devices=[2,2]<=[4] last_tile_dim_replicate}",
                            "{devices=[4]<=[4]}", 4)


def test_tiles_that_do_not_nest_take_the_boundary_piece_from_a_neighbour():
    """f32[14] in 2 tiles of 7 (each held twice) to 4 tiles of 4: device 1's tile [4,8) lies
    across the boundary at 7; devices 0, 2 and 3 slice theirs from their own tile, device 1
    slices [4,7) and receives element 7 from device 2 (the first holder of [7,14)): one
    permute of 4 B. Gathering the dim whole (7 elements from the other tile) sent 28 B per
    device."""
    plan = plan_reshard(ArrayShape("f32", (14,)),
                        parse_sharding("{devices=[2,2]<=[4] last_tile_dim_replicate}"),
                        parse_sharding("{devices=[4]<=[4]}"), 4)
    assert plan.cost == 4 and plan.total == 4
    spmd = check_equivalent(SPLIT_ACROSS, 4)
    assert collectives(spmd) == [("collective-permute", [(2, 1)])]
    x = np.arange(14, dtype=np.float32)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)


GATHER_ACROSS = _copy_module("f32", "9", "{devices=[8]<=[8]}",
                             "{devices=[4,2]<=[8] last_tile_dim_replicate}", 8)


def test_tiles_that_do_not_nest_exchange_their_pieces_largest_first():
    """f32[9] in 8 tiles of 2 (devices 5-7 hold padding) to 4 tiles of 3 held twice: devices
    2k and 2k+1 need [3k, 3k+3), from 2 source tiles. Rounds filled tile by tile
    ({0->1, 1->0, 2->3, 3->4, 4->5} of 2 elements, {1->2, 3->5} of 2, {1->3} of 1) had device 1
    send 8 + 8 + 4 = 20 B, all devices 60 B; realigned (XLA's way: element 3 goes 1->2, 5 goes
    2->3, 6 and 7 go 3->4, 8 goes 4->5 in one permute of 2-element buffers, then pairs
    all-gather) 16 B from the busiest device, 96 B in all. Filled with the 2-element pieces
    first and each piece where the busiest device sends least ({0->1, 2->3, 3->4} of 2,
    {1->3, 3->5} of 2, {1->0, 4->5} of 1, {1->2} of 1), devices 1 and 3 send 16 B, all devices
    8 + 16 + 8 + 16 + 4 = 52 B: fewer in all than realigned, as few from the busiest device.
    Gathering the dim whole sent 7 x 8 = 56 B from every device."""
    plan = plan_reshard(ArrayShape("f32", (9,)), parse_sharding("{devices=[8]<=[8]}"),
                        parse_sharding("{devices=[4,2]<=[8] last_tile_dim_replicate}"), 8)
    assert plan.cost == 16 and plan.total == 52
    spmd = check_equivalent(GATHER_ACROSS, 8)
    assert collectives(spmd) == [
        ("collective-permute", [(0, 1), (2, 3), (3, 4)]),
        ("collective-permute", [(1, 3), (3, 5)]),
        ("collective-permute", [(1, 0), (4, 5)]),
        ("collective-permute", [(1, 2)])]
    x = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


REALIGNED = _copy_module("f32", "6,3", "{devices=[8,1]<=[8]}",
                         "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", 8)


def test_uneven_tiles_are_realigned_before_gathering():
    """f32[6,3] in 8 row tiles of 1 (tiles 6, 7 padding) to 2 tiles of 3 rows held 4 times:
    the row tiles do not gather into tiles of 3 (4 of them make 4 rows), and the exchange of
    the pieces would need more than 4 rounds (each target tile takes rows from 3 devices, 4
    devices each). As XLA does (its left halo exchange before the all-gather to a partially
    replicated sharding), the boundary rows move first so that the four tiles of each target
    tile hold its rows in order: row 3 from device 3 to 4, 4 to 5, 5 to 6 (one permute of
    12 B), then an all-gather over fours (3 x 12 B) and a slice of 3 rows: 48 B from the
    busiest device, where gathering all 8 tiles sent 84 B."""
    plan = plan_reshard(ArrayShape("f32", (6, 3)), parse_sharding("{devices=[8,1]<=[8]}"),
                        parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"), 8)
    assert plan.cost == 12 + 36 and plan.total == 3 * 12 + 8 * 36
    spmd = check_equivalent(REALIGNED, 8)
    assert collectives(spmd) == [
        ("collective-permute", [(3, 4), (4, 5), (5, 6)]),
        ("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7]], (0,))]
    x = np.arange(18, dtype=np.float32).reshape(6, 3)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


#: fuzz/10600000549's reshard: 5 elements in 4 tiles of 2 held twice to 2 tiles of 3 held 4 times
UNEVEN_PAIRS = _copy_module("f64", "5", "{devices=[4,2]<=[8] last_tile_dim_replicate}",
                            "{devices=[2,4]<=[8] last_tile_dim_replicate}", 8)


def test_pieces_largest_first_beat_the_realigned_gathers_in_all():
    """f64[5] in 4 tiles of 2 (elements 0-1, 2-3, 4 and padding, padding; devices 2k and 2k+1
    hold tile k) to 2 tiles of 3 (devices 0-3 elements 0-2, devices 4-7 elements 3-4).
    Realigned, as XLA does, element 3 moves from tile 1 to tile 2 (devices 2, 3 to 4, 5: 8 B
    each), after which tiles 0 and 1 (and 2 and 3) gather into the target's tiles over pairs
    (16 B from every device): 24 B from the busiest device, 144 B in all. The exchange of the
    pieces, filled tile by tile, had some device send 4 elements (32 B); filled with the
    2-element pieces first and each 1-element piece where the busiest device sends least
    ({0->2, 1->3} of 2, {2->0, 3->1, 4->6, 5->7}, {2->4, 3->5}, {2->6, 3->7} of 1), devices 2
    and 3 send 24 B, all devices 2 x 16 + 2 x 24 + 2 x 8 = 96 B: as few from the busiest
    device, fewer in all."""
    plan = plan_reshard(ArrayShape("f64", (5,)),
                        parse_sharding("{devices=[4,2]<=[8] last_tile_dim_replicate}"),
                        parse_sharding("{devices=[2,4]<=[8] last_tile_dim_replicate}"), 8)
    assert (plan.cost, plan.total) == (24, 96)
    spmd = check_equivalent(UNEVEN_PAIRS, 8)
    assert collectives(spmd) == [
        ("collective-permute", [(0, 2), (1, 3)]),
        ("collective-permute", [(2, 0), (3, 1), (4, 6), (5, 7)]),
        ("collective-permute", [(2, 4), (3, 5)]),
        ("collective-permute", [(2, 6), (3, 7)])]
    x = np.array([1.5, -2.0, 3.25, 7.0, -9.5])
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


@needs_xla
def test_pieces_largest_first_send_no_more_than_xla_from_the_busiest_device():
    """XLA partitions the same reshard: gspmdc's busiest device sends no more than XLA's."""
    result = compared_with_xla(UNEVEN_PAIRS, 8)
    assert result.our_busiest <= result.xla_busiest, (result.our_busiest, result.xla_busiest)


#: fuzz/9800001301's reshard: dim 1's 3 tiles of 2 rows do not nest in 2 tiles of 3
MOVED_THROUGH = _copy_module("f16", "1,6,7,15", "{devices=[1,3,2,1]<=[6]}",
                             "{devices=[1,2,1,3]0,5,4,3,2,1}", 6)


@pytest.mark.parametrize("size", range(3, 20))
@pytest.mark.parametrize("held,kept", [(8, 2), (8, 4), (4, 2)])
def test_realigned_gathers_reproduce_the_value(size, held, kept):
    """f32[size, 3] in `held` row tiles to `kept` row tiles held `held / kept` times, for every
    size up to 19 (realigned where the row tiles do not gather into the kept ones, a plan
    beginning with the exchange of the boundary pieces): the value arrives exact, and the plan
    never sends more from the busiest device than gathering the rows whole and slicing."""
    r = held // kept
    source = f"{{devices=[{held},1]<=[{held}]}}"
    target = f"{{devices=[{kept},1,{r}]<=[{held}] last_tile_dim_replicate}}"
    plan = plan_reshard(ArrayShape("f32", (size, 3)), parse_sharding(source),
                        parse_sharding(target), held)
    whole = (held - 1) * -(-size // held) * 3 * 4
    assert plan.cost <= whole
    text = _copy_module("f32", f"{size},3", source, target, held)
    spmd = check_equivalent(text, held)
    x = np.arange(size * 3, dtype=np.float32).reshape(size, 3)
    np.testing.assert_array_equal(run_global(spmd, [x], held), x)


REALIGNED_WINDOW = """HloModule m, num_partitions=8

""" + reducer("min", element_type="s64") + """
ENTRY e {
  x = s64[6] parameter(0), sharding={devices=[8]<=[8]}
  z = s64[] constant(9223372036854775807)
  ROOT r = s64[6] reduce-window(x, z), window={size=4 pad=2_1}, to_apply=min,
    sharding={devices=[2,4]<=[8] last_tile_dim_replicate}
}
"""


def test_a_windowed_dim_realigned_keeps_the_result_tiling():
    """s64[6] in 8 tiles of 1 under a reduce-window (4 wide, padding 2_1) whose result is in 2
    tiles of 3 held 4 times. Realigned, the operand reaches the result's tiling by one permute
    {3->4, 4->5, 5->6} of 8 B (3 B per device on average) and an all-gather over fours (24 B),
    then the window's halos travel (2 elements from the left half, 1 from the right: 8 + 4 B
    on average): 39 B per device, as XLA. Gathering the dim whole was 56 B, so the window ran
    replicated."""
    from gspmdc import api
    from conformance.differential import collective_bytes
    spmd = check_equivalent(REALIGNED_WINDOW, 8)
    assert collectives(spmd)[:2] == [
        ("collective-permute", [(3, 4), (4, 5), (5, 6)]),
        ("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7]], (0,))]
    assert collective_bytes(api.to_text(spmd), 8) == 39
    x = np.array([5, -3, 8, 1, 9, -7], dtype=np.int64)
    big = np.iinfo(np.int64).max
    padded = np.concatenate([[big, big], x, [big]])
    want = np.array([padded[i:i + 4].min() for i in range(6)])
    np.testing.assert_array_equal(run_global(spmd, [x], 8), want)


def test_a_dim_whose_tiles_do_not_nest_moves_them_all_away_first():
    """f16[1,6,7,15] from [1,3,2,1] to [1,2,1,3] on 6 devices (XLA's plan): dim 1 gives its 3
    tiles to dim 3 in one all-to-all over groups of 3 (each device keeps one of 3 blocks of its
    [1,2,4,15] shard, sends 2 blocks of 40 elements: 160 B), then, whole, takes 2 tiles from
    dim 2 (7 rows padded to 8) over pairs (shard [1,6,4,5], sends one half: 60 elements,
    120 B), and a permute puts each [1,3,7,5] tile (210 B) on its device (4 of the 6 move):
    490 B on the busiest device. Before, dim 1 could not give tiles away while it also
    gained some, and the plan gathered dims 2 and 1 (1,080 B)."""
    plan = plan_reshard(ArrayShape("f16", (1, 6, 7, 15)),
                        parse_sharding("{devices=[1,3,2,1]<=[6]}"),
                        parse_sharding("{devices=[1,2,1,3]0,5,4,3,2,1}"), 6)
    assert plan.collectives == ["all-to-all", "all-to-all", "collective-permute"]
    assert plan.cost == 160 + 120 + 210
    spmd = check_equivalent(MOVED_THROUGH, 6)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all", "all-to-all",
                                                  "collective-permute"]
    x = np.arange(630, dtype=np.float16).reshape(1, 6, 7, 15)
    np.testing.assert_array_equal(run_global(spmd, [x], 6), x)


#: fuzz/9900000044's reshard: dim 2's 4 tiles of 2 do not nest in 2 tiles of 3
MOVED_FIRST = _copy_module("f32", "4,5,6", "{devices=[2,1,4]3,2,1,7,5,0,6,4}",
                           "{devices=[1,4,2]7,6,0,3,5,4,2,1}", 8)


def test_the_dim_whose_tiles_do_not_nest_moves_first():
    """f32[4,5,6] from [2,1,4] to [1,4,2] on 8 devices: dim 1 gains 4 tiles, which dim 2
    (whose 4 tiles of 2 do not nest in 2 tiles of 3) can give in one all-to-all (its [2,5,2]
    shard, 5 rows padded to 8, in 4 blocks of [2,2,2]: 3 sent, 96 B); dim 2, whole then, takes
    dim 0's 2 tiles over pairs (half of [2,2,6]: 48 B) and a permute puts each [4,2,3] tile on
    its device (96 B): 240 B, XLA's plan and bytes. Moving dim 0's 2 tiles to dim 1 first
    left dim 2 nothing to give all of its tiles to, and the plan gathered (480 B). The permute
    goes first, on the [2,5,2] source shards (80 B; the [4,2,3] tiles it would move last are
    larger by the padding of dim 1), and the all-to-alls run on the permuted devices: 224 B."""
    plan = plan_reshard(ArrayShape("f32", (4, 5, 6)),
                        parse_sharding("{devices=[2,1,4]3,2,1,7,5,0,6,4}"),
                        parse_sharding("{devices=[1,4,2]7,6,0,3,5,4,2,1}"), 8)
    assert plan.collectives == ["collective-permute", "all-to-all", "all-to-all"]
    assert plan.cost == 80 + 96 + 48
    spmd = check_equivalent(MOVED_FIRST, 8)
    x = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), x)


@pytest.mark.parametrize("dims", ["1,6,7,15", "2,5,3,4", "1,9,5,7"])
def test_tiles_moved_through_a_whole_dim_uneven(dims):
    _copied_unchanged(dims, "{devices=[1,3,2,1]<=[6]}", "{devices=[1,2,1,3]0,5,4,3,2,1}", 6)


def _copied_unchanged(dims: str, source: str, target: str, n: int) -> None:
    """A copy of an f32 value of `dims` resharded from `source` to `target` on `n` devices
    gives back the value, equivalent to the unpartitioned program."""
    shape = tuple(int(d) for d in dims.split(","))
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    spmd = check_equivalent(_copy_module("f32", dims, source, target, n), n)
    np.testing.assert_array_equal(run_global(spmd, [x], n), x)



#: fuzz/10100002420's reshard (a `copy` in a conditional's branches): dim 2's 3 tiles of 2 do
#: not nest in 2 tiles of 3, and no dim gains 3 tiles to take them
GATHERED_TO_RECEIVE = _copy_module("pred", "6,4,6", "{devices=[1,2,3]<=[6]}",
                                   "{devices=[1,1,2,3]<=[6] last_tile_dim_replicate}", 6)


def test_a_dim_whose_tiles_do_not_nest_is_gathered_to_receive_another_dims_tiles():
    """pred[6,4,6] from [1,2,3] to [1,1,2] held 3 times on 6 devices (XLA's plan): dim 2's 3
    tiles are gathered over groups of 3 (each device sends its [6,2,2] shard to 2 others:
    48 B), then dim 1's 2 tiles move to the whole dim 2 in one all-to-all over pairs (half of
    the [6,2,6] shard: 36 B): 84 B. Before, both dims were gathered (48 B, then the [6,2,6]
    shard to the other of a pair: 72 B; 120 B) and the target sliced from the whole value."""
    plan = plan_reshard(ArrayShape("pred", (6, 4, 6)),
                        parse_sharding("{devices=[1,2,3]<=[6]}"),
                        parse_sharding("{devices=[1,1,2,3]<=[6] last_tile_dim_replicate}"), 6)
    assert plan.collectives == ["all-gather", "all-to-all"]
    assert plan.cost == 48 + 36
    spmd = check_equivalent(GATHERED_TO_RECEIVE, 6)
    assert [c[0] for c in collectives(spmd)] == ["all-gather", "all-to-all"]
    x = np.arange(144).reshape(6, 4, 6) % 3 == 0
    np.testing.assert_array_equal(run_global(spmd, [x], 6), x)


@pytest.mark.parametrize("dims", ["6,4,6", "3,5,7", "1,3,5", "2,2,4"])
def test_gathered_to_receive_uneven(dims):
    _copied_unchanged(dims, "{devices=[1,2,3]<=[6]}",
                      "{devices=[1,1,2,3]<=[6] last_tile_dim_replicate}", 6)


@needs_xla
@pytest.mark.parametrize("text,n", [(SLICE_FIRST, 8), (HALO_TRIMMED, 8), (HALO_ONE_WAY, 2),
                                    (HALO_TWO_DIMS, 4), (SPLIT_ACROSS, 4), (GATHER_ACROSS, 8),
                                    (padded_all_to_all(), 8), (MOVED_THROUGH, 6),
                                    (MOVED_FIRST, 8), (GATHERED_TO_RECEIVE, 6),
                                    (REALIGNED, 8), (REALIGNED_WINDOW, 8)],
                         ids=["slice-first", "halo-trimmed", "halo-one-way", "halo-two-dims",
                              "split-across", "gather-across", "padded-all-to-all",
                              "moved-through", "moved-first", "gathered-to-receive",
                              "realigned", "realigned-window"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both programs
    compute the reference's values."""
    result = compared_with_xla(text, n)
    assert "XLA" not in result.value_mismatch, result.value_mismatch


def test_the_last_row_read_by_shard_0_travels_in_one_permute():
    """`slice={[3:4]}` of a dim of 4 in 4 shards of 1 (`jnp.roll`'s wrap-around row): shard 0
    reads element 3, three hops to its right, and nothing in between, so the plan records that
    it reaches hop 3 and skips hops 1 and 2 (the text round-trips); one permute from shard 3
    instead of three. A plan whose skip exceeds its reach is refused."""
    from gspmdc.passes.spmd.halo import HaloPlan, WindowedDim, plan_halo
    plan = plan_halo(WindowedDim(4, 4, 1, 1, -3, 0))
    text = plan.to_text()
    assert text.endswith("reach_right=[3,0,0,0],skip_right=[2,0,0,0],real=[1,0,0,0]")
    again = HaloPlan.from_text(text)
    assert [bool(again.receives("right", hop)[0]) for hop in (1, 2, 3)] == [False, False, True]
    with pytest.raises(ValueError, match="skip_right"):
        HaloPlan.from_text(text.replace("skip_right=[2,0,0,0]", "skip_right=[2,1,0,0]"))
    spmd = check_equivalent("""HloModule m, num_partitions=4

ENTRY e {
  x = f32[4,3] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT s = f32[1,3] slice(x), slice={[3:4], [0:3]}, sharding={devices=[4,1]<=[4]}
}
""", 4)
    assert collectives(spmd) == [("collective-permute", [(3, 0)])]


# ---- all-to-alls taking the dims that lose tiles in either order ------------------------------

TWO_DIMS_LOSING_TILES = """HloModule m, num_partitions=4

ENTRY e {
  p = bf16[7,7,3,1] parameter(0), sharding={devices=[1,2,2,1]<=[4]}
  ROOT c = bf16[7,7,3,1] copy(p), sharding={devices=[2,1,1,1,2]1,3,0,2 last_tile_dim_replicate}
}
"""


def test_the_all_to_all_may_take_the_last_dim_losing_tiles():
    """Dims 1 and 2 give up their two tiles each, dim 0 gains two. Moving dim 2's tiles to
    dim 0 by an all-to-all (each device's bf16[7,4,2,1] shard, dim 0 padded to 8, is 128 B, of
    which it sends half: 64 B), permuting the bf16[4,4,3,1] shards to the devices whose groups gather dim 1 (96 B,
    every device) and gathering dim 1 (96 B) sends 256 B per device, XLA's plan
    (fuzz/10100002061); moving dim 1's tiles instead (the dims taken first to last) or
    gathering both sends 280. (The exchange of the pieces sends less still: each device lacks
    three quarters of the columns and layers of its rows, 192 B, from at most four holders.)"""
    plan = plan_staged(ArrayShape("bf16", (7, 7, 3, 1)),
                       parse_sharding("{devices=[1,2,2,1]<=[4]}"),
                       parse_sharding("{devices=[2,1,1,1,2]1,3,0,2 last_tile_dim_replicate}"), 4)
    assert plan.collectives == ["all-to-all", "collective-permute", "all-gather"]
    assert plan.cost == 256
    spmd = check_equivalent(TWO_DIMS_LOSING_TILES, 4)
    assert sent_per_device(spmd, 4).tolist() == [192] * 4


@needs_xla
def test_two_dims_losing_tiles_against_xla():
    compared_with_xla(TWO_DIMS_LOSING_TILES, 4)


# ---- partial sums reduce-scattered into the dim whose tiles the devices already match --------

PARTIALS_TO_TWO_DIMS = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[11,6,1] parameter(0), sharding={replicated}
  p = f32[11,6,1] custom-call(x), custom_call_target="Sharding", sharding={devices=[1,1,1,2,2]<=[4] last_tile_dims={unreduced, replicated}}
  ROOT t = f32[11,6,1] custom-call(p), custom_call_target="Sharding", sharding={devices=[2,2,1]1,3,0,2}
}
"""


def test_partial_sums_scatter_into_the_dim_that_needs_no_permute():
    """f32[11,6,1] summed over pairs {0,2} and {1,3}, to [2,2,1] tiles on devices 1,3,0,2:
    device 0's tile is (1,0), device 2's (1,1), so the pairs split dim 1 between them and the
    devices 0 and 1, which hold the same sums, take the two halves of dim 0. Reduce-scattered
    into dim 1, each device sends half its [11,6,1] shard (11 x 3 x 4 = 132 B) and slices its
    dim-0 half locally. Scattered into dim 0 (the first dim that can take the sums), dim 0
    padded to 12, each sends half of [12,6,1] (144 B) and its halves then sit on the wrong
    devices: a permute of the [6,3,1] tile (72 B), 216 B (fuzz/11300002752, where XLA's
    all-reduce of the dim-1 half and permute sent 204). Since each pair also wants one half of
    dim 0 (devices 0, 2 the second, 1, 3 the first), the sums are sliced to it first
    (`_sliced_partials`) and the reduce-scatter into dim 1 sends half of [6,6,1]: 72 B."""
    plan = plan_reshard(ArrayShape("f32", (11, 6, 1)),
                        parse_sharding("{devices=[1,1,1,2,2]<=[4] "
                                       "last_tile_dims={unreduced, replicated}}"),
                        parse_sharding("{devices=[2,2,1]1,3,0,2}"), 4)
    assert plan.collectives == ["reduce-scatter"]
    assert [type(step).__name__ for step in plan.steps] == ["Slice", "ReduceScatter"]
    assert plan.steps[1].dim == 1
    assert plan.cost == 72
    spmd = check_equivalent(PARTIALS_TO_TWO_DIMS, 4)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter"]
    x = np.arange(66, dtype=np.float32).reshape(11, 6, 1)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)
