"""No more collective bytes than XLA (issue 13) for a gather with explicit batch dims whose
operand has more batch tiles than its indices: XLA's parallel-dims partitioning aligns the
indices' batch tiles to the operand's device groups and keeps the indices' other tiles within
each group (`GatherScatterOperandsShardedAcrossParallelDims`: the indices' replicas lend the
missing batch tiles), so the indices move to the operand's device order, not the operand to
the indices'. gspmdc's candidate: the operand's tiling, the indices' tiles laid out on the
devices of each of its tiles (`_within` in `passes/spmd/op_rules_gather.py`); and the converse
(the indices' tiling, the operand's tiles on the devices of each of theirs). Bytes by hand from
the cost model's formulas (`gspmdc.ir.cost`: an all-gather over g devices sends (g-1) times its
shard from each); values against the unpartitioned program; with the `[xla]` extra, against
XLA's own partitioned program (fuzz/11300000679, shrunk; skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.oracle import xla_available
from spmd_partition_helpers import (busiest_per_collective, check_equivalent, collectives,
                                    sent_bytes)

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


# operand pred[7,6]: batching dim 0 in 4 tiles held by pairs {2k, 2k+1}, dim 1 (sliced 2 of 6:
# neither passed through nor indexed) in 2; indices u32[7,2,3]: batching dim 0 in 2 tiles and
# index pass-through dim 2 in 2 (uneven: 2 and 1), each tile on 2 devices in another order
BATCH_ORDER = """HloModule m, num_partitions=8

ENTRY e {
  p = pred[7,6] parameter(0), sharding={devices=[4,2]<=[8]}
  i = u32[7,2,3] parameter(1), sharding={devices=[2,1,2,2]1,2,6,3,4,0,5,7 last_tile_dim_replicate}
  ROOT g = pred[7,2,2,3] gather(p, i), offset_dims={2}, collapsed_slice_dims={},
    start_index_map={1}, index_vector_dim=3, slice_sizes={1,2},
    operand_batching_dims={0}, start_indices_batching_dims={0},
    sharding={devices=[4,1,1,1,2]<=[8] last_tile_dim_replicate}
}
"""


def _inputs():
    """Start indices over the whole dim and beyond it (clamped to 4 by the gather)."""
    rng = np.random.default_rng(5)
    return [rng.integers(0, 2, (7, 6)).astype(np.bool_),
            rng.integers(0, 9, (7, 2, 3)).astype(np.uint32)]


def test_the_indices_follow_the_operands_batch_tiles():
    """The local gather takes the operand's batch tiles (rows 2k, 2k+1 on devices 2k and
    2k+1) and the indices' dim-2 tiles on the devices of each (device 2k+j: tile j, the
    devices of a pair holding the same index tile before, so in device order): pred[2,2,2,2].
    Device d needs the indices' rows of pair d // 2 and columns of tile d % 2: devices 2-5 and
    7 hold them already (a local slice), devices 0, 1 and 6 receive u32[2,2,2] (32 B) from
    devices 1, 6 and 0. The operand is gathered on dim 1 in the pairs (pred[2,3]: 6 B from
    each), the result on dim 3 (pred[2,2,2,2]: 16 B from each): 54 B from devices 0, 1 and 6,
    34 on average, where moving the operand to the indices' order (main before) sent 56 from
    the busiest device, 43.5 on average, and XLA's program 54 and 42."""
    spmd = check_equivalent(BATCH_ORDER, 8, inputs=_inputs())
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert collectives(spmd) == [
        ("all-gather", pairs, (1,)),
        ("collective-permute", [(0, 6), (1, 0), (2, 2), (3, 3), (4, 4), (5, 5), (6, 1),
                                (7, 7)]),
        ("all-gather", pairs, (3,))]
    gather = next(inst for inst in spmd.entry.instructions if inst.opcode == "gather")
    assert gather.shape.dims == (2, 2, 2, 2)
    assert str(gather.sharding) == "{devices=[4,1,1,2]<=[8]}"
    assert busiest_per_collective(spmd, 8) == 54
    assert sent_bytes(spmd, 8) == 34


def test_the_indices_follow_the_operands_batch_tiles_with_random_indices():
    check_equivalent(BATCH_ORDER, 8, seed=13)


@needs_xla
def test_the_indices_in_the_operands_order_send_no_more_than_xla():
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        result = run_case(Case("gather-batch-order", BATCH_ORDER, 8), oracle)
    assert result.status == "compared", result.detail
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
    assert (result.our_busiest, result.xla_busiest) == (54, 54)
    assert result.our_bytes < result.xla_bytes
