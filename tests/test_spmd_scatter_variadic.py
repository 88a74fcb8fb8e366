"""A variadic scatter's results share one sharding in the partitioned program: when the
annotation gives its tuple elements different shardings and the first is on one device
(`{maximal device=k}`), the scatter runs in one sharding for all its results (on that device,
or tiled or replicated like any scatter whose results are not all on one device, as XLA's
partitioner does) and each result is resharded to what its users need (found by `make
conformance-xla`: the second result kept its tiled sharding, so the kernel's whole-size result
did not match the instruction's shard shape; exit 3)."""
from __future__ import annotations


def test_variadic_scatter_with_a_maximal_first_result(hlo_module, reducer, check_equivalent):
    combiner = """add2 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  d = f32[] parameter(3)
  s = f32[] add(a, c)
  t = f32[] add(b, d)
  ROOT r = (f32[], f32[]) tuple(s, t)
}
"""
    text = hlo_module("""  p = f32[4,6] parameter(0)
  q = f32[4,6] parameter(1)
  i = s32[3,1] parameter(2)
  u = f32[3,6] parameter(3)
  v = f32[3,6] parameter(4)
  s = (f32[4,6], f32[4,6]) scatter(p, q, i, u, v), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add2, sharding={{maximal device=1}, {devices=[2,1,2]<=[4] last_tile_dim_replicate}}
  a = f32[4,6] get-tuple-element(s), index=0
  b = f32[4,6] get-tuple-element(s), index=1, sharding={devices=[2,2]<=[4]}
  ROOT r = (f32[4,6], f32[4,6]) tuple(a, b)""", computations=combiner)
    spmd = check_equivalent(text, 4)
    scatter = next(inst for inst in spmd.entry.instructions if inst.opcode == "scatter")
    first, second = scatter.sharding.leaf_shardings(scatter.shape)
    assert first == second
