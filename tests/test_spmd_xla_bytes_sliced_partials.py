"""No more collective bytes than XLA (issue 13) where partial sums go to a target that tiles a
dim on which every reduction group wants one tile: the sum commutes with the slice, so each
device slices its partial values to its target tile first and the all-reduce moves that tile
instead of the whole partial result (the reshard planner's `_sliced_partials`); for a dot, the
operand replicated within each contracting group is sliced by the output's tiles in the output's
device order, so the local dot itself shrinks (XLA's dot grouped on the contracting dims,
docs/design/partitioning.md#dot). Where the groups straddle the target's tiles, or the target
tile lies outside the held one, nothing is sliced first. Bytes per device by hand from the cost
model (`gspmdc.ir.cost`: an all-reduce of E elements over g members sends `2E - c_r - c_{r+1}`
of them from member r, with chunks c of `ceil(E / g)`); values against the unpartitioned
program; with the `[xla]` extra, against XLA's partitioned program."""
from __future__ import annotations

import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
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


def test_target_tiles_outside_the_held_tile_are_not_sliced_first():
    """Devices 0, 2 want rows 4..5 and devices 4, 6 rows 0..1, which their partial sums do not
    hold: nothing is sliced before the sum (the values would be the other half's); the sums are
    reduce-scattered, then the halves permuted."""
    plan = _plan((8,), "{devices=[2,2,2]<=[8] last_tile_dims={unreduced, replicated}}",
                 "{devices=[4,2]4,6,1,3,0,2,5,7 last_tile_dim_replicate}", 8, "f32")
    assert "Slice" not in [type(step).__name__ for step in plan.steps]
    spmd = check_equivalent(OUTSIDE, 8)
    assert [op for op, *_ in collectives(spmd)] == ["reduce-scatter", "collective-permute"]


@needs_xla
@pytest.mark.parametrize("text,n", [(DOT, 4), (REDUCE, 4), (NESTED, 8)],
                         ids=["dot", "reduce", "nested"])
def test_xla_sends_as_much_from_the_busiest_device(text, n):
    result = compared_with_xla(text, n)
    assert result.our_busiest <= result.xla_busiest
