"""The cost model (ir/cost.py) on hand-computed cases: bytes per device for every collective kind,
group modes, async forms, and the time model. test_bytes_agreement.py checks that the planner,
explain and the profiler all use it."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.ir import cost

from hlo_text import hlo_module, reducer

RING_4 = [[0, 1, 2, 3]]
PAIRS_2x2 = [[0, 1], [2, 3]]


def test_all_gather_sends_its_operand_to_every_other_member():
    t = cost.all_gather(PAIRS_2x2, 96, 4)
    assert t.sent.tolist() == [96] * 4 and t.received.tolist() == [96] * 4
    assert t.total_sent == 384 and t.num_groups == 2 and t.group_size == 2


def test_even_ring_collectives_give_the_textbook_fractions():
    # f32[8,64] (2048 bytes) over groups of 4: all-reduce 2*3/4, reduce-scatter 3/4
    assert cost.all_reduce(RING_4, 512, 4, 4).sent.tolist() == [3072] * 4
    assert cost.reduce_scatter(RING_4, 512, 4, 4).sent.tolist() == [1536] * 4
    a2a = cost.all_to_all(RING_4, 512, 4, 4)
    assert a2a.sent.tolist() == [1536] * 4 and a2a.received.tolist() == [1536] * 4


def test_uneven_all_reduce_is_exact_per_device():
    """f32[5] over 4: chunks of 2, 1, 1, 1 elements. Member r sends every chunk but its own,
    then every chunk but member r+1's: 5-2 + 5-1 = 7, 8, 8, 7 elements."""
    t = cost.all_reduce(RING_4, 5, 4, 4)
    assert t.sent.tolist() == [28, 32, 32, 28]
    assert t.received.tolist() == [28, 28, 32, 32]      # what member r-1 sends
    assert t.total_sent == 2 * 3 * 5 * 4                 # 2 (g-1) E w over the group
    assert t.mean_sent == 30 and t.max_sent == 32
    assert t.describe() == "sends 28 to 32 bytes per device (120 in total)"


def test_a_group_of_one_moves_nothing():
    t = cost.all_reduce([[0], [1]], 8, 4, 2)
    assert t.total_sent == 0 and t.describe() == "sends 0 bytes per device"


def test_permute_counts_only_moving_pairs():
    t = cost.collective_permute([(0, 1), (1, 1), (3, 0)], 256, 4)
    assert t.sent.tolist() == [256, 0, 0, 256] and t.received.tolist() == [256, 256, 0, 0]
    assert t.describe() == "sends 256 bytes from each of 2 devices"
    assert t.num_groups == 3 and t.group_size == 2         # its pairs


def test_broadcast_goes_down_the_chain_from_the_first_member():
    t = cost.collective_broadcast([[2, 0, 1]], 64, 3)
    assert t.sent.tolist() == [64, 0, 64] and t.received.tolist() == [64, 64, 0]


def test_tuple_all_to_all_sends_every_operand_but_its_own():
    t = cost.all_to_all_tuple([[0, 1, 2]], [8, 8, 8], 3)
    assert t.sent.tolist() == [16] * 3 and t.received.tolist() == [16] * 3


def _module(body: str, n: int = 4, callee: str = ""):
    return api.parse(hlo_module(f"  x = f32[8] parameter(0)\n  {body}", callee + reducer("add"),
                                f", num_partitions={n}"))


def _traffic(body: str, n: int = 4):
    module = _module(body, n)
    return cost.instruction_traffic(module.entry.root, n, module.computations)


@pytest.mark.parametrize("body, sent", [
    # no channel id: replica groups of one replica, every partition alone
    ("ROOT r = f32[8] all-reduce(x), replica_groups={}, to_apply=add", [0] * 4),
    # channel id without use_global_device_ids: one group of every partition
    ("ROOT r = f32[8] all-reduce(x), channel_id=1, replica_groups={}, to_apply=add", [48] * 4),
    ("ROOT r = f32[8] all-reduce(x), channel_id=1, replica_groups={{0,1},{2,3}}, "
     "use_global_device_ids=true, to_apply=add", [32] * 4),
    ("ROOT g = f32[16] all-gather(x), channel_id=1, replica_groups={{0,1},{2,3}}, "
     "dimensions={0}, use_global_device_ids=true", [32] * 4),
    ("ROOT p = f32[8] collective-permute(x), channel_id=1, source_target_pairs={{0,1},{1,0}}",
     [32, 32, 0, 0]),
    ("ROOT a = f32[8] all-to-all(x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}",
     [24] * 4),
])
def test_instruction_traffic_follows_the_group_modes(body, sent):
    assert _traffic(body).sent.tolist() == sent


def test_async_start_costs_as_the_collective_it_wraps_and_done_moves_nothing():
    module = _module("s = ((f32[8]), f32[16], u32[]) async-start(x), calls=wrapped\n"
                     "  ROOT d = f32[16] async-done(s)", callee="""
%wrapped {
  y = f32[8] parameter(0)
  ROOT g = f32[16] all-gather(y), channel_id=1, replica_groups={{0,1},{2,3}}, dimensions={0}, use_global_device_ids=true
}
""")
    start, done = module.entry.instruction("s"), module.entry.root
    assert cost.instruction_traffic(start, 4, module.computations).sent.tolist() == [32] * 4
    assert cost.instruction_traffic(done, 4, module.computations) is None


def test_time_model():
    gather = cost.all_gather(RING_4, 1_000_000, 4)
    # recursive doubling: 2 steps instead of 3, the same bytes
    assert cost.collective_seconds(gather, 1e-5, 1e9) == (pytest.approx(2e-5 + 3e-3), "tree")
    big = cost.all_reduce(RING_4, 1_000_000, 4, 4)          # 4 MB: the ring is faster
    assert cost.collective_seconds(big, 1e-5, 1e9) == (pytest.approx(6e-5 + 6e-3), "ring")
    small = cost.all_reduce([list(range(64))], 4, 4, 64)    # 16 bytes over 64: a tree
    assert cost.collective_seconds(small, 1e-5, 1e9) == (pytest.approx(12 * (1e-5 + 16e-9)),
                                                         "tree")
    # uneven: the ring's time is the busiest device's bytes, exactly
    uneven = cost.reduce_scatter(RING_4, 10, 4, 4)
    assert uneven.max_sent == (10 - 2) * 4
    assert cost.collective_seconds(uneven, 0.0, 1.0) == (32.0, "ring")
    assert cost.collective_seconds(cost.collective_permute([(0, 0)], 64, 2), 1e-5, 1e9) == \
        (0.0, "none")


def test_bytes_are_integers():
    t = cost.all_reduce(RING_4, 7, 2, 4)
    assert t.sent.dtype == np.int64 and isinstance(t.total_sent, int)
