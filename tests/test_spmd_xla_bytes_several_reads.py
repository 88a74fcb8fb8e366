"""No more collective bytes than XLA (issue 13) where one instruction reads one value in
several shardings (a `tuple` holding a parameter in two elements sharded differently, the
initial state of a `while`), or an instruction reads it in a tiling that a later user reads
whole: insert-reshards makes the read after which the others cost least first and takes the
others from it (`passes/spmd/reshard_order.py`), as XLA's partitioner, whose reshard to the
tiling (or to one device) goes through the replicated value, finds that value in its reshard
cache for the other read. Bytes per device by hand from the cost model's formulas
(`gspmdc.ir.cost`: an all-gather sends each device's shard to the g-1 others; a
collective-permute counts on the devices that send); values against the unpartitioned program;
with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_order import first_made
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: fuzz/11100001032 reduced: the loop state holds `p` in columns of 2 tiles held 3 times (in
#: another device order than `p`'s 3 tiles held twice) and replicated
LOOP_STATE = """HloModule m, num_partitions=6

cond {
  s = (s32[], f32[5], f32[5]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}

body {
  s = (s32[], f32[5], f32[5]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  a = f32[5] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  n = f32[5] negate(a)
  ROOT t = (s32[], f32[5], f32[5]) tuple(j, n, n)
}

ENTRY e {
  p = f32[5] parameter(0), sharding={devices=[3,2]<=[6] last_tile_dim_replicate}
  zero = s32[] constant(0)
  init = (s32[], f32[5], f32[5]) tuple(zero, p, p), sharding={{replicated}, {devices=[2,3]1,2,3,0,4,5 last_tile_dim_replicate}, {replicated}}
  w = (s32[], f32[5], f32[5]) while(init), condition=cond, body=body, sharding={{replicated}, {devices=[2,3]1,2,3,0,4,5 last_tile_dim_replicate}, {replicated}}
  ROOT b = f32[5] get-tuple-element(w), index=2
}
"""

#: fuzz/11200001884 reduced: a `dot` reads `p` in 8 column tiles, the root later reads it on
#: one device (whose reshard gathers it on every device); `LATER_WHOLE_DEAD` has a dead user
#: reading it on that device first
LATER_WHOLE = """HloModule m, num_partitions=8

ENTRY main {
  p = f64[2,5] parameter(0), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}
  c = f64[2] constant({0.75, -1.5}), sharding={replicated}
  d = f64[5] dot(c, p), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={devices=[8]5,2,4,7,0,6,1,3}
  ROOT t = (f64[2,5], f64[5]) tuple(p, d), sharding={{maximal device=3}, {devices=[8]5,2,4,7,0,6,1,3}}
}
"""
LATER_WHOLE_DEAD = LATER_WHOLE.replace(
    "  c = ", "  r = f64[2,5] reshape(p), sharding={maximal device=3}\n  c = ")
LATER_REPLICATED = LATER_WHOLE.replace("{{maximal device=3}, ", "{{replicated}, ")

#: one tiling in two device orders and replicated, read by the root
REORDERED = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  ROOT t = (f32[8], f32[8]) tuple(p, p), sharding={{devices=[4]3,2,1,0}, {replicated}}
}
"""


def test_the_loop_state_is_gathered_once_and_its_tiles_sliced_from_it():
    """`p` (f32[5] in 3 tiles of 2, padded) gathered over each group of 3 devices: every device
    sends its 8 B shard twice, 16 B, and the 2 column tiles (of 3) are sliced from it. Before,
    the columns came first by permutes of pieces (4 devices sending 8 B, then 3 sending 4 B)
    and the replicated element was gathered from them (groups of 2, 12 B each): 44/6 + 12 B
    per device, 24 on the busiest. The body gathers `n` for the last element each trip (12 B,
    3 trips) either way: 52 B per device in all, XLA's bytes."""
    spmd = check_equivalent(LOOP_STATE, 6)
    assert collectives(spmd) == [("all-gather", [[0, 2, 4], [1, 3, 5]], (0,))]
    assert sent_bytes(spmd, 6) == 16 + 3 * 12
    assert int(sent_per_device(spmd, 6).max()) == 16 + 3 * 12


def test_a_value_read_in_another_device_order_and_whole_is_gathered_once():
    """Permuting `p`'s 8 B shards into the reversed order (8 B per device) and gathering the
    whole value from either order (24 B) sent 32 B per device; the gather alone, with the
    reversed tiles sliced from it, sends 24."""
    spmd = check_equivalent(REORDERED, 4)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]
    assert sent_bytes(spmd, 4) == 3 * 8


@pytest.mark.parametrize("text", [LATER_WHOLE, LATER_WHOLE_DEAD, LATER_REPLICATED])
def test_a_tiling_is_sliced_from_the_gather_a_later_user_makes(text):
    """`p`'s f64[1,3] shards (its 5 columns in 2 tiles, padded) gathered over the column pairs
    (24 B from every device), the 5 columns over the row pairs (f64[1,5]: 40 B): 64 B on every
    device, and the dot's 8 column tiles sliced from the whole value. Before, the dot's tiles
    came first by two rounds of permutes (8 B from 4 devices, then from 3; device 0 in both)
    and the root gathered `p` anyway: 80 B on the busiest device. XLA gathers for the dot
    (its reshard to the tiles goes through the whole value) without trimming the padding:
    24 + 48 = 72 B on every device."""
    spmd = check_equivalent(text, 8)
    assert [(c[0], c[2]) for c in collectives(spmd)] == [("all-gather", (1,)),
                                                         ("all-gather", (0,))]
    assert sent_per_device(spmd, 8).tolist() == [24 + 40] * 8


_SHAPE = ArrayShape("f32", (12,))
_HAVE, _TILES, _WHOLE, _OTHER = (HloSharding.maximal(d) for d in range(4))
#: bytes of each reshard: the tiles cost 6 from the value, the whole 10; the tiles are free
#: from the whole, the whole costs 8 from the tiles; anything else 100
_BYTES = {(_HAVE, _TILES): 6, (_HAVE, _WHOLE): 10, (_WHOLE, _TILES): 0, (_TILES, _WHOLE): 8}


def _measure(shape, source, target):
    return 0 if source == target else _BYTES.get((source, target), 100)


def test_the_read_made_first_is_the_one_after_which_all_cost_least():
    """Tiles first then the whole from them: 6 + 8; the whole first and the tiles from it:
    10 + 0."""
    assert first_made(_SHAPE, _HAVE, frozenset(), [_TILES, _WHOLE], _measure, _measure) == 1


def test_operand_order_is_kept_on_a_tie_and_held_reshards_are_sources():
    """With the whole value held already (another instruction reads it), the tiles come from
    it for nothing in either order: operand order stays. Reads that do not help each other
    keep operand order too."""
    assert first_made(_SHAPE, _HAVE, frozenset([_WHOLE]), [_TILES, _WHOLE], _measure,
                      _measure) == 0
    assert first_made(_SHAPE, _HAVE, frozenset(), [_OTHER, _TILES], _measure, _measure) == 0


def test_all_devices_bytes_break_a_tie_of_the_busiest():
    """Every reshard sends 5 B from the busiest device: both orders tie at 10. In all, tiles
    first then the whole from them send 7 + 8; the whole first then the tiles from it 9 + 1."""
    def busiest(shape, source, target):
        return 0 if source == target else 5

    def total(shape, source, target):
        return {(_HAVE, _TILES): 7, (_HAVE, _WHOLE): 9, (_WHOLE, _TILES): 1,
                (_TILES, _WHOLE): 8}.get((source, target), _measure(shape, source, target))
    assert first_made(_SHAPE, _HAVE, frozenset(), [_TILES, _WHOLE], busiest, total) == 1


@needs_xla
def test_no_more_bytes_than_xla_for_a_loop_state_read_twice():
    result = compared_with_xla(LOOP_STATE, 6)
    assert result.our_bytes == result.xla_bytes == 52


@needs_xla
def test_no_more_bytes_than_xla_for_a_tiling_read_before_the_whole_value():
    result = compared_with_xla(LATER_WHOLE, 8)
    assert (result.our_busiest, result.xla_busiest) == (64, 72)
