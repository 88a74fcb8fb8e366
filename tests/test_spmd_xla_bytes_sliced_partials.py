"""No more collective bytes than XLA (issue 13) where partial sums go to a target that tiles a
dim on which every reduction group wants one tile: the sum commutes with the slice, so each
device slices its partial values to its target tile first and the all-reduce moves that tile
instead of the whole partial result (the reshard planner's `_sliced_partials`); for a dot, the
operand replicated within each contracting group is sliced by the output's tiles in the output's
device order, so the local dot itself shrinks (XLA's dot grouped on the contracting dims,
docs/design/partitioning.md#dot). Where the groups straddle the target's tiles, or the target
tile lies outside the held one, the partial sums are also sliced to the target's tiles laid out
on the reduction groups (`_sliced_on_groups`: each group a tile nested in its own, the one most
of its members want), summed there and permuted to the devices that want them (XLA's gather on
an operand tiled on its trivially sliced dims, and any other op leaving partial sums). Bytes
per device by hand from the cost model (`gspmdc.ir.cost`: an all-reduce of E elements over g
members sends `2E - c_r - c_{r+1}` of them from member r, with chunks c of `ceil(E / g)`);
values against the unpartitioned program; with the `[xla]` extra, against XLA's partitioned
program."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import _fill_by_score, plan_reshard
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from filecheck import check, directives
from hlo_text import hlo_module, reducer

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: fuzz/11600001034 (off) reduced: a dot contracting over a dim tiled in 2 (partial sums over
#: {0,1} and {2,3}) whose result is annotated in 2 tiles of its 15 rows, tile 0 on {2,3} and
#: tile 1 on {0,1}: each reduction group wants one tile
DOT = hlo_module("""  a = s32[2] parameter(0), sharding={devices=[2,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  b = s32[15,2,1] parameter(1), sharding={devices=[1,2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT d = s32[15,1] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={1}, sharding={devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}""",
                 header=", num_partitions=4")

#: a sum over columns tiled in 2 (partial sums over {0,2} and {1,3}) into 2 tiles of 7 rows,
#: tile 0 on {0,2} and tile 1 on {1,3}
REDUCE = hlo_module("""  p = f32[7,6] parameter(0), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  z = f32[] constant(0)
  ROOT r = f32[7] reduce(p, z), dimensions={1}, to_apply=add, sharding={devices=[2,2]0,2,1,3 last_tile_dim_replicate}""",
                    reducer("add", "add"), ", num_partitions=4")

#: the same sum into tiles on {0,1} and {2,3}: each group straddles both tiles
STRADDLING = REDUCE.replace("devices=[2,2]0,2,1,3", "devices=[2,2]<=[4]")

#: 8 rows tiled in 2 and 4 columns in 2, summed over the columns (groups {0,2}, {1,3}, {4,6},
#: {5,7}), into 4 tiles of rows: tile k on the group of row tile k // 2
NESTED = hlo_module("""  p = f32[8,4] parameter(0), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(p, z), dimensions={1}, to_apply=add, sharding={devices=[4,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}""",
                    reducer("add", "add"), ", num_partitions=8")

#: the same with tiles 0 and 2 swapped: devices 0 and 2 want rows 4..5, outside their rows 0..3
OUTSIDE = NESTED.replace("0,2,1,3,4,6,5,7", "4,6,1,3,0,2,5,7")

#: fuzz/16300001389 reduced: a gather of one row of 6 from an operand whose indexed dim 0 is
#: tiled in 2 (device parity) and dim 1 in 2, into a result tiled in 4 on its last dim, tile k
#: on a pair of devices of one parity ({5,1}, {2,3}, {7,6}, {0,4})
GATHER = hlo_module("""  p = bf16[4,8] parameter(0), sharding={devices=[2,2,2]<=[4,2]T(1,0) last_tile_dim_replicate}
  i = s64[1,3] parameter(1), sharding={replicated}
  ROOT g = bf16[3,1,6] gather(p, i), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=0, slice_sizes={1,6}, sharding={devices=[1,1,4,2]5,1,2,3,7,6,0,4 last_tile_dim_replicate}""",
                    header=", num_partitions=8")

#: a sum over columns tiled by device parity into rows tiled in 4 on the same pairs of devices
PARITY = hlo_module("""  p = f32[8,16] parameter(0), sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(p, z), dimensions={1}, to_apply=add, sharding={devices=[4,2]5,1,2,3,7,6,0,4 last_tile_dim_replicate}""",
                    reducer("add", "add"), ", num_partitions=8")


def _plan(dims, source, target, n, element="s32"):
    return plan_reshard(ArrayShape(element, dims), parse_sharding(source),
                        parse_sharding(target), n)


def test_partial_sums_are_sliced_to_the_target_tile_before_the_all_reduce():
    """s32[15,1] summed over pairs {0,1}, {2,3} into 2 tiles of 8 rows (the second 7 real and 1
    padding) held by {2,3} and {0,1}: a local slice, then the all-reduce of s32[8,1] (chunks 4
    and 4: 2*8 - 8 = 8 elements, 32 B from every device). Before, the all-reduce moved all 15
    rows (chunks 8 and 7: 15 elements, 60 B) and the slice came after it."""
    plan = _plan((15, 1), "{devices=[1,1,2,2]<=[2,2]T(1,0) last_tile_dims={unreduced, replicated}}",
                 "{devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}", 4)
    assert [type(step).__name__ for step in plan.steps] == ["Slice", "AllReduce"]
    assert (plan.cost, plan.total) == (32, 128)
    assert plan.steps[1].groups.tolist() == [[2, 3], [0, 1]]


def test_groups_straddling_the_target_tiles_are_not_sliced_first():
    """The groups {0,2} and {1,3} each want both tiles of `{devices=[2,2]<=[4] ...}`: slicing
    before the sum would add different rows; the sums are reduce-scattered (8 padded rows over
    pairs: 4 elements, 16 B), as on main."""
    plan = _plan((7,), "{devices=[1,2,2]<=[4] last_tile_dims={unreduced, replicated}}",
                 "{devices=[2,2]<=[4] last_tile_dim_replicate}", 4, "f32")
    assert [type(step).__name__ for step in plan.steps] == ["ReduceScatter"]
    assert plan.cost == 16


def test_the_dot_slices_its_replicated_operand_in_the_output_device_order():
    """The rhs, replicated on its free dim 0 within each contracting group, is sliced to the
    output's rows in the output's device order (rows 8..15 on devices 0 and 1), so the local dot
    is s32[8,1] and its partial sums are already the output's tiles: one all-reduce of s32[8,1],
    32 B from every device, XLA's program (main: the whole s32[15,1] dot, its all-reduce, 60 B,
    then a slice)."""
    spmd = check_equivalent(DOT, 4)
    dot = next(inst for inst in spmd.entry.instructions if inst.opcode == "dot")
    assert dot.shape.dims == (8, 1)
    assert collectives(spmd) == [("all-reduce", [[2, 3], [0, 1]])]
    assert sent_per_device(spmd, 4).tolist() == [32, 32, 32, 32]


def test_a_reduce_slices_its_partial_sums_before_the_all_reduce():
    """The local reduce leaves f32[7] partial sums over pairs {0,2}, {1,3}, each pair wanting
    one tile of 4 rows (the second 3 real and 1 padding): sliced, then all-reduced (chunks 2
    and 2: 4 elements, 16 B), where main all-reduced the 7 rows (chunks 4 and 3: 7 elements,
    28 B, as XLA) and sliced after."""
    spmd = check_equivalent(REDUCE, 4)
    assert collectives(spmd) == [("all-reduce", [[0, 2], [1, 3]])]
    total = next(inst for inst in spmd.entry.instructions if inst.opcode == "all-reduce")
    assert total.shape.dims == (4,)
    assert total.operands[0].opcode == "dynamic-slice"
    assert sent_per_device(spmd, 4).tolist() == [16, 16, 16, 16]


def test_straddling_groups_reduce_scatter_and_keep_the_values():
    spmd = check_equivalent(STRADDLING, 4)
    assert collectives(spmd) == [("reduce-scatter", [[0, 2], [1, 3]], (0,))]
    assert sent_per_device(spmd, 4).tolist() == [16, 16, 16, 16]


def test_nested_tiles_on_a_tiled_dim_are_sliced_within_the_held_tile():
    """Rows held in 2 tiles of 4, wanted in 4 tiles of 2 nested in them, each group wanting
    one: a slice of the local f32[4] to f32[2], then its all-reduce (2 elements, 8 B), where
    main reduce-scattered (8 B) and then permuted the halves devices 1, 2, 5 and 6 did not
    hold (8 B more on those)."""
    spmd = check_equivalent(NESTED, 8)
    assert collectives(spmd) == [("all-reduce", [[0, 2], [1, 3], [4, 6], [5, 7]])]
    assert sent_per_device(spmd, 8).tolist() == [8] * 8


def test_target_tiles_outside_the_held_tile_are_sliced_within_it_then_permuted():
    """Devices 0, 2 want rows 4..5 and devices 4, 6 rows 0..1, which their partial sums do not
    hold: no row outside the held half is sliced (the values would be the other half's). Each
    pair slices the rows its held half keeps on the partial groups instead (`_sliced_on_groups`:
    {0,2} rows 0..1, {4,6} rows 4..5, the groups that want their rows keep them), all-reduces
    them (f32[2] over pairs: chunks 1 and 1, 2 elements, 8 B) and permutes the 8 B sums to
    devices 0, 2, 4 and 6: 16 B from the busiest, 96 B in all. Main reduce-scattered (8 B) then
    permuted on six devices: 16 B, 112 B in all."""
    plan = _plan((8,), "{devices=[2,2,2]<=[8] last_tile_dims={unreduced, replicated}}",
                 "{devices=[4,2]4,6,1,3,0,2,5,7 last_tile_dim_replicate}", 8, "f32")
    assert [type(step).__name__ for step in plan.steps] == ["Slice", "AllReduce", "Permute"]
    held = plan.steps[0].before.coordinates()[:, 0]
    assert (plan.steps[0].after.coordinates()[:, 0] // 2 == held).all()
    assert (plan.cost, plan.total) == (16, 96)
    spmd = check_equivalent(OUTSIDE, 8)
    assert [op for op, *_ in collectives(spmd)] == ["all-reduce", "collective-permute"]


def test_partial_sums_are_sliced_on_their_groups_when_members_want_different_tiles():
    """The gather's masked results, bf16[3,1,6] summed over the parity pairs {2k, 2k+1}, go to 4
    tiles of the last dim on {5,1}, {2,3}, {7,6}, {0,4}: the pairs {0,1} and {4,5} each want two
    tiles. Each pair slices one tile (the one both of {2,3} and of {6,7} want, and for {0,1}
    and {4,5} tiles 0 and 3 in group order), all-reduces bf16[3,1,2] (chunks 3 and 3: 6
    elements, 12 B) and devices 0 and 5 swap theirs (12 B): 24 B from the busiest, 120 B in
    all. Main reduce-scattered the 18 elements (18 B), sliced and permuted on six devices: 36
    B, 264 B in all."""
    plan = _plan((3, 1, 6), "{devices=[1,1,1,2,4]<=[4,2]T(1,0) last_tile_dims={unreduced, "
                 "replicated}}", "{devices=[1,1,4,2]5,1,2,3,7,6,0,4 last_tile_dim_replicate}", 8,
                 "bf16")
    assert [type(step).__name__ for step in plan.steps] == ["Slice", "AllReduce", "Permute"]
    assert plan.steps[1].groups.tolist() == [[0, 1], [2, 3], [6, 7], [4, 5]]
    moved = [pair for pair in plan.steps[2].pairs.tolist() if pair[0] != pair[1]]
    assert sorted(moved) == [[0, 5], [5, 0]]
    assert (plan.cost, plan.total) == (24, 120)


def test_groups_take_the_tiles_most_of_their_members_want_while_they_have_room():
    """Four groups of one held tile over two new tiles, two groups each: groups 0 and 1 want
    tile 0 with both members, group 2 tile 1 with one, group 3 either with one (the first of
    equals is tile 0, full: it takes the tile left); in a second held tile two groups that want
    nothing nested take its tiles in order."""
    score = np.array([[2, 0], [2, 0], [0, 1], [1, 1], [0, 0], [0, 0]])
    parent = np.array([0, 0, 0, 0, 1, 1])
    assert _fill_by_score(score[:4], parent[:4], 2).tolist() == [0, 0, 1, 1]
    assert _fill_by_score(score[[4, 0, 5, 2]], np.array([1, 0, 1, 0]), 1).tolist() == \
        [0, 0, 1, 1]


def test_a_gather_on_its_indexed_operand_tiles_sums_the_target_tiles():
    """The operand is gathered on dim 1 only (each device sends its bf16[2,4], 16 B), the
    gather runs masked on its operand's row tiles, and its partial results are sliced, summed
    over the pairs and permuted as above: 40 B from devices 0 and 5, 28 B from the others (XLA:
    40 B from the busiest, 37 B on average; main gathered the whole operand, 48 B from each)."""
    spmd = check_equivalent(GATHER, 8)
    assert [op for op, *_ in collectives(spmd)] == ["all-gather", "all-reduce",
                                                    "collective-permute"]
    assert sent_per_device(spmd, 8).tolist() == [40, 28, 28, 28, 28, 40, 28, 28]
    check(api.to_text(spmd), directives("""
    // CHECK: all-gather({{.*}}dimensions={1}
    // CHECK: gather({{.*}}sharding={devices=[1,1,1,2,4]<=[4,2]T(1,0) last_tile_dims={unreduced, replicated}}
    // CHECK: dynamic-slice({{.*}}dynamic_slice_sizes={3,1,2}
    // CHECK: bf16[3,1,2] all-reduce({{.*}}replica_groups={{[{][{]0,1[}],[{]2,3[}],[{]6,7[}],[{]4,5[}][}]}}
    // CHECK: bf16[3,1,2] collective-permute(
    """))


def test_a_reduce_slices_its_sums_on_the_groups_too():
    """The same layout after a reduce over parity-tiled columns: f32[8] sums sliced to f32[2],
    all-reduced over the pairs (2 elements, 8 B) and permuted between devices 0 and 5 (8 B): 16
    B from those two, 8 B from the others. XLA all-reduces the 8 sums and slices (32 B from
    every device); main reduce-scattered and permuted (24 B from six devices)."""
    spmd = check_equivalent(PARITY, 8)
    assert [op for op, *_ in collectives(spmd)] == ["all-reduce", "collective-permute"]
    assert sent_per_device(spmd, 8).tolist() == [16, 8, 8, 8, 8, 16, 8, 8]


@needs_xla
@pytest.mark.parametrize("text,n", [(DOT, 4), (REDUCE, 4), (NESTED, 8), (GATHER, 8),
                                    (PARITY, 8)],
                         ids=["dot", "reduce", "nested", "gather", "parity"])
def test_xla_sends_as_much_from_the_busiest_device(text, n):
    result = compared_with_xla(text, n)
    assert result.our_busiest <= result.xla_busiest
