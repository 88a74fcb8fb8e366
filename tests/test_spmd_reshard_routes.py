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
  a = f32[2,4,10] parameter(0), sharding={devices=[1,1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  b = f64[4,4,3] parameter(1), sharding={devices=[1,2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT t = (f32[2,4,10], f64[4,4,3]) tuple(a, b),
    sharding={{devices=[2,1,1,2]0,3,2,1 last_tile_dim_replicate},
              {devices=[1,2,1,2]1,2,0,3 last_tile_dim_replicate}}
}
"""


def test_the_route_of_a_reshard_spreads_its_bytes_over_devices_idle_elsewhere():
    """`b`'s reshard swaps the tiles of devices 0 and 1: one collective-permute of their
    f64[4,2,3] shards, 192 B from each of them. `a`'s reshard (f32[2,4,5] shards, 160 B, to
    f32[1,4,10]) is cheapest alone as a slice, a permute of the f32[1,4,5] halves from devices
    1 and 3 (80 B) and an all-gather of them in pairs (80 B each): [80, 160, 80, 160], busiest
    160; so the program sends [272, 352, 80, 160], busiest 352. Its other route, an all-to-all
    moving the halves between the pairs (80 B each) then a permute of the f32[1,4,10] result
    from devices 2 and 3 (160 B), sends [80, 80, 240, 240] (busiest 240 alone) and the
    program [272, 272, 240, 240]: busiest 272 (XLA's program of the same module)."""
    spmd = check_equivalent(TWO_RESHARDS, 4)
    assert sent_per_device(spmd, 4).tolist() == [272, 272, 240, 240]
    assert sorted(c[0] for c in collectives(spmd)) == \
        ["all-to-all", "collective-permute", "collective-permute"]
    check(api.to_text(spmd), directives("""
    // CHECK: all-to-all({{.*}}spmd_value="a"
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]0,0[}],[{]2,3[}],[{]1,1[}],[{]3,2[}][}]}}{{.*}}spmd_value="a"
    """))


def test_the_routes_of_a_reshard_are_its_plans_with_distinct_bytes_per_device():
    """`a`'s reshard above: the chosen plan first, then one plan per other vector of bytes per
    device: the all-to-all between the pairs then a permute from devices 2 and 3 (or, with the
    groups reversed, from devices 0 and 1), the slice, all-gather in pairs and permute from
    devices 1 and 3 (f32[1,4,10], 160 B), and the all-gather of dim 2 in pairs then a slice
    (each device its f32[2,4,5] shard to its partner, 160 B); the sum over the devices of
    each is its plan's `total`."""
    source = parse_sharding("{devices=[1,1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}")
    target = parse_sharding("{devices=[2,1,1,2]0,3,2,1 last_tile_dim_replicate}")
    shape = ArrayShape("f32", (2, 4, 10))
    routes = plan_routes(shape, source, target, 4)
    assert routes.plans[0] is plan_reshard(shape, source, target, 4)
    assert routes.sent.tolist()[0] == [80, 160, 80, 160]
    assert sorted(map(tuple, routes.sent.tolist()[1:])) == [
        (80, 80, 240, 240), (80, 240, 80, 240), (160, 160, 160, 160), (240, 240, 80, 80)]
    assert [int(row.sum()) for row in routes.sent] == [plan.total for plan in routes.plans]
