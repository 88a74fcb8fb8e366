"""Tokens and infeeds in the partitioned program: every partition makes its own token, and reads
its own shard of an infeed's data (the layouts below are worked out by hand from the tilings)."""
from __future__ import annotations

import pytest

from gspmdc.errors import UnsupportedError

from spmd_partition_helpers import partition


def program(infeed_shape: str, sharding: str, root_shape: str, root_sharding: str,
            token_sharding: str = "{maximal device=0}") -> str:
    return f"""HloModule m
ENTRY e {{
  t = token[] after-all(), sharding={token_sharding}
  i = ({infeed_shape}, token[]) infeed(t), sharding={sharding}
  ROOT d = {root_shape} get-tuple-element(i), index=0, sharding={root_sharding}
}}
"""


def only(module, opcode):
    (found,) = [i for c in module.computations.values() for i in c.instructions
                if i.opcode == opcode]
    return found


def branches(module, conditional):
    return [module.computations[ref.name] for ref in conditional.attrs["branch_computations"]]


def infeed_in(comp):
    (infeed,) = [i for i in comp.instructions if i.opcode == "infeed"]
    return infeed


def test_an_evenly_tiled_infeed_reads_the_shard_shape():
    spmd = partition(program("f32[8,6]", "{{devices=[2,3]<=[6]}, {maximal device=0}}",
                             "f32[8,6]", "{devices=[2,3]<=[6]}"), 6)
    assert str(only(spmd, "infeed").shape) == "(f32[4,2], token[])"
    assert not [i for i in spmd.entry.instructions if i.opcode == "conditional"]
    assert str(only(spmd, "after-all").shape) == "token[]"


def test_an_uneven_infeed_reads_each_partitions_rows_and_pads_them_with_zeros():
    # 10 rows over 4: shards of 3 rows at 0, 3, 6 and 1 row at 9; two shapes, two branches
    spmd = partition(program("f32[10,3]", "{{devices=[4,1]<=[4]}, {maximal device=0}}",
                             "f32[10,3]", "{devices=[4,1]<=[4]}"), 4)
    conditional = only(spmd, "conditional")
    assert str(conditional.shape) == "(f32[3,3], token[])"
    selector = conditional.operands[0]
    table = selector.operands[0].operands[0]
    assert table.literal.value.tolist() == [0, 0, 0, 1]
    full, last = branches(spmd, conditional)
    assert str(infeed_in(full).shape) == "(f32[3,3], token[])"
    assert str(infeed_in(last).shape) == "(f32[1,3], token[])"
    (pad,) = [i for i in last.instructions if i.opcode == "pad"]
    assert str(pad.shape) == "f32[3,3]" and pad.operands[1].literal.value == 0
    assert [(d.low, d.high) for d in pad.attrs["padding"]] == [(0, 2), (0, 0)]


def test_each_maximal_leaf_is_read_on_its_device_and_zero_elsewhere():
    spmd = partition(program("(f32[5,2], s32[3])",
                             "{{maximal device=0}, {maximal device=1}, {maximal device=0}}",
                             "(f32[5,2], s32[3])", "{{maximal device=0}, {maximal device=1}}"), 2)
    conditional = only(spmd, "conditional")
    first, second = branches(spmd, conditional)
    assert str(infeed_in(first).shape) == "((f32[5,2], ()), token[])"
    assert str(infeed_in(second).shape) == "(((), s32[3]), token[])"
    for comp, zero_shape in ((first, "s32[3]"), (second, "f32[5,2]")):
        (zeros,) = [i for i in comp.instructions if i.opcode == "broadcast"]
        assert str(zeros.shape) == zero_shape and zeros.operands[0].literal.value == 0
        assert str(comp.root.shape) == "((f32[5,2], s32[3]), token[])"


def test_an_infeed_on_one_device_runs_there_and_gives_zeros_elsewhere():
    spmd = partition(program("f32[3,2]", "{{maximal device=1}, {maximal device=1}}",
                             "f32[3,2]", "{maximal device=1}", "{maximal device=1}"), 2)
    conditional = only(spmd, "conditional")
    predicate = conditional.operands[0]
    assert predicate.opcode == "compare" and predicate.operands[1].literal.value == 1
    assert predicate.operands[0].opcode == "partition-id"
    there = spmd.computations[conditional.attrs["true_computation"].name]
    elsewhere = spmd.computations[conditional.attrs["false_computation"].name]
    assert str(infeed_in(there).shape) == "(f32[3,2], token[])"
    assert [i.opcode for i in elsewhere.root.operands] == ["broadcast", "after-all"]


def test_an_outfeed_is_still_refused():
    text = """HloModule m
ENTRY e {
  p = f32[4] parameter(0), sharding={devices=[2]<=[2]}
  t = token[] after-all(), sharding={maximal device=0}
  ROOT o = token[] outfeed(p, t), outfeed_shape=f32[4], sharding={maximal device=0}
}
"""
    with pytest.raises(UnsupportedError, match="outfeed cannot be partitioned"):
        partition(text, 2)
