"""No more collective bytes than XLA (issue 13) where an op's result is a tuple some of whose
elements nobody reads: such an element stays where the op computed it (nothing reshards it),
so a variadic reduce (an argmax) of a value on one device whose index nobody reads runs on
that device and broadcasts only its values, as XLA's partitioner does. Bytes per device by hand
from the cost model's formulas (`gspmdc.ir.cost`: a broadcast from one device is a select and a
ring all-reduce of B bytes over g devices, 2 (g-1)/g B per device); values against the
unpartitioned program; with the `[xla]` extra, against XLA's own partitioned program. Likewise
an instruction whose value never reaches the root: the reshard made for it goes with it, so
later users do not read it as one made anyway."""
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


#: fuzz/10100002785's slice (options on): a dead reshape asks for `p` replicated first
DEAD_FIRST_USER = """HloModule m, num_partitions=4

ENTRY e {
  p = s32[3,4,4,15] parameter(0), sharding={devices=[2,1,2,1]1,0,3,2}
  dead = s32[3,4,4,15] reshape(p), sharding={replicated}
  s = s32[3,4,1,15] slice(p), slice={[0:3], [0:4], [3:4], [0:15]}, sharding={devices=[2,1,2,1]1,0,3,2}
  ROOT t = (s32[3,4,4,15], s32[3,4,1,15]) tuple(p, s), sharding={{devices=[2,1,2,1]1,0,3,2}, {devices=[2,1,2,1]1,0,3,2}}
}
"""


def test_a_reshard_for_a_dead_user_is_not_shared_by_later_users():
    """`dead` (nothing reads it) gathers `p`; the slice, planned after it, read that gather as
    one made anyway and ran replicated on it (two all-gathers: 2,400 B per device). The gather
    goes with `dead`, so the slice keeps `p`'s tiling and the devices holding row 3 of dim 2
    send their [2,4,1,15] piece (480 B) to the other device of their pair: 240 B per device,
    as XLA's program."""
    spmd = check_equivalent(DEAD_FIRST_USER, 4)
    assert collectives(spmd) == [("collective-permute", [(0, 1), (2, 3)])]
    assert sent_bytes(spmd, 4) == 240


#: fuzz/10400000267's tail (options off, as XLA hands it on): `dead_on_one` and `dead_whole`
#: are planned before the root and ask for `s` on device 1 and `r` replicated
DEAD_USERS_FIRST = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[5,4] parameter(0)
  a = f32[5,4] abs(p)
  one = f32[] constant(1)
  b = f32[5,4] broadcast(one), dimensions={}
  s = f32[5,4] add(a, b)
  barrier = f32[5,4] custom-call(s), custom_call_target="ShardBarrierTo", custom_call_has_side_effect=true
  dead_on_one = f32[5,4] reshape(barrier), sharding={maximal device=1}
  r = f32[5,4] rsqrt(s), sharding={devices=[2,1]<=[2]}
  dead_whole = f32[5,4] reshape(r), sharding={replicated}
  ROOT t = (f32[5,4], f32[5,4]) tuple(barrier, r), sharding={{maximal device=1}, {replicated}}
}
"""


def test_a_live_user_does_not_take_a_dead_users_reshard():
    """`r` is a pure op of a replicated value: every partition computes it again whole for the
    root, no bytes (as XLA's program). `dead_whole` asked for `r` replicated first, when the
    whole `s` it would be computed from was had only through `dead_on_one`'s reshard (dead,
    so not offered), and got an all-gather; the root took that node from the cache (48 B per
    device). A dead user's reshards are now its own."""
    from gspmdc import api
    from gspmdc.passes.pipeline import compile_spmd
    spmd = compile_spmd(api.parse(DEAD_USERS_FIRST, "m"), 2)
    assert collectives(spmd) == []


@needs_xla
def test_no_more_bytes_than_xla_with_dead_users_first():
    compared_with_xla(DEAD_USERS_FIRST, 2)


@needs_xla
def test_no_more_bytes_than_xla_with_a_dead_user():
    compared_with_xla(DEAD_FIRST_USER, 4)
