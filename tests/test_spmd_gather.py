"""Gather partitioning (docs/design/partitioning.md#gather-and-scatter): each strategy forced by
the shardings, checked against
the unpartitioned program on 2, 3, 4 and 8 partitions (uneven shards, garbage padding, start
indices out of range so HLO's clamping matters), with the collectives each strategy implies."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.traffic import collective_traffic, sent_per_device
from gspmdc.runtime import io

from hlo_text import hlo_module as module, reducer
from spmd_partition_helpers import check_equivalent, collectives, run_global, sent_bytes

SHARED = Path(__file__).resolve().parents[2] / "shared"

DEVICES = [2, 3, 4, 8]


def table(rows: int, cols: int) -> np.ndarray:
    return (np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + 1) * 0.5


def tiled(n: int, rank: int, dim: int) -> str:
    counts = [1] * rank
    counts[dim] = n
    return f"{{devices=[{','.join(map(str, counts))}]<=[{n}]}}"


#: start indices with values below 0 and beyond the table (clamped by HLO)
INDICES = np.array([[3], [-4], [0], [40], [55], [17], [1]], np.int32)
#: rows of the tables indexed by INDICES (uneven on 2, 3, 4 and 8 partitions)
ROWS = 41


@pytest.mark.parametrize("n", DEVICES)
def test_indexed_operand_dim_is_gathered_by_masked_local_gathers_and_one_all_reduce(n):
    text = module(f"""
  t = f32[{ROWS},6] parameter(0), sharding={tiled(n, 2, 0)}
  i = s32[7,1] parameter(1), sharding={{replicated}}
  ROOT g = f32[7,6] gather(t, i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,6}}, sharding={{replicated}}""")
    spmd = check_equivalent(text, n, inputs=[table(ROWS, 6), INDICES])
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert collectives(spmd)[0][1] == [list(range(n))]


@pytest.mark.parametrize("n", DEVICES)
def test_indexed_operand_with_implicit_index_vector_and_tiled_result(n):
    """index_vector_dim = rank of the indices; the partial result is reduce-scattered into the
    result's tiling of the offset dim."""
    text = module(f"""
  t = f32[{ROWS},{2 * n}] parameter(0), sharding={tiled(n, 2, 0)}
  i = s32[5] parameter(1), sharding={{replicated}}
  ROOT g = f32[5,{2 * n}] gather(t, i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{2 * n}}}, sharding={tiled(n, 2, 1)}""")
    indices = np.array([40, -1, 14, 3, 70], np.int32)
    spmd = check_equivalent(text, n, inputs=[table(ROWS, 2 * n), indices])
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter"]


@pytest.mark.parametrize("n", DEVICES)
def test_operand_pass_through_dim_needs_no_communication(n):
    text = module(f"""
  t = f32[4,9] parameter(0), sharding={tiled(n, 2, 1)}
  i = s32[7,1] parameter(1), sharding={{replicated}}
  ROOT g = f32[7,9] gather(t, i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,9}}, sharding={tiled(n, 2, 1)}""")
    spmd = check_equivalent(text, n, inputs=[table(4, 9), INDICES])
    assert collectives(spmd) == []


@pytest.mark.parametrize("n", DEVICES)
def test_index_pass_through_dims_need_no_communication(n):
    text = module(f"""
  t = f32[{ROWS},3] parameter(0), sharding={{replicated}}
  i = s32[7,1] parameter(1), sharding={tiled(n, 2, 0)}
  ROOT g = f32[7,3] gather(t, i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,3}}, sharding={tiled(n, 2, 0)}""")
    spmd = check_equivalent(text, n, inputs=[table(ROWS, 3), INDICES])
    assert collectives(spmd) == []


@pytest.mark.parametrize("n", DEVICES)
def test_explicit_batch_dims_tiled_alike_need_no_communication(n):
    """take_along_axis: operand and indices tiled on their batching dims."""
    text = module(f"""
  x = f32[9,6] parameter(0), sharding={tiled(n, 2, 0)}
  i = s32[9,2,1] parameter(1), sharding={tiled(n, 3, 0)}
  ROOT g = f32[9,2] gather(x, i), offset_dims={{}}, collapsed_slice_dims={{1}}, start_index_map={{1}}, operand_batching_dims={{0}}, start_indices_batching_dims={{0}}, index_vector_dim=2, slice_sizes={{1,1}}, sharding={tiled(n, 2, 0)}""")
    indices = np.array([[-1, 7, 0, 5, 2, 9, 3, 4, 1], [5, 0, 6, 1, 4, 2, -8, 3, 3]],
                       np.int32).T.reshape(9, 2, 1)
    spmd = check_equivalent(text, n, inputs=[table(9, 6), indices])
    assert collectives(spmd) == []


def test_vocab_and_batch_tiles_combine_on_a_mesh():
    """The embedding pattern on a 2x4 mesh: table rows over y, token batch over x; each device
    gathers its rows for its batch and one all-reduce over y combines them (no all-gather of the
    table)."""
    text = module("""
  t = f32[53,4] parameter(0), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  i = s32[6,5,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT g = f32[6,5,4] gather(t, i), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,4}, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}""")
    rng = np.random.default_rng(1)
    indices = rng.integers(-3, 60, size=(6, 5, 1)).astype(np.int32)
    spmd = check_equivalent(text, 8, inputs=[table(53, 4), indices])
    found = collectives(spmd)
    assert [c[0] for c in found] == ["all-reduce"]
    assert found[0][1] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_two_index_components_one_tiled_with_a_window():
    """A 2-component start index: dim 0 indexed with slice size 1 (tiled, masked), dim 1 with a
    window of 2 (gathered, clamped to [0, 3])."""
    text = module("""
  t = f32[37,5] parameter(0), sharding={devices=[3,1]<=[3]}
  i = s32[4,2] parameter(1), sharding={replicated}
  ROOT g = f32[4,2] gather(t, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,2}, sharding={replicated}""")
    indices = np.array([[36, 4], [-2, 1], [13, -5], [50, 3]], np.int32)
    spmd = check_equivalent(text, 3, inputs=[table(37, 5), indices])
    assert "all-gather" not in [c[0] for c in collectives(spmd)]


def test_embedding_gather_moves_no_more_bytes_than_xla():
    """jax-programs/embedding_gather (vocab-sharded table, take_along_axis): XLA's outputs with no
    more collective bytes per run than XLA's own partitioning."""
    folder = SHARED / "jax-programs" / "embedding_gather"
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    reference = json.loads((folder / "reference.json").read_text())
    n = reference["num_partitions"]
    spmd = api.parse(api.to_text(compile_spmd(api.load(folder / "program.hlo"), n)))
    inputs = io.read_inputs(folder / "inputs.npz", api.load(folder / "program.hlo"))
    got = io.output_arrays(spmd, run_global(spmd, inputs, n))
    want = np.load(folder / "outputs.npz")
    for key in want.files:
        np.testing.assert_allclose(np.asarray(got[key], np.float64),
                                   np.asarray(want[key], np.float64), rtol=1e-4, atol=1e-5)
    traffic = collective_traffic(spmd, n)
    xla = reference["collectives"]["xla_spmd"]
    assert sum(t.total_result_bytes for t in traffic) <= xla["total_dynamic_bytes"]
    assert sum(t.total_sent_bytes for t in traffic) <= xla["total_est_sent_bytes"] + 1e-6
    assert "all-gather" not in {t.opcode for t in traffic}


# ---- scatter ---------------------------------------------------------------------------------

COMBINERS = reducer("add") + reducer("max") + """
assign {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}

add_pair {
  a0 = f32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  s0 = f32[] add(a0, b0)
  s1 = s32[] add(a1, b1)
  ROOT r = (f32[], s32[]) tuple(s0, s1)
}
"""


def scatter_module(body: str) -> str:
    return module(body, COMBINERS)


#: scatter indices with duplicates (3 twice) and out-of-range rows (skipped by HLO)
SCATTER_INDICES = np.array([[3], [-4], [0], [40], [55], [17], [3]], np.int32)


@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("combiner", ["add", "assign", "max"])
def test_scatter_into_an_indexed_tiled_dim_shifts_indices_locally(n, combiner):
    """Trivially sliced operand: indices and updates replicated, each partition shifts the
    indices by its offset and scatter's bounds check drops the others: no communication, any
    combiner."""
    text = scatter_module(f"""
  x = f32[{ROWS},6] parameter(0), sharding={tiled(n, 2, 0)}
  i = s32[7,1] parameter(1), sharding={{replicated}}
  u = f32[7,6] parameter(2), sharding={{replicated}}
  ROOT s = f32[{ROWS},6] scatter(x, i, u), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply={combiner}, sharding={tiled(n, 2, 0)}""")
    updates = np.arange(42, dtype=np.float32).reshape(7, 6) - 20
    spmd = check_equivalent(text, n, inputs=[table(ROWS, 6), SCATTER_INDICES, updates])
    assert collectives(spmd) == []


@pytest.mark.parametrize("n", DEVICES)
def test_scatter_with_a_tiled_window_dim_keeps_operand_and_updates_tiled(n):
    """Operand pass-through: the updates cover dim 1 whole, so both stay tiled on it."""
    text = scatter_module(f"""
  x = f32[5,{2 * n + 1}] parameter(0), sharding={tiled(n, 2, 1)}
  i = s32[7,1] parameter(1), sharding={{replicated}}
  u = f32[7,{2 * n + 1}] parameter(2), sharding={tiled(n, 2, 1)}
  ROOT s = f32[5,{2 * n + 1}] scatter(x, i, u), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=add, sharding={tiled(n, 2, 1)}""")
    indices = np.array([[3], [-1], [0], [4], [5], [2], [3]], np.int32)
    updates = np.arange(7 * (2 * n + 1), dtype=np.float32).reshape(7, -1)
    spmd = check_equivalent(text, n, inputs=[table(5, 2 * n + 1), indices, updates])
    assert collectives(spmd) == []


def test_scatter_window_covering_a_tiled_indexed_dim_keeps_its_index():
    """The updates cover tiled dim 0 whole and an index component addresses it: the window is in
    bounds only at 0, on every shard alike, so that component is not shifted by the shard's
    offset (shifting made the shards after the first skip the update: fuzz/9400000031)."""
    text = scatter_module("""
  x = f32[4,3] parameter(0), sharding={replicated}
  i = s32[5,3,2] parameter(1), sharding={replicated}
  u = f32[5,4,3,1] parameter(2), sharding={replicated}
  ROOT s = f32[4,3] scatter(x, i, u), update_window_dims={1,3}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=2, to_apply=add, sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}""")
    indices = np.stack([np.array([[0, 0, 1], [0, -1, 0], [2, 0, 0], [0, 0, 0], [0, 3, 0]]),
                        np.array([[0, 1, 2], [2, 1, 0], [1, 3, -1], [1, 2, 0], [0, 0, 2]])],
                       axis=-1).astype(np.int32)
    updates = np.arange(60, dtype=np.float32).reshape(5, 4, 3, 1)
    spmd = check_equivalent(text, 8, inputs=[table(4, 3), indices, updates])
    assert collectives(spmd) == []


@pytest.mark.parametrize("n", DEVICES)
def test_scatter_with_explicit_batch_dims_tiled_alike(n):
    text = scatter_module(f"""
  x = f32[9,6] parameter(0), sharding={tiled(n, 2, 0)}
  i = s32[9,2,1] parameter(1), sharding={tiled(n, 3, 0)}
  u = f32[9,2] parameter(2), sharding={tiled(n, 2, 0)}
  ROOT s = f32[9,6] scatter(x, i, u), update_window_dims={{}}, inserted_window_dims={{1}}, input_batching_dims={{0}}, scatter_indices_batching_dims={{0}}, scatter_dims_to_operand_dims={{1}}, index_vector_dim=2, to_apply=add, sharding={tiled(n, 2, 0)}""")
    indices = np.array([[-1, 7, 0, 5, 2, 9, 3, 4, 1], [5, 0, 6, 1, 2, 2, -8, 3, 1]],
                       np.int32).T.reshape(9, 2, 1)
    updates = np.arange(18, dtype=np.float32).reshape(9, 2)
    spmd = check_equivalent(text, n, inputs=[table(9, 6), indices, updates])
    assert collectives(spmd) == []


def test_variadic_scatter_into_indexed_tiled_dims_on_a_mesh():
    """Two operands combined as a pair; rows tiled over one mesh axis, replicated over the
    other; the 2-component index also addresses the whole column dim."""
    text = scatter_module("""
  x = f32[23,5] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  y = s32[23,5] parameter(1), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  i = s32[6,2] parameter(2), sharding={replicated}
  u = f32[6] parameter(3), sharding={replicated}
  v = s32[6] parameter(4), sharding={replicated}
  ROOT s = (f32[23,5], s32[23,5]) scatter(x, y, i, u, v), update_window_dims={}, inserted_window_dims={0,1}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=add_pair, sharding={{devices=[4,1,2]<=[8] last_tile_dim_replicate}, {devices=[4,1,2]<=[8] last_tile_dim_replicate}}""")
    indices = np.array([[22, 4], [0, 0], [5, 5], [-1, 2], [6, 1], [22, 4]], np.int32)
    spmd = check_equivalent(text, 8, inputs=[
        table(23, 5), np.arange(115, dtype=np.int32).reshape(23, 5), indices,
        np.arange(6, dtype=np.float32), np.arange(6, dtype=np.int32) * 10])
    assert collectives(spmd) == []


@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("combiner", ["add", "max"])
def test_scatter_with_tiled_indices_combines_partial_results_with_its_combiner(n, combiner):
    """Index pass-through: indices and updates stay tiled on their batch dim (uneven: padding
    rows are dropped), every partition scatters its share into the operand (first partition) or
    the combiner's identity, and one all-reduce with the scatter's own computation combines."""
    text = scatter_module(f"""
  x = f32[6,4] parameter(0), sharding={{replicated}}
  i = s32[{8 * n + 3},1] parameter(1), sharding={tiled(n, 2, 0)}
  u = f32[{8 * n + 3},4] parameter(2), sharding={tiled(n, 2, 0)}
  ROOT s = f32[6,4] scatter(x, i, u), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply={combiner}, sharding={{replicated}}""")
    rows = 8 * n + 3
    rng = np.random.default_rng(n)
    indices = rng.integers(-2, 8, size=(rows, 1)).astype(np.int32)
    updates = rng.integers(-50, 50, size=(rows, 4)).astype(np.float32)
    spmd = check_equivalent(text, n, inputs=[table(6, 4), indices, updates])
    found = collectives(spmd)
    assert [c[0] for c in found] == ["all-reduce"]
    (reducer,) = [i.attr("to_apply").name for i in spmd.entry.instructions
                  if i.opcode == "all-reduce"]
    assert reducer == combiner


def test_scatter_assignment_with_tiled_indices_gathers_them():
    """Assignment has no identity to combine partial results with: the indices are gathered
    (each device's s32[5,1], 20 B, to the 3 others: 60 B), and the updates' row tiles move
    to the columns their windows cover whole (an all-to-all: 3/4 of each device's f32[5,4],
    60 B), so the scatter runs on column tiles and its f32[6,1] tiles are gathered (24 B to 3
    others: 72 B): 192 B per device, where gathering the updates too sent 300 B."""
    text = scatter_module("""
  x = f32[6,4] parameter(0), sharding={replicated}
  i = s32[19,1] parameter(1), sharding={devices=[4,1]<=[4]}
  u = f32[19,4] parameter(2), sharding={devices=[4,1]<=[4]}
  ROOT s = f32[6,4] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=assign, sharding={replicated}""")
    indices = np.array([[k % 5] for k in range(19)], np.int32)       # unique per row of 5
    updates = np.arange(76, dtype=np.float32).reshape(19, 4)
    spmd = check_equivalent(text, 4, inputs=[table(6, 4), indices, updates])
    assert [c[0] for c in collectives(spmd)] == ["all-gather", "all-to-all", "all-gather"]
    assert sent_bytes(spmd, 4) == 192


def test_a_tie_of_the_busiest_device_goes_to_the_fewest_bytes_over_all_devices():
    """A gather with a batching dim (operand dim 1, indices dim 1) on 4 devices: the operand's
    batch tiles lie on devices {0,1} and {2,3}, the indices' on {0,2} and {1,3}, and the
    result is annotated in the indices' tiling with its devices reordered (1,3,0,2), in which
    the operand's batch tiles already match. Moving the indices to the result's order sends
    each device's `s32[1,8,1,1]` (32 B from each: 128 B in all); aligning the operand to the
    indices (two devices trade their `pred[3,8]` rows, 24 B) and moving the `pred[1,8,1]`
    result (8 B from each) sends 32 B from the busiest device too, but 80 B in all: the tie
    goes to it, as XLA's partitioner aligns the operand with the indices' batch tiles and
    reshards the result."""
    text = module("""
  x = pred[3,16] parameter(0), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  i = s32[2,16,1,1] parameter(1), sharding={devices=[2,2,1,1]<=[4]}
  ROOT g = pred[2,16,1] gather(x, i), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0}, operand_batching_dims={1}, start_indices_batching_dims={1}, index_vector_dim=3, slice_sizes={1,1}, sharding={devices=[2,2,1]1,3,0,2}""")
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 2, size=(3, 16)).astype(bool),
              rng.integers(-1, 4, size=(2, 16, 1, 1)).astype(np.int32)]
    spmd = check_equivalent(text, 4, inputs=inputs)
    sent = sent_per_device(spmd, 4)
    assert sent.max() == 32 and sent.sum() == 80
