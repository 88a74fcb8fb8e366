"""No more collective bytes than XLA (issue 13) for three gather/scatter partitionings of XLA's
(`passes/spmd/op_rules_gather.py`):

- a gather whose operand is tiled on its indexed dim over every device while the indices and
  the result have batch tiles held by groups of devices: XLA's index pass-through groups the
  devices by the batch tiles and, where the operand has too few replicas for that, coarsens its
  index tiles onto each group's devices (`GroupShardingOnReplicatedDim` borrowing from the
  trivially sliced dims), so the masked local gathers are summed within each group; ties on the
  busiest device are broken by the bytes of all devices (docs/design/cost-model.md);
- scatter's counterpart, XLA's trivially sliced operand: the result's tiles kept and the
  indices' batch tiles coarsened onto the replicas of each (a generated module, where the
  candidates before sent more);
- a variadic scatter whose results are not all on one device (`{maximal device=2}` beside a
  tiled result): XLA runs it like any scatter, in the operands' tiling, and moves only the
  maximal result, where gspmdc gathered both operands onto device 2.

Bytes by hand from the cost model's formulas (`gspmdc.ir.cost`); values against numpy written
here and the unpartitioned program; with the `[xla]` extra, against XLA's own partitioned
program (skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.differential import Case, run_case
from conformance.oracle import xla_available
from spmd_partition_helpers import (busiest_per_collective, check_equivalent, collectives,
                                    partition, run_global, sent_bytes)

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


GATHER = """HloModule m, num_partitions=6

ENTRY e {
  p = f32[5] parameter(0), sharding={devices=[6]<=[6]}
  i = u32[4,1] parameter(1), sharding={devices=[2,1,3]<=[6] last_tile_dim_replicate}
  ROOT g = f32[4] gather(p, i), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0},
    index_vector_dim=1, slice_sizes={1}, sharding={devices=[2,3]<=[6] last_tile_dim_replicate}
}
"""


def _gather_inputs():
    """Indices over the whole operand, and beyond it (clamped to 4 by the gather)."""
    p = np.array([0.5, -1.25, 2.0, 3.5, -4.75], np.float32)
    return [p, np.array([[4], [0], [9], [2]], np.uint32)]


def test_gather_sums_masked_gathers_within_each_batch_group():
    """f32[5] in 6 one-element tiles, indices and result in 2 batch tiles held by {0,1,2} and
    {3,4,5}. The operand's 6 index tiles cannot sit beside the batch tiles (6 x 2 > 6 devices):
    coarsened to 3 tiles of 2 elements laid over each group's devices (device d: batch tile
    d // 3, operand tile d % 3), the operand moves by one collective-permute (f32[1] from the
    4 devices whose element goes elsewhere: 16 B in all) and one all-gather in pairs {d, d+3}
    (4 B from each device: 24 B), and the masked local f32[2] gathers are all-reduced over each
    group (2 (3-1) x 8 B per group: 64 B): 104 B over the 6 devices, 17.33 each, 20 from the
    busiest (4 + 4 + 12). Gathering the operand whole sends 20 B from every device (120 B):
    a tie on the busiest device, which the bytes of all devices break."""
    spmd = check_equivalent(GATHER, 6, inputs=_gather_inputs())
    assert collectives(spmd) == [
        ("collective-permute", [(0, 0), (1, 3), (2, 1), (3, 4), (4, 2), (5, 5)]),
        ("all-gather", [[0, 3], [1, 4], [2, 5]], (0,)),
        ("all-reduce", [[0, 1, 2], [3, 4, 5]])]
    assert sent_bytes(spmd, 6) * 6 == 104
    assert busiest_per_collective(spmd, 6) == 20


def test_gather_in_groups_matches_numpy():
    """The partitioned gather's values against numpy: `p[clamp(i, 0, 4)]`."""
    p, i = _gather_inputs()
    got = run_global(partition(GATHER, 6), _gather_inputs(), 6)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(np.asarray(got), p[np.clip(i[:, 0], 0, 4)])


def test_gather_in_groups_keeps_values_with_random_indices():
    check_equivalent(GATHER, 6, seed=7)


SCATTER = """HloModule m, num_partitions=4

smallest {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  d = f32[] parameter(3)
  x = f32[] minimum(a, c)
  y = f32[] minimum(b, d)
  ROOT t = (f32[], f32[]) tuple(x, y)
}

ENTRY e {
  p = f32[6,2] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  q = f32[6,2] parameter(1), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  i = s32[1,1] parameter(2), sharding={replicated}
  u = f32[1,6] parameter(3), sharding={replicated}
  s = (f32[6,2], f32[6,2]) scatter(p, q, i, u, u), update_window_dims={1},
    inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, index_vector_dim=1,
    to_apply=smallest,
    sharding={{maximal device=2}, {devices=[2,1,2]<=[4] last_tile_dim_replicate}}
  a = f32[6,2] get-tuple-element(s), index=0, sharding={maximal device=2}
  b = f32[6,2] get-tuple-element(s), index=1,
    sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  ROOT r = (f32[6,2], f32[6,2]) tuple(a, b),
    sharding={{maximal device=2}, {devices=[2,1,2]<=[4] last_tile_dim_replicate}}
}
"""


def _scatter_inputs():
    rng = np.random.default_rng(11)
    p = rng.standard_normal((6, 2)).astype(np.float32)
    q = rng.standard_normal((6, 2)).astype(np.float32)
    return [p, q, np.array([[1]], np.int32), rng.standard_normal((1, 6)).astype(np.float32)]


def test_scatter_with_a_maximal_result_runs_in_its_operands_tiling():
    """The update windows cover the operands' tiled dim 0 whole, so the scatter runs on the
    operands' row tiles (the replicated updates sliced locally) and only the result on device 2
    moves: one all-gather of f32[3,2] in pairs {0,2}, {1,3} (24 B from each device), XLA's
    program. Before, both operands were gathered onto device 2 (48 B from each device)."""
    spmd = check_equivalent(SCATTER, 4, inputs=_scatter_inputs())
    scatter = next(inst for inst in spmd.entry.instructions if inst.opcode == "scatter")
    assert [leaf.dims for leaf in scatter.shape.leaves()] == [(3, 2), (3, 2)]
    assert collectives(spmd) == [("all-gather", [[0, 2], [1, 3]], (0,))]
    assert sent_bytes(spmd, 4) == 24


def test_scatter_with_a_maximal_result_matches_numpy():
    """Column 1 of both operands becomes the minimum of itself and the update row."""
    p, q, i, u = _scatter_inputs()
    want_p, want_q = p.copy(), q.copy()
    want_p[:, 1] = np.minimum(p[:, 1], u[0])
    want_q[:, 1] = np.minimum(q[:, 1], u[0])
    got = run_global(partition(SCATTER, 4), _scatter_inputs(), 4)
    np.testing.assert_array_equal(np.asarray(got[0]), want_p)
    np.testing.assert_array_equal(np.asarray(got[1]), want_q)


@needs_xla
@pytest.mark.parametrize("name, text, n", [("gather-in-groups", GATHER, 6),
                                           ("scatter-maximal-and-tiled", SCATTER, 4)])
def test_no_more_bytes_than_xla_and_the_same_values(name, text, n):
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        result = run_case(Case(name, text, n, False, False), oracle)
    assert result.status == "compared", result.detail
    assert result.our_bytes is not None and result.xla_bytes is not None
    assert result.our_bytes <= result.xla_bytes
    assert result.values == "compared" and not result.value_mismatch


def test_scatter_spreads_its_updates_over_each_result_tiles_replicas():
    """Scatter's counterpart (XLA's trivially sliced operand, the indices grouped on the
    replicas of each operand tile): in fuzz/11100001462 (propagation to outputs and parameters
    on) an f32[15] `maximum` scatter keeps its result's 4 tiles, each held by 2 devices, and
    takes the indices' batch tiles coarsened onto those pairs, the partial results combined
    by an all-reduce in each pair: 87 B per device (96 from the busiest), where the candidates
    before sent 108 (112); the values still equal the unpartitioned program's."""
    import fuzz
    from conformance.differential import _gspmdc_compile
    from spmd_partition_helpers import assert_close, inputs_for, reference
    c = fuzz.case(11100001462)
    case = Case("fuzz/11100001462 [on]", c.text, c.num_partitions, True, True)
    _, spmd = _gspmdc_compile(c.text, case)
    scatter = next(inst for inst in spmd.entry.instructions if inst.opcode == "scatter")
    assert scatter.sharding.has_unreduced
    assert sent_bytes(spmd, 8) == 87
    assert sent_per_device(spmd, 8).max() == 96
    inputs = inputs_for(c.text, 3)
    assert_close(run_global(spmd, inputs, 8), reference(c.text, inputs))
