"""No more collective bytes than XLA (issue 13) in the data-movement ops of seed 10900's
classes: a `concatenate` whose concat dim is tiled moves those tiles into another dim (XLA's
HandleConcatenate, `HandleElementwiseWithDimsToReplicate`); a partial result's reshard to its
annotation that one user alone reads is priced to that user, who may sum the partials into
what it reads instead (XLA's reshard cache keeps the summed value); a reshard whose uneven
tiles do not nest realigns them by an exchange of pieces before the other dims gather (XLA
shifts boundary elements by permutes, then all-gathers); an all-to-all may list its groups'
members in reverse order so that the permute after it moves fewer devices. Bytes are worked out by hand from
the cost model's formulas (`gspmdc.ir.cost`: an all-to-all over g devices sends (g-1)/g of the
local shard); values against the unpartitioned program; with the `[xla]` extra, against XLA's
own partitioned program (skipped without it)."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_staged

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

CONCAT = """HloModule m, num_partitions=2

ENTRY main {
  p0 = f32[4,6] parameter(0), sharding={devices=[1,2]0,1}
  p1 = f32[4,2] parameter(1), sharding={devices=[1,2]0,1}
  c = f32[4,8] concatenate(p0, p1), dimensions={1}, sharding={devices=[1,2]0,1}
  ROOT n = f32[4,8] negate(c), sharding={devices=[2,1]0,1}
}
"""


def test_concatenate_moves_its_concat_dim_tiles_into_another_dim():
    """The concat dim's 2 tiles move into dim 0 (4 rows, divisible by 2): each operand goes
    from [1,2] to [2,1] by an all-to-all (p0's [4,3] shard, 48 B, sends half: 24 B; p1's
    [4,1] shard, 8 B), the concatenate runs on [2,8] tiles, which the negate reads as they
    are: 32 B per device. Before, each operand's halo came by collective-permutes and the
    result moved to [2,1] by an all-to-all: 48 B per device."""
    spmd = check_equivalent(CONCAT, 2)
    assert collectives(spmd) == [("all-to-all", [[0, 1]], (0,)), ("all-to-all", [[0, 1]], (0,))]
    assert sent_bytes(spmd, 2) == 32


CONCAT_UNMOVABLE = """HloModule m, num_partitions=2

ENTRY main {
  p0 = f32[3,6] parameter(0), sharding={devices=[1,2]0,1}
  p1 = f32[3,2] parameter(1), sharding={devices=[1,2]0,1}
  c = f32[3,8] concatenate(p0, p1), dimensions={1}, sharding={devices=[1,2]0,1}
  ROOT n = f32[3,8] negate(c), sharding={devices=[2,1]0,1}
}
"""


def test_concatenate_moves_no_tiles_into_a_dim_they_do_not_divide():
    """With 3 rows no other dim takes the 2 tiles evenly (XLA's GetFirstTargetDimToMove
    ShardingTiles needs the size divisible by the merged count): no all-to-all into dim 0 is
    planned for the operands, and the values still match."""
    spmd = check_equivalent(CONCAT_UNMOVABLE, 2)
    assert not any(c[0] == "all-to-all" and c[2] == (0,) and i < 2
                   for i, c in enumerate(collectives(spmd)))


PARTIAL_SLICED = """HloModule m, num_partitions=4

ENTRY main {
  p0 = f32[5,16] parameter(0), sharding={devices=[1,4]<=[4]}
  p1 = f32[16] parameter(1), sharding={devices=[4]<=[4]}
  d = f32[5] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  i = s32[] parameter(2), sharding={replicated}
  ROOT s = f32[4] dynamic-slice(d, i), dynamic_slice_sizes={4}, sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
}
"""


def test_a_partial_result_read_by_one_user_is_summed_into_what_it_reads():
    """The dot leaves partial sums over its 4 contracting tiles; its one user, the
    dynamic-slice, reads it replicated: one all-reduce of f32[5] over 4 devices, 2 x 3/4 x
    20 = 30 B per device, and the slice is local (XLA's reshard cache has the summed value).
    Before, the partials went to the dot's annotation first (a reduce-scatter into 2 padded
    tiles of 3, 12 B, and an all-reduce over pairs, 12 B) and the dynamic-slice summed its
    masked windows (a reduce-scatter of f32[4] over pairs, 8 B): 32 B (the fuzz/10900000648
    class: 62 -> 60 B, XLA's)."""
    spmd = check_equivalent(PARTIAL_SLICED, 4)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3]])]
    assert sent_bytes(spmd, 4) == 30


REALIGNED = """HloModule m, num_partitions=8

ENTRY main {
  p = f32[2,6] parameter(0), sharding={devices=[2,4]<=[8]}
  ROOT n = f32[2,6] negate(p), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
}
"""


def test_tiles_that_do_not_nest_are_realigned_before_the_other_dims_gather():
    """Dim 1's 4 tiles of 2 (the last one empty) do not gather into 2 tiles of 3; the plan
    first moves pieces so that each device holds its row's part of its target columns (device
    d takes columns 3 * (d // 4) .. + 3; devices 2, 3, 6 and 7 take the other row, as their own
    row's tile is full): 13 pieces of one or two elements in 4 collective-permute rounds filled
    largest piece first (the 2-element pieces in the first two, 88 B in all; filled tile by
    tile, 3 rounds of 8, 8 and 4 B buffers sent 96 B and 20 B from devices 1 and 5), then the
    rows are gathered in pairs (an f32[1,3] tile, 12 B): 23 B per device on average, 28 from
    the busiest (24 and 32 before). Before that, dim 1 was gathered over 4 (3 x 8 B) and an
    all-to-all (12 B) split it again: 36 B."""
    spmd = check_equivalent(REALIGNED, 8)
    found = collectives(spmd)
    assert [c[0] for c in found] == ["collective-permute"] * 4 + ["all-gather"]
    assert found[-1] == ("all-gather", [[0, 2], [1, 3], [6, 4], [7, 5]], (0,))
    assert sent_bytes(spmd, 8) == 23


TRANSPOSED = """HloModule m, num_partitions=8

ENTRY main {
  p = s64[5,6] parameter(0), sharding={devices=[2,4]7,3,1,4,0,6,2,5}
  c = s64[] constant(-3)
  b = s64[5,6] broadcast(c), dimensions={}
  e = pred[5,6] compare(p, b), direction=EQ, sharding={devices=[2,4]7,3,1,4,0,6,2,5}
  ROOT t = pred[6,5]{0,1} transpose(e), dimensions={1,0}, sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
}
"""


def test_a_transposed_operand_realigns_its_uneven_tiles():
    """fuzz/10900001669's transpose: its operand goes from 4 column tiles of 2 in an explicit
    device order to 2 tiles of 3 with the rows whole. Realigned first: 18 B per device, where
    gathering the columns over 4 and the rows in pairs sent 36 (XLA 25.5)."""
    spmd = check_equivalent(TRANSPOSED, 8)
    assert [c[0] for c in collectives(spmd)][-1] == "all-gather"
    assert sent_bytes(spmd, 8) == 18


TRADED = """HloModule m, num_partitions=4

ENTRY main {
  p = f32[4,4] parameter(0), sharding={devices=[4,1]0,2,1,3}
  ROOT n = f32[4,4] negate(p), sharding={devices=[2,2]2,1,3,0}
}
"""


def test_all_to_all_groups_in_reverse_order_leave_half_the_devices_in_place():
    """Row tiles 0, 1 on devices 0, 2 (and 2, 3 on 1, 3) split their columns in pairs: the
    all-to-all over {2,0} and {3,1} (members in reverse order of their row tiles) gives device
    2 the column tile 0 of the first row pair and device 3 that of the second, where the target
    wants them; devices 0 and 1 then swap their [2,2] tiles. Bytes per device on average: the
    all-to-all sends half of the [1,4] shard (8 B) everywhere, the permute 16 B from 2 of the 4
    devices (8): 16 B. In the forward order (groups {0,2}, {1,3}) every device moved in the
    permute: 24 B, XLA's too. (The exchange of pieces sends less still, the program's: devices
    2 and 3 hold one row of their [2,2] tile and receive the other's half, f32[1,2] (8 B);
    devices 0 and 1 hold neither row of theirs and receive two halves: 16 B from the busiest
    device, 12 on average.)"""
    staged = plan_staged(ArrayShape("f32", (4, 4)), parse_sharding("{devices=[4,1]0,2,1,3}"),
                         parse_sharding("{devices=[2,2]2,1,3,0}"), 4)
    assert staged.collectives == ["all-to-all", "collective-permute"]
    assert staged.steps[0].groups.tolist() == [[2, 0], [3, 1]]
    assert staged.total == 4 * 16
    spmd = check_equivalent(TRADED, 4)
    assert {c[0] for c in collectives(spmd)} == {"collective-permute"}
    assert sent_bytes(spmd, 4) == 12


@needs_xla
@pytest.mark.parametrize("text,n", [(CONCAT, 2), (PARTIAL_SLICED, 4), (REALIGNED, 8),
                                    (TRANSPOSED, 8), (TRADED, 4)],
                         ids=["concatenate", "partial-sliced", "realigned", "transposed",
                              "traded"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both programs
    compute the reference's values."""
    compared_with_xla(text, n)
