"""No more collective bytes than XLA (issue 13) by the partitioner's per-op strategies, as XLA's
partitioner has them: a convolution whose window covers a tiled spatial dim whole convolves each
partition's part of the window and all-reduces the small partial result (instead of gathering
the input); a slice annotated onto one device is sliced in its tiled operand's tiling first.
Bytes per device by hand from the cost model's formulas (`gspmdc.ir.cost`: a ring
all-reduce of B bytes over g devices sends 2 (g-1)/g B); values against the unpartitioned
program; with the `[xla]` extra, against XLA's own partitioned program (skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest


from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.differential import Case, run_case
from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


WHOLE_WINDOW_CONV = """HloModule m, num_partitions=2

ENTRY e {
  x = f32[7,3,4,4] parameter(0), sharding={devices=[1,1,2,1]<=[2]}
  k = f32[4,2,4,2] parameter(1), sharding={replicated}
  ROOT c = f32[3,1,4,2] convolution(x, k), window={size=4x2 stride=1x2 pad=0_0x1_1},
    dim_labels=1b0f_io01->b01f, sharding={replicated}
}
"""


def test_a_window_covering_a_tiled_dim_whole_adds_partial_convolutions():
    """Input spatial dim 0 (size 4) is tiled in two and the window (size 4, no padding) covers
    it whole: each partition convolves its two rows with the kernel's matching two taps (a
    slice of the replicated kernel) into a partial f32[3,1,4,2] output (96 B), and one
    all-reduce adds them: 96 B per device (2 (g-1)/g x 96), XLA's figure. Gathering the input
    sent 7*3*2*4*4 = 672 B per device."""
    spmd = check_equivalent(WHOLE_WINDOW_CONV, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 2) == 96


@needs_xla
def test_whole_window_conv_sends_no_more_than_xla():
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        result = run_case(Case("whole-window", WHOLE_WINDOW_CONV, 2, False, False), oracle)
    assert result.our_bytes is not None and result.xla_bytes is not None
    assert result.our_bytes <= result.xla_bytes


STRIDED_SLICE = """HloModule m, num_partitions={n}

ENTRY e {{
  p = f32[4,10] parameter(0), sharding={{devices=[1,{n}]<=[{n}]}}
  ROOT s = f32[4,3] slice(p), slice={{[0:4], [1:10:4]}}, sharding={{replicated}}
}}
"""


def test_a_strided_slice_of_a_tiled_dim_sends_only_the_column_read():
    """Columns 1, 5 and 9 of a dim tiled in two (columns 0-4, 5-9), the result in two tiles of
    two: shard 0's outputs read column 5, the first of shard 1, which alone travels (a permute
    of f32[4,1], 16 B from device 1), and the tiled result is gathered (f32[4,2], 32 B each):
    device 1 sends 48 B, device 0 32 B, 40 B on average. The masked strategy (each partition
    cuts the range the slice spans from its own columns, one all-reduce sums the f32[4,3]
    parts) sends 48 B from every device: the same from the busiest, more in all, so the halo
    wins the tie. Gathering the operand sent 80 B; a halo of whole shards, before the halo
    spans, more than the masked strategy."""
    spmd = check_equivalent(STRIDED_SLICE.format(n=2), 2)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute", "all-gather"]
    assert sent_bytes(spmd, 2) == 40


INTERIOR_PAD = """HloModule m, num_partitions={n}

ENTRY e {{
  p = f32[{rows},2] parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  v = f32[] parameter(1), sharding={{replicated}}
  ROOT q = f32[{out},2] pad(p, v), padding={low}_{high}_{interior}x0_0,
    sharding={{devices=[{n},1]<=[{n}]}}
}}
"""


def test_an_interior_pad_whose_windows_read_only_holes_of_a_neighbour_sends_nothing():
    """f32[3,2] tiled in three, padded 3 low, 1 high, 2 between rows: f32[11,2] in shards of
    4 rows, row k at 3 + 3k, so each shard's rows are its own row and pad values. The halo
    planner counted the holes after the left neighbour's row as a read of that row and sent it
    (a permute of one row from two devices: 2.7 B per device; XLA sends nothing)."""
    spmd = check_equivalent(INTERIOR_PAD.format(n=3, rows=3, out=11, low=3, high=1,
                                                interior=2), 3)
    assert collectives(spmd) == []


@pytest.mark.parametrize("n,rows,low,high,interior", [
    (2, 5, 1, 2, 2), (3, 5, 0, 0, 3), (4, 5, 2, 1, 1), (4, 7, 3, 0, 2), (3, 4, 0, 2, 4),
    (4, 3, 1, 1, 3)])
def test_interior_pads_of_tiled_rows_keep_their_values(n, rows, low, high, interior):
    """Pads whose windows read holes next to a neighbour's rows (some such holes, some the
    neighbour's real rows) reproduce the unpartitioned pad, uneven shards included."""
    out = low + rows + (rows - 1) * interior + high
    check_equivalent(INTERIOR_PAD.format(n=n, rows=rows, out=out, low=low, high=high,
                                         interior=interior), n)


SCATTER_INTO_ONE_ELEMENT = """HloModule m, num_partitions=4

maximum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] maximum(a, b)
}

ENTRY e {
  p = f32[1,3] parameter(0), sharding={devices=[4,1]3,2,1,0}
  i = s32[5,1] parameter(1), sharding={replicated}
  u = f32[5,3] parameter(2), sharding={replicated}
  ROOT s = f32[1,3] scatter(p, i, u), update_window_dims={1}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=maximum,
    sharding={devices=[4,1]3,2,1,0}
}
"""


def test_a_scatter_into_a_size_one_dim_tiled_over_devices_stays_local():
    """Dim 0 has one row, tiled four ways (device 3 holds it, the others padding): each
    partition scatters into its own shard with the indices shifted by its offset (updates of
    other rows dropped by the scatter's bounds check), as for a longer indexed dim. The row was
    gathered to every partition first (a masked all-reduce)."""
    text = SCATTER_INTO_ONE_ELEMENT
    inputs = [np.arange(3, dtype=np.float32).reshape(1, 3),
              np.array([[0], [1], [0], [-1], [0]], dtype=np.int32),
              np.linspace(-2, 5, 15, dtype=np.float32).reshape(5, 3)]
    spmd = check_equivalent(text, 4, inputs=inputs)
    assert collectives(spmd) == []


PRED_GATHER = """HloModule m, num_partitions={n}

ENTRY e {{
  p = pred[{size},2] parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  i = s32[4,1] parameter(1), sharding={{replicated}}
  ROOT g = pred[4,2] gather(p, i), offset_dims={{1}}, collapsed_slice_dims={{0}},
    start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,2}}, sharding={{replicated}}
}}
"""


@pytest.mark.parametrize("n,size", [(2, 8), (3, 7), (4, 1)])
def test_a_pred_gather_of_a_tiled_indexed_dim_ors_the_masked_local_gathers(n, size):
    """Rows of a `pred` operand tiled on its indexed dim (uneven on 3; one row tiled four
    ways): each partition gathers the rows in its range (false elsewhere) and one all-reduce
    with `or` combines them (8 B x 2 (n-1)/n per device), as XLA does; the operand was
    gathered whole before (pred has no sum, the partial form was not used). The one row tiled
    four ways is sent to device 1 (2 B), its two tiles' pair then all-gathered (2 B from every
    device; the masked gather of it sent 2, 3, 4, 3 B)."""
    rng = np.random.default_rng(n)
    inputs = [rng.random((size, 2)) < 0.5,
              rng.integers(-1, size + 1, size=(4, 1)).astype(np.int32)]
    spmd = check_equivalent(PRED_GATHER.format(n=n, size=size), n, inputs=inputs)
    if size == 1:
        assert [c[0] for c in collectives(spmd)] == ["collective-permute", "all-gather"]
        assert sent_per_device(spmd, n).tolist() == [4, 2, 2, 2]
        return
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, n) == 8 * 2 * (n - 1) / n


WHOLE_DIM_STARTS = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[8,3] parameter(0), sharding={devices=[4,1]<=[4]}
  u = f32[8,2] parameter(1), sharding={devices=[4,1]<=[4]}
  i = s32[] parameter(2), sharding={maximal device=1}
  j = s32[] parameter(3), sharding={replicated}
  d = f32[8,3] dynamic-update-slice(p, u, i, j), sharding={devices=[4,1]<=[4]}
  ROOT s = f32[8,2] dynamic-slice(d, i, j), dynamic_slice_sizes={8,2},
    sharding={devices=[4,1]<=[4]}
}
"""


def test_the_start_of_a_dim_taken_whole_is_not_broadcast():
    """Dim 0 is updated and sliced whole: HLO clamps its start `i` to 0 whatever it is, so
    the start on device 1 is not broadcast to the others (a select + all-reduce of 4 B) and
    each partition works on its rows with start 0 there."""
    inputs = [np.arange(24, dtype=np.float32).reshape(8, 3),
              -np.arange(16, dtype=np.float32).reshape(8, 2), np.int32(5), np.int32(1)]
    spmd = check_equivalent(WHOLE_DIM_STARTS, 4, inputs=inputs)
    assert collectives(spmd) == []


SHARED_BROADCAST = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[16,8] parameter(0), sharding={maximal device=0}
  i = s32[] parameter(1), sharding={replicated}
  a = f32[16,8] negate(p), sharding={replicated}
  s = f32[4,8] dynamic-slice(p, i, i), dynamic_slice_sizes={4,8}, sharding={maximal device=0}
  ROOT t = (f32[16,8], f32[4,8]) tuple(a, s), sharding={{replicated}, {devices=[1,2]0,1}}
}
"""


def test_a_value_already_broadcast_for_one_user_is_free_for_the_next():
    """`p` on device 0 is broadcast for the replicated negate (512 B per device); the
    dynamic-slice after it, annotated on device 0 but needed tiled, then runs on that
    replicated copy (its reshard node is shared: no more bytes) and is sliced to its tiles,
    instead of running on device 0 and broadcasting its f32[4,8] result (128 B more)."""
    inputs = [np.arange(128, dtype=np.float32).reshape(16, 8), np.int32(9)]
    spmd = check_equivalent(SHARED_BROADCAST, 2, inputs=inputs)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 2) == 512


DIMENSION_SIZE = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[14,8] parameter(0), sharding={devices=[4,1]<=[4]}
  n = s32[] get-dimension-size(p), dimensions={0}, sharding={replicated}
  m = s32[] get-dimension-size(p), dimensions={1}, sharding={maximal device=2}
  ROOT t = (s32[], s32[]) tuple(n, m), sharding={{replicated}, {maximal device=2}}
}
"""


def test_get_dimension_size_of_a_tiled_value_is_its_global_size_without_a_gather():
    """The size of a static dim is known whatever the operand's tiling (14 for the tiled dim,
    not a partition's 4 rows): no collective. It ran on the operand gathered whole."""
    spmd = check_equivalent(DIMENSION_SIZE, 4, inputs=[np.zeros((14, 8), np.float32)])
    assert collectives(spmd) == []



TWO_DIM_SCATTER = """HloModule m, num_partitions=4

ENTRY e {
  a = f32[2,6,2] parameter(0), sharding={replicated}
  b = f32[2,6,16,2] parameter(1), sharding={devices=[2,1,1,2]<=[4]}
  ROOT d = f32[6,16] dot(a, b), lhs_batch_dims={1}, lhs_contracting_dims={2,0},
    rhs_batch_dims={1}, rhs_contracting_dims={3,0}, sharding={devices=[2,2]<=[4]}
}
"""


def test_partial_sums_reduce_scatter_into_two_tiled_dims_in_stages():
    """The kernel is tiled on both contracting dims (four tiles), the replicated lhs is sliced
    alike: each partition's dot is a partial f32[6,16] (384 B). No one dim of the `[2,2]`
    output takes all four partials, so a reduce-scatter over pairs into rows (192 B each) and
    one over the other pairs into columns (96 B) send 288 B per device, XLA's figure. Without
    the staged form the all-reduce and slice cost 576 B, and the dot moved the kernel to the
    output's tiling by two all-to-alls instead (384 B)."""
    spmd = check_equivalent(TWO_DIM_SCATTER, 4)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter", "reduce-scatter"]
    assert sent_bytes(spmd, 4) == 288


GATHER_OF_A_SIZE_ONE_DIM = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[1,6] parameter(0), sharding={devices=[2,1]<=[2]}
  i = s32[3,2] parameter(1), sharding={replicated}
  ROOT g = f32[3,1,2] gather(p, i), offset_dims={1,2}, collapsed_slice_dims={},
    start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,2}, sharding={replicated}
}
"""


def test_a_size_one_dim_sliced_whole_is_not_also_an_indexed_dim():
    """Dim 0 has one row and the slice takes it whole: it is a pass-through dim of the gather,
    not also an indexed one (taking it as both asked one dim of the extended space to carry
    two operand dims' tiles, and compiling failed)."""
    inputs = [np.arange(6, dtype=np.float32).reshape(1, 6),
              np.array([[0, 1], [0, 4], [0, 3]], dtype=np.int32)]
    check_equivalent(GATHER_OF_A_SIZE_ONE_DIM, 2, inputs=inputs)


#: fuzz/10100001471's slice: annotated onto device 2, its operand tiled in 2 row blocks
SLICE_FOR_ONE_DEVICE = """HloModule m, num_partitions=8

ENTRY e {
  p = u16[7,1] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  s = u16[6,1] slice(p), slice={[0:6], [0:1]}, sharding={maximal device=2}
  ROOT c = u16[6,1] copy(s), sharding={replicated}
}
"""


def test_a_slice_for_one_device_is_sliced_in_its_operands_tiling():
    """XLA slices in the operand's sharding when that has more tiles than the result's: rows
    [0, 6) in the operand's 2 blocks are [0, 3) and [3, 6); the second block's devices receive
    row 3 from the first's (a halo of one u16 from 4 of the 8 devices: 1 B per device), and the
    [3,1] result (6 B) is gathered in pairs for the replicated copy (6 B per device): 7 B.
    Before, the only plans were the slice on device 2 and the masked slice whose [6,1] partial
    results are summed over pairs (2 (2-1)/2 12 B = 12 B per device)."""
    spmd = check_equivalent(SLICE_FOR_ONE_DEVICE, 8)
    assert collectives(spmd) == [
        ("collective-permute", [(0, 4), (1, 5), (2, 6), (3, 7)]),
        ("all-gather", [[0, 4], [1, 5], [2, 6], [3, 7]], (0,))]
    assert sent_bytes(spmd, 8) == 7


@needs_xla
def test_no_more_bytes_than_xla_for_a_slice_for_one_device():
    from conformance.oracle import XlaOracle
    with XlaOracle() as xla:
        result = run_case(Case("slice", SLICE_FOR_ONE_DEVICE, 8), xla)
    assert result.status == "compared", result.detail
    assert result.our_bytes <= result.xla_bytes, (result.our_bytes, result.xla_bytes)
    assert not result.value_mismatch, result.value_mismatch
