"""No more collective bytes than XLA (issue 13) where an op computed in its operand's sharding
is read by its users in one sharding other than its annotation: the candidate is priced at the
cheaper of the reshard through the annotation and the reshard straight from the computed result
(which insert-reshards' chain cleanup makes of the two steps;
docs/design/partitioning.md#a-result-read-through-its-annotation). Bytes by hand from the cost
model (an all-gather over g devices: each sends its shard to the g-1 others); values against
the unpartitioned program; with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from gspmdc.passes.spmd.traffic import sent_per_device
from spmd_partition_helpers import busiest_per_collective, check_equivalent, collectives, \
    compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: fuzz/11400002898 [off], shrunk: rows of 2 (s32[2,1,15] per device, padded) on 4 devices, an
#: `or` annotated in 2 column tiles held twice, read replicated by the root tuple (of two
#: elements: XLA's import folds a tuple of one into its element's annotation).
ROWS_READ_WHOLE = """HloModule m, num_partitions=4

ENTRY e {
  p = s32[5,1,15] parameter(0), sharding={devices=[4,1,1]<=[4]}
  q = s32[3] parameter(1), sharding={replicated}
  o = s32[5,1,15] or(p, p), sharding={devices=[1,1,2,2]<=[4] last_tile_dim_replicate}
  ROOT t = (s32[5,1,15], s32[3]) tuple(o, q), sharding={{replicated}, {replicated}}
}
"""


def test_an_op_read_whole_takes_the_cheaper_of_its_annotation_and_one_gather():
    """On the rows, one all-gather over the 4 devices: each sends its 2x1x15 s32 (120 B) to 3
    others, 360 B. Through the annotation: every device lacks the other row tiles of its
    columns (8, or 7 of the padded 8), sent by an exchange of pieces (an all-to-all, a permute
    and a gather sent 320): devices 0 and 1 send rows of 2 (s32[2,1,8] 64 B to each other,
    [2,1,7] 56 B to each of devices 2 and 3), device 2 its one row (s32[1,1,8] 32 B to devices
    0 and 1, [1,1,7] 28 B to device 3). Filled largest piece first, four rounds: devices 0 and
    1 send 64 + 64 + 56 = 184 B, device 2 64 + 64 + 32 = 160 (three rounds of [2,1,8] buffers
    sent 192 from each of the three). Then a gather of the columns (a 5x1x8 s32 tile, 160 B):
    344 B from the busiest device, 292 on average, the cheaper of the two. (The rounds'
    busiest devices sum to 376 with the gather, more than the one gather's 360, but no device
    sends in every round: the program's busiest device is what the plans compare.)"""
    spmd = check_equivalent(ROWS_READ_WHOLE, 4)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"] * 4 + ["all-gather"]
    assert collectives(spmd)[-1] == ("all-gather", [[0, 2], [1, 3]], (2,))
    assert sent_per_device(spmd, 4).tolist() == [344, 344, 320, 160]


#: the same op read in its annotation by one user and whole by another: the annotation is
#: made for the first, and the second reads it from there (a gather of the columns, 160 B)
#: rather than from the rows (360 B), so the two steps stay.
ROWS_READ_TWICE = """HloModule m, num_partitions=4

ENTRY e {
  p = s32[5,1,15] parameter(0), sharding={devices=[4,1,1]<=[4]}
  o = s32[5,1,15] or(p, p), sharding={devices=[1,1,2,2]<=[4] last_tile_dim_replicate}
  n = s32[5,1,15] negate(o), sharding={devices=[1,1,2,2]<=[4] last_tile_dim_replicate}
  ROOT t = (s32[5,1,15], s32[5,1,15]) tuple(o, n), sharding={{replicated}, {devices=[1,1,2,2]<=[4] last_tile_dim_replicate}}
}
"""


def test_an_op_read_in_its_annotation_too_keeps_the_annotation():
    """One user reads the columns: the rows go to the columns once (the exchange of pieces,
    184 B from the busiest device, as above), the replicated element is gathered from the
    columns (160 B): 344 B from the busiest device; gathering the rows for it as well (360 B)
    would send more."""
    spmd = check_equivalent(ROWS_READ_TWICE, 4)
    assert sent_per_device(spmd, 4).tolist() == [344, 344, 320, 160]
    assert collectives(spmd)[-1] == ("all-gather", [[0, 2], [1, 3]], (2,))


@needs_xla
def test_an_op_read_whole_sends_what_xla_sends():
    """XLA computes the `or` on the rows and gathers it once (its reshard to the annotation
    goes through the replicated value, which its cache gives to the root): 360 B per device;
    gspmdc's exchange into the annotation and gather of the columns send 344."""
    result = compared_with_xla(ROWS_READ_WHOLE, 4)
    assert (result.our_busiest, result.xla_busiest) == (344, 360)


#: fuzz/11600000918, shrunk: a sort run in its operands' tiles (2 row tiles, 2 column tiles,
#: held twice), its second element annotated [1,2,1,4] and read by a negate in [4,1,2] tiles
#: (ordered as the iota [2,2,2] with dims 1 and 2 swapped).
SORT_ELEMENT_READ_ELSEWHERE = """HloModule m, num_partitions=8

lt {
  a = s8[] parameter(0)
  b = s8[] parameter(1)
  c = f32[] parameter(2)
  d = f32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=LT
}

ENTRY e {
  k = s8[11,7,4] parameter(0), sharding={devices=[2,2,1,2]<=[8] last_tile_dim_replicate}
  v = f32[11,7,4] parameter(1), sharding={devices=[2,2,1,2]<=[8] last_tile_dim_replicate}
  s = (s8[11,7,4], f32[11,7,4]) sort(k, v), dimensions={2}, is_stable=true, to_apply=lt, sharding={{devices=[2,2,1,2]<=[8] last_tile_dim_replicate}, {devices=[1,2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}}
  g = f32[11,7,4] get-tuple-element(s), index=1, sharding={devices=[1,2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  ROOT n = f32[11,7,4] negate(g), sharding={devices=[4,1,2]<=[2,2,2]T(0,2,1)}
}
"""


def test_a_sort_element_read_in_other_tiles_skips_its_annotation():
    """Each device holds a 6x4x4 f32 shard (rows 6 of 11, columns 4 of 7, all 4 of dim 2) and
    wants 3 of its 6 rows (row tiles of 3, the two replicas of a shard taking one half each),
    its 7 columns (both column halves, one from its partner) and 2 of dim 2's 4. A local slice
    of its rows, then one all-to-all in pairs trading the column halves for dim 2's halves: each
    device sends 3x4x2 f32, 96 B. Through the annotation a permute (4 devices send their 384 B
    shard) and a gather of the rows (384 B) came first: 864 B from the busiest device."""
    spmd = check_equivalent(SORT_ELEMENT_READ_ELSEWHERE, 8)
    assert collectives(spmd) == [("all-to-all", [[0, 2], [1, 3], [4, 6], [5, 7]], (2,))]
    assert busiest_per_collective(spmd, 8) == 96


@needs_xla
def test_a_sort_element_read_in_other_tiles_sends_less_than_xla():
    """XLA reshards the element to its annotation and then to the negate's tiles."""
    result = compared_with_xla(SORT_ELEMENT_READ_ELSEWHERE, 8)
    assert result.our_busiest == 96 < result.xla_busiest
