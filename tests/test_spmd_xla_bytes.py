"""No more collective bytes than XLA (issue 13, partitioner side): values had without
communication where XLA has them so (an optimization barrier keeping its sharding, a constant
materialised where it is needed, a value on one device that every partition computes, a value
of replicated inputs computed again whole, an op run on its operand's device), and the reshard
planner's cheaper gather order and tie-break. Bytes are worked out by hand from the cost model's
formulas (`gspmdc.ir.cost`: all-gather = (g-1) x the shard per device, all-reduce = ring chunks);
values against numpy or the unpartitioned program; with the `[xla]` extra, against XLA's own
partitioned program (skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard

from conformance.differential import collective_bytes
from conformance.oracle import xla_available
from hlo_text import reducer
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, run_global

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

OPT_BARRIER = """HloModule m, num_partitions=2

ENTRY main {
  p0 = f32[8,4] parameter(0), sharding={devices=[2,1]0,1}
  p1 = f64[7] parameter(1), sharding={replicated}
  t = (f32[8,4], f64[7]) tuple(p0, p1), sharding={{devices=[2,1]0,1}, {replicated}}
  ob = (f32[8,4], f64[7]) opt-barrier(t), sharding={{devices=[2,1]0,1}, {maximal device=0}}
  g = f32[8,4] get-tuple-element(ob), index=0, sharding={devices=[2,1]0,1}
  ROOT n = f32[8,4] negate(g), sharding={devices=[2,1]0,1}
}
"""


def test_opt_barrier_keeps_its_sharding():
    """The barrier's operand takes the barrier's own sharding (the tiled leaf as it is, the
    replicated one copied onto device 0): nothing is sent. Run replicated (the default action)
    it all-gathered the [8,4] leaf: 64 B per device."""
    spmd = check_equivalent(OPT_BARRIER, 2)
    assert collectives(spmd) == []
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    np.testing.assert_array_equal(run_global(spmd, [x, np.zeros(7)], 2), -x)


CONSTANT = """HloModule m, num_partitions=2

ENTRY main {
  c = s32[1] constant({7}), sharding={devices=[2]<=[2]}
  d = f32[5] constant({1, 2, 3, 4, 5}), sharding={devices=[2]<=[2]}
  e = f32[5] negate(d), sharding={devices=[2]<=[2]}
  ROOT t = (s32[1], f32[5], f32[5]) tuple(c, d, e), sharding={{replicated}, {replicated},
    {devices=[2]1,0}}
}
"""


def test_a_constant_is_materialised_where_it_is_needed():
    """Each partition has every constant whole: needed replicated it is used as it is, and the
    negate, needed in the other device order, is computed again from it (a local slice) instead
    of moving its 3-element shards (12 B per device)."""
    spmd = check_equivalent(CONSTANT, 2, inputs=[])
    assert collectives(spmd) == []
    c, d, e = run_global(spmd, [], 2)
    np.testing.assert_array_equal(c, [7])
    np.testing.assert_array_equal(d, [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(e, [-1, -2, -3, -4, -5])


EVERYWHERE = """HloModule m, num_partitions=4

ENTRY main {
  a = u16[] parameter(0), sharding={replicated}
  b = u16[] parameter(1), sharding={replicated}
  p = u16[] power(a, b), sharding={maximal device=3}
  s = u16[] shift-right-arithmetic(p, b), sharding={maximal device=0}
  x = f32[8] parameter(2), sharding={replicated}
  e = f32[8] exponential(x), sharding={maximal device=1}
  ROOT t = (u16[], f32[8]) tuple(s, e), sharding={{replicated}, {devices=[4]<=[4]}}
}
"""


def test_a_value_on_one_device_computed_everywhere_moves_for_free():
    """`p`, `s` and `e` are pure ops of replicated values: every partition computes them whole,
    so moving them to another device or to all of them is a copy. Otherwise: a 2-byte permute
    from device 3 to 0, a broadcast of `s` (all-reduce of 1 element over 4: ring chunks
    (1,0,0,0), at most 2 elements = 4 B) and of `e` (8 elements: at most 2*8 - 2 - 2 = 12
    elements = 48 B)."""
    spmd = check_equivalent(EVERYWHERE, 4)
    assert collectives(spmd) == []
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    s, e = run_global(spmd, [np.uint16(3), np.uint16(2), x], 4)
    assert s == (3 ** 2) >> 2
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)


ON_ONE_DEVICE_THEN_EVERYWHERE = """HloModule m, num_partitions=2

ENTRY main {
  p = f32[4] parameter(0), sharding={maximal device=0}
  s = f32[2] slice(p), slice={[1:3]}
  n = f32[2] negate(s), sharding={maximal device=1}
  ROOT c = f32[2] copy(n)
}
"""


def test_a_value_broadcast_from_one_device_stays_broadcast():
    """`s` runs on device 0 (its operand's) and is broadcast to be replicated; `n` then runs
    whole on every partition, so its move to all of them is a copy. The broadcast must stay:
    replaced by a direct permute from device 0 to 1, partition 0 would negate zeros (the
    program returned -0.0 there)."""
    spmd = check_equivalent(ON_ONE_DEVICE_THEN_EVERYWHERE, 2, propagate=True)
    p = np.array([0.5, -0.25, 0.75, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(run_global(spmd, [p], 2), -p[1:3])


REDUCE_ON_DEVICE = """HloModule m, num_partitions=4

""" + reducer("add") + """
ENTRY main {
  x = f32[2,5,7,7] parameter(0), sharding={maximal device=1}
  z = f32[] constant(0)
  ROOT r = f32[2,7] reduce(x, z), dimensions={1,3}, to_apply=add, sharding={devices=[2,2]<=[4]}
}
"""


def test_a_reduce_of_a_value_on_one_device_runs_there():
    """Reducing on device 1 and broadcasting the 14-element result: one all-reduce (ring
    chunks (4,4,3,3): device r sends 28 - c[r] - c[r+1] elements, at most 22 = 88 B) instead
    of broadcasting the 490-element input (at most 2*490 - 2*122 = 736 elements = 2944 B)."""
    spmd = check_equivalent(REDUCE_ON_DEVICE, 4)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert collective_bytes(_text(spmd), 4) <= 88
    x = np.arange(490, dtype=np.float32).reshape(2, 5, 7, 7) / 100
    np.testing.assert_allclose(run_global(spmd, [x], 4), x.sum(axis=(1, 3)), rtol=1e-5)


RECOMPUTED = """HloModule m, num_partitions=3

""" + reducer("add", element_type="s32") + """
ENTRY main {
  x = s32[16,2] parameter(0), sharding={replicated}
  z = s32[] constant(0)
  r = s32[16] reduce(x, z), dimensions={1}, to_apply=add, sharding={devices=[3]<=[3]}
  ROOT n = s32[16] negate(r), sharding={replicated}
}
"""


def test_a_tiled_value_of_replicated_inputs_is_computed_again_whole():
    """The row sums, tiled 3 ways (6 padded elements each), needed replicated: computed whole
    from the replicated input on every partition instead of an all-gather (2 x 24 B per
    device)."""
    spmd = check_equivalent(RECOMPUTED, 3)
    assert collectives(spmd) == []
    x = np.arange(32, dtype=np.int32).reshape(16, 2)
    np.testing.assert_array_equal(run_global(spmd, [x], 3), -x.sum(axis=1))


#: fuzz/11600000871 [on], shrunk: a select-and-scatter annotated in 2x2 tiles (devices
#: 2,1,3,0) of an operand two pure ops above an iota, tiled 2x2 (devices 0..3).
TWO_LEVELS = """HloModule m, num_partitions=4

le {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LE
}

""" + reducer("add") + """
ENTRY main {
  i = f32[4,5] iota(), iota_dimension=1, sharding={devices=[2,2]<=[4]}
  r = f32[4,5] sine(i), sharding={devices=[2,2]<=[4]}
  x = f32[4,5] multiply(r, r), sharding={devices=[2,2]<=[4]}
  y = f32[4,5] negate(x), sharding={devices=[2,2]<=[4]}
  s = f32[4,2] parameter(0), sharding={replicated}
  z = f32[] constant(0)
  ROOT o = f32[4,5] select-and-scatter(x, s, z), window={size=2x2 stride=1x3 pad=1_0x2_0}, select=le, scatter=add, sharding={devices=[2,2]2,1,3,0}
}
"""


def test_values_two_pure_ops_above_free_leaves_are_priced_free():
    """`r` (the sine of an iota) is computed again whole from the iota, `x` (r * r) from `r`
    computed whole: the op rules count `x`'s reshards free, as insert-reshards has them
    (`_replicated_source` takes `r`, one level); `y`, a third op up, is not."""
    from gspmdc import api
    from gspmdc.passes.spmd.op_rules import recomputed_for_free
    values = {i.name: i for i in api.parse(TWO_LEVELS).entry.instructions}
    assert recomputed_for_free(values["r"]) and recomputed_for_free(values["r"], deep=False)
    assert recomputed_for_free(values["x"]) and not recomputed_for_free(values["x"], deep=False)
    assert not recomputed_for_free(values["y"])


def test_an_op_of_values_computed_again_whole_runs_replicated_for_free():
    """Every partition computes `x` whole (iota, sine, multiply), runs the select-and-scatter
    on it and the replicated source, and keeps its own tile of the result: no collective.
    Priced with an all-gather of `x`, the tiled windows won, sending 68 B of halos."""
    spmd = check_equivalent(TWO_LEVELS, 4)
    assert collectives(spmd) == []

def test_gathers_that_barely_grow_the_shard_go_first():
    """s32[2,1,2] in [2,2,2] tiles to replicated: dim 1 (size 1, split 2 ways) gathered first
    while the shard is one element: 4 B, then dim 2 (4 B), then dim 0 (the [1,1,2] shard: 8 B)
    = 16 B per device; in reverse dim order dim 1 would gather the [1,1,2] shard (8 B): 20 B."""
    plan = plan_reshard(ArrayShape("s32", (2, 1, 2)), parse_sharding("{devices=[2,2,2]<=[8]}"),
                        parse_sharding("{replicated}"), 8)
    assert [s.describe() for s in plan.steps] == [
        "all-gather dim 1 over groups of 2", "all-gather dim 2 over groups of 2",
        "all-gather dim 0 over groups of 2"]
    assert plan.cost == 16
    text = ("HloModule m, num_partitions=8\n\nENTRY e {\n"
            "  p = s32[2,1,2] parameter(0), sharding={devices=[2,2,2]<=[8]}\n"
            "  ROOT n = s32[2,1,2] negate(p), sharding={replicated}\n}\n")
    spmd = check_equivalent(text, 8)
    x = np.arange(4, dtype=np.int32).reshape(2, 1, 2)
    np.testing.assert_array_equal(run_global(spmd, [x], 8), -x)


def test_equal_busiest_device_plans_go_by_all_devices_bytes():
    """s32[1] in 3 tiles (2 of them padding), each held twice, to replicated: the all-gather
    has every device send its 4-byte shard to 2 others (8 B each, 48 B in all); the masked
    gather is an all-reduce of 1 element per group of 3 (ring chunks (1,0,0): devices send 1,
    2, 1 elements: at most 8 B too, 32 B in all). The busiest device sends the same, so the
    masked gather wins on the total."""
    plan = plan_reshard(ArrayShape("s32", (1,)),
                        parse_sharding("{devices=[3,2]<=[6] last_tile_dim_replicate}"),
                        parse_sharding("{replicated}"), 6)
    assert plan.collectives == ["all-reduce"] and plan.cost == 8


#: fuzz/9800001683's placement annotation of a tiled value
PINNED = """HloModule m, num_partitions=4

ENTRY main {
  p = f32[3,8] parameter(0), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  pin = f32[3,8] custom-call(p), custom_call_target="PinToDevice"
  host = f32[3,8] custom-call(pin), custom_call_target="MoveToHost", sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  ROOT dev = f32[3,8] custom-call(host), custom_call_target="MoveToDevice", sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
}
"""


@pytest.mark.parametrize("target", ["PinToDevice", "MoveToHost", "MoveToDevice"])
def test_placement_annotations_keep_a_tiled_operand(target):
    """A memory-placement custom-call passes its operand through: partitioned like an
    elementwise op, it runs on each partition's [3,4] tile and nothing is sent (XLA's
    partitioned program for fuzz/9800001683 sends 0 B: `PinToDevice` on the operand's tile;
    XLA's CPU runtime has no kernel for these calls, so the oracle cannot run them). Before, it ran on its operand gathered whole (3 x 4 x 4 = 48 B per
    device) and sliced its result back."""
    text = PINNED.replace('"PinToDevice"', f'"{target}"')
    spmd = check_equivalent(text, 4)
    assert collectives(spmd) == []
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)


def _text(module) -> str:
    from gspmdc import api
    return api.to_text(module)


@needs_xla
@pytest.mark.parametrize("text,n", [(OPT_BARRIER, 2), (CONSTANT, 2), (EVERYWHERE, 4),
                                    (REDUCE_ON_DEVICE, 4), (RECOMPUTED, 3)],
                         ids=["opt-barrier", "constant", "everywhere", "on-device", "recomputed"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module (its own propagation from the same annotations): gspmdc
    sends no more bytes per device, and both programs compute the reference's values."""
    compared_with_xla(text, n)

