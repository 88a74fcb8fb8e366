"""No more collective bytes than XLA (issue 13) for a gather and a scatter with explicit batch
dims whose operand and indices are tiled in different device orders: XLA's parallel-dims
partitioning aligns the side with fewer batch tiles to the other's device groups and keeps its
other tiles within each group (`GatherScatterOperandsShardedAcrossParallelDims`: replicas lend
the missing batch tiles), so the indices move to the operand's device order, not the operand to
the indices'. gspmdc's candidates: one value's tiling (the operand's or the indices', and the
scatter's result's) with the other's tiles laid out on the devices of each of its tiles
(`_within` in `passes/spmd/op_rules_gather.py`). Bytes by hand from the cost model's formulas
(`gspmdc.ir.cost`: an all-gather over g devices sends (g-1) times its shard from each); values
against the unpartitioned program; with the `[xla]` extra, against XLA's own partitioned
program (the gather: fuzz/11300000679, shrunk; skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.oracle import xla_available
from gspmdc.passes.spmd.traffic import sent_per_device
from spmd_partition_helpers import (busiest_per_collective, check_equivalent, collectives,
                                    compared_with_xla, sent_bytes)

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
    """Following the operand's batch tiles, the local gather would take rows 2k, 2k+1 on
    devices 2k and 2k+1 and the indices' dim-2 tiles on the devices of each: devices 0, 1 and 6
    receive u32[2,2,2] (32 B), the operand is gathered on dim 1 in the pairs (pred[2,3]: 6 B),
    the result on dim 3 (pred[2,2,2,2]: 16 B): 54 B from devices 0, 1 and 6, 34 on average.
    Moving the operand to the indices' tiles sends less now that its result reaches the root's
    tiles by pieces: devices 0 and 6 swap their pred[2,3] tiles (6 B), the operand is gathered
    on dim 1 in pairs (6 B) and on dim 0 in pairs (pred[2,6], 12 B), the gather runs on
    pred[4,2,2,2] in the indices' tiles, and its rows reach the root's row tiles of 2 by
    pieces in four rounds (pred[2,2,2,2], 16 B, from devices 0, 1 and 2, then 8 B pieces:
    device 3 two, devices 0, 4, 5, 6 and 7 one): 48 B from device 0, 32.5 on average (XLA's program 54 and 42). The rounds' busiest devices
    sum to 64 over the program's collectives, but no device sends in all of them."""
    spmd = check_equivalent(BATCH_ORDER, 8, inputs=_inputs())
    gather = next(inst for inst in spmd.entry.instructions if inst.opcode == "gather")
    assert gather.shape.dims == (4, 2, 2, 2)
    assert str(gather.sharding) == \
        "{devices=[2,1,1,2,2]1,2,3,6,0,4,5,7 last_tile_dim_replicate}"
    assert collectives(spmd)[0] == ("collective-permute", [(0, 6), (1, 1), (2, 2), (3, 3),
                                                           (4, 4), (5, 5), (6, 0), (7, 7)])
    assert sent_per_device(spmd, 8).tolist() == [48, 34, 34, 34, 26, 26, 32, 26]


def test_the_indices_follow_the_operands_batch_tiles_with_random_indices():
    check_equivalent(BATCH_ORDER, 8, seed=13)


@needs_xla
def test_the_indices_in_the_operands_order_send_no_more_than_xla():
    result = compared_with_xla(BATCH_ORDER, 8)
    assert (result.our_busiest, result.xla_busiest) == (48, 54)
    assert result.our_bytes < result.xla_bytes


# the converse: the operand f32[8,6,3] with its batching dim 0 in 2 tiles held by {0,5,1,2} and
# {3,6,4,7} and its pass-through dim 2 in 4 (uneven: 1, 1, 1 and padding) in that order; the
# indices s32[8,4] with their batching dim 0 in 2 tiles held by {0,1,2,3} and {4,5,6,7}
OPERAND_ORDER = """HloModule m, num_partitions=8

ENTRY e {
  p = f32[8,6,3] parameter(0), sharding={devices=[2,1,4]0,5,1,2,3,6,4,7}
  i = s32[8,4] parameter(1), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT g = f32[8,4,3] gather(p, i), offset_dims={2}, collapsed_slice_dims={1},
    start_index_map={1}, index_vector_dim=2, slice_sizes={1,1,3},
    operand_batching_dims={0}, start_indices_batching_dims={0},
    sharding={devices=[4,1,1,2]<=[8] last_tile_dim_replicate}
}
"""


def test_the_operand_follows_the_indices_batch_tiles():
    """The local gather takes the indices' batch tiles (rows 0-3 on {0,1,2,3}, 4-7 on
    {4,5,6,7}) and the operand's dim-2 tiles on the devices of each, in the order of the tile
    each device holds, then of device id: devices 0, 3, 1, 2 (operand column tiles 0, 0, 2, 3)
    take tiles 0-3, and 5, 6, 4, 7 (1, 1, 2, 3) likewise: f32[4,4,1] on
    `[2,1,4]0,3,1,2,5,6,4,7`. Only devices 3 and 5 lack their operand tile and swap it
    (f32[4,6,1]: 96 B each); the result reaches the annotation by an all-to-all in pairs (32 B
    from each) and an all-gather of dim 2 (64 B from each): 192 B from the busiest device, 120
    on average, where keeping the operand's tiling (main before) sent 224 and 128 (the indices
    and the result also swapped between 3 and 5), and XLA's program sends 352 and 304."""
    spmd = check_equivalent(OPERAND_ORDER, 8, seed=17)
    assert collectives(spmd) == [
        ("collective-permute", [(0, 0), (1, 1), (2, 2), (3, 5), (4, 4), (5, 3), (6, 6),
                                (7, 7)]),
        ("all-to-all", [[0, 3], [1, 2], [5, 6], [4, 7]], (0,)),
        ("all-gather", [[0, 1], [3, 2], [5, 4], [6, 7]], (2,))]
    gather = next(inst for inst in spmd.entry.instructions if inst.opcode == "gather")
    assert gather.shape.dims == (4, 4, 1)
    assert str(gather.sharding) == "{devices=[2,1,4]0,3,1,2,5,6,4,7}"
    assert busiest_per_collective(spmd, 8) == 192
    assert sent_bytes(spmd, 8) == 120


@needs_xla
def test_the_operand_in_the_indices_order_sends_no_more_than_xla():
    result = compared_with_xla(OPERAND_ORDER, 8)
    assert (result.our_busiest, result.xla_busiest) == (192, 352)

# scatter's counterpart: the operand (= result) tiled on its indexed dim 1 in 2 tiles held by
# {0,1,2,3} and {4,5,6,7}; the indices and updates on the batching dim 0 in 4 tiles held by
# {k, k+4}; the combiner assigns (no identity: no partial results)
SCATTER = """HloModule m, num_partitions=8

assign {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}

ENTRY e {
  p = f32[8,6] parameter(0), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
  i = s32[8,3] parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  u = f32[8,3] parameter(2), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  ROOT s = f32[8,6] scatter(p, i, u), update_window_dims={}, inserted_window_dims={1},
    scatter_dims_to_operand_dims={1}, index_vector_dim=2, input_batching_dims={0},
    scatter_indices_batching_dims={0}, to_apply=assign,
    sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
}
"""


def _scatter_inputs():
    """Three distinct columns per row (an assignment is then the same in any order), 6 being
    out of bounds (dropped by the scatter)."""
    rng = np.random.default_rng(9)
    columns = np.stack([rng.permutation(7)[:3] for _ in range(8)]).astype(np.int32)
    return [rng.standard_normal((8, 6)).astype(np.float32), columns,
            rng.standard_normal((8, 3)).astype(np.float32)]


def test_the_scatter_keeps_the_results_tiles_with_the_indices_batch_tiles_on_each():
    """The local scatter takes the result's column tiles (device d: tile d // 4) and the
    indices' batch tiles on the devices of each (device d: rows 2 (d % 4), 2 (d % 4) + 1, where
    the indices and updates already are): f32[2,3] on `[4,2]<=[2,4]T(1,0)`, no input moved,
    each device shifting its indices by its columns' offset. The result goes to the annotation
    by an all-gather of dim 0 over {0,1,2,3} and {4,5,6,7} (3 x f32[2,3]: 72 B from each
    device), as XLA's program; keeping the updates' tiling (main before) gathered the operand's
    columns in pairs {d, d+4} too (24 B more from each)."""
    spmd = check_equivalent(SCATTER, 8, inputs=_scatter_inputs())
    assert collectives(spmd) == [("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7]], (0,))]
    scatter = next(inst for inst in spmd.entry.instructions if inst.opcode == "scatter")
    assert scatter.shape.dims == (2, 3)
    assert str(scatter.sharding) == "{devices=[4,2]<=[2,4]T(1,0)}"
    assert busiest_per_collective(spmd, 8) == 72
    assert sent_bytes(spmd, 8) == 72


@needs_xla
def test_the_scatter_in_the_results_tiling_sends_no_more_than_xla():
    result = compared_with_xla(SCATTER, 8)
    assert (result.our_busiest, result.xla_busiest) == (72, 72)



# the operand f32[8,6,3] (= result) addressed on dim 1 with window size 1, its dim 2 covered
# whole by the update windows; the combiner assigns
SCATTER_WINDOWS = """HloModule m, num_partitions=8

assign {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] copy(b)
}

ENTRY e {
  p = f32[8,6,3] parameter(0), sharding={OPERAND}
  i = s32[8,4] parameter(1), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  u = f32[8,4,3] parameter(2), sharding={UPDATES}
  ROOT s = f32[8,6,3] scatter(p, i, u), update_window_dims={2}, inserted_window_dims={1},
    scatter_dims_to_operand_dims={1}, index_vector_dim=2, input_batching_dims={0},
    scatter_indices_batching_dims={0}, to_apply=assign, sharding={RESULT}
}
"""


def _scatter_windows(operand: str, updates: str, result: str) -> str:
    return SCATTER_WINDOWS.replace("OPERAND", operand).replace("UPDATES", updates).replace(
        "RESULT", result)


def _scatter_windows_inputs():
    """Four distinct columns per row, 6 being out of bounds (dropped)."""
    rng = np.random.default_rng(21)
    columns = np.stack([rng.permutation(7)[:4] for _ in range(8)]).astype(np.int32)
    return [rng.standard_normal((8, 6, 3)).astype(np.float32), columns,
            rng.standard_normal((8, 4, 3)).astype(np.float32)]


# the indices' batch tiles on pairs {2k, 2k+1}; the operand's window dim 2 in 2 tiles held by
# {0,1,2,3} and {4,5,6,7}; the updates' batch tiles on pairs in another order
INDICES_TILES = _scatter_windows(
    "devices=[1,1,2,4]<=[8] last_tile_dim_replicate",
    "devices=[4,1,1,2]7,2,3,1,4,6,5,0 last_tile_dim_replicate",
    "devices=[4,1,1,2]<=[8] last_tile_dim_replicate")


def test_the_scatter_runs_in_its_result_tiles_where_the_operand_moves_by_pieces():
    """The local scatter could take the indices' batch tiles (pair k: rows 2k, 2k+1) and the
    operand's dim-2 tiles on the devices of each, then gather the result on dim 2 in the pairs:
    256 B from the busiest device, 192 on average (XLA's program: 256 and 216). In the
    result's own tiles instead (`[4,1,1,2]<=[8]`, whole on dim 2), every device holds one
    dim-2 tile of all rows of the operand and lacks the other tile of its two rows: an
    exchange of f32[2,6,2] pieces (96 B) from a device of the other operand tile; the updates
    move to the same rows by a permute (f32[2,4,3], 96 B, from the 6 devices not holding
    theirs): 192 B from the busiest device, 168 on average, nothing gathered after."""
    spmd = check_equivalent(INDICES_TILES, 8, inputs=_scatter_windows_inputs())
    assert collectives(spmd) == [
        ("collective-permute", [(0, 4), (1, 5), (2, 6), (3, 7), (4, 0), (5, 1), (6, 2),
                                (7, 3)]),
        ("collective-permute", [(0, 6), (1, 2), (2, 0), (3, 3), (4, 4), (5, 7), (6, 5),
                                (7, 1)])]
    scatter = next(inst for inst in spmd.entry.instructions if inst.opcode == "scatter")
    assert scatter.shape.dims == (2, 6, 3)
    assert busiest_per_collective(spmd, 8) == 192
    assert sent_bytes(spmd, 8) == 168


# the operand's indexed dim 1 in 2 tiles held by {0,5,7,2} and {4,1,3,6}; the updates' batch
# tiles on pairs and their dim 1 (the indices' other batch dim) in 2; the result on the batching
# dim and dim 2
OPERAND_TILES = _scatter_windows(
    "devices=[1,2,1,4]0,5,7,2,4,1,3,6 last_tile_dim_replicate",
    "devices=[4,2,1]<=[8]",
    "devices=[2,1,2,2]0,5,7,3,6,4,1,2 last_tile_dim_replicate")


def test_the_scatter_keeps_the_operands_tiles_with_the_indices_batch_tiles_on_each():
    """Keeping the operand's dim-1 tiles with the indices' batch tiles on the devices of each
    ({0,5,7,2} hold index tiles 0, 2, 3, 1, so 0, 2, 5, 7 take batch tiles 0-3; {4,1,3,6}
    likewise 1, 3, 4, 6: f32[2,3,3] on `[4,2,1]0,1,2,3,5,4,7,6`, neither the operand nor the
    indices moving) sent 264 B from the busiest device, 237 on average (the updates gathered on
    dim 1 in the pairs, 48 B, the result to its annotation by a permute, an all-to-all in pairs
    and an all-gather; main sent 312 and 264 and XLA's program sends 480 and 396). Now that the
    result reaches its annotation by pieces, the scatter runs on f32[2,6,3] in the indices'
    batch tiles held twice: the operand gathered on dim 1 in pairs (72 B), the updates too
    (48 B), then the result's pieces in four rounds (devices 2, 4 and 6 send 144 B, devices
    0, 1 and 3 96, devices 5 and 7 48): 264 B from the busiest device again, 222 on average. The
    rounds' busiest devices sum to 408 over the program's collectives, but no device sends in
    every round."""
    spmd = check_equivalent(OPERAND_TILES, 8, inputs=_scatter_windows_inputs())
    assert collectives(spmd)[:2] == [("all-gather", [[0, 1], [2, 3], [5, 4], [7, 6]], (1,)),
                                     ("all-gather", [[0, 1], [2, 3], [4, 5], [6, 7]], (1,))]
    scatter = next(inst for inst in spmd.entry.instructions if inst.opcode == "scatter")
    assert scatter.shape.dims == (2, 6, 3)
    assert str(scatter.sharding) == "{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}"
    assert sent_per_device(spmd, 8).tolist() == [216, 216, 264, 216, 264, 168, 264, 168]


@needs_xla
@pytest.mark.parametrize("text, ours, xla", [(INDICES_TILES, 192, 256), (OPERAND_TILES, 264, 480)],
                         ids=["scatter-indices-tiles", "scatter-operand-tiles"])
def test_the_scatters_send_no_more_than_xla(text, ours, xla):
    result = compared_with_xla(text, 8)
    assert (result.our_busiest, result.xla_busiest) == (ours, xla)
