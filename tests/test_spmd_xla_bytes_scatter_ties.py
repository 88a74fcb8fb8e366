"""No more collective bytes than XLA (issue 13) where a scatter's strategies tie on the busiest
device.

- XLA's partitioner takes a scatter's explicit batch and index parallel strategies first, at
  no cost, where the operand (or the indices) is tiled on those dims, and reshards the result
  to its annotation afterwards: on a tie a scatter whose operand is tiled on batch dims keeps
  the operand's tiling before the result's, so its operand stays where it is for its other
  readers too (otherwise the result's tiling stays first).
- A get-tuple-element annotated otherwise than its tuple's element is resharded to its
  annotation from the element's value; with one reader that node is unread until the reader
  takes it (as the reshard of any result to its annotation): the reader pays for it only where
  it reads it, so a scatter keeping its operand's tiling pays the operand's move too.
- On a tie of the busiest device, a scatter whose updates may spread over the partitions
  (partial results combined by an all-reduce) takes the plan with the fewest bytes over all
  devices, as gather and reduce do.

Bytes per device by hand from the cost model's formulas (`gspmdc.ir.cost`: an all-gather sends
each device's shard to the g-1 others, a ring all-reduce of E elements sends about 2 (g-1)/g E
of them); `sent_bytes` is the mean per device, `busiest_per_collective` the busiest device's;
values against the unpartitioned program, uneven shapes included; with the `[xla]` extra,
against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available

from spmd_partition_helpers import (
    busiest_per_collective, check_equivalent, collectives, compared_with_xla, sent_bytes,
)

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

MIN = """min {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] minimum(a, b)
}
"""

MUL = """mul {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] multiply(a, b)
}
"""

ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""

ADD_S32 = """adds {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
"""

ARGMAX = """argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  better = pred[] compare(a, b), direction=GT
  same = pred[] compare(a, b), direction=EQ
  first = pred[] compare(i, j), direction=LT
  tie = pred[] and(same, first)
  keep = pred[] or(better, tie)
  v = f32[] select(keep, a, b)
  k = s32[] select(keep, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}
"""


def batched(rows: int = 8) -> str:
    """A min-scatter over an explicit batch dim whose operand (a reshape of `p`) is tiled 6
    ways on that dim, annotated replicated but read tiled by the root; `p` is also reduced to
    a replicated scalar (fuzz/12900002231, propagation options on)."""
    return f"""HloModule m, num_partitions=6

{MIN}
{MUL}
ENTRY e {{
  p = f32[{rows},1] parameter(0), sharding={{devices=[6,1]<=[6]}}
  one = f32[] constant(1)
  r = f32[] reduce(p, one), dimensions={{0,1}}, to_apply=mul, sharding={{replicated}}
  x = f32[{rows},1,1] reshape(p), sharding={{devices=[6,1,1]<=[6]}}
  i = s32[{rows},1] parameter(1), sharding={{replicated}}
  u = f32[1,{rows}] parameter(2), sharding={{replicated}}
  s = f32[{rows},1,1] scatter(x, i, u), update_window_dims={{0}}, inserted_window_dims={{1}},
    scatter_dims_to_operand_dims={{1}}, index_vector_dim=1, input_batching_dims={{0}},
    scatter_indices_batching_dims={{0}}, to_apply=min, sharding={{replicated}}
  ROOT t = (f32[{rows},1,1], f32[]) tuple(s, r),
    sharding={{{{devices=[6,1,1]<=[6]}}, {{replicated}}}}
}}
"""


def test_a_scatter_keeps_its_operands_tiling_on_a_tie():
    """Scattering in the operand's batch tiles (the result is read in them) or gathering the
    operand for a replicated scatter both cost 40 B at the scatter; kept in its tiles, `p` is
    reduced locally and the partial products all-reduced (one f32 over 6 devices: 8 B from
    the busiest, 20/3 B per device), XLA's program. Before, `p` was gathered whole for the
    scatter and the reduce read that copy: each device's 8 B shard to the 5 others, 40 B."""
    spmd = check_equivalent(batched(), 6)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert busiest_per_collective(spmd, 6) == 8
    assert sent_bytes(spmd, 6) == pytest.approx(20 / 3)


@pytest.mark.parametrize("rows", [7, 6, 11])
def test_batched_uneven(rows):
    spmd = check_equivalent(batched(rows), 6)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]


def element_annotated(rows: int = 8) -> str:
    """An argmax over the last dim of a value row-tiled 4 ways; its index element annotated
    with the rows on devices 0, 2, 1, 3, read through a get-tuple-element annotated with them
    on devices 1, 0, 3, 2 by an add-scatter over an explicit batch dim (the rows) whose result
    is row-tiled as the argmax computes it (fuzz/11600000835 as generated, options on, reduced
    to a batch scatter)."""
    return f"""HloModule m, num_partitions=4

{ARGMAX}
{ADD_S32}
ENTRY e {{
  p = f32[{rows},2,3] parameter(0), sharding={{devices=[4,1,1]<=[4]}}
  iota = s32[{rows},2,3] iota(), iota_dimension=2, sharding={{devices=[4,1,1]<=[4]}}
  neg = f32[] constant(-inf)
  zero = s32[] constant(0)
  r = (f32[{rows},2], s32[{rows},2]) reduce(p, iota, neg, zero), dimensions={{2}},
    to_apply=argmax, sharding={{{{devices=[4,1]<=[4]}}, {{devices=[4,1]0,2,1,3}}}}
  k = s32[{rows},2] get-tuple-element(r), index=1, sharding={{devices=[4,1]1,0,3,2}}
  i = s32[{rows},1] parameter(1), sharding={{replicated}}
  u = s32[{rows}] parameter(2), sharding={{replicated}}
  ROOT s = s32[{rows},2] scatter(k, i, u), update_window_dims={{}}, inserted_window_dims={{1}},
    scatter_dims_to_operand_dims={{1}}, index_vector_dim=1, input_batching_dims={{0}},
    scatter_indices_batching_dims={{0}}, to_apply=adds, sharding={{devices=[4,1]<=[4]}}
}}
"""


def test_an_unread_element_reshard_is_paid_by_the_scatter_keeping_it():
    """Scattering in `k`'s annotated tiles (its operand's, tiled on the batch dim) costs a
    permute of the result back into its annotation (16 B), as reading `k` in the result's
    tiles costs a permute of `k` (16 B): a tie the operand's tiling wins. But `k`'s own move
    to its annotation (two permutes of the element, 16 B) is made for this one reader: it is
    paid only by the plan reading it, and the element is read straight from where the argmax
    computed it, in the result's tiles: nothing moves (XLA's program). With that move taken
    as made, the scatter ran in `k`'s tiles: two permutes, 32 B."""
    spmd = check_equivalent(element_annotated(), 4)
    assert collectives(spmd) == []


@pytest.mark.parametrize("rows", [7, 6])
def test_element_annotated_uneven(rows):
    spmd = check_equivalent(element_annotated(rows), 4)
    assert collectives(spmd) == []


def spread(rows: int = 3) -> str:
    """An add-scatter of updates f32[rows,2] tiled 2x3 (window rows x update batch) into a
    replicated f32[1,4] (fuzz/13000001777, both option settings)."""
    return f"""HloModule m, num_partitions=6

{ADD}
ENTRY e {{
  o = f32[1,4] parameter(0), sharding={{replicated}}
  i = s32[2,2] parameter(1), sharding={{replicated}}
  u = f32[{rows},2] parameter(2), sharding={{devices=[2,3]<=[6]}}
  ROOT s = f32[1,4] scatter(o, i, u), update_window_dims={{0}}, inserted_window_dims={{0}},
    scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=1, to_apply=add,
    sharding={{replicated}}
}}
"""


def test_spread_updates_win_a_tie_of_the_busiest_device_by_the_mean():
    """Gathering the updates whole (their 3 batch tiles, then their 2 window halves) sends
    16 + 16 = 32 B from every device. Keeping the batch tiles (XLA's index pass-through):
    the halves gathered over pairs (8 B each), each device scatters its one update column
    into the operand or into zeros, and the f32[1,4] partial sums are all-reduced over the
    triples (2 (3-1) 4 = 16 elements sent per triple, 24 B from the busiest): 32 B from the
    busiest as well, but 8 + 64/3 = 88/3 B per device."""
    spmd = check_equivalent(spread(), 6)
    assert [c[0] for c in collectives(spmd)] == ["all-gather", "all-reduce"]
    assert busiest_per_collective(spmd, 6) == 32
    assert sent_bytes(spmd, 6) == pytest.approx(88 / 3)


@pytest.mark.parametrize("rows", [4, 2])
def test_spread_uneven(rows):
    check_equivalent(spread(rows), 6)


@needs_xla
@pytest.mark.parametrize("text, n", [(batched(), 6), (batched(7), 6),
                                     (element_annotated(), 4), (element_annotated(7), 4),
                                     (spread(), 6), (spread(4), 6)])
def test_no_more_bytes_than_xla(text, n):
    compared_with_xla(text, n)
