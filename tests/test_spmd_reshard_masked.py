"""Fewer bytes than all-gathers where XLA sends fewer (issue 13, partitioner side): a masked gather
(one all-reduce of zero-padded shards) when padding makes the all-gathers dearer, and an iota or
a broadcast computed again in the sharding a user needs instead of being gathered. Bytes are
worked out by hand from the cost model's ring formulas; values against numpy and the
unpartitioned program, with garbage in the padding."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_routes
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from spmd_partition_helpers import (
    check_equivalent, collectives, compared_with_xla, opcodes, partition, run_global,
)

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def _uneven(shape: str, source: str, target: str, n: int) -> str:
    return (f"HloModule m, num_partitions={n}\n\nENTRY e {{\n"
            f"  p = {shape} parameter(0), sharding={source}\n"
            f"  e = {shape} exponential(p), sharding={source}\n"
            f"  ROOT r = {shape} negate(e), sharding={target}\n}}\n")


def test_tiny_uneven_value_is_summed_or_coarsened_not_gathered():
    """f32[3,3] in 8 row tiles (1 row each, 5 of them padding) needed replicated. All-gather:
    each device sends its padded 12-byte row to 7 others = 84 B. Masked gather: an all-reduce of
    the 9 real elements over 8 devices, ring chunks (2,1,1,1,1,1,1,1): device r sends
    2*9 - c[r] - c[r+1] elements, at most 16 = 64 B. Cheaper still, the rows exchanged into 4
    tiles of one row first (devices 2k and 2k+1 holding row k: device 0 sends row 0 to device
    1, devices 1 and 2 their rows to devices 2, 3 and 4, 5: 12, 24, 24 B), then an all-gather
    in fours of the 12-byte rows (36 B each): [48, 60, 60, 36, 36, 36, 36, 36]."""
    shape = ArrayShape("f32", (3, 3))
    source, target = parse_sharding("{devices=[8,1]<=[8]}"), parse_sharding("{replicated}")
    plan = plan_reshard(shape, source, target, 8)
    assert plan.collectives == ["collective-permute", "all-gather"]
    assert plan.cost == 60
    masked = [p for p in plan_routes(shape, source, target, 8).plans
              if p.collectives == ["all-reduce"]]
    assert [p.cost for p in masked] == [64]
    spmd = check_equivalent(_uneven("f32[3,3]", "{devices=[8,1]<=[8]}", "{replicated}", 8), 8)
    assert sent_per_device(spmd, 8).tolist() == [48, 60, 60, 36, 36, 36, 36, 36]
    x = np.arange(9, dtype=np.float32).reshape(3, 3) / 10
    np.testing.assert_allclose(run_global(spmd, [x], 8), -np.exp(x), rtol=1e-6)


def test_masked_gather_over_two_dims_with_replicas_groups_distinct_tiles():
    """f32[2,2] in [4,4] tiles, each held by devices i and 16+i (32 devices): the masked
    gather sums the 16 tiles of each replica set, {0..15} and {16..31}. All-gathers: 3*4 B then
    3*8 B = 36 B; the masked gather of 4 elements over 16: chunks (1,1,1,1,0,...), at most
    2*4 - 0 - 0 = 8 elements = 32 B. Cheapest: the rows exchanged into 2 row tiles (the
    devices of row tile 1, 4 and 5, take row 0 from devices 0 and 1; those of row tiles 2 and
    3 row 1 from devices 4 and 5: 4 B from devices 0, 1, 16, 17, 8 B from 4, 5, 20, 21),
    then all-gathers of dim 1 in fours (3*4 B) and of dim 0 in pairs (8 B): 28 B at most."""
    shape = ArrayShape("f32", (2, 2))
    source = "{devices=[4,4,2]<=[2,16]T(1,0) last_tile_dim_replicate}"
    routes = plan_routes(shape, parse_sharding(source), parse_sharding("{replicated}"), 32)
    masked = [p for p in routes.plans if p.collectives == ["all-reduce"]]
    assert [p.cost for p in masked] == [32]
    assert masked[0].steps[0].groups.tolist() == [list(range(16)), list(range(16, 32))]
    exchanged = [4, 4, 0, 0, 8, 8] + [0] * 10
    assert routes.sent[0].tolist() == [20 + b for b in exchanged] * 2
    spmd = check_equivalent(_uneven("f32[2,2]", source, "{replicated}", 32), 32)
    assert sent_per_device(spmd, 32).tolist() == [20 + b for b in exchanged] * 2


@pytest.mark.parametrize("element", ["f32", "pred"])
def test_size_one_dim_summed_within_the_target_tile_groups(element):
    """f32[1,4] in 8 row tiles (device 0 holds the row, the others padding) needed in 2 row
    tiles each held by 4 devices: target tile 0 (devices 0-3) holds the row and tile 1 only
    padding, so the devices sharing a target tile sum their zeroed shards, {0..3} and {4..7}
    (XLA's partial replication by a sum within the groups of the replicated dim). Ring chunks
    (1,1,1,1) of 4 elements: every device sends 2*4 - 1 - 1 = 6 elements, 24 B for f32 (the sum
    over all 8 devices, chunks (1,1,1,1,0,0,0,0): 8 elements, 32 B; all-gathers in the groups:
    3 padded rows, 48 B)."""
    source, target = "{devices=[8,1]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    plan = plan_reshard(ArrayShape(element, (1, 4)), parse_sharding(source),
                        parse_sharding(target), 8)
    assert plan.collectives == ["all-reduce"]
    assert plan.cost == (24 if element == "f32" else 6)
    text = _uneven("f32[1,4]", source, target, 8)
    if element == "pred":
        text = text.replace("ROOT r = f32[1,4] negate(e)", "ROOT r = pred[1,4] compare(e, e), "
                            "direction=EQ")
    spmd = check_equivalent(text, 8)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3], [4, 5, 6, 7]])]


@pytest.mark.parametrize("source", ["{devices=[6]<=[6]}", "{devices=[6]0,1,4,3,2,5}"])
def test_size_one_dim_sent_to_its_target_tile_when_that_moves_fewer_bytes(source):
    """f32[1] in 6 tiles (device 0 holds the element) needed in 2 tiles each held by 3 devices
    (fuzz/11500000183's reshard): device 0 sends its 4 B to devices 1 and 2, 8 B in all, where
    summing within {0,1,2} and {3,4,5} also sends 8 B from the busiest device (ring chunks
    (1,0,0): 2 - 0 - 0 elements from the middle device) but 32 B in all, and needs a permute
    first where the devices are out of order."""
    target = "{devices=[2,3]<=[6] last_tile_dim_replicate}"
    plan = plan_reshard(ArrayShape("f32", (1,)), parse_sharding(source), parse_sharding(target),
                        6)
    assert plan.collectives == ["collective-permute"]
    assert (plan.cost, plan.total) == (8, 8)
    spmd = check_equivalent(_uneven("f32[1]", source, target, 6), 6)
    assert collectives(spmd) == [("collective-permute", [(0, 1)]),
                                 ("collective-permute", [(0, 2)])]


@pytest.mark.parametrize("source,target", [
    ("{devices=[2,4]<=[8]}", "{replicated}"),
    ("{devices=[8,1]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    ("{devices=[4,2]<=[2,4]T(1,0)}", "{devices=[1,2,4]<=[8] last_tile_dim_replicate}"),
])
def test_even_gathers_stay_all_gathers(source, target):
    """On dims that divide evenly all-gathers send (g-1)/g of what an all-reduce sends: never
    masked."""
    plan = plan_reshard(ArrayShape("f32", (8, 16)), parse_sharding(source),
                        parse_sharding(target), 8)
    assert "all-reduce" not in plan.collectives


def test_pred_masked_gather_uses_or():
    text = _uneven("f32[3,2]", "{devices=[8,1]<=[8]}", "{replicated}", 8).replace(
        "ROOT r = f32[3,2] negate(e)", "ROOT r = pred[3,2] compare(e, e), direction=EQ")
    text = text.replace("-> f32", "-> pred")
    check_equivalent(text, 8)


BROADCAST = """HloModule m, num_partitions=4

ENTRY e {
  s = f32[] parameter(0), sharding={replicated}
  q = f32[8,6] parameter(1), sharding={replicated}
  b = f32[8,6] broadcast(s), dimensions={}, sharding={devices=[4,1]<=[4]}
  i = s32[8,6] iota(), iota_dimension=0, sharding={devices=[4,1]<=[4]}
  c = f32[8,6] convert(i), sharding={replicated}
  m = f32[8,6] multiply(b, q), sharding={replicated}
  ROOT t = (f32[8,6], f32[8,6]) tuple(m, c), sharding={{replicated}, {replicated}}
}
"""


def test_broadcast_of_a_replicated_scalar_and_an_iota_are_recomputed_not_gathered():
    """Gathering the row-tiled broadcast and iota would send 3 * 48 B each per device; both are
    computed again replicated from the replicated scalar: no collective at all."""
    spmd = check_equivalent(BROADCAST, 4)
    assert collectives(spmd) == []
    assert opcodes(spmd).count("all-gather") == 0
    s, q = np.float32(1.5), np.arange(48, dtype=np.float32).reshape(8, 6)
    m, c = run_global(spmd, [s, q], 4)
    np.testing.assert_array_equal(m, s * q)
    np.testing.assert_array_equal(c, np.broadcast_to(np.arange(8, dtype=np.float32)[:, None],
                                                      (8, 6)))


def test_broadcast_recomputed_from_its_operand_resharded():
    """broadcast f32[8] (tiled in 4) -> f32[8,6] tiled [4,1], needed [1,4]-tiled on columns: the
    operand's 8 elements gathered (each device sends its 8 B to 3 others: 24 B) and broadcast
    locally cost less than moving the broadcast's tiles (an all-to-all of each device's [2,8]
    padded shard: 3 of its 4 blocks of 16 B = 48 B)."""
    text = """HloModule m, num_partitions=4

ENTRY e {
  v = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  b = f32[8,6] broadcast(v), dimensions={0}, sharding={devices=[4,1]<=[4]}
  ROOT r = f32[8,6] negate(b), sharding={devices=[1,4]<=[4]}
}
"""
    spmd = check_equivalent(text, 4)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]


# ---- realigned, then summed (fuzz/14500000042 on) ---------------------------------------------

REALIGNED_SUM = """HloModule m, num_partitions=8

ENTRY e {
  p = f32[2,1] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT a = f32[2,1] add(p, p), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
}
"""


def test_tiles_realigned_into_the_target_groups_then_summed():
    """f32[2,1] in 8 row tiles (rows 0 and 1 on devices 0 and 1) needed in 2 row tiles held by
    {0..3} and {4..7}: row 1 moves from device 1 to device 4, the first of its target group
    (4 B), then each four sums its zeroed shards (ring chunks (1,0,0,0): at most 2 elements,
    8 B): 12 B from device 1, XLA's program. Sending row 1 from device 1 to each of its 4
    holders sent 16 B; the realigned all-gather over fours 4 + 12 B."""
    source, target = "{devices=[8,1]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    plan = plan_reshard(ArrayShape("f32", (2, 1)), parse_sharding(source),
                        parse_sharding(target), 8)
    assert plan.collectives == ["collective-permute", "all-reduce"]
    assert plan.cost == 12
    spmd = check_equivalent(REALIGNED_SUM, 8)
    assert collectives(spmd) == [("collective-permute", [(1, 4)]),
                                 ("all-reduce", [[0, 1, 2, 3], [4, 5, 6, 7]])]
    x = np.array([[1.5], [-2.0]], dtype=np.float32)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), 2 * x)


def test_realigned_parts_are_summed_at_their_place_in_the_tile():
    """f32[3,4] in 16 row tiles needed in 2 row tiles (rows 0-1, row 2) held by 8 devices each:
    device 1's row 1 is the second part of target tile 0 and must land at its row 1; row 2
    moves from device 2 to device 8 (16 B). The sum of 2 rows over 8 (ring chunks of 1
    element: 2*8 - 1 - 1 = 14 elements, 56 B): 72 B from the busiest device, where the
    all-gather over eights sent 16 + 7 * 16 = 128."""
    source = "{devices=[16,1]<=[16]}"
    target = "{devices=[2,1,8]<=[16] last_tile_dim_replicate}"
    plan = plan_reshard(ArrayShape("f32", (3, 4)), parse_sharding(source),
                        parse_sharding(target), 16)
    assert plan.collectives == ["collective-permute", "all-reduce"]
    assert plan.cost == 72
    spmd = check_equivalent(_uneven("f32[3,4]", source, target, 16), 16)
    assert collectives(spmd) == [("collective-permute", [(2, 8)]),
                                 ("all-reduce", [list(range(8)), list(range(8, 16))])]
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    np.testing.assert_allclose(run_global(spmd, [x], 16), -np.exp(x), rtol=1e-6)


@needs_xla
def test_realigned_sum_sends_what_xla_sends():
    result = compared_with_xla(REALIGNED_SUM, 8)
    assert (result.our_busiest, result.our_bytes) == (result.xla_busiest, result.xla_bytes)
