"""No more collective bytes than XLA (issue 13) for a gather whose operand is tiled on a batching
dim and whose indices are tiled on another batch dim over the replicas of those tiles: XLA's
gather recursion partitions by one strategy's tiles (the explicit batch dim's, from the operand)
and the rest within each group of their devices by the next (index pass-through, from the
indices), so the local gather is tiled on both dims and neither input moves (`_merged` in
`passes/spmd/op_rules_gather.py`). Bytes by hand from the cost model's formulas
(`gspmdc.ir.cost`: an all-gather over g devices sends (g-1) times its shard from each);
values against the unpartitioned program; with the `[xla]` extra, against XLA's own
partitioned program (fuzz/11200002727 on, shrunk; skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.passes.spmd.op_rules_gather import _merged
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from spmd_partition_helpers import busiest_per_collective, check_equivalent, collectives, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


# operand dim 2 (a batching dim) in 2 tiles held by {0,2} and {1,3}; indices dim 0 (an index
# pass-through dim) in 2 tiles held by {0,1} and {2,3}; the result [1,2,2] on devices 0,3,2,1
BATCH_AND_INDEX = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[2,5,8] parameter(0), sharding={devices=[1,1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  i = s32[5,4,8,2] parameter(1), sharding={devices=[2,1,1,1,2]<=[4] last_tile_dim_replicate}
  ROOT g = f32[5,4,8] gather(p, i), offset_dims={}, collapsed_slice_dims={0,1},
    start_index_map={1,0}, index_vector_dim=3, slice_sizes={1,1,1},
    operand_batching_dims={2}, start_indices_batching_dims={2},
    sharding={devices=[1,2,2]0,3,2,1}
}
"""


def _inputs():
    """Indices over the whole operand, some beyond it (clamped by the gather)."""
    rng = np.random.default_rng(7)
    p = rng.standard_normal((2, 5, 8)).astype(np.float32)
    rows = rng.integers(-1, 7, (5, 4, 8))
    cols = rng.integers(-1, 3, (5, 4, 8))
    return [p, np.stack([rows, cols], axis=3).astype(np.int32)]


def test_the_batch_tiles_and_the_index_tiles_combine_into_one_local_gather():
    """Device d gathers the indices' rows of tile d // 2 (its own, uneven: rows 0-2 or 3-4)
    from the operand's batch tile d % 2 (its own, and the indices' columns of that tile: a
    local slice): f32[3,4,4] with no input moved. Each device then lacks, of its result tile
    (all rows, half of dims 1 and 2), the other row tile's rows, held by the device of the
    same column tile in the other row tile: one exchange of f32[3,2,4] pieces (96 B from every
    device), where an all-gather of dim 0 over {0,2} and {1,3} sent 3*4*4*4 = 192 B from each,
    keeping the operand's tiling alone gathered the indices (s32[3,4,4,2], 384 B from each)
    and XLA's program sends 256 (an all-to-all and a collective-permute)."""
    spmd = check_equivalent(BATCH_AND_INDEX, 4, inputs=_inputs())
    assert collectives(spmd) == [("collective-permute", [(0, 2), (1, 3), (2, 0), (3, 1)])]
    gather = next(inst for inst in spmd.entry.instructions if inst.opcode == "gather")
    assert gather.shape.dims == (3, 4, 4)
    assert busiest_per_collective(spmd, 4) == 96
    assert sent_bytes(spmd, 4) == 96


def test_batch_and_index_tiles_keep_values_with_random_indices():
    check_equivalent(BATCH_AND_INDEX, 4, seed=11)


# operand f32[2,3,2]: indexed dim 0 in 2 tiles by d // 4, pass-through dim 2 by (d // 2) % 2;
# indices s64[3,1]: batch dim 0 by d // 4, the index vector dim by (d // 2) % 2
INDICES_FIRST = """HloModule m, num_partitions=8

ENTRY e {
  p = f32[2,3,2] parameter(0), sharding={devices=[2,1,2,2]<=[8] last_tile_dim_replicate}
  i = s64[3,1] parameter(1), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}
  g = f32[3,3,2] gather(p, i), offset_dims={0,2}, collapsed_slice_dims={0},
    start_index_map={0}, index_vector_dim=1, slice_sizes={1,3,2},
    sharding={devices=[1,1,2,4]<=[8] last_tile_dim_replicate}
  ROOT c = f32[3,3,2] custom-call(g), custom_call_target="Sharding",
    sharding={devices=[2,1,2,2]<=[8] last_tile_dim_replicate}
}
"""


def test_the_index_tiles_first_then_the_operands_pass_through_tiles():
    """The indices' batch tiles (d // 4) first, then the operand's pass-through dim 2 tiles
    ((d // 2) % 2) on the devices of each; its indexed dim 0 tiles share the indices' mesh axis,
    so that dim is gathered: the operand's f32[1,3,1] over pairs {d, d+4} (12 B), the indices'
    index vector dim over {d, d+2} (s64[2,1], 16 B), the local gather f32[3,2,1] (no partial
    sums), and pieces to the annotated result: device d < 4 lacks rows 0-1 of column 2
    (f32[2,1,1], 8 B) from device d + 4, which lacks row 2 of columns 0-1 (f32[1,2,1], 8 B)
    from d; in two rounds each piece travels at its size (an all-to-all, or one round, sent
    both at f32[2,2,1], 16 B): 36 B from every device, where the all-to-all sent 44, keeping
    the result's tiling 68 (the indices gathered on both dims, 32 B, and the masked gather's
    f32[3,3,1] all-reduced, 36 B) and XLA's program 140 from the busiest device (shrunk from
    fuzz/11200000348)."""
    spmd = check_equivalent(INDICES_FIRST, 8, propagate=True)
    assert collectives(spmd) == [
        ("all-gather", [[0, 4], [1, 5], [2, 6], [3, 7]], (0,)),
        ("all-gather", [[0, 2], [1, 3], [4, 6], [5, 7]], (1,)),
        ("collective-permute", [(0, 4), (1, 5), (2, 6), (3, 7)]),
        ("collective-permute", [(4, 0), (5, 1), (6, 2), (7, 3)])]
    gather = next(inst for inst in spmd.entry.instructions if inst.opcode == "gather")
    assert gather.shape.dims == (3, 2, 1)
    assert sent_per_device(spmd, 8).tolist() == [36] * 8


def test_merging_takes_each_dim_from_the_first_part_that_tiles_it():
    """Operand tiles on extended dim 2 by d % 2, index tiles on dim 0 by d // 2, result tiles
    on dim 1 by (d in {1,2}) and dim 2 by d // 2: dim 2 stays the operand's (first), dim 0
    takes the indices', and the result's dim 1 would put 8 tiles on 4 devices, so it is left
    out."""
    d = np.arange(4)
    zero = np.zeros(4, np.int64)
    operand = (np.stack([zero, zero, d % 2], axis=1), [1, 1, 2])
    indices = (np.stack([d // 2, zero, zero], axis=1), [2, 1, 1])
    result = (np.stack([zero, np.isin(d, [1, 2]).astype(np.int64), d // 2], axis=1), [1, 2, 2])
    coords, counts = _merged([(operand, [0, 1, 2]), (indices, [0, 1, 2]),
                              (result, [0, 1, 2])], 4)
    assert counts == [2, 1, 2]
    assert coords[:, 0].tolist() == [0, 0, 1, 1] and coords[:, 2].tolist() == [0, 1, 0, 1]
    # the result first: its dims 1 and 2 tile all 4 devices, so the others add nothing
    coords, counts = _merged([(result, [0, 1, 2]), (operand, [0, 1, 2]),
                              (indices, [0, 1, 2])], 4)
    assert counts == [1, 2, 2] and coords[:, 2].tolist() == [0, 0, 1, 1]


def test_merging_skips_tiles_on_the_devices_an_earlier_dim_already_splits():
    """Operand tiles on dim 1 by d // 2 and index tiles on dim 0 by d // 2 too (one mesh axis):
    the pair would leave tiles (0, 1) and (1, 0) without devices, so dim 0 stays whole."""
    d = np.arange(4)
    zero = np.zeros(4, np.int64)
    operand = (np.stack([zero, d // 2], axis=1), [1, 2])
    indices = (np.stack([d // 2, zero], axis=1), [2, 1])
    coords, counts = _merged([(operand, [0, 1]), (indices, [0, 1])], 4)
    assert counts == [1, 2] and coords[:, 1].tolist() == [0, 0, 1, 1]


@needs_xla
def test_batch_and_index_tiles_send_no_more_than_xla_from_the_busiest_device():
    """XLA's program moves its local result by an all-to-all and a permute of two devices'
    tiles: 256 B from the busiest device, 176 on average; gspmdc's exchange of pieces sends 96
    from each."""
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        result = run_case(Case("gather-batch-and-index", BATCH_AND_INDEX, 4, True, True), oracle)
    assert result.status == "compared", result.detail
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
    assert (result.our_busiest, result.xla_busiest) == (96, 256)


@needs_xla
def test_index_tiles_first_send_no_more_than_xla():
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        result = run_case(Case("gather-indices-first", INDICES_FIRST, 8), oracle)
    assert result.status == "compared", result.detail
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
    assert (result.our_busiest, result.xla_busiest) == (36, 140)
