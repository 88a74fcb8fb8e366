"""No more collective bytes than XLA (issue 13) where a dead instruction (one whose value does
not reach the root) and a live one read the same value: insert-reshards plans the dead one too,
but the reshards made only for it are removed with it, so a live user taking one pays its
bytes (they are not "had" for free), and takes it only where that moves no more bytes than its
own reshard (while a value's replicated reshard that a live user reads is had whole for
free). Bytes per device (the mean over the devices, `sent_bytes`), by hand from the cost
model's formulas (`gspmdc.ir.cost`: an all-gather sends each device's shard to the g-1 others;
a collective-permute sends each moving shard once); values against the unpartitioned program;
with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available

from gspmdc.passes.spmd.traffic import sent_per_device

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


GATHERED_FOR_A_DEAD_RESHAPE = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[8,2] parameter(0), sharding={devices=[2,1]0,1}
  dead = f32[8,2] reshape(p), sharding={replicated}
  c = f32[] constant(0), sharding={replicated}
  ROOT r = f32[8,2] pad(p, c), padding=1_-1x0_0, sharding={devices=[2,1]0,1}
}
"""


def test_a_gather_made_for_a_dead_user_is_not_read_for_free():
    """`dead` reads `p` replicated (an all-gather, 32 B from each device) and nothing reads
    `dead`. The pad shifts `p` down one row: tiled, device 0 sends its last row (f32[1,2],
    8 B) to device 1, 4 B per device. Before, the pad counted the dead reshape's gather as paid
    and padded the replicated `p` (32 B per device, kept alive by the pad; fuzz/10900001414's
    select-and-scatter, 1,344 B where 132 do)."""
    spmd = check_equivalent(GATHERED_FOR_A_DEAD_RESHAPE, 2)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"]
    assert sent_bytes(spmd, 2) == 8 / 2


GATHERED_ONTO_A_DEVICE_FOR_A_DEAD_RESHAPE = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[4]0,1,2,3}
  dead = f32[8] reshape(p), sharding={maximal device=1}
  a = f32[8] negate(p), sharding={devices=[4]0,1,2,3}
  ROOT r = f32[8] abs(a), sharding={devices=[4]1,0,3,2}
}
"""


def test_a_value_gathered_onto_a_device_for_a_dead_user_is_not_recomputed_from_for_free():
    """`dead` gathers `p` onto device 1, which gives every device the whole `p` (an
    all-gather, 8 B from each device to 3 others: 24 B per device). The root reads `a` in
    another device order: a collective-permute of each device's f32[2], 8 B per device.
    Before, `a` was computed again whole from the dead reshape's gather, which it kept alive
    (fuzz/10900000546, 13.3 B per device where 2 do)."""
    spmd = check_equivalent(GATHERED_ONTO_A_DEVICE_FOR_A_DEAD_RESHAPE, 4)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"]
    assert sent_bytes(spmd, 4) == 2 * 4


TAKEN_WHERE_CHEAPER = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[2,2] parameter(0), sharding={devices=[2,1]0,1}
  dead = f32[2,2] reshape(p), sharding={maximal device=1}
  c = f32[] constant(0), sharding={replicated}
  q = f32[8,8] pad(p, c), padding=3_3x3_3, sharding={devices=[2,1]0,1}
  r = f32[8,16] concatenate(q, q), dimensions={1}, sharding={devices=[2,1]0,1}
  ROOT s = f32[8,16] negate(r), sharding={replicated}
}
"""


def test_a_gather_made_for_a_dead_user_is_taken_where_it_moves_fewer_bytes():
    """`q` is planned tiled (its one user's plan, made ahead, reads it so), then the
    concatenate, whose result the root reads whole, reads `q` replicated. The dead reshape
    gathered `p` on every device (each sends its f32[1,2], 8 B); computing `q` again whole from
    that costs those 8 B, fewer than gathering `q` (each device's f32[4,8], 128 B), so the
    concatenate takes it (without the dead reshape the program gathers `q`)."""
    spmd = check_equivalent(TAKEN_WHERE_CHEAPER, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]
    assert sent_bytes(spmd, 2) == 1 * 2 * 4
    without = check_equivalent(TAKEN_WHERE_CHEAPER.replace(
        "  dead = f32[2,2] reshape(p), sharding={maximal device=1}\n", ""), 2)
    assert sent_bytes(without, 2) == 4 * 8 * 4


FROM_A_LIVE_GATHER = """HloModule m, num_partitions=2

lt {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT c = pred[] compare(x, y), direction=LT
}

ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[2,1]0,1}
  s = f32[8,8] sort(p), dimensions={0}, to_apply=lt, sharding={replicated}
  a = f32[8,8] negate(p), sharding={devices=[2,1]0,1}
  b = f32[8,16] concatenate(a, a), dimensions={1}, sharding={devices=[2,1]0,1}
  ROOT t = (f32[8,8], f32[8,16]) tuple(s, b), sharding={{replicated}, {replicated}}
}
"""


def test_a_pure_op_is_computed_again_from_the_gather_a_live_user_reads():
    """The sort gathers `p` (each device sends its f32[4,8], 128 B). The concatenate, read whole
    by the root, reads `a` replicated: `a` is computed again whole from that gather (a live
    user's reshard, paid anyway) instead of gathered itself (another 128 B per device)."""
    spmd = check_equivalent(FROM_A_LIVE_GATHER, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]
    assert sent_bytes(spmd, 2) == 4 * 8 * 4


BROADCAST_FOR_A_DEAD_USER_AND_A_LATER_ONE = """HloModule m, num_partitions=2

ENTRY e {
  p = c64[4,4] parameter(0), sharding={maximal device=1}
  dead = c64[4,4] negate(p), sharding={devices=[2,1]0,1}
  i = f32[4,4] imag(p), sharding={replicated}
  ROOT t = (f32[4,4], c64[4,4]) tuple(i, p), sharding={{replicated}, {devices=[2,1]0,1}}
}
"""


def test_a_broadcast_made_for_a_dead_user_that_a_later_user_reads_too_is_read_for_free():
    """`dead` broadcasts `p` from device 1 first (select + all-reduce of its 128 B: 2 (2-1)/2
    128 = 128 B per device), then slices its rows. The root reads `p` in those rows too, so
    the broadcast is made anyway: `imag` reads it whole for free. Before, `imag` took that
    broadcast as made for the dead user only, ran on device 1 and broadcast its f32[4,4]
    result as well (another 64 B per device; fuzz/12500002542 off, where XLA's import leaves
    the root's annotation as such a dead reshape: 2,884 B per device to XLA's 1,930)."""
    spmd = check_equivalent(BROADCAST_FOR_A_DEAD_USER_AND_A_LATER_ONE, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert list(sent_per_device(spmd, 2)) == [128, 128]


READ_ONLY_BY_GET_DIMENSION_SIZE = """HloModule m, num_partitions=2

ENTRY e {
  p = c64[4,4] parameter(0), sharding={maximal device=1}
  a = f32[4,4] imag(p), sharding={devices=[2,1]0,1}
  n = s32[] get-dimension-size(a), dimensions={0}, sharding={replicated}
  b = f32[4,4] imag(p), sharding={replicated}
  ROOT t = (s32[], f32[4,4]) tuple(n, b), sharding={{replicated}, {replicated}}
}
"""


def test_a_value_only_get_dimension_size_reads_is_dead():
    """`get-dimension-size` reads only the shape of `a` (partitioned, it is the constant 4), so
    `a` is dead and `p`'s broadcast is not made for it: `b` runs on device 1 and broadcasts its
    f32[4,4] result (64 B per device). Taken as live, `a` read `p` from its broadcast (c64,
    128 B per device), which `b` then read as well (fuzz/11600000153 off)."""
    spmd = check_equivalent(READ_ONLY_BY_GET_DIMENSION_SIZE, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert list(sent_per_device(spmd, 2)) == [64, 64]


@needs_xla
@pytest.mark.parametrize("text,n", [(GATHERED_FOR_A_DEAD_RESHAPE, 2),
                                    (GATHERED_ONTO_A_DEVICE_FOR_A_DEAD_RESHAPE, 4),
                                    (TAKEN_WHERE_CHEAPER, 2), (FROM_A_LIVE_GATHER, 2),
                                    (BROADCAST_FOR_A_DEAD_USER_AND_A_LATER_ONE, 2)],
                         ids=["gathered-for-a-dead-reshape", "onto-a-device-for-a-dead-reshape",
                              "taken-where-cheaper", "from-a-live-gather",
                              "broadcast-for-a-dead-user-and-a-later-one"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both
    programs compute the reference's values."""
    compared_with_xla(text, n)
