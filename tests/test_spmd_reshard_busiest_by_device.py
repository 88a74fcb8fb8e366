"""A reshard plan costs what its busiest device sends over all its steps, summed device by
device (docs/partitioning.md, "Resharding"): two steps that load different devices cost the
larger of their sums, not the sum of each step's busiest device. Bytes per device by hand;
the emitted program measured by the cost model; values against the unpartitioned program."""
from __future__ import annotations

from gspmdc import api
from gspmdc.passes.spmd.reshard_plan import plan_reshard
from gspmdc.passes.spmd.traffic import sent_per_device

from spmd_partition_helpers import check_equivalent

#: f32[9,1] in 4 row tiles (uneven: 3, 3, 3, 0 real rows) held twice, into 2 row tiles (5 and
#: 4 rows) held four times by other devices
TEXT = """HloModule m, num_partitions=8
ENTRY e {
  p = f32[9,1] parameter(0), sharding={devices=[4,2]1,2,0,3,6,7,4,5}
  ROOT c = f32[9,1] copy(p), sharding={devices=[2,1,4]4,0,2,3,7,5,6,1 last_tile_dim_replicate}
}
"""


def test_a_plan_costs_its_busiest_device_over_all_steps():
    """The plan: one row (4 B) each from devices 0 and 6 into the tiles that do not nest
    (an exchange of pieces), a permute of the f32[3,1] shards of devices 1 and 4 (12 B each),
    then two all-gathers of f32[3,1] over pairs (12 B from every device each). Devices 1 and 4
    send 12 + 24 = 36 B, devices 0 and 6 4 + 24 = 28, the others 24; 224 B in all. Each step's
    busiest device summed would be 4 + 12 + 24 = 40 B, a device no step loads twice."""
    module = api.parse(TEXT, "m")
    p, c = module.entry.instructions[0], module.entry.root
    plan = plan_reshard(p.shape, p.sharding, c.sharding, 8)
    assert plan.sent_by_device(8).tolist() == [28, 36, 24, 24, 36, 24, 28, 24]
    assert (plan.cost, plan.total) == (36, 224)


def test_the_emitted_program_sends_what_the_plan_costs():
    spmd = check_equivalent(TEXT, 8)
    sent = sent_per_device(spmd, 8)
    assert (int(sent.max()), int(sent.sum())) == (36, 224)
