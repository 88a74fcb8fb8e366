"""No more collective bytes than XLA (issue 13) where the choice for one op depends on its
users: insert-reshards prices a plan whose result is not the op's annotation by the shardings
its users' plans read it in (one op ahead), sums a partial result once where users read the sum,
merges equal annotated ops before planning, and recomputes the elements of a tuple-shaped op of
replicated operands (sort, topk) whole. Bytes per device by hand from the cost model's formulas
(`gspmdc.ir.cost`: a ring all-reduce of B bytes over g devices sends 2 (g-1)/g B); values
against the unpartitioned program; with the `[xla]` extra, against XLA's own partitioned
program (skipped without it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from spmd_partition_helpers import busiest_per_collective, check_equivalent, collectives, \
    compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")
PIPELINE_SHIFT = Path(__file__).resolve().parents[2] / "shared" / "jax-programs" / \
    "pipeline_shift"



TOPK_MIXED = """HloModule m, num_partitions=3

ENTRY e {
  p = f32[6] parameter(0)
  ROOT t = (f32[2], s32[2]) topk(p), k=2, largest=true,
    sharding={{maximal device=1}, {devices=[3]0,2,1}}
}
"""


def test_topk_with_one_leaf_on_a_device_runs_where_its_operand_is_whole():
    """The values on device 1, the indices tiled: every partition has the operand whole, so
    running the top-k whole everywhere gives both leaves without a collective (on device 1
    alone, the indices were broadcast by an all-reduce)."""
    spmd = check_equivalent(TOPK_MIXED, 3)
    assert collectives(spmd) == []


SORT_OF_WHOLE = """HloModule m, num_partitions=8

greater {
  a = s16[] parameter(0)
  b = s16[] parameter(1)
  c = bf16[] parameter(2)
  d = bf16[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=GT
}

ENTRY e {
  keys = s16[2,2] parameter(0)
  values = bf16[2,2] parameter(1)
  s = (s16[2,2], bf16[2,2]) sort(keys, values), dimensions={0}, is_stable=true,
    to_apply=greater,
    sharding={{devices=[2,4]<=[8]}, {devices=[2,1,4]0,1,6,7,2,3,4,5 last_tile_dim_replicate}}
  k = s16[2,2] get-tuple-element(s), index=0, sharding={devices=[2,4]<=[8]}
  v = bf16[2,2] get-tuple-element(s), index=1,
    sharding={devices=[2,1,4]0,1,6,7,2,3,4,5 last_tile_dim_replicate}
  ROOT t = (bf16[2,2], s16[2,2]) tuple(v, k)
}
"""


def test_a_sort_of_whole_operands_is_run_whole_for_leaves_tiled_differently():
    """The two leaves are tiled differently; sorting the replicated operands on every
    partition and slicing each leaf moves nothing (tiled by the first leaf's kept dim, the
    second leaf was permuted and gathered)."""
    spmd = check_equivalent(SORT_OF_WHOLE, 8)
    assert collectives(spmd) == []


SLICE_READ_WHOLE = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[4,8] parameter(0), sharding={devices=[4,1]<=[4]}
  s = f32[1,8] slice(x), slice={[3:4], [0:8]}, sharding={devices=[4,1]<=[4]}
  ROOT r = f32[8] reshape(s), sharding={replicated}
}
"""


def test_a_slice_its_user_reads_whole_is_cut_where_it_lies_and_summed():
    """Row 3 lives on shard 3; the reshape reads it replicated. Each shard cuts its part (zero
    but on shard 3) and one all-reduce of the 32-byte row sums it: 2 * 3/4 * 32 = 48 B per
    device. Priced alone, the slice took the halo (shard 3 sends the row to shard 0: 8 B per
    device on average) and the reshape then gathered it by the same all-reduce: 56 B."""
    spmd = check_equivalent(SLICE_READ_WHOLE, 4)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 4) == 48


TWIN_SLICES = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[4,8] parameter(0), sharding={devices=[4,1]<=[4]}
  cut1 = f32[1,8] slice(x), slice={[3:4], [0:8]}, sharding={devices=[4,1]<=[4]}
  cut2 = f32[1,8] slice(x), slice={[3:4], [0:8]}, sharding={devices=[4,1]<=[4]}
  r = f32[8] reshape(cut1), sharding={replicated}
  n = f32[1,8] negate(cut2), sharding={devices=[4,1]<=[4]}
  ROOT t = (f32[8], f32[1,8]) tuple(r, n)
}
"""


def test_equal_slices_are_one_value_summed_once_for_both_users():
    """The two slices are the same value: one all-reduce (48 B per device) gives the reshape
    its replicated row and the negate its tile (sliced locally). Planned apart: a halo for
    one, an all-reduce for the other, and the gather of the first again: 104 B."""
    spmd = check_equivalent(TWIN_SLICES, 4)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 4) == 48


COMPUTED_AS_READ = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[8,6] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[8,6] tanh(x), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  ROOT c = f32[8,6] copy(z), sharding={devices=[4,1]<=[4]}
}
"""


def test_an_op_is_computed_in_the_sharding_its_only_user_reads():
    """`z` is annotated in columns but its only user reads it in rows, as `x` is: tanh runs on
    the row tiles and nothing moves (to columns and back were four collectives, 144 B)."""
    spmd = check_equivalent(COMPUTED_AS_READ, 4)
    assert collectives(spmd) == []


def test_pipeline_shift_sends_the_stage_read_once():
    """The JAX pipelining program (skipped without ../shared): the last stage's row is both
    rolled round (`jnp.roll`) and written to the outputs; the two equal slices are one value,
    cut where it lies and summed by one all-reduce (384 B per device) that the roll slices
    and the output's two device-order permutes (128 B each on average) start from, beside
    the roll's permute (192 B): 832 B per iteration, 11 iterations."""
    if not PIPELINE_SHIFT.is_dir():
        pytest.skip(f"{PIPELINE_SHIFT} not found")
    n = json.loads((PIPELINE_SHIFT / "reference.json").read_text())["num_partitions"]
    spmd = compile_spmd(api.load(PIPELINE_SHIFT / "program.hlo"), n)
    assert sent_bytes(spmd, n) == 11 * 832
    xla = sent_bytes(api.load(PIPELINE_SHIFT / "xla_spmd.hlo"), n)
    assert sent_bytes(spmd, n) < xla


# ---- a result's reshard to its annotation that its one user need not read ----------------------

DOT_READ_BY_ONE_ADD = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[4,2,3] parameter(0), sharding={devices=[2,1,1]0,1}
  q = f32[4,2,2] parameter(1), sharding={devices=[2,1,1]0,1}
  d = f32[4,2,2] dot(p, p), lhs_batch_dims={0}, lhs_contracting_dims={2},
    rhs_batch_dims={0}, rhs_contracting_dims={2}, sharding={replicated}
  ROOT u = f32[4,2,2] add(q, d), sharding={replicated}
}
"""


def test_a_result_reshard_only_its_one_user_could_read_is_priced_to_that_user():
    """The dot runs on its batch tiles (gathering its result, 32 B per device, costs less than
    gathering `p`, 48 B) and is resharded to its replicated annotation for `u` alone. `u` can
    read that node and gather `q` (32 B), or add the tiles and gather its own result (32 B):
    a tie while the dot's gather counted as made. Nobody else reads it, so the first way pays
    it too (64 B): `u` adds on the tiles, the dot's gather is dropped, 32 B in all (XLA's
    reshard cache likewise maps the gathered dot back to its tiles)."""
    spmd = check_equivalent(DOT_READ_BY_ONE_ADD, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]
    assert sent_bytes(spmd, 2) == 2 * 2 * 2 * 4


SCATTER_OF_A_DOT = """HloModule m, num_partitions=2

region {
  a0 = f32[] parameter(0)
  a1 = f32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = f32[] parameter(3)
  z0 = f32[] add(a0, b0)
  z1 = f32[] add(a1, b1)
  ROOT t = (f32[], f32[]) tuple(z0, z1)
}

ENTRY e {
  p = f32[1,1,1] parameter(0), sharding={devices=[2,1,1]1,0}
  d = f32[1,1,1] dot(p, p), lhs_batch_dims={0}, lhs_contracting_dims={2},
    rhs_batch_dims={0}, rhs_contracting_dims={2}, sharding={replicated}
  i = s32[4,6,2] parameter(1), sharding={replicated}
  c = f32[] constant(-0.25)
  u = f32[1,4,6] broadcast(c), dimensions={}
  s = (f32[1,1,1], f32[1,1,1]) scatter(p, d, i, u, u), update_window_dims={0},
    inserted_window_dims={1,2}, scatter_dims_to_operand_dims={1,2}, index_vector_dim=2,
    to_apply=region, sharding={{replicated}, {devices=[1,1,2]<=[2]}}
  ROOT r = f32[1,1,1] get-tuple-element(s), index=0, sharding={replicated}
}
"""


def test_a_scatter_of_a_dot_runs_on_the_dots_tiles():
    """fuzz/10100002341's shape: the scatter can read the dot's replicated reshard (4 B, the
    dot's f32[1,1,1] gathered) and gather `p` (4 B more), or scatter on the tiles the dot and
    `p` have and make its one read element whole (4 B): XLA's 4 B."""
    spmd = check_equivalent(SCATTER_OF_A_DOT, 2)
    assert sent_bytes(spmd, 2) == 4


# ---- an op computed replicated where its users are then computed again whole -----------------

#: fuzz/11200000144 [off] as generated, its dead code dropped: a `reduce-window` of `p`'s
#: column tiles (f32[7,1,2] = 56 B a device) annotated in row tiles, reshaped (an uneven merge
#: of its tiled dim: a halo exchange) to rows the root reads whole (a tuple of two elements:
#: XLA's import folds a tuple of one into its element's annotation).
WINDOW_RESHAPED_READ_WHOLE = """HloModule m, num_partitions=4

min_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] minimum(a, b)
}

ENTRY e {
  p = f32[7,1,6] parameter(0), sharding={devices=[1,1,4]<=[4]}
  init = f32[] constant(inf)
  w = f32[5,3,5] reduce-window(p, init), window={size=1x1x2 stride=2x1x1 pad=2_1x0_2x0_0},
    to_apply=min_f32, sharding={devices=[4,1,1]<=[4]}
  r = f32[15,5] reshape(w), sharding={devices=[4,1]<=[4]}
  q = s32[3] parameter(1), sharding={replicated}
  ROOT t = (f32[15,5], s32[3]) tuple(r, q), sharding={{replicated}, {replicated}}
}
"""


def test_an_op_whose_users_are_computed_again_whole_runs_replicated():
    """In its row tiles the reduce-window moves `p`'s columns into rows (an all-to-all) and
    exchanges a halo, and the reshape of those rows exchanges halos again (cheaper, one op
    ahead, than gathering `p`); but the root reads the reshape whole, so its rows are
    gathered after all (80 B from each device to 3 others): 372 B on the busiest device.
    Computed replicated from `p` gathered (each device sends its 56 B to 3 others), the
    reduce-window gives the reshape its operand whole, computed again whole for free, which
    the root reads as it is: one all-gather, 168 B on every device. `p`'s last column tile
    holds padding alone, so its columns are exchanged into 2 tiles first and gathered in
    pairs: 168 B from the busiest device as well, fewer on the others."""
    spmd = check_equivalent(WINDOW_RESHAPED_READ_WHOLE, 4)
    assert [c[0] for c in collectives(spmd)][-1] == "all-gather"
    sent = sent_per_device(spmd, 4)
    assert sent.max() == 3 * 56 and sent.sum() < 4 * 3 * 56


# ---- a contraction computed replicated where a user then reads it whole -----------------------

#: a convolution of replicated operands annotated in batch tiles, updated by a
#: `dynamic-update-slice` at a batch row read from device 1 and annotated in rows of its
#: first spatial dim, read whole by the root (fuzz/16000001505's shape, its other ops dropped).
CONVOLUTION_UPDATED_AND_READ_WHOLE = """HloModule m, num_partitions=2

ENTRY e {
  x = f32[5,9,4,2] parameter(0), sharding={replicated}
  k = f32[1,9,3,2] parameter(1), sharding={replicated}
  c = f32[4,4,9,1] convolution(x, k), window={size=1x2 stride=3x3 pad=0_0x2_1 lhs_dilate=1x2},
    dim_labels=1fb0_0oi1->1bf0, feature_group_count=3, sharding={devices=[1,2,1,1]<=[2]}
  u = f32[3,1,1,1] constant({{{{1}}}, {{{-0.25}}}, {{{0.5}}}})
  i = s32[] parameter(2), sharding={maximal device=1}
  z = s32[] constant(0)
  d = f32[4,4,9,1] dynamic-update-slice(c, u, z, i, z, z), sharding={devices=[2,1,1,1]<=[2]}
  q = s32[3] parameter(3), sharding={replicated}
  ROOT t = (f32[4,4,9,1], s32[3]) tuple(d, q), sharding={{replicated}, {replicated}}
}
"""

#: the same with a plain convolution of b0f operands: batch tiles, an update at a batch row
#: read from device 1, rows of the spatial dim, read whole by the root.
PLAIN_CONVOLUTION_UPDATED_AND_READ_WHOLE = """HloModule m, num_partitions=2

ENTRY e {
  x = f32[4,6,2] parameter(0), sharding={replicated}
  k = f32[2,2,3] parameter(1), sharding={replicated}
  c = f32[4,5,3] convolution(x, k), window={size=2}, dim_labels=b0f_0io->b0f,
    sharding={devices=[2,1,1]<=[2]}
  u = f32[1,1,3] constant({{{1, 2, 3}}})
  i = s32[] parameter(2), sharding={maximal device=1}
  z = s32[] constant(0)
  d = f32[4,5,3] dynamic-update-slice(c, u, i, z, z), sharding={devices=[1,2,1]<=[2]}
  q = s32[3] parameter(3), sharding={replicated}
  ROOT t = (f32[4,5,3], s32[3]) tuple(d, q), sharding={{replicated}, {replicated}}
}
"""


@pytest.mark.parametrize("text", [CONVOLUTION_UPDATED_AND_READ_WHOLE,
                                  PLAIN_CONVOLUTION_UPDATED_AND_READ_WHOLE],
                         ids=["grouped", "plain"])
def test_a_convolution_whose_user_reads_it_whole_runs_replicated(text):
    """Its operands replicated, the convolution costs nothing in its batch tiles or computed
    whole and sliced to them. One op ahead, the update (planned with the convolution in its
    annotation and priced to its own) writes the batch tiles in place; but the root reads the
    update whole, so in its own plan it gathers the convolution (half of it, 288 B or 120 B,
    from each device). Computed whole, the convolution gives the update its operand from that
    replicated value for free (XLA's reshard cache hands a value's replicated form back to a
    reader of its tiles' reshard): the update then only needs its row from device 1, a 4-byte
    all-reduce, and the root reads it as it is."""
    spmd = check_equivalent(text, 2)
    assert collectives(spmd) == [("all-reduce", [[0, 1]])]
    assert busiest_per_collective(spmd, 2) == 4


# ---- one op ahead, a tuple's element no live instruction reads costs nothing ---------------------

#: fuzz/15400000163 [off]'s shape: a scatter annotated replicated of `p`'s row tiles with
#: indices on device 0, whose result a batch scatter (rows = its batch dim) reads beside `p`;
#: of that scatter's two results the root reads the second, in column tiles, and nothing reads
#: the first (annotated replicated).
SCATTER_READ_BY_A_SCATTER_WITH_A_DEAD_ELEMENT = """HloModule m, num_partitions=2

max_u32 {
  a = u32[] parameter(0)
  b = u32[] parameter(1)
  ROOT r = u32[] maximum(a, b)
}

add_pair {
  a0 = u32[] parameter(0)
  a1 = u32[] parameter(1)
  b0 = u32[] parameter(2)
  b1 = u32[] parameter(3)
  r0 = u32[] add(a0, b0)
  r1 = u32[] add(a1, b1)
  ROOT r = (u32[], u32[]) tuple(r0, r1)
}

ENTRY e {
  p = u32[4,5] parameter(0), sharding={devices=[2,1]<=[2]}
  i = s32[2,5,2] parameter(1), sharding={maximal device=0}
  u = u32[2,1,5] parameter(2), sharding={replicated}
  sa = u32[4,5] scatter(p, i, u), update_window_dims={1}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={1,0}, index_vector_dim=2, to_apply=max_u32, sharding={replicated}
  c = s32[] constant(7)
  bi = s32[6,6,4,1] broadcast(c), dimensions={}
  cu = u32[] constant(7)
  bu = u32[4,6,6,4] broadcast(cu), dimensions={}
  sb = (u32[4,5], u32[4,5]) scatter(sa, p, bi, bu, bu), update_window_dims={0},
    inserted_window_dims={}, scatter_dims_to_operand_dims={1}, index_vector_dim=3,
    input_batching_dims={0}, scatter_indices_batching_dims={2}, to_apply=add_pair,
    sharding={{replicated}, {devices=[1,2]<=[2]}}
  g0 = u32[4,5] get-tuple-element(sb), index=0, sharding={replicated}
  ROOT g1 = u32[4,5] get-tuple-element(sb), index=1, sharding={devices=[1,2]<=[2]}
}
"""


def test_a_tuple_element_nobody_reads_is_not_priced_one_op_ahead():
    """One op ahead (priced to its annotation, without its own users' needs), the batch
    scatter would gather its rows to have its first result replicated, so it reads `sa`
    replicated, and `sa` gathers `p` (its row half, 40 B, from each device) to run replicated.
    Nothing reads that first result, so it is priced as computed: in `p`'s rows the batch
    scatter moves only its second result into column tiles, and `sa` runs on `p`'s rows as
    they are (XLA's program). Each device sends the indices' all-reduce (s32[2,5,2], 80 B: a
    ring over 2 devices sends 2 (g-1)/g of it) and half its [2,5] rows padded to [2,6] (24 B)."""
    spmd = check_equivalent(SCATTER_READ_BY_A_SCATTER_WITH_A_DEAD_ELEMENT, 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce", "all-to-all"]
    assert busiest_per_collective(spmd, 2) == 80 + 24


# ---- a result on one device reaching a tiled annotation through its broadcast ---------------

#: fuzz/10900000418 [off]'s shape: a slice of a parameter on device 1, annotated in row tiles
#: held twice, read by the root in four row tiles.
SLICE_ON_ONE_DEVICE = """HloModule m, num_partitions=4

ENTRY e {
  p = f16[8,1] parameter(0), sharding={maximal device=1}
  s = f16[6,1] slice(p), slice={[2:8], [0:1]}, sharding={devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT n = f16[6,1] negate(s), sharding={devices=[4,1]<=[4]}
}
"""


def test_a_result_on_one_device_is_priced_through_its_broadcast():
    """Sliced on device 1, the result is broadcast (the replicated node its reshard to the
    annotation goes through) and the root's rows are sliced from that: a ring all-reduce of 6
    f16 elements in chunks of 2, 2, 1 and 1, each device sending 3 chunks in each of its two
    phases, the busiest 4 + 4 + 2 B: 20 B. Priced as a reshard from the annotation (24 B:
    the broadcast, then 4 B to the rows), slicing on device 1 lost to broadcasting `p`, 8
    elements in chunks of 2: 3 x 4 B twice, 24 B."""
    spmd = check_equivalent(SLICE_ON_ONE_DEVICE, 4)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3]])]
    assert busiest_per_collective(spmd, 4) == 2 * (4 + 4 + 2)


# ---- a value passed on through a tuple and its get-tuple-element -------------------------------

#: fuzz/11400000288 [off], shrunk: a scatter of `i`'s batch tiles into `p` whose rows are in
#: 3 tiles held twice (f16[2,4] = 16 B a device), annotated in `p`'s rows by column tiles; a
#: tuple passes it to a get-tuple-element the root reads on device 0.
SCATTER_THROUGH_A_TUPLE = """HloModule m, num_partitions=6

add_f16 {
  a = f16[] parameter(0)
  b = f16[] parameter(1)
  ROOT r = f16[] add(a, b)
}

ENTRY e {
  p = f16[6,4] parameter(0), sharding={devices=[3,1,2]<=[2,3]T(1,0) last_tile_dim_replicate}
  i = s32[1,1,6,6] parameter(1), sharding={devices=[1,1,2,3]<=[6]}
  c = f16[] constant(2.0)
  u = f16[1,6,6] broadcast(c), dimensions={}, sharding={devices=[1,1,2,3]<=[6] last_tile_dim_replicate}
  s = f16[6,4] scatter(p, i, u), update_window_dims={}, inserted_window_dims={1},
    scatter_dims_to_operand_dims={1}, index_vector_dim=0, input_batching_dims={0},
    scatter_indices_batching_dims={3}, to_apply=add_f16, sharding={devices=[2,3]<=[6]}
  t = (f16[6,4]) tuple(s), sharding={{devices=[2,3]<=[6]}}
  g = f16[6,4] get-tuple-element(t), index=0, sharding={devices=[2,3]<=[6]}
  ROOT r = (f16[6,4]) tuple(g), sharding={{maximal device=0}}
}
"""


def test_a_value_read_through_a_tuple_is_priced_with_the_tuples_readers():
    """The scatter runs on `i`'s tiles, leaving partial sums in `p`'s row tiles. Its one user
    is the tuple, which reads it in its annotation (the sums moved to the column tiles: an
    all-reduce, then permutes); the value's true reader is the root, on device 0. Priced
    with that read, the sums are taken whole from the all-reduce over each pair (16 B a
    device) and gathered over each row of 3 (each sends 16 B to 2 others): 48 B on the
    busiest device, where going through the annotation sent 80."""
    spmd = check_equivalent(SCATTER_THROUGH_A_TUPLE, 6)
    assert collectives(spmd) == [("all-reduce", [[0, 3], [1, 4], [2, 5]]),
                                 ("all-gather", [[0, 1, 2], [3, 4, 5]], (0,))]
    assert busiest_per_collective(spmd, 6) == 16 + 2 * 16


#: fuzz/11500000652 [off], shrunk: a select moved to its annotation's column-reversed rows, an
#: erf annotated in the rows in order, passed on by a tuple to the root, which reads it whole
#: (the dead is-finite reads the select where it lies).
ERF_THROUGH_A_TUPLE = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[2,4,4] parameter(0), sharding={devices=[1,2,1]<=[2]}
  f = pred[] constant(false)
  m = pred[2,4,4] broadcast(f), dimensions={}, sharding={devices=[1,2,1]0,1}
  s = f32[2,4,4] select(m, p, p), sharding={devices=[2,1,1]1,0}
  d = pred[2,4,4] is-finite(s)
  e = f32[2,4,4] erf(s), sharding={devices=[2,1,1]<=[2]}
  q = s32[3] parameter(1)
  t = (s32[3], f32[2,4,4]) tuple(q, e)
  g0 = s32[3] get-tuple-element(t), index=0
  g1 = f32[2,4,4] get-tuple-element(t), index=1
  ROOT r = (s32[3], f32[2,4,4]) tuple(g0, g1), sharding={{replicated}, {replicated}}
}
"""


def test_a_result_passed_on_by_a_tuple_is_gathered_from_where_it_was_computed():
    """The select runs on `p`'s column tiles and an all-to-all moves it to its rows (each
    device sends half its 64 B shard); the erf runs on those rows, reversed against its
    annotation, priced with the root's read through the tuple: one gather from where it was
    computed (64 B from each device). The erf's permute to its annotation is read by the
    tuple alone, which passes it on, so no one reads it: 96 B, where permuting first and
    gathering after sent 160."""
    spmd = check_equivalent(ERF_THROUGH_A_TUPLE, 2, propagate=True)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all", "all-gather"]
    assert busiest_per_collective(spmd, 2) == 32 + 64


#: fuzz/11600000166, shrunk: a scatter whose updates are in 2 tiles of dim 1 held 3 times,
#: annotated in column tiles held twice, passed on by a tuple to a get-tuple-element annotated
#: replicated, which the root reads on device 3.
SCATTER_READ_WHOLE_THROUGH_A_TUPLE = """HloModule m, num_partitions=6

min_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] minimum(a, b)
}

ENTRY e {
  one = f32[] constant(1.0)
  o = f32[6,6] broadcast(one), dimensions={}
  two = s32[] constant(2)
  i = s32[4,5,2] broadcast(two), dimensions={},
    sharding={devices=[1,3,1,2]<=[6] last_tile_dim_replicate}
  u = f32[2,4,5,1] parameter(0),
    sharding={devices=[1,2,1,1,3]3,4,5,0,1,2 last_tile_dim_replicate}
  s = f32[6,6] scatter(o, i, u), update_window_dims={0,3}, inserted_window_dims={},
    scatter_dims_to_operand_dims={0,1}, index_vector_dim=2, to_apply=min_f32,
    sharding={devices=[1,3,2]<=[2,3]T(1,0) last_tile_dim_replicate}
  q = s32[3] parameter(1), sharding={replicated}
  t = (f32[6,6], s32[3]) tuple(s, q)
  g = f32[6,6] get-tuple-element(t), index=0, sharding={replicated}
  h = s32[3] get-tuple-element(t), index=1
  ROOT r = (f32[6,6], s32[3]) tuple(g, h), sharding={{maximal device=3}, {replicated}}
}
"""


def test_a_get_tuple_element_annotated_otherwise_passes_its_readers_needs_on():
    """On the updates' tiles the scatter leaves partial minima, which cost less summed into
    the annotation (each pair's column tiles sliced, then an all-reduce of f32[6,2]: 48 B)
    than gathering the updates (each device's f32[2,2,5,1], 80 B); but the get-tuple-element
    gathers the annotation over each row of 3 (96 B more) for the root's device. Priced with
    that read, the updates are gathered over each pair and the scatter runs whole, from which
    device 3 takes its value: 80 B, where summing first sent 144."""
    spmd = check_equivalent(SCATTER_READ_WHOLE_THROUGH_A_TUPLE, 6, propagate=True)
    assert collectives(spmd) == [("all-gather", [[3, 0], [4, 1], [5, 2]], (1,))]
    assert busiest_per_collective(spmd, 6) == 80


#: fuzz/11600000087 [off], shrunk: a convolution contracting over `k`'s tiled input feature
#: dim, its output features in 2 uneven tiles (3 into 2 + 1 padded), annotated in 2 batch by
#: 2 feature tiles, passed on by a tuple to the root on device 2.
CONVOLUTION_SUMS_TO_ONE_DEVICE = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[2,2,2,3] parameter(0), sharding={devices=[1,2,1,1,2]<=[4] last_tile_dims={replicated}}
  k = f32[2,2,3,3] parameter(1), sharding={devices=[2,1,1,2]<=[4]}
  c = f32[2,2,1,3] convolution(x, k), window={size=2x2 stride=2x3 pad=2_0x0_2},
    dim_labels=01bf_10io->0b1f, sharding={devices=[1,2,1,2]<=[4]}
  q = s32[3] parameter(2), sharding={replicated}
  t = (s32[3], f32[2,2,1,3]) tuple(q, c)
  g = s32[3] get-tuple-element(t), index=0
  h = f32[2,2,1,3] get-tuple-element(t), index=1
  ROOT r = (s32[3], f32[2,2,1,3]) tuple(g, h), sharding={{maximal device=2}, {maximal device=2}}
}
"""


def test_partial_sums_are_summed_whole_only_where_their_readers_gain_more():
    """The convolution leaves partial sums of f32[2,2,1,2] (32 B) on each device. Summing
    them whole (an all-reduce over each pair: 32 B) and gathering the feature tiles (32 B)
    sends 64 B; reduce-scattering them into the annotation's batch tiles (16 B), then
    gathering its feature tiles (16 B) and batch tiles (24 B: the uneven feature dim sliced
    back to 3) sends 56 B, the annotation's own reshard as XLA makes it."""
    spmd = check_equivalent(CONVOLUTION_SUMS_TO_ONE_DEVICE, 4)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter", "all-gather", "all-gather"]
    assert busiest_per_collective(spmd, 4) == 16 + 16 + 24


#: fuzz/11600000800 [on], shrunk: a select of two parameters' row tiles, broadcast and passed
#: on by a tuple to a get-tuple-element on device 0, which the root reads whole.
BROADCAST_ON_ONE_DEVICE = """HloModule m, num_partitions=2

ENTRY e {
  p = s32[2,7] parameter(0), sharding={devices=[2,1]<=[2]}
  q = s32[2,7] parameter(1), sharding={devices=[2,1]<=[2]}
  three = s32[] constant(3)
  t3 = s32[2,7] broadcast(three), dimensions={}
  c = pred[2,7] compare(p, t3), direction=GE, sharding={replicated}
  s = s32[2,7] select(c, p, q)
  b = s32[2,5,2,7] broadcast(s), dimensions={2,3}
  t = (s32[2,5,2,7], s32[2,7]) tuple(b, p)
  g = s32[2,5,2,7] get-tuple-element(t), index=0, sharding={maximal device=0}
  h = s32[2,7] get-tuple-element(t), index=1
  ROOT r = (s32[2,5,2,7], s32[2,7]) tuple(g, h), sharding={{replicated}, {devices=[2,1]<=[2]}}
}
"""


def test_a_broadcast_computed_again_whole_is_credited_its_operands_gather_at_most():
    """Computed replicated, the select gives the broadcast its operand whole (the broadcast
    then computed again on device 0 for free), but gathers `p`, `q` and the compare (28 + 28
    + 7 B). On its row tiles, the broadcast's move to device 0 (its 560 B result gathered,
    280 B) is not what it costs: insert-reshards computes it again there from the select
    gathered (28 B), which is all a replicated select saves it: 28 B."""
    spmd = check_equivalent(BROADCAST_ON_ONE_DEVICE, 2, propagate=True)
    assert collectives(spmd) == [("all-gather", [[0, 1]], (0,))]
    assert busiest_per_collective(spmd, 2) == 28


DOT_OF_A_GATHERED_OPERAND = """HloModule m, num_partitions=2

ENTRY e {
  x = f32[4,6] parameter(0), sharding={devices=[1,2]<=[2]}
  c = f32[] constant(0.75)
  d = f32[4,6] dot(x, c), lhs_contracting_dims={}, rhs_contracting_dims={}, sharding={replicated}
  ROOT t = (f32[4,6], f32[4,6]) tuple(d, x), sharding={{replicated}, {replicated}}
}
"""


def test_a_dot_reads_the_gather_of_its_operand_another_user_makes():
    """The dot (a scaling: no contracting dims) and the tuple both want `x` whole. Run on
    `x`'s column tiles the dot's result would be gathered (48 B a device) besides `x`'s own
    gather for the tuple (48 B); the dot priced with the gather the tuple makes anyway reads
    it instead: one all-gather, 4*3*4 = 48 B a device (XLA's reshard cache;
    fuzz/12900002150 off: 920 B before, 472 after, XLA 472; the dot plan's shared reshards)."""
    spmd = check_equivalent(DOT_OF_A_GATHERED_OPERAND, 2)
    assert collectives(spmd) == [("all-gather", [[0, 1]], (1,))]
    assert busiest_per_collective(spmd, 2) == 48


DOT_OF_A_MOVED_OPERAND = """HloModule m, num_partitions=2

ENTRY e {
  x = f32[12,16] parameter(0), sharding={devices=[1,2]<=[2]}
  a = f32[12,16] abs(x), sharding={devices=[2,1]<=[2]}
  w = f32[16,2] parameter(1), sharding={replicated}
  d = f32[12,2] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1]<=[2]}
  ROOT t = (f32[12,2], f32[12,16]) tuple(d, a), sharding={{devices=[2,1]<=[2]}, {devices=[2,1]<=[2]}}
}
"""


def test_a_dot_reads_its_operand_as_moved_for_another_user():
    """`x` is tiled on the dot's contracting dim; `abs` wants it row-tiled, an all-to-all
    (each device sends half its `f32[12,8]`, 192 B). Alone, the dot would rather keep `x`
    and reduce-scatter its `f32[12,2]` partial sums (48 B) than move `x` (192 B); priced with
    the row-tiled `x` made for `abs` anyway, it reads that instead and needs nothing more:
    192 B a device, not 240 (XLA's reshard cache; fuzz/12900001247 off: 1752 B before, 1512
    after, XLA 1512)."""
    spmd = check_equivalent(DOT_OF_A_MOVED_OPERAND, 2)
    assert collectives(spmd) == [("all-to-all", [[0, 1]], (0,))]
    assert busiest_per_collective(spmd, 2) == 192


@needs_xla
@pytest.mark.parametrize("text,n", [(TOPK_MIXED, 3), (SORT_OF_WHOLE, 8), (SLICE_READ_WHOLE, 4),
                                    (TWIN_SLICES, 4), (COMPUTED_AS_READ, 4),
                                    (DOT_READ_BY_ONE_ADD, 2), (SCATTER_OF_A_DOT, 2),
                                    (SCATTER_THROUGH_A_TUPLE, 6),
                                    (WINDOW_RESHAPED_READ_WHOLE, 4),
                                    (CONVOLUTION_UPDATED_AND_READ_WHOLE, 2),
                                    (SCATTER_READ_BY_A_SCATTER_WITH_A_DEAD_ELEMENT, 2),
                                    (SLICE_ON_ONE_DEVICE, 4),
                                    (SCATTER_READ_WHOLE_THROUGH_A_TUPLE, 6),
                                    (CONVOLUTION_SUMS_TO_ONE_DEVICE, 4),
                                    (DOT_OF_A_GATHERED_OPERAND, 2), (DOT_OF_A_MOVED_OPERAND, 2)],
                         ids=["topk-mixed", "sort-of-whole", "slice-read-whole", "twin-slices",
                              "computed-as-read", "dot-read-by-one-add", "scatter-of-a-dot",
                              "scatter-through-a-tuple", "window-reshaped-read-whole",
                              "convolution-updated-and-read-whole",
                              "scatter-read-by-a-scatter-with-a-dead-element",
                              "slice-on-one-device", "scatter-read-whole-through-a-tuple",
                              "convolution-sums-to-one-device", "dot-of-a-gathered-operand",
                              "dot-of-a-moved-operand"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both
    programs compute the reference's values."""
    result = compared_with_xla(text, n)
    assert "XLA" not in result.value_mismatch, result.value_mismatch
