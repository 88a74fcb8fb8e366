"""Reshard routes chosen for the whole program (issue 13; `passes/spmd/reshard_routes.py`):
where the plan of a reshard cheapest for its own busiest device loads a device other
collectives load already, another plan of it that spreads its bytes over devices idle elsewhere
is taken when that lowers the program's busiest device (then the bytes of all devices). Bytes
per device by hand from the cost model's formulas (`gspmdc.ir.cost`: a collective-permute
sends its operand from each device whose pair moves, an all-gather each device's shard to the
g-1 others, an all-to-all every block but the device's own); values against the unpartitioned
program."""
from __future__ import annotations

from gspmdc import api
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_routes
from gspmdc.passes.spmd.traffic import sent_per_device

from filecheck import check, directives
from spmd_partition_helpers import check_equivalent, collectives

TWO_RESHARDS = """HloModule m, num_partitions=4

ENTRY e {
  a = f32[4,8] parameter(0), sharding={devices=[1,4]0,2,1,3}
  b = f32[4,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT t = (f32[4,8], f32[4,8]) tuple(a, b),
    sharding={{devices=[2,1,2]0,3,2,1 last_tile_dim_replicate}, {devices=[4,1]0,3,2,1}}
}
"""


def test_the_route_of_a_reshard_spreads_its_bytes_over_devices_idle_elsewhere():
    """`b`'s reshard swaps the rows of devices 1 and 3: one collective-permute of their
    f32[1,8] shards, 32 B from each of them. `a`'s reshard (f32[4,2] column shards to f32[2,8]
    row tiles held by the pairs {0,3} and {2,1}) is cheapest alone as an all-to-all in pairs
    (each device half its shard, 16 B), a permute of the f32[2,4] halves from devices 1 and 3
    (32 B) and an all-gather of them in the pairs (32 B each): [48, 80, 48, 80], busiest 80;
    so the program sends [48, 112, 48, 112], busiest 112. Its other route of the same bytes
    over all devices permutes from devices 0 and 2 instead: [80, 48, 80, 48], and the program
    [80, 80, 80, 80]: busiest 80."""
    spmd = check_equivalent(TWO_RESHARDS, 4)
    assert sent_per_device(spmd, 4).tolist() == [80, 80, 80, 80]
    assert sorted(c[0] for c in collectives(spmd)) == \
        ["all-gather", "all-to-all", "collective-permute", "collective-permute"]
    check(api.to_text(spmd), directives("""
    // CHECK: all-to-all({{.*}}spmd_value="a"
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]2,0[}],[{]3,3[}],[{]0,2[}],[{]1,1[}][}]}}{{.*}}spmd_value="a"
    """))


def test_the_routes_of_a_reshard_are_its_plans_with_distinct_bytes_per_device():
    """`a`'s reshard above: the chosen plan first, then one plan per other vector of bytes per
    device: the same steps permuting from devices 0 and 2, each of the two with the all-gather
    before the permute (which then moves the gathered f32[2,8] tile, 64 B), and the all-gather
    of dim 1 whole then a slice (each device its f32[4,2] shard to the 3 others, 96 B); the sum
    over the devices of each is its plan's `total`."""
    source = parse_sharding("{devices=[1,4]0,2,1,3}")
    target = parse_sharding("{devices=[2,1,2]0,3,2,1 last_tile_dim_replicate}")
    shape = ArrayShape("f32", (4, 8))
    routes = plan_routes(shape, source, target, 4)
    assert routes.plans[0] is plan_reshard(shape, source, target, 4)
    assert routes.sent.tolist()[0] == [48, 80, 48, 80]
    assert sorted(map(tuple, routes.sent.tolist()[1:])) == [
        (48, 112, 48, 112), (80, 48, 80, 48), (96, 96, 96, 96), (112, 48, 112, 48)]
    assert [int(row.sum()) for row in routes.sent] == [plan.total for plan in routes.plans]
