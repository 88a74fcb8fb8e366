"""No more collective bytes than XLA (issue 13) where one reshard can serve several users:
insert-reshards prices an operand reshard that a user not planned yet also reads as shared (its
bytes are moved anyway), and a value on one device reaches other partitions through one
broadcast node (select + all-reduce, as XLA's reshard of a single-device value replicates it
first) from which every other sharding is sliced. Bytes per device by hand from the cost
model's formulas (`gspmdc.ir.cost`: an all-gather sends each device's shard to the g-1 others,
a ring all-reduce of B bytes over g devices sends 2 (g-1)/g B); values against the
unpartitioned program; with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from gspmdc import api
from gspmdc.passes.spmd.traffic import collective_traffic

from conformance.differential import Case, run_case
from conformance.oracle import xla_available

from filecheck import check, directives
from spmd_partition_helpers import check_equivalent, collectives

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def _sent(spmd, n: int) -> float:
    return float(sum(t.total_sent_bytes for t in collective_traffic(spmd, n)))


GATHERED_FOR_TWO = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[2,5,6] parameter(0), sharding={devices=[1,1,2]0,1}
  u = f32[2,5,4] parameter(1), sharding={replicated}
  i = s32[] parameter(2), sharding={replicated}
  z = s32[] constant(0), sharding={replicated}
  d = f32[2,5,6] dynamic-update-slice(p, u, z, z, i), sharding={replicated}
  ROOT t = (f32[2,5,6], f32[2,5,6]) tuple(p, d), sharding={{replicated}, {replicated}}
}
"""


def test_an_operand_gathered_for_a_later_user_too_is_gathered_once():
    """`d` can write its update into the tiled `p` and gather its result (120 B), or gather
    `p` (120 B) and write replicated; the root needs `p` gathered anyway, so the second plan
    shares that one all-gather: each device sends its f32[2,5,3] shard once, 120 B (XLA's
    bytes; two gathers, 240 B, before)."""
    spmd = check_equivalent(GATHERED_FOR_TWO, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]
    assert _sent(spmd, 2) == 2 * 5 * 3 * 4


ONE_DEVICE_FOR_THREE = """HloModule m, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[6,4] parameter(0), sharding={maximal device=0}
  a = f32[6,4] negate(p), sharding={devices=[2,1]0,1}
  b = f32[6,4] abs(p), sharding={devices=[1,2]0,1}
  zero = f32[] constant(0), sharding={replicated}
  r = f32[4] reduce(p, zero), dimensions={0}, to_apply=add, sharding={replicated}
  ROOT t = (f32[6,4], f32[6,4], f32[4]) tuple(a, b, r),
    sharding={{devices=[2,1]0,1}, {devices=[1,2]0,1}, {replicated}}
}
"""


def test_a_value_on_one_device_is_broadcast_once_for_every_other_sharding():
    """`p` lives on device 0 and is read row-tiled, column-tiled and replicated: one
    broadcast (select + all-reduce of its 96 B: 2 (2-1)/2 96 = 96 B per device) serves all
    three, each tiling sliced from it, and the reduce reads it replicated instead of running
    on device 0 and broadcasting its result (before: two broadcasts)."""
    spmd = check_equivalent(ONE_DEVICE_FOR_THREE, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert _sent(spmd, 2) == 96
    check(api.to_text(spmd), directives("""
    // CHECK: all-reduce({{.*}}spmd_value="p" {{.*}}spmd_to="{replicated}"
    // CHECK-NOT: all-reduce(
    // CHECK: ROOT %t
    """))


@needs_xla
@pytest.mark.parametrize("text,n", [(GATHERED_FOR_TWO, 2), (ONE_DEVICE_FOR_THREE, 2)],
                         ids=["gathered-for-two", "one-device-for-three"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both
    programs compute the reference's values."""
    from conformance.oracle import XlaOracle
    with XlaOracle() as xla:
        result = run_case(Case("bytes", text, n), xla)
    assert result.status == "compared", result.detail
    assert result.our_bytes <= result.xla_bytes, (result.our_bytes, result.xla_bytes)
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
