"""No more collective bytes than XLA (issue 13) where partial sums go to a tiling whose tiles do
not nest in theirs: the reshard planner all-reduces them and then exchanges the pieces of the new
tiles by collective-permutes, as XLA's reshard of partial sums does (all-reduce, then as any
tiling), instead of only gathering and slicing after the all-reduce
(docs/design/partitioning.md#resharding). Bytes per device by hand from the
cost model's formulas (`gspmdc.ir.cost`: an all-reduce of E elements over g members sends
`2E - c_r - c_{r+1}` of them from member r, a collective-permute its buffer from each sender);
values against the unpartitioned program; with the `[xla]` extra, against XLA's own partitioned
program."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from hlo_text import hlo_module, reducer

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: fuzz/11400002053 (on) reduced: rows in 2 tiles, columns in 3 tiles (of 3, 3 and 2), reduced
#: over the rows into 6 tiles of 2 columns
REDUCE = hlo_module("""  p = f32[3,8] parameter(0), sharding={devices=[2,3]4,0,1,3,5,2}
  one = f32[] constant(1.0)
  ROOT r = f32[8] reduce(p, one), dimensions={0}, to_apply=mul, sharding={devices=[6]<=[6]}""",
                    reducer("mul", "multiply"), ", num_partitions=6")

PARTIALS = "{devices=[3,2]4,3,0,5,1,2 last_tile_dims={unreduced}}"


def test_partial_sums_are_all_reduced_then_exchanged():
    """f32[8] summed over pairs ({4,3}, {0,5}, {1,2}), columns in tiles of 3, to 6 tiles of 2:
    the all-reduce of the 3 local columns sends 3 elements (12 B) from every device; then
    devices 0..3 each need 2 columns, which a holder of their tile sends (8 B, no device twice
    in a round), devices 4 and 5 only padding: 12 + 8 = 20 B on the busiest device. Before,
    the columns were all-gathered after the all-reduce (groups of 3, 12 B padded shards twice:
    24 B) and sliced: 36 B."""
    plan = plan_reshard(ArrayShape("f32", (8,)), parse_sharding(PARTIALS),
                        parse_sharding("{devices=[6]<=[6]}"), 6)
    assert [type(step).__name__ for step in plan.steps] == ["AllReduce", "Exchange"]
    assert plan.cost == 20


def test_the_reduce_keeps_its_input_tiling_and_reproduces_the_value():
    """The reduce leaves the partial sums (its input's tiling), which now cost less than moving
    the input to the result's tiling first (permutes of pieces of the rows, 32 B on the busiest
    device): 20 B, as in the plan above."""
    inputs = [np.linspace(0.5, 1.5, 24, dtype=np.float32).reshape(3, 8)]
    spmd = check_equivalent(REDUCE, 6, inputs=inputs)
    assert collectives(spmd)[0] == ("all-reduce", [[4, 3], [0, 5], [1, 2]])
    assert {op for op, _ in collectives(spmd)[1:]} == {"collective-permute"}
    assert int(sent_per_device(spmd, 6).max()) == 20


@needs_xla
def test_xla_sends_as_much_from_the_busiest_device():
    result = compared_with_xla(REDUCE, 6)
    assert result.our_busiest <= result.xla_busiest
