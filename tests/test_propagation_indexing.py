"""Gather and scatter propagation (docs/design/propagation.md#gather-and-scatter): index
passthrough, operand passthrough, parallel
dims (implicit iota indices and explicit batching dims); expected values worked out by hand."""
from gspmdc.ir.parser import parse_module
from gspmdc.passes.propagation.graph import ModuleGraph
from gspmdc.passes.propagation.indexing import gather_view, iota_dimension, scatter_view

from hlo_text import reducer
from propagation_helpers import expect, find, run

# rows of a [16,8] table picked by 6 indices: output [6,8]
GATHER = """
HloModule m
ENTRY e {{
  p0 = f32[16,8] parameter(0){table}
  table = f32[16,8] copy(p0)
  p1 = s32[6] parameter(1){idx}
  idx = s32[6] copy(p1)
  g = f32[6,8] gather(table, idx), offset_dims={{1}}, collapsed_slice_dims={{0}},
      start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,8}}{out}
  ROOT t = (f32[6,8]) tuple(g)
}}"""


def gather(table="", idx="", out=""):
    fmt = lambda s: f", sharding={s}" if s else ""  # noqa: E731
    return run(GATHER.format(table=fmt(table), idx=fmt(idx), out=fmt(out)))


def test_gather_output_batch_dims_follow_the_indices():
    m = gather(idx="{devices=[2]<=[2]}")
    expect(m, g="{devices=[2,1]<=[2]}")


def test_gather_offset_dims_follow_whole_operand_dims():
    # columns are sliced whole (slice size 8 = dim size): they pass through to the output
    m = gather(table="{devices=[1,2]<=[2]}")
    expect(m, g="{devices=[1,2]<=[2]}")


def test_gather_sliced_operand_dims_do_not_pass_through():
    # rows are indexed, not sliced whole: nothing follows into the output
    m = gather(table="{devices=[2,1]<=[2]}")
    expect(m, g=None)


def test_gather_backward_to_indices_and_operand():
    m = gather(out="{devices=[2,2]<=[4]}")
    # indices take the batch split (output rows, devices {0,1}/{2,3}); the operand takes the
    # offset split (output columns, devices {0,2}/{1,3}) on its passthrough dim
    expect(m, idx="{devices=[2,2]<=[4] last_tile_dim_replicate}",
           table="{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}")


IOTA_GATHER = """
HloModule m
ENTRY e {
  p0 = f32[4,16,2] parameter(0), sharding={devices=[4,1,1]<=[4]}
  operand = f32[4,16,2] copy(p0)
  row = s32[4,5,1] iota(), iota_dimension=0
  p1 = s32[4,5,1] parameter(1)
  col = s32[4,5,1] copy(p1)
  idx = s32[4,5,2] concatenate(row, col), dimensions={2}
  g = f32[4,5,2] gather(operand, idx), offset_dims={2}, collapsed_slice_dims={0,1},
      start_index_map={0,1}, index_vector_dim=2, slice_sizes={1,1,2}
  ROOT t = (f32[4,5,2]) tuple(g)
}"""


def test_iota_index_component_makes_a_parallel_dim():
    m = run(IOTA_GATHER)
    # index component 0 is iota along index dim 0 and addresses operand dim 0 (slice size 1,
    # same size 4): operand dim 0 <-> output dim 0 walk in lockstep
    expect(m, g="{devices=[4,1,1]<=[4]}", idx="{devices=[4,1,1]<=[4]}")


def test_parallel_dims_are_spmd_only():
    m = run(IOTA_GATHER, is_spmd=False)
    expect(m, g=None)


def test_explicit_batching_dims():
    m = run("""
HloModule m
ENTRY e {
  p0 = f32[4,16,8] parameter(0), sharding={devices=[2,1,1]<=[2]}
  p1 = s32[4,3,1] parameter(1)
  g = f32[4,3,8] gather(p0, p1), offset_dims={2}, collapsed_slice_dims={1},
      operand_batching_dims={0}, start_indices_batching_dims={0}, start_index_map={1},
      index_vector_dim=2, slice_sizes={1,1,8}
  ROOT t = (f32[4,3,8]) tuple(g)
}""")
    expect(m, g="{devices=[2,1,1]<=[2]}")


SCATTER = """
HloModule m
{add}ENTRY e {{
  p0 = f32[16,8] parameter(0){operand}
  operand = f32[16,8] copy(p0)
  p1 = s32[6] parameter(1){idx}
  idx = s32[6] copy(p1)
  p2 = f32[6,8] parameter(2){upd}
  upd = f32[6,8] copy(p2)
  s = f32[16,8] scatter(operand, idx, upd), to_apply=add, update_window_dims={{1}},
      inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1{out}
  ROOT t = (f32[16,8]) tuple(s)
}}"""


def scatter(operand="", idx="", upd="", out="", **options):
    fmt = lambda s: f", sharding={s}" if s else ""  # noqa: E731
    return run(SCATTER.format(add=reducer("add"), operand=fmt(operand), idx=fmt(idx), upd=fmt(upd),
                              out=fmt(out)), **options)


def test_scatter_output_follows_the_operand():
    expect(scatter(operand="{devices=[2,1]<=[2]}"), s="{devices=[2,1]<=[2]}")


def test_scatter_output_follows_update_window_dims():
    # update columns are whole operand columns
    expect(scatter(upd="{devices=[1,2]<=[2]}"), s="{devices=[1,2]<=[2]}")


def test_scatter_backward():
    m = scatter(out="{devices=[1,2]<=[2]}", idx="{devices=[2]<=[2]}")
    # operand: the output's sharding; update: window dim from the output (columns) merged with
    # nothing compatible from the indices (rows, same devices) -> the output's
    expect(m, operand="{devices=[1,2]<=[2]}", upd="{devices=[1,2]<=[2]}")


def test_scatter_indices_follow_the_updates():
    # (a scatter passes shardings to its operands only once it is sharded itself)
    m = scatter(upd="{devices=[2,1]<=[2]}", out="{replicated}")
    expect(m, idx="{devices=[2]<=[2]}")


def test_non_spmd_scatter_is_replicated():
    m = scatter(operand="{devices=[2,1]<=[2]}", is_spmd=False)
    expect(m, s="{replicated}")


def test_views_and_iota_detection():
    m = parse_module("""
HloModule m
ENTRY e {
  a = s32[3,4] constant({{0,1,2,3},{0,1,2,3},{0,1,2,3}})
  i3 = s32[3] iota(), iota_dimension=0
  b = s32[4,3] broadcast(i3), dimensions={1}
  t = f32[16,8] parameter(0)
  i = s32[6] parameter(1)
  ROOT g = f32[6,8] gather(t, i), offset_dims={1}, collapsed_slice_dims={0},
      start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
}""")
    graph = ModuleGraph(m)
    assert iota_dimension(find(m, "a"), graph) == 1
    assert iota_dimension(find(m, "b"), graph) == 1
    view = gather_view(m.entry.root)
    assert view.operand_passthrough() == [(1, 1)]
    assert view.index_batch_dims() == [0] and view.result_batch_dims() == [0]


def test_scatter_view_window_sizes():
    m = parse_module(SCATTER.format(add=reducer("add"), operand="", idx="", upd="", out=""))
    view = scatter_view(find(m, "s"))
    assert view.slice_sizes == (1, 8) and view.operand_passthrough() == [(1, 1)]


def test_iota_dimension_through_a_loop_or_a_branch_parameter():
    m = parse_module("""
HloModule m
body {
  p = (s32[4,3], s32[4,3]) parameter(0)
  kept = s32[4,3] get-tuple-element(p), index=0
  changed = s32[4,3] get-tuple-element(p), index=1
  n = s32[4,3] negate(changed)
  ROOT r = (s32[4,3], s32[4,3]) tuple(kept, n)
}
cond {
  p = (s32[4,3], s32[4,3]) parameter(0)
  ROOT f = pred[] constant(false)
}
branch {
  q = (s32[4,3], s32[4,3]) parameter(0)
  ROOT second = s32[4,3] get-tuple-element(q), index=1
}
other {
  q = (s32[4,3], s32[4,3]) parameter(0)
  ROOT first = s32[4,3] get-tuple-element(q), index=0
}
ENTRY e {
  a = s32[4,3] iota(), iota_dimension=1
  b = s32[4,3] iota(), iota_dimension=0
  t = (s32[4,3], s32[4,3]) tuple(a, b)
  w = (s32[4,3], s32[4,3]) while(t), condition=cond, body=body
  k = s32[] parameter(0)
  c = s32[4,3] conditional(k, t, t), branch_computations={branch, other}
  ROOT o = (s32[4,3], s32[4,3]) tuple(c, c)
}""")
    graph = ModuleGraph(m)
    # passed through unchanged: the loop operand's element, an iota along dim 1
    assert iota_dimension(find(m, "kept"), graph) == 1
    # rewritten by the body: unknown after the first iteration
    assert iota_dimension(find(m, "changed"), graph) is None
    # a branch reads its operand tuple's element (b, an iota along dim 0)
    assert iota_dimension(find(m, "second"), graph) == 0
    assert iota_dimension(find(m, "first"), graph) == 1
