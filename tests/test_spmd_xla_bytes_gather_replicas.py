"""No more collective bytes than XLA (issue 13) for a gather whose operand is tiled on an indexed
dim and replicated over groups of devices, while the indices and the result are tiled on the
batch dim over devices that cut across those groups: XLA's gather recursion keeps the operand's
index tiles and lays the indices' (or the result's) batch tiles over the replicas of each, so
the local gathers are masked and summed in small groups and the summed tiles move once
(`_within` in `passes/spmd/op_rules_gather.py`). Bytes per device by hand from the cost model's
formulas (`gspmdc.ir.cost`: a ring all-reduce of B bytes over g devices sends 2 (g-1)/g B, a
collective-permute B from each device that sends to another); values against the
unpartitioned program; with the `[xla]` extra, against XLA's own partitioned program (skipped
without it)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.passes.spmd.op_rules_gather import _within
from gspmdc.passes.spmd.tiling import tiling_from_coordinates

from conformance.differential import Case, run_case
from conformance.oracle import xla_available
from spmd_partition_helpers import busiest_per_collective, check_equivalent, collectives, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


ON_REPLICAS = """HloModule m, num_partitions=8

ENTRY e {
  p = f32[2,64] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  i = s32[8,2] parameter(1), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  ROOT g = f32[8,4] gather(p, i), offset_dims={1}, collapsed_slice_dims={0},
    start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,4},
    sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""


def _inputs():
    """Row indices over both operand tiles (and out of range: clamped), columns anywhere."""
    rng = np.random.default_rng(3)
    p = rng.standard_normal((2, 64)).astype(np.float32)
    rows = np.array([0, 1, 1, 0, 5, -2, 1, 0], np.int32)
    cols = rng.integers(-4, 70, 8).astype(np.int32)
    return [p, np.stack([rows, cols], axis=1)]


def test_the_indices_batch_tiles_go_over_the_replicas_of_each_operand_tile():
    """The operand's row tiles are held by devices 0-3 and 4-7; the indices' and the result's
    four batch tiles by pairs {0,1}, {2,3}, {4,5}, {6,7}, which cut across those groups. Laid
    over each group's replicas instead (device d: batch tile d % 4, operand tile d // 4), the
    indices move by one collective-permute (s32[2,2], 16 B, from the 6 devices whose tile
    changes: 12 B on average), the masked local gathers f32[2,4] (32 B) are summed over
    {d, d+4} (all-reduce, 2 (2-1)/2 x 32 = 32 B) and the summed tiles go to the result's
    devices by one collective-permute (32 B from 6 devices: 24 B): 68 B per device on average,
    80 from the busiest, XLA's program. Keeping the operand's tiling instead gathered the
    indices (48 B) and reduce-scattered the whole partial f32[8,4] (64 B): 112 B."""
    spmd = check_equivalent(ON_REPLICAS, 8, inputs=_inputs())
    assert [c[0] for c in collectives(spmd)] == \
        ["collective-permute", "all-reduce", "collective-permute"]
    assert collectives(spmd)[1][1] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sent_bytes(spmd, 8) == 68
    assert busiest_per_collective(spmd, 8) == 80


def test_gather_on_replicas_keeps_values_with_random_indices():
    """The same gather on random inputs (indices anywhere, clamped by the gather)."""
    check_equivalent(ON_REPLICAS, 8, seed=5)


def test_tiles_spread_evenly_over_each_group_keep_their_devices():
    """Index tiles by device d % 2, operand tiles by d // 2 (4 devices): each operand tile's two
    devices hold both index tiles already, so the layout is unchanged (the coarsening alone,
    as scatter's candidates use it)."""
    d = np.arange(4)
    part = (np.stack([d % 2], axis=1), [2])
    other = (np.stack([d // 2], axis=1), [2])
    coords, counts = _within(part, [0], other, [0], 4)
    assert counts == [2] and coords[:, 0].tolist() == [0, 1, 0, 1]


def test_tiles_sharing_the_groups_axis_are_laid_over_each_groups_devices():
    """Index tiles by d // 2 and operand tiles by d // 4 on 8 devices: the index tiles of a
    group are 0, 0, 1, 1 (and 2, 2, 3, 3), which do not form one tiling with the operand's;
    laid over each group's devices in order they become d % 4, which does."""
    d = np.arange(8)
    part = (np.stack([d // 2, np.zeros(8, np.int64)], axis=1), [4, 1])
    other = (np.stack([np.zeros(8, np.int64), d // 4], axis=1), [1, 2])
    coords, counts = _within(part, [0], other, [1], 8)
    assert counts[0] == 4 and coords[:, 0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    coords[:, 1] = other[0][:, 1]
    assert tiling_from_coordinates(coords, (4, 2)) is not None


@needs_xla
def test_gather_on_replicas_sends_no_more_than_xla():
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        result = run_case(Case("gather-on-replicas", ON_REPLICAS, 8, False, False), oracle)
    assert result.our_bytes is not None and result.xla_bytes is not None
    assert result.our_bytes <= result.xla_bytes
