"""No more collective bytes than XLA (issue 13) for a `dynamic-update-slice` whose annotated
result tiles a dim the update slices: as XLA's partitioner does, the operand takes the result's
tiling and the update that tiling with the sliced dims whole, and each partition writes the part
of the update in its range (docs/design/partitioning.md#dynamic-slices), instead of writing in
the operand's tiling and resharding the result. Bytes per device by hand from the cost model's
formulas (`gspmdc.ir.cost`: an all-to-all sends every block but its own, an all-gather its
operand to each other member); values against the unpartitioned program; with the `[xla]`
extra, against XLA's own partitioned program."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: fuzz/11400000216 (on) reduced: `p` is tiled on dim 2, which the update slices; the result
#: tiles dim 0 (sliced too, from start `START`) and dim 1 (whole in the update, tiled in `u`
#: as in the result)
UPDATE = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[4,4,8] parameter(0), sharding={devices=[1,1,2,2]<=[4] last_tile_dim_replicate}
  u = f32[2,4,1] parameter(1), sharding={devices=[1,2,1,2]<=[4] last_tile_dim_replicate}
  i = s32[] parameter(2), sharding={replicated}
  s = s32[] START
  zero = s32[] constant(0)
  ROOT d = f32[4,4,8] dynamic-update-slice(p, u, s, zero, i), sharding={devices=[2,2,1]<=[2,2]T(1,0)}
}
"""

CONSTANT_START = UPDATE.replace("START", "constant(2)")
ANY_START = UPDATE.replace("START", "parameter(3), sharding={replicated}")


def _inputs(start: int, end: int) -> list:
    return [np.arange(128, dtype=np.float32).reshape(4, 4, 8),
            -1 - np.arange(8, dtype=np.float32).reshape(2, 4, 1), np.int32(end), np.int32(start)]


@pytest.mark.parametrize("end", [0, 3, 7, 9])
def test_the_operand_takes_the_results_tiling_and_the_update_stays(end):
    """`p` moves to the result's tiling: each device keeps its half of dim 0 (a local slice)
    and swaps half of its f32[2,4,4] (128 B) with its partner, 64 B; `u` is already tiled like
    the result on dim 1, so nothing else moves. Before, the update was written in `p`'s tiling
    (`u` gathered on dim 1: 16 B) and the result moved by the same all-to-all: 80 B."""
    spmd = check_equivalent(CONSTANT_START, 4, inputs=_inputs(2, end)[:3])
    assert collectives(spmd) == [("all-to-all", [[0, 2], [1, 3]], (1,))]
    assert list(sent_per_device(spmd, 4)) == [64] * 4


@pytest.mark.parametrize("start", [-1, 0, 1, 2, 3, 5])
def test_an_update_over_any_rows_is_written_in_the_results_tiling(start):
    """A start only known at run time (clamped to [0, 2]) may put the update over both halves
    of dim 0 (start 1): each partition writes its own rows of it, and the bytes are the same."""
    spmd = check_equivalent(ANY_START, 4, inputs=_inputs(start, 5))
    assert list(sent_per_device(spmd, 4)) == [64] * 4


@needs_xla
def test_xla_sends_as_much():
    result = compared_with_xla(CONSTANT_START, 4)
    assert result.xla_busiest == result.our_busiest == 64
