"""Values known uniform along some dims (`passes/spmd/uniform_dims.py`) are resharded through
their first element along those dims (`reshard_uniform.py`): XLA's partitioner copies a
broadcast between two device orders without a collective-permute, and so does gspmdc, for
any value the analysis proves uniform, a manual region's result included when its local
value is the same on every device. Uniform dims are checked by hand on small programs; bytes
are worked out by hand from the cost model (a collective-permute counts its senders' shards;
`sent_bytes` is the mean per device); values against numpy; with the `[xla]` extra, against
XLA's own partitioned program (skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.spmd.uniform_dims import UniformDims

from conformance.oracle import xla_available
from spmd_partition_helpers import (
    check_equivalent, collectives, inputs_for, partition, run_global, sent_bytes,
)

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

GLOBAL = """HloModule g, num_partitions=2

ENTRY main {
  p = f32[4,6] parameter(0)
  b = f32[3,4,6] broadcast(p), dimensions={1,2}
  c = f32[] constant(2)
  bc = f32[3,4,6] broadcast(c), dimensions={}
  m = f32[3,4,6] multiply(b, bc)
  t = f32[6,3,4] transpose(m), dimensions={2,0,1}
  r = f32[3,24] reshape(m)
  rc = f32[2,36] reshape(bc)
  i = s32[3,4] iota(), iota_dimension=1
  s = f32[2,4,6] slice(bc), slice={[0:2], [0:4], [0:6]}
  z = f32[] constant(0)
  pd = f32[3,5,6] pad(bc, z), padding=0_0x1_0x0_0
  k = f32[4,6] constant({{1,1,1,1,1,1},{2,2,2,2,2,2},{3,3,3,3,3,3},{4,4,4,4,4,4}})
  e = f32[3,4,6] exponential(b)
  ROOT tu = (f32[6,3,4], f32[3,24], f32[2,36], s32[3,4], f32[2,4,6], f32[3,5,6], f32[4,6], f32[3,4,6]) tuple(t, r, rc, i, s, pd, k, e)
}
"""


def test_uniform_dims_follow_broadcasts_through_pure_ops():
    """A broadcast adds uniform dims, a splat constant's broadcast is uniform along every dim,
    an elementwise op keeps the dims all its operands share, a transpose moves them, a reshape
    keeps a run of dims whose operand dims are all uniform, a slice keeps them, a pad drops
    the dims it pads, an iota is uniform off its iota dimension; a non-splat constant and a
    parameter know none."""
    uniform = UniformDims()
    entry = api.parse(GLOBAL).entry
    got = {inst.name: sorted(uniform(inst)) for inst in entry.instructions if uniform(inst)}
    assert got == {"b": [0], "bc": [0, 1, 2], "m": [0], "t": [1], "r": [0], "rc": [0, 1],
                   "i": [0], "s": [0, 1, 2], "pd": [0, 2], "e": [0]}


BROADCAST_ORDERS = """HloModule b, num_partitions=4

ENTRY main {
  p = f32[8] parameter(0), sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  q = f32[8,6] parameter(1), sharding={devices=[2,2]0,1,2,3}
  b = f32[8,6] broadcast(p), dimensions={0}, sharding={devices=[2,2]0,1,2,3}
  e = f32[8,6] exponential(b), sharding={devices=[2,2]0,1,2,3}
  m = f32[8,6] multiply(e, q), sharding={devices=[2,2]0,1,2,3}
  ROOT t = (f32[8,6], f32[8,6]) tuple(e, m), sharding={{devices=[2,2]0,1,3,2}, {devices=[2,2]0,1,2,3}}
}
"""


def test_a_broadcast_in_another_device_order_of_its_new_dim_moves_nothing():
    """`e` (an exponential of a broadcast along dim 1) goes to an order where devices 2 and 3
    swap their dim-1 tiles: a collective-permute of the f32[4,3] shard from 2 of the 4 devices
    (24 B per device) before; its elements are the same along dim 1, so each device keeps its
    own column: no collective, as XLA's partitioner copies it."""
    spmd = check_equivalent(BROADCAST_ORDERS, 4)
    assert collectives(spmd) == []
    assert sent_bytes(spmd, 4) == 0


def manual_region(scalar: str) -> str:
    """A manual region adding `scalar` (an instruction text, inside the region) to a broadcast
    constant entering it in a device order {0,2,1,3} of 4 column tiles; the result leaves in
    that order and is read in the iota order."""
    return f"""HloModule region, num_partitions=4

ENTRY main {{
  one = f32[] constant(1)
  b = f32[4,8] broadcast(one), dimensions={{}}
  in = f32[4,8] custom-call(b), custom_call_target="Sharding", sharding={{devices=[1,4]0,2,1,3}}
  local = f32[4,2] custom-call(in), custom_call_target="SPMDFullToShardShape", sharding={{manual}}
  {scalar}
  s = f32[4,2] broadcast(x), dimensions={{}}, sharding={{manual}}
  a = f32[4,2] add(local, s), sharding={{manual}}
  out = f32[4,8] custom-call(a), custom_call_target="SPMDShardToFullShape", sharding={{devices=[1,4]0,2,1,3}}
  p = f32[3] parameter(0), sharding={{replicated}}
  ROOT t = (f32[3], f32[4,8]) tuple(p, out), sharding={{{{replicated}}, {{devices=[1,4]<=[4]}}}}
}}
"""


SAME_EVERYWHERE = manual_region("x = f32[] constant(2), sharding={manual}")
PER_DEVICE = manual_region("id = u32[] partition-id(), sharding={manual}\n"
                           "  x = f32[] convert(id), sharding={manual}")


def test_a_manual_region_of_constants_leaves_uniform():
    """The region's value is 1 + 2 on every device: read in another device order it needs no
    collective (before: a collective-permute of the f32[4,2] shard from devices 1 and 2, 16 B
    per device), as XLA copies it."""
    spmd = partition(SAME_EVERYWHERE, 4)
    x = np.arange(3, dtype=np.float32)
    got_p, got = run_global(spmd, [x], 4)
    np.testing.assert_array_equal(got_p, x)
    np.testing.assert_array_equal(got, np.full((4, 8), 3, np.float32))
    assert collectives(spmd) == [] and sent_bytes(spmd, 4) == 0


def test_a_manual_region_of_per_device_values_keeps_its_permute():
    """Each device adds its partition id: the local values are uniform, but differ between
    devices, so leaving the region the value is uniform along dim 0 only (its column tiles come
    from different devices). The permute moves one row of each shard, f32[1,2] from devices 1
    and 2 (4 B per device, before 16 B) and the columns land where they belong: tile k holds 1 +
    the id of the device that computed it, {0,2,1,3}[k]. (XLA's partitioner, which tracks
    the local broadcast alone, copies the value here and its program's columns are in the
    wrong order.)"""
    spmd = partition(PER_DEVICE, 4)
    _, got = run_global(spmd, [np.zeros(3, np.float32)], 4)
    want = np.repeat(1 + np.array([0, 2, 1, 3], np.float32), 2)[None, :].repeat(4, axis=0)
    np.testing.assert_array_equal(got, want)
    assert collectives(spmd) == [("collective-permute", [(0, 0), (1, 2), (2, 1), (3, 3)])]
    assert sent_bytes(spmd, 4) == 4


def uneven_region(body: str, leave: str) -> str:
    """A manual region entered from a broadcast constant `f32[7,2]` whose 7 rows are cut in two
    tiles (4 real rows, then 3 and a row of padding) by devices {0,1} and {2,3}; `body` computes
    `a` from the local value `local`; the result leaves in the sharding `leave` and is read with
    the two row tiles swapped between the device pairs."""
    return f"""HloModule uneven_region, num_partitions=4

ENTRY main {{
  one = f32[] constant(1)
  b = f32[7,2] broadcast(one), dimensions={{}}
  in = f32[7,2] custom-call(b), custom_call_target="Sharding", sharding={{devices=[2,1,2]<=[4] last_tile_dim_replicate}}
  local = f32[4,2] custom-call(in), custom_call_target="SPMDFullToShardShape", sharding={{manual}}
  {body}
  out = f32[7,2] custom-call(a), custom_call_target="SPMDShardToFullShape", sharding={leave}
  p = f32[3] parameter(0), sharding={{replicated}}
  ROOT t = (f32[3], f32[7,2]) tuple(p, out), sharding={{{{replicated}}, {{devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}}}}
}}
"""


ENTERED = "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"
HALF_CEIL = ("h = f32[] constant(0.5), sharding={manual}\n"
             "  hb = f32[4,2] broadcast(h), dimensions={}, sharding={manual}\n"
             "  s = f32[4,2] add(local, hb), sharding={manual}\n"
             "  a = f32[4,2] ceil(s), sharding={manual}")
UNEVEN_REGION = uneven_region(HALF_CEIL, ENTERED)


@pytest.mark.parametrize("body, leave, dims", [
    (HALF_CEIL, ENTERED, [0, 1]),
    ("a = f32[4,2] reverse(local), dimensions={0}, sharding={manual}", ENTERED, [1]),
    (HALF_CEIL, "{devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}", [1]),
    (HALF_CEIL, "{devices=[2,1,2]1,0,3,2 last_tile_dim_replicate}", [0, 1]),
], ids=["elementwise", "reverse", "other-layout", "replicas-reordered"])
def test_a_region_entered_unevenly_keeps_the_real_elements_uniform(body, leave, dims):
    """Entering the region, the device pair holding the last row tile has a row of padding
    (unspecified values): no local value is uniform along the rows. Computed element by
    element and leaving in the layout it entered in (replicas in any order), the real elements
    are the entering broadcast's, so the result is uniform along both dims; a `reverse` moves
    padding into real rows, and leaving with the row tiles on other devices puts that padding
    row among the real ones: uniform along the columns only."""
    entry = api.parse(uneven_region(body, leave)).entry
    out = next(i for i in entry.instructions if i.name == "out")
    assert sorted(UniformDims()(out)) == dims


def test_a_region_entered_unevenly_reads_in_another_order_without_a_collective():
    """The region's result is ceil(1 + 0.5) = 2 in every real element; read with the row tiles
    swapped it needs no collective (before: a collective-permute of the first column of every
    f32[4,2] shard, f32[4,1], 16 B from each device), as XLA copies it."""
    spmd = partition(UNEVEN_REGION, 4)
    x = np.arange(3, dtype=np.float32)
    got_p, got = run_global(spmd, [x], 4)
    np.testing.assert_array_equal(got_p, x)
    np.testing.assert_array_equal(got, np.full((7, 2), 2, np.float32))
    assert collectives(spmd) == [] and sent_bytes(spmd, 4) == 0


UNEVEN = """HloModule u, num_partitions=4

ENTRY main {
  p = f32[3] parameter(0), sharding={devices=[4]<=[4]}
  b = f32[3,6] broadcast(p), dimensions={0}, sharding={devices=[4,1]<=[4]}
  n = f32[3,6] negate(b), sharding={devices=[4,1]<=[4]}
  ROOT t = (f32[3,6]) tuple(n), sharding={{devices=[4,1]0,2,1,3}}
}
"""

SHORT_UNEVEN = """HloModule s, num_partitions=4

ENTRY main {
  c = f32[] parameter(0), sharding={replicated}
  b = f32[3,5] broadcast(c), dimensions={}, sharding={devices=[4,1]<=[4]}
  n = f32[3,5] negate(b), sharding={devices=[4,1]<=[4]}
  ROOT t = (f32[3,5]) tuple(n), sharding={{devices=[1,4]<=[4]}}
}
"""


@pytest.mark.parametrize("text", [UNEVEN, SHORT_UNEVEN], ids=["uneven", "short"])
def test_uniform_dims_with_padded_tiles_keep_real_values(text):
    """A dim tiled 4 ways over 3 rows leaves the last tile all padding: its device has no
    real element to broadcast from, so that dim is not taken through its first element (the
    values, with garbage in the padding, still match numpy)."""
    check_equivalent(text, 4, inputs=inputs_for(text, 1))


@needs_xla
def test_manual_region_of_constants_against_xla():
    """XLA's program for the region of constants sends nothing either; both programs give the
    value of the program without the region's boundaries."""
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    reference = SAME_EVERYWHERE.replace(
        'custom-call(in), custom_call_target="SPMDFullToShardShape", sharding={manual}',
        "copy(in)").replace(
        'custom-call(a), custom_call_target="SPMDShardToFullShape", sharding={devices=[1,4]0,2,1,3}',
        "copy(a)").replace("f32[4,2]", "f32[4,8]").replace(", sharding={manual}", "")
    with XlaOracle() as xla:
        result = run_case(Case("uniform", SAME_EVERYWHERE, 4, reference_text=reference), xla)
    assert result.status == "compared", result.detail
    assert result.our_bytes == result.xla_bytes == 0
    assert result.values == "compared" and not result.value_mismatch, result.value_mismatch


@needs_xla
def test_region_entered_unevenly_against_xla():
    """XLA's program for the unevenly entered region sends nothing either, with the same
    values."""
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    reference = UNEVEN_REGION.replace(
        'custom-call(in), custom_call_target="SPMDFullToShardShape", sharding={manual}',
        "copy(in)").replace(
        f'custom-call(a), custom_call_target="SPMDShardToFullShape", sharding={ENTERED}',
        "copy(a)").replace("f32[4,2]", "f32[7,2]").replace(", sharding={manual}", "")
    with XlaOracle() as xla:
        result = run_case(Case("uneven", UNEVEN_REGION, 4, reference_text=reference), xla)
    assert result.status == "compared", result.detail
    assert result.our_bytes == result.xla_bytes == 0
    assert result.values == "compared" and not result.value_mismatch, result.value_mismatch


def _per_device(spmd, n: int) -> np.ndarray:
    from gspmdc.passes.spmd.traffic import collective_traffic
    sent = np.zeros(n)
    for t in collective_traffic(spmd, n):
        sent += np.asarray(t.traffic.sent, dtype=float) * t.executions
    return sent


@pytest.mark.parametrize("module", [10900002953, 10900000013, 11100001923, 11100000202,
                                    14657000213, 15100000332])
def test_generated_modules_send_less_on_no_device_more(module, monkeypatch):
    """Generated modules whose reshards take the new form (a manual region of constants; a
    pure function of constants gathered for the output; ...): every device sends no more than
    with the whole values resharded, some device less, and the values are the unpartitioned
    program's."""
    import fuzz
    from gspmdc.passes.spmd import op_rules_data
    case = fuzz.case(module)
    n = case.num_partitions
    spmd = partition(case.text, n, propagate=True)
    inputs = inputs_for(case.text)
    want = api.evaluate(api.parse(case.reference_text or case.text), inputs)
    for got_leaf, want_leaf in zip(run_global(spmd, inputs, n), want):
        kind = complex if np.iscomplexobj(want_leaf) else float
        np.testing.assert_allclose(np.asarray(got_leaf).astype(kind),
                                   np.asarray(want_leaf).astype(kind), rtol=1e-3, atol=1e-3)
    monkeypatch.setattr(op_rules_data, "plan_uniform", lambda *args: None)
    whole = _per_device(partition(case.text, n, propagate=True), n)
    through = _per_device(spmd, n)
    assert (through <= whole).all() and (through < whole).any(), (through, whole)
