"""The direct exchange of pieces (issue 13: module-settings sending no more than XLA from the
busiest device but more on the mean, fuzz/16000004472 off and fuzz/16100003355 on). Between
tilings whose tiles nest, every device may lack only a part of its new tile, held whole by a
few other devices: one collective-permute per round of pieces sends each missing piece once,
where XLA's all-to-all (grouped so that the new tiles land on other devices than the
target's) and the permute after it send it twice, and an all-gather sends every member's
whole shard. The plan takes the exchange only where its busiest device sends fewer bytes
(then all devices together). Bytes worked out by hand from the cost model's formulas
(`gspmdc.ir.cost`: a collective-permute costs its buffer on each device that sends to
another); values against numpy; with the `[xla]` extra, against XLA's own program."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.liveness import memory_profile, shape_bytes
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_staged
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, run_global

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

ROWS = "{devices=[2,1,1,2]0,3,1,2 last_tile_dim_replicate}"
COLUMNS = "{devices=[1,4,1]<=[4]}"
ROWS_TO_COLUMNS = ("HloModule m, num_partitions=4\n\nENTRY e {\n"
                   f"  p = f64[5,7,11] parameter(0), sharding={ROWS}\n"
                   f"  ROOT c = f64[5,7,11] copy(p), sharding={COLUMNS}\n}}\n")


def test_rows_held_twice_to_column_tiles_move_only_the_missing_rows():
    """f64[5,7,11] in 2 row tiles (3 and 2 rows) held by devices {0,3} and {1,2}, to 4 column
    tiles of 2 (the last 1) on devices 0..3. Each device holds all columns of its rows and lacks
    the other tile's rows of its own columns: devices 1 and 2 (row tile 1) lack rows 0-2
    (f64[3,2,11], 528 B), devices 0 and 3 rows 3-4 (352 B, in the round's buffer of 528 B),
    each from the other tile's holder. One round: 528 B from every device. The staged plan
    slices the columns of the replicas and gathers the rows (1,056 B from each); XLA's
    all-to-all over {0,1} and {3,2} leaves devices 2 and 3 each other's columns and permutes
    them (1,408 B from the busiest device, 968 on the mean)."""
    shape = ArrayShape("f64", (5, 7, 11))
    staged = plan_staged(shape, parse_sharding(ROWS), parse_sharding(COLUMNS), 4)
    assert (staged.cost, staged.total) == (1056, 4 * 1056)
    plan = plan_reshard(shape, parse_sharding(ROWS), parse_sharding(COLUMNS), 4)
    assert plan.collectives == ["collective-permute"]
    assert (plan.cost, plan.total) == (528, 4 * 528)
    spmd = check_equivalent(ROWS_TO_COLUMNS, 4)
    found = collectives(spmd)
    assert [c[0] for c in found] == ["collective-permute"]
    rows_of = {0: 0, 3: 0, 1: 1, 2: 1}
    assert all(rows_of[a] != rows_of[b] for a, b in found[0][1])
    assert sent_per_device(spmd, 4).tolist() == [528] * 4
    x = np.arange(5 * 7 * 11, dtype=np.float64).reshape(5, 7, 11)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)


@needs_xla
def test_rows_to_columns_against_xla():
    compared_with_xla(ROWS_TO_COLUMNS, 4)


def test_an_all_to_all_that_lands_on_the_target_stays():
    """f32[4,4] row tiles to column tiles on 2 devices: the all-to-all gives each device its
    new tile (each sends the half it does not keep, 16 B); the exchange would send the same
    piece (16 B from each), so the staged plan, first of equals, is kept."""
    plan = plan_reshard(ArrayShape("f32", (4, 4)), parse_sharding("{devices=[2,1]<=[2]}"),
                        parse_sharding("{devices=[1,2]<=[2]}"), 2)
    assert plan.collectives == ["all-to-all"]
    assert (plan.cost, plan.total) == (16, 32)


def test_a_permute_after_an_all_to_all_is_saved():
    """f32[8,4,4,1], dim 2 in 2 tiles held twice (device d: tile d // 2), to [2,2] tiles of
    dims 0 and 1 on devices 3,0,1,2. Every device holds one dim-2 half of its new [4,2,4,1]
    tile and lacks the other (f32[4,2,2,1], 64 B), held by the two devices of the other dim-2
    tile: one piece per device, 64 B from each. The staged plan slices the replicas, moves
    dim 2's tiles to dim 1 by an all-to-all (64 B) and permutes the tiles to their devices
    (128 B): 192 B."""
    source = "{devices=[1,1,2,1,2]<=[4] last_tile_dim_replicate}"
    target = "{devices=[2,2,1,1]3,0,1,2}"
    shape = ArrayShape("f32", (8, 4, 4, 1))
    assert plan_staged(shape, parse_sharding(source), parse_sharding(target), 4).cost == 192
    plan = plan_reshard(shape, parse_sharding(source), parse_sharding(target), 4)
    assert (plan.cost, plan.total) == (64, 4 * 64)
    text = ("HloModule m, num_partitions=4\n\nENTRY e {\n"
            f"  p = f32[8,4,4,1] parameter(0), sharding={source}\n"
            f"  ROOT c = f32[8,4,4,1] copy(p), sharding={target}\n}}\n")
    spmd = check_equivalent(text, 4)
    assert sent_per_device(spmd, 4).tolist() == [64] * 4
    x = np.arange(128, dtype=np.float32).reshape(8, 4, 4, 1)
    np.testing.assert_array_equal(run_global(spmd, [x], 4), x)


def test_the_exchange_holds_no_padded_copy_of_the_shard():
    """The program of the reshard above on one device: its shard f32[8,4,2,1] (256 B), its new
    tile f32[4,2,4,1] (128 B), one piece of 64 B per round. Every cut and every placement
    fits inside the shard and the tile, so no buffer is larger than the shard (a cut padded by
    the round's buffer on every dim was f32[12,6,4,2], 2,304 B) and at the peak the device
    holds at most its shard, the tile built so far, a zero tile and the tile with the piece
    placed in it, and the piece sent and received: 256 + 3 * 128 + 2 * 64 = 768 B (5,780
    before; the staged plan's program 512)."""
    source = "{devices=[1,1,2,1,2]<=[4] last_tile_dim_replicate}"
    target = "{devices=[2,2,1,1]3,0,1,2}"
    text = ("HloModule m, num_partitions=4\n\nENTRY e {\n"
            f"  p = f32[8,4,4,1] parameter(0), sharding={source}\n"
            f"  ROOT c = f32[8,4,4,1] copy(p), sharding={target}\n}}\n")
    spmd = check_equivalent(text, 4)
    assert max(shape_bytes(i.shape) for i in spmd.entry.instructions) == 256
    assert memory_profile(spmd).peak_bytes <= 768


def test_more_pieces_than_rounds_are_not_exchanged():
    """f32[16] in 8 tiles to replicated: every device lacks 7 pieces, more than the exchange's
    rounds: the all-gather (7 tiles of 8 B from each device: 56 B)."""
    plan = plan_reshard(ArrayShape("f32", (16,)), parse_sharding("{devices=[8]<=[8]}"),
                        parse_sharding("{replicated}"), 8)
    assert plan.collectives == ["all-gather"]
    assert plan.cost == 56


#: fuzz/11500000934 off, shrunk: a dot annotated in 4 row tiles whose weights are in 2 column
#: tiles held twice, read whole by the root
DOT_READ_WHOLE = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[6,1,3] parameter(0), sharding={replicated}
  w = f32[3,2] parameter(1), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  d = f32[6,1,2] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0},
    sharding={devices=[4,1,1]<=[4]}
  q = f32[3] parameter(2), sharding={replicated}
  ROOT t = (f32[6,1,2], f32[3]) tuple(d, q), sharding={{replicated}, {replicated}}
}
"""


def test_a_dot_moved_cheaply_to_its_annotation_is_priced_where_its_users_read_it():
    """Run in the weights' column tiles, the dot reaches its row-tiled annotation by an
    exchange of pieces (each device lacks the other column of its rows: 8 B), the cheapest
    candidate priced to the annotation; but the root reads it whole, and the f32[6,1,1]
    columns gathered in pairs send 24 B. Priced where its users read it, the dot runs
    replicated on the weights' columns gathered in pairs (f32[3,1], 12 B from each device)."""
    spmd = check_equivalent(DOT_READ_WHOLE, 4)
    assert collectives(spmd) == [("all-gather", [[0, 2], [1, 3]], (1,))]
    assert sent_per_device(spmd, 4).tolist() == [12] * 4
    dot = next(inst for inst in spmd.entry.instructions if inst.opcode == "dot")
    assert dot.shape.dims == (6, 1, 2)
