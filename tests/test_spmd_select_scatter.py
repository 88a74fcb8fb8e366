"""select-and-scatter partitioned along its windowed dims (op_rules_window.py): operand halos
in, scattered contributions back to their owners (halo.return_halo); compared with the
unpartitioned program with garbage padding."""
from __future__ import annotations

import pytest

from spmd_partition_helpers import check_equivalent
from test_spmd_window_ops import halo_only, module, tiled

# (operand rows, window spec on dim 0, source rows)
SCATTER_WINDOWS = [
    (16, "size=3x1 stride=2x1 pad=1_1x0_0", 8),      # overlapping windows, padding
    (10, "size=3x1 stride=1x1 pad=1_1x0_0", 10),     # uneven, stride 1
    (10, "size=3x1 stride=2x1 pad=1_1x0_0", 5),      # uneven source too
    (20, "size=5x1 pad=2_2x0_0", 20),                # two elements each side
    (9, "size=3x1 stride=2x1", 4),
]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("rows,window,out", SCATTER_WINDOWS)
def test_select_and_scatter_sends_halos_there_and_back(n, rows, window, out):
    """Max-pool gradient: operand halos in, scattered contributions on neighbours' elements
    back by the reverse permutes; padding (-inf) never selected, uneven source masked."""
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},32] parameter(0), sharding={s}
  g = f32[{out},32] parameter(1), sharding={s}
  z = f32[] constant(0.5)
  ROOT r = f32[{rows},32] select-and-scatter(x, g, z), window={{{window}}}, select=ge,
    scatter=add, sharding={s}"""), n, rtol=1e-4, atol=1e-4)
    halo_only(spmd, required=False)


def test_select_and_scatter_without_halos_masks_the_padding_of_an_uneven_source():
    """Window 1 with stride 3 on a dim of 2 tiled in two: each shard's window input is its own
    element (no halo), but the source dim (1 element) is uneven: the second shard's source
    element is padding and must scatter nothing (it scattered the first shard's value again;
    found by fuzzing)."""
    check_equivalent(module("""
  x = f32[5,2,5] parameter(0), sharding={devices=[1,2,1,3]<=[6] last_tile_dim_replicate}
  g = f32[2,1,4] parameter(1), sharding={replicated}
  z = f32[] constant(0)
  ROOT r = f32[5,2,5] select-and-scatter(x, g, z), window={size=3x1x2 stride=2x3x1},
    select=ge, scatter=add, sharding={devices=[3,1,2]<=[2,3]T(1,0)}"""), 6)
