"""A reshard plan closing with a permute is also planned with the permute moved back to the
smallest local shard before it, the steps between run on the permuted devices (issue 13:
fuzz/11300002423 off, where XLA's all-to-all then permute sends more from the busiest device
than gathering, and gathering more on the mean than XLA). Bytes per device worked out by hand
from the cost model's formulas (`gspmdc.ir.cost`); values against the unpartitioned program and
numpy."""
from __future__ import annotations

import numpy as np

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard
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
    200, 200 B (busiest 200, mean 170)."""
    plan = plan_reshard(ArrayShape("f32", (9, 3, 4, 1)), parse_sharding(SOURCE),
                        parse_sharding(TARGET), 4)
    assert plan.collectives == ["collective-permute", "all-to-all"]
    assert (plan.cost, plan.total) == (200, 680)
    spmd = check_equivalent(UNEVEN, 4)
    found = collectives(spmd)
    assert [c[0] for c in found] == ["collective-permute", "all-to-all"]
    assert found[0][1] == [(0, 3), (1, 1), (2, 0), (3, 2)]
    assert sent_per_device(spmd, 4).tolist() == [200, 80, 200, 200]
    x = np.arange(108, dtype=np.float32).reshape(9, 3, 4, 1)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)


def test_the_permute_stays_last_where_no_earlier_shard_is_smaller():
    """f32[8,4,4,1], the same shardings on even dims: the all-to-all neither pads nor shrinks
    the [4,4,2,1] shard, so the permute stays after it (64 B all-to-all, 128 B permute)."""
    plan = plan_reshard(ArrayShape("f32", (8, 4, 4, 1)), parse_sharding(SOURCE),
                        parse_sharding(TARGET), 4)
    assert plan.collectives == ["all-to-all", "collective-permute"]
    assert plan.cost == 64 + 128
