"""A slice of a pad on a tiled dim (through single-use copies) is partitioned as one pad with
the slice's cut taken off its edge padding, as XLA's partitioner preprocesses such chains: one
halo exchange where the pad and the slice each exchanged theirs. Bytes by hand (a
collective-permute sends its operand from each source); values against the unpartitioned
program."""
from __future__ import annotations

from gspmdc.ir.parser import parse_module
from gspmdc.passes.spmd.merge_pad_slice import merge_pad_slices

from spmd_partition_helpers import check_equivalent, collectives, sent_bytes

SHIFT = """HloModule m, num_partitions=4

ENTRY main {
  p = f32[8,3] parameter(0), sharding={devices=[4,1]<=[4]}
  v = f32[] constant(5)
  pad = f32[10,3] pad(p, v), padding=2_0x0_0, sharding={devices=[4,1]<=[4]}
  c = f32[10,3] copy(pad), sharding={devices=[4,1]<=[4]}
  ROOT s = f32[8,3] slice(c), slice={[0:8], [0:3]}, sharding={devices=[4,1]<=[4]}
}
"""

#: the pad read by the slice and by the root: not merged (it is computed anyway)
SHARED = SHIFT.replace("ROOT s = f32[8,3] slice(c)", "s = f32[8,3] slice(c)").replace(
    "\n}\n", "\n  ROOT t = (f32[8,3], f32[10,3]) tuple(s, pad), "
             "sharding={{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}\n}\n")


def test_the_slice_becomes_one_pad_with_its_cut_taken_off():
    """pad 2_0 then slice [0:8] is pad 2_-2: the copy and the pad are dropped."""
    module = parse_module(SHIFT)
    merge_pad_slices(module.entry)
    assert [i.opcode for i in module.entry.instructions] == ["parameter", "constant", "pad"]
    root = module.entry.root
    assert root.name == "s" and [(p.low, p.high) for p in root.attr("padding")] == \
        [(2, -2), (0, 0)]


def test_a_shift_by_two_rows_is_one_permute():
    """Every device but the last sends its last 2 rows (2 x 3 x 4 B = 24 B) to the next, the
    first fills its top with the pad value: one collective-permute (the pad's halo exchange
    and the slice's sent 84 B from the busiest device before)."""
    spmd = check_equivalent(SHIFT, 4)
    assert collectives(spmd) == [("collective-permute", [(0, 1), (1, 2), (2, 3)])]
    assert sent_bytes(spmd, 4) == 24 * 3 / 4


def test_a_pad_with_another_user_is_not_merged():
    module = parse_module(SHARED)
    merge_pad_slices(module.entry)
    assert [i.opcode for i in module.entry.instructions].count("slice") == 1
    check_equivalent(SHARED, 4)
