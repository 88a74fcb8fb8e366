"""Reshard plans that need no permute, or a smaller one (issue 13: module-settings sending less
than XLA from the busiest device but more on the mean). A plan closing with a permute is also
planned with the permute moved back to the smallest local shard before it, the steps between
run on the permuted devices (fuzz/11300002423 off); the replicas are also sliced into the dims
gaining tiles last to first, so the all-to-alls fill the others (fuzz/12000000473 on). Bytes
per device worked out by hand from the cost model's formulas (`gspmdc.ir.cost`); values against
the unpartitioned program and numpy."""
from __future__ import annotations

import numpy as np

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_staged
from gspmdc.passes.spmd.traffic import sent_per_device

from spmd_partition_helpers import check_equivalent, collectives, run_global

SOURCE = "{devices=[1,1,2,1,2]<=[4] last_tile_dim_replicate}"
TARGET = "{devices=[2,2,1,1]3,0,1,2}"
UNEVEN = ("HloModule m, num_partitions=4\n\nENTRY e {\n"
          f"  p = f32[9,3,4,1] parameter(0), sharding={SOURCE}\n"
          f"  ROOT c = f32[9,3,4,1] copy(p), sharding={TARGET}\n}}\n")


def test_the_permute_goes_before_an_all_to_all_that_pads():
    """f32[9,3,4,1], dim 2 in 2 tiles held twice (device d: dim 2 tile d // 2), to [2,2] tiles
    of dims 0 and 1 on devices 3,0,1,2. The replicas slice dim 0 (device d: rows of tile d % 2,
    a [5,3,2,1] shard, 120 B); an all-to-all over {0,2} and {1,3} moves dim 2's tiles to dim 1,
    whose 3 columns it pads to 4 ([5,4,2,1] in 2 blocks: 80 B each); devices 0, 2 and 3 then
    hold another device's tile. Permuted last, the [5,2,4,1] tiles (160 B): 240 B busiest, 200
    mean (XLA's plan); gathering dim 2 instead sends every [9,3,2,1] shard (216 B from each).
    Permuted before the all-to-all, devices 0, 2 and 3 send their 120 B sliced shard: 200, 80,
    200, 200 B (busiest 200, mean 170). The exchange of the pieces sends less still (the
    program's): each device lacks the other dim-2 half of its [5,2,4,1] tile, one
    [5,2,2,1] piece (80 B) from a device holding it."""
    plan = plan_staged(ArrayShape("f32", (9, 3, 4, 1)), parse_sharding(SOURCE),
                       parse_sharding(TARGET), 4)
    assert plan.collectives == ["collective-permute", "all-to-all"]
    assert (plan.cost, plan.total) == (200, 680)
    spmd = check_equivalent(UNEVEN, 4)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"]
    assert sent_per_device(spmd, 4).tolist() == [80, 80, 80, 80]
    x = np.arange(108, dtype=np.float32).reshape(9, 3, 4, 1)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)


def test_the_permute_stays_last_where_no_earlier_shard_is_smaller():
    """f32[8,4,4,1], the same shardings on even dims: the all-to-all neither pads nor shrinks
    the [4,4,2,1] shard, so the permute stays after it (64 B all-to-all, 128 B permute)."""
    plan = plan_staged(ArrayShape("f32", (8, 4, 4, 1)), parse_sharding(SOURCE),
                       parse_sharding(TARGET), 4)
    assert plan.collectives == ["all-to-all", "collective-permute"]
    assert plan.cost == 64 + 128


ROWS = "{devices=[2,1,1,2]<=[4] last_tile_dim_replicate}"
ROWS_TO_TWO_DIMS = ("HloModule m, num_partitions=4\n\nENTRY e {\n"
                    f"  p = s64[3,6,4] parameter(0), sharding={ROWS}\n"
                    "  ROOT c = s64[3,6,4] copy(p), sharding={devices=[1,2,2]<=[4]}\n}\n")


def test_the_replicas_slice_the_dim_the_all_to_all_cannot_fill():
    """s64[3,6,4], rows in 2 tiles (device d: tile d // 2) held twice, to `[1,2,2]<=[4]`
    (device d: dim 1 tile d // 2, dim 2 tile d % 2). Slicing dim 2 from the replicas (device d
    keeps half d % 2: a [2,6,2] shard, 192 B), an all-to-all over {0,2} and {1,3} moves the
    rows' tiles to dim 1 and every device then holds its target tile: half its shard sent,
    96 B from each. Slicing dim 1 first (the dims first to last), the rows' tiles move to dim
    2 and devices 1 and 2 must swap their [3,3,2] tiles (96 + 144 B: XLA's plan); without the
    slice the all-to-all moves the whole [2,6,4] shard (192 B from each: main's plan)."""
    plan = plan_reshard(ArrayShape("s64", (3, 6, 4)), parse_sharding(ROWS),
                        parse_sharding("{devices=[1,2,2]<=[4]}"), 4)
    assert plan.collectives == ["all-to-all"]
    assert (plan.cost, plan.total) == (96, 4 * 96)
    spmd = check_equivalent(ROWS_TO_TWO_DIMS, 4)
    found = collectives(spmd)
    assert found == [("all-to-all", [[0, 2], [1, 3]], (1,))]
    assert sent_per_device(spmd, 4).tolist() == [96, 96, 96, 96]
    x = np.arange(72, dtype=np.int64).reshape(3, 6, 4)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)
