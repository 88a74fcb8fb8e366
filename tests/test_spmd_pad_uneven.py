"""The pad-uneven pass on its own: where its masks go in the instruction list, that a computation
needing none is left as it is, and that the partitioned program reads no padding (the test
harness fills padding with NaN, so an unmasked reduce would return NaN)."""
from __future__ import annotations

from gspmdc import api
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.pipeline import partitioner_pipeline
from gspmdc.passes.spmd.pad_uneven import PadUneven

from hlo_text import reducer
from spmd_partition_helpers import check_equivalent

# 10 rows over 4 tiles: shards of 3, the last holding 1 row and 2 of padding; the reduce over
# the rows sits between instructions that need no mask
UNEVEN = """HloModule uneven

""" + reducer("add") + """
ENTRY main {
  x = f32[10,8] parameter(0), sharding={devices=[4,1]<=[4]}
  e = f32[10,8] exponential(x), sharding={devices=[4,1]<=[4]}
  zero = f32[] constant(0)
  s = f32[8] reduce(e, zero), dimensions={0}, to_apply=add
  ROOT n = f32[8] negate(s)
}
"""

EVEN = UNEVEN.replace("f32[10,8]", "f32[12,8]")


def _resharded(text: str, n: int):
    """The module after the passes before pad-uneven."""
    passes = partitioner_pipeline(propagate=False)
    before = passes[:[p.name for p in passes].index("pad-uneven")]
    return run_pipeline(PassContext(n), api.parse(text), before)


def test_masks_go_right_before_the_reduce_and_the_rest_keeps_its_order():
    module = _resharded(UNEVEN, 4)
    old = [i.name for i in module.entry.instructions]
    PadUneven().apply(PassContext(4), module)
    new = module.entry.instructions
    reduce_at = next(k for k, i in enumerate(new) if i.opcode == "reduce")
    masks = [i for i in new if i.name not in old]
    assert masks and all(i.attr("metadata").get("op_type") == "pad-mask" for i in masks)
    # every mask instruction comes after the instructions before the reduce, and right before it
    assert [i.name for i in new if i.name in old] == old
    assert new[reduce_at - len(masks):reduce_at] == masks
    assert new[reduce_at].operands[0].opcode == "select"


def test_a_computation_without_uneven_reads_is_left_as_it_is():
    module = _resharded(EVEN, 4)
    instructions = module.entry.instructions
    names = [i.name for i in instructions]
    PadUneven().apply(PassContext(4), module)
    assert module.entry.instructions is instructions
    assert [i.name for i in instructions] == names


def test_the_partitioned_reduce_reads_no_padding():
    check_equivalent(UNEVEN, 4)
