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
