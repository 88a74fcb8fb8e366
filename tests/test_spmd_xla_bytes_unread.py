"""No more collective bytes than XLA (issue 13) where an op's result is a tuple some of whose
elements nobody reads: such an element stays where the op computed it (nothing reshards it),
so a variadic reduce (an argmax) of a value on one device whose index nobody reads runs on
that device and broadcasts only its values, as XLA's partitioner does. Bytes per device by hand
from the cost model's formulas (`gspmdc.ir.cost`: a broadcast from one device is a select and a
ring all-reduce of B bytes over g devices, 2 (g-1)/g B per device); values against the
unpartitioned program; with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def _argmax(read: str) -> str:
    return f"""HloModule m, num_partitions=8

argmax {{
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  better = pred[] compare(a, b), direction=GT
  same = pred[] compare(a, b), direction=EQ
  first = pred[] compare(i, j), direction=LT
  tie = pred[] and(same, first)
  keep = pred[] or(better, tie)
  v = f32[] select(keep, a, b)
  k = s32[] select(keep, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}}

ENTRY e {{
  p = f32[2,9] parameter(0), sharding={{maximal device=7}}
  iota = s32[2,9] iota(), iota_dimension=0
  neg = f32[] constant(-inf)
  zero = s32[] constant(0)
  r = (f32[9], s32[9]) reduce(p, iota, neg, zero), dimensions={{0}}, to_apply=argmax,
    sharding={{{{replicated}}, {{replicated}}}}
  {read}
}}
"""


#: fuzz/9800000093 (seed 9800): only the values of the argmax are read
VALUES_ONLY = _argmax("ROOT v = f32[9] get-tuple-element(r), index=0, sharding={replicated}")

#: both elements read: the whole result is needed replicated
BOTH = _argmax("v = f32[9] get-tuple-element(r), index=0, sharding={replicated}\n"
               "  k = s32[9] get-tuple-element(r), index=1, sharding={replicated}\n"
               "  ROOT t = (f32[9], s32[9]) tuple(v, k), sharding={{replicated}, {replicated}}")


def test_a_reduce_on_one_device_broadcasts_only_the_elements_read():
    """Broadcasting `p` (f32[2,9], 72 B) costs 2 (8-1)/8 72 = 126 B per device, as does
    broadcasting the whole reduce result (f32[9] + s32[9], 72 B); reducing on device 7 and
    broadcasting only the values read (f32[9], 36 B) costs 2 (8-1)/8 36 = 63 B (XLA's bytes;
    126 B before, when the unread indices were priced as resharded too)."""
    spmd = check_equivalent(VALUES_ONLY, 8)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 8) == 63


def test_a_reduce_on_one_device_whose_elements_are_all_read_moves_the_same():
    """With both elements read, broadcasting the operand or the result moves 126 B per
    device either way."""
    spmd = check_equivalent(BOTH, 8)
    assert sent_bytes(spmd, 8) == 126


@needs_xla
@pytest.mark.parametrize("text", [VALUES_ONLY, BOTH], ids=["values-only", "both"])
def test_no_more_bytes_than_xla_for_a_reduce_on_one_device(text):
    compared_with_xla(text, 8)
