"""No more collective bytes than XLA (issue 13) for scatter and select-and-scatter.

- A scatter whose updates spread over the indices' tiles (index pass-through) can keep the
  indices where they are, whatever the operand's and updates' layouts (XLA's partitioner
  starts from the indices' sharding), and can tile the operand on the devices each index tile
  holds (its replicas): XLA's recursion over the mesh dims a strategy leaves replicated, e.g.
  the operand's rows over one mesh axis and the updates' batch over the other.
- A variadic scatter whose operands are tiled differently runs in a tiling any of its results,
  operands or updates proposes (XLA reshards its operands to a common sharding), not only the
  first's.
- Updates tiled on a scatter dim the scatter cannot tile (a variadic scatter: no partial
  values to combine) move their tiles to a dim the update windows cover whole by an
  all-to-all, and the scatter runs in those tiles, rather than gathering the updates.
- A select-and-scatter whose `source` is a constant still exchanges halos of its operand: only
  an operand read through a window that is free to take whole (a constant) makes halos
  pointless.

Bytes per device by hand from the cost model's formulas (`gspmdc.ir.cost`: an all-gather sends
each device's shard to the g-1 others, a reduce-scatter of B bytes over g devices sends
(g-1)/g B, a ring all-reduce 2 (g-1)/g B); values against the unpartitioned program, uneven
shapes included; with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""

MAX = """max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
"""

GE = """ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
"""


def indices_kept(rows: int = 6) -> str:
    """The indices tiled 3 ways (pairs of replicas), the updates (a splat: free in any tiling)
    annotated with the pairs in another order, the result tiled 6 ways on the dim the update
    windows cover whole."""
    values = ", ".join(f"{{{k}}}" for k in range(rows))
    return f"""HloModule m, num_partitions=6

{ADD}
ENTRY e {{
  o = f32[{rows},1] constant({{{values}}}), sharding={{devices=[6,1]<=[6]}}
  i = s32[12,1] parameter(0), sharding={{devices=[3,1,2]<=[6] last_tile_dim_replicate}}
  one = f32[] constant(1)
  u = f32[12,{rows}] broadcast(one), dimensions={{}},
    sharding={{devices=[3,1,2]<=[2,3]T(1,0) last_tile_dim_replicate}}
  ROOT s = f32[{rows},1] scatter(o, i, u), update_window_dims={{1}}, inserted_window_dims={{1}},
    scatter_dims_to_operand_dims={{1}}, index_vector_dim=1, to_apply=add,
    sharding={{devices=[6,1]<=[6]}}
}}
"""


def test_index_pass_through_keeps_the_indices_where_they_are():
    """The indices stay in their pairs of replicas {0,1}, {2,3}, {4,5}; the result's rows,
    coarsened to the two devices of a pair, are laid over each pair's devices (device d holds
    rows 3 (d % 2) to 3 (d % 2) + 2: the result's halves by d // 3 give both devices of the
    pairs {0,1} and {4,5} the same half), so each device scatters its 4 rows of updates into
    its f32[3,1] half (partial sums over the 3 index tiles, groups {0,2,4} and {1,3,5}); one
    reduce-scatter over each triple, (3-1)/3 of 12 B = 8 B, hands every device a row, and
    devices 1 and 4 swap theirs (a collective-permute, 4 B from each of 2 devices): 28/3 B per
    device, 12 from the busiest. The whole f32[6,1] reduce-scattered over the triples sent
    16 B; before that, the indices moved to the updates' layout and the result was resharded
    from there, or the indices were gathered: 32 B."""
    spmd = check_equivalent(indices_kept(), 6)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter", "collective-permute"]
    assert collectives(spmd)[1][1] == [(0, 0), (1, 4), (2, 2), (3, 3), (4, 1), (5, 5)]
    assert sent_bytes(spmd, 6) == pytest.approx(28 / 3)


def operand_on_index_replicas(rows: int = 8) -> str:
    """A max-scatter into an operand row-tiled 4 ways; indices and updates tiled 2 ways on
    their batch dim, each tile held by devices {0,2} or {1,3}; the result replicated."""
    return f"""HloModule m, num_partitions=4

{MAX}
ENTRY e {{
  o = f32[{rows},3] parameter(0), sharding={{devices=[4,1]<=[4]}}
  i = s32[16,1] parameter(1), sharding={{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}}
  u = f32[16,3] parameter(2), sharding={{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}}
  ROOT s = f32[{rows},3] scatter(o, i, u), update_window_dims={{1}}, inserted_window_dims={{0}},
    scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=max,
    sharding={{replicated}}
}}
"""


def test_the_operand_is_tiled_over_the_replicas_of_each_index_tile():
    """A 2x2 mesh: the operand's rows coarsened to halves on {0,1} / {2,3} (one all-gather of
    pairs: 24 B), each device scatters its index tile's updates into its half (no update
    moves), an all-reduce(max) over the index tiles (2 (2-1)/2 48 = 48 B) and an all-gather of
    the halves (48 B): 120 B. Before: the operand gathered whole (72 B) and the whole result
    all-reduced over the index tiles (96 B), 168 B."""
    spmd = check_equivalent(operand_on_index_replicas(), 4)
    assert [c[0] for c in collectives(spmd)] == ["all-gather", "all-reduce", "all-gather"]
    assert sent_bytes(spmd, 4) == 120


@pytest.mark.parametrize("rows", [7, 5, 3])
def test_operand_on_index_replicas_uneven(rows):
    """The same on operands whose rows do not split evenly (padding never scattered into)."""
    check_equivalent(operand_on_index_replicas(rows), 4)


@pytest.mark.parametrize("rows", [5, 4])
def test_indices_kept_uneven(rows):
    check_equivalent(indices_kept(rows), 6)


def constant_source(size: int = 16) -> str:
    outputs = (size - 4) // 2 + 1
    values = ", ".join(str(k + 1) for k in range(outputs))
    return f"""HloModule m, num_partitions=4

{GE}
{ADD}
ENTRY e {{
  p = f32[{size}] parameter(0), sharding={{devices=[4]<=[4]}}
  s = f32[{outputs}] constant({{{values}}})
  z = f32[] constant(0)
  ROOT r = f32[{size}] select-and-scatter(p, s, z), window={{size=4 stride=2}}, select=ge,
    scatter=add, sharding={{devices=[4]<=[4]}}
}}
"""


def test_a_constant_source_does_not_stop_the_halo_exchange():
    """Windows of 4 at stride 2 over f32[16] in shards of 4: each window that crosses a shard
    boundary reads 2 elements of the right neighbour (8 B, three devices send) and sends
    its scattered part back (8 B): 12 B per device on average; before, the operand was
    gathered whole because the source (read elementwise) is a constant: 48 B."""
    spmd = check_equivalent(constant_source(), 4)
    assert {c[0] for c in collectives(spmd)} == {"collective-permute"}
    assert sent_bytes(spmd, 4) == 12


@pytest.mark.parametrize("size", [15, 13, 9])
def test_constant_source_uneven(size):
    check_equivalent(constant_source(size), 4)


MIN2 = """min2 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  d = f32[] parameter(3)
  x = f32[] minimum(a, c)
  y = f32[] minimum(b, d)
  ROOT t = (f32[], f32[]) tuple(x, y)
}
"""


def variadic_second_tiled(columns: int = 8) -> str:
    """A variadic min-scatter of single elements (both operand dims addressed with window
    size 1): its first operand and result replicated, its second operand and result tiled 2
    ways on the columns; only the second result is read."""
    return f"""HloModule m, num_partitions=2

{MIN2}
ENTRY e {{
  p = f32[2,{columns}] parameter(0), sharding={{replicated}}
  q = f32[2,{columns}] parameter(1), sharding={{devices=[1,2]<=[2]}}
  i = s32[5,2] parameter(2), sharding={{replicated}}
  u = f32[5] parameter(3), sharding={{replicated}}
  s = (f32[2,{columns}], f32[2,{columns}]) scatter(p, q, i, u, u), update_window_dims={{}},
    inserted_window_dims={{0,1}}, scatter_dims_to_operand_dims={{1,0}}, index_vector_dim=1,
    to_apply=min2, sharding={{{{replicated}}, {{devices=[1,2]<=[2]}}}}
  ROOT b = f32[2,{columns}] get-tuple-element(s), index=1, sharding={{devices=[1,2]<=[2]}}
}}
"""


def test_a_variadic_scatter_takes_the_tiling_of_its_second_operand():
    """XLA reshards a variadic scatter's operands to one common sharding: here the second's
    (the first, replicated, is sliced locally), the indices shifted by each partition's
    offset: nothing is sent (XLA: 0 B). Before, only the first result's and operand's
    tilings were candidates: the second operand was gathered (2 x 4 f32 = 32 B)."""
    spmd = check_equivalent(variadic_second_tiled(), 2)
    assert collectives(spmd) == []
    assert sent_bytes(spmd, 2) == 0


@pytest.mark.parametrize("columns", [7, 5])
def test_variadic_second_tiled_uneven(columns):
    check_equivalent(variadic_second_tiled(columns), 2)


def iota_indices(rows: int = 8, indices: str = "") -> str:
    """An add-scatter whose indices are an iota along the operand's rows (row k of the updates
    goes to row k of the operand), operand, updates and result row-tiled 4 ways; the indices
    annotated with `indices` (none: replicated)."""
    return f"""HloModule m, num_partitions=4

{ADD}
ENTRY e {{
  o = f32[{rows},3] parameter(0), sharding={{devices=[4,1]<=[4]}}
  i = s32[{rows},1] iota(), iota_dimension=0{indices}
  u = f32[{rows},3] parameter(1), sharding={{devices=[4,1]<=[4]}}
  ROOT s = f32[{rows},3] scatter(o, i, u), update_window_dims={{1}}, inserted_window_dims={{0}},
    scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=add,
    sharding={{devices=[4,1]<=[4]}}
}}
"""


def test_iota_indices_make_a_parallel_dim():
    """The indices' rows are an iota along the operand's rows (XLA's parallel dims of a
    scatter, found from iota index components): the operand's row tiles take the same rows of
    the indices (a local slice of the replicated iota) and of the updates, each shifted by its
    partition's offset, so nothing moves. Before, the updates were gathered whole to every
    row tile (an all-gather: 3/4 of 96 B from each device, 72 B)."""
    spmd = check_equivalent(iota_indices(), 4)
    assert collectives(spmd) == []


SWAPPED = f"""HloModule m, num_partitions=8

{ADD}
ENTRY e {{
  o = f32[8,4] parameter(0), sharding={{devices=[4,2]<=[8]}}
  rows = s32[8] iota(), iota_dimension=0
  r = s32[1,8,4] broadcast(rows), dimensions={{1}}
  columns = s32[4] iota(), iota_dimension=0
  c = s32[1,8,4] broadcast(columns), dimensions={{2}}
  i = s32[2,8,4] concatenate(r, c), dimensions={{0}}, sharding={{devices=[1,2,4]<=[8]}}
  u = f32[8,4] parameter(1), sharding={{devices=[4,2]<=[8]}}
  ROOT s = f32[8,4] scatter(o, i, u), update_window_dims={{}}, inserted_window_dims={{0,1}},
    scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=0, to_apply=add,
    sharding={{replicated}}
}}
"""


def test_iota_indices_tiled_otherwise_are_still_parallel_dims():
    """Both operand dims are parallel (the index components are iotas along the indices' rows
    and columns), but the indices are annotated 2 x 4 where the operand is 4 x 2: the scatter
    still finds the iotas behind the reshard that lays the indices out like the operand (an
    iota is recomputed locally, free), scatters each f32[2,2] tile in place and only the
    replicated result is gathered (each device's 16 B to the 7 others: 112 B). Before, the
    operand and the updates were gathered whole first (224 B)."""
    spmd = check_equivalent(SWAPPED, 8)
    assert sent_bytes(spmd, 8) == 112


@pytest.mark.parametrize("rows", [7, 5, 6])
def test_iota_indices_uneven(rows):
    """Rows that do not split evenly: the padding rows of the local indices (whatever they
    hold) are dropped, never scattered into a partition's real rows."""
    spmd = check_equivalent(iota_indices(rows), 4)
    assert collectives(spmd) == []


def updates_on_a_scatter_dim(columns: int = 2) -> str:
    """A variadic min-scatter (no partial values to combine: its scatter dims cannot be
    tiled) of f32[6,{columns}] windows into a replicated f32[7,{columns}] operand: the windows
    cover its columns whole (the indices' column component is checked against 0 only); the
    first updates tiled 2 ways on their second scatter dim, the second replicated; the first
    result read, replicated."""
    return f"""HloModule m, num_partitions=2

{MIN2}
ENTRY e {{
  p = f32[7,{columns}] parameter(0), sharding={{replicated}}
  i = s32[4,6,2] parameter(1), sharding={{replicated}}
  u = f32[6,4,6,{columns}] parameter(2), sharding={{devices=[1,2,1,1]<=[2]}}
  v = f32[6,4,6,{columns}] parameter(3), sharding={{replicated}}
  s = (f32[7,{columns}], f32[7,{columns}]) scatter(p, p, i, u, v), update_window_dims={{0,3}},
    inserted_window_dims={{}}, scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=2,
    to_apply=min2, sharding={{{{replicated}}, {{replicated}}}}
  ROOT a = f32[7,{columns}] get-tuple-element(s), index=0, sharding={{replicated}}
}}
"""


def test_updates_tiles_move_to_the_columns_their_windows_cover_whole():
    """The scatter runs in the operand's column halves (operand pass-through): the tiled
    updates move their tiles from the scatter dim to their window's column dim by one
    all-to-all (each device keeps half of its f32[6,2,6,2] shard, 576 B, and sends the other
    half: 288 B), the replicated ones are sliced locally, and the result's halves are gathered
    (f32[7,1]: 28 B to the other device): 316 B from each device (XLA: 324 B, the same plan
    from its resharding of the operands to the updates' common sharding). Before, the first
    updates were gathered whole (576 B each)."""
    spmd = check_equivalent(updates_on_a_scatter_dim(), 2)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all", "all-gather"]
    assert sent_bytes(spmd, 2) == 316


def test_updates_moved_uneven():
    """Three columns over two devices: the column halves are padded, the padding's windows
    are dropped by the scatter's bounds check (values only)."""
    check_equivalent(updates_on_a_scatter_dim(3), 2)


@needs_xla
@pytest.mark.parametrize("text, n", [(indices_kept(), 6), (operand_on_index_replicas(), 4),
                                     (constant_source(), 4), (variadic_second_tiled(7), 2),
                                     (iota_indices(), 4), (SWAPPED, 8),
                                     (updates_on_a_scatter_dim(), 2)])
def test_no_more_bytes_than_xla(text, n):
    compared_with_xla(text, n)

