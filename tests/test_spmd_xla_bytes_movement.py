"""No more collective bytes than XLA (issue 13) in the data-movement ops of seed 10900's
classes: a `concatenate` whose concat dim is tiled moves those tiles into another dim (XLA's
HandleConcatenate, `HandleElementwiseWithDimsToReplicate`). Bytes are worked out by hand from
the cost model's formulas (`gspmdc.ir.cost`: an all-to-all over g devices sends (g-1)/g of the
local shard); values against the unpartitioned program; with the `[xla]` extra, against XLA's
own partitioned program (skipped without it)."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available
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


@needs_xla
@pytest.mark.parametrize("text,n", [(CONCAT, 2)], ids=["concatenate"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both programs
    compute the reference's values."""
    compared_with_xla(text, n)
