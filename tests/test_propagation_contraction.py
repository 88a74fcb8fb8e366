"""Dot and convolution propagation (docs/design/propagation.md#dot-and-convolution), expected
shardings
worked out by hand from the dimension mappings."""
from gspmdc.ir.parser import parse_module
from gspmdc.passes.propagation.contraction import convolution_dims, dot_dims

from propagation_helpers import expect, find, run

DOT_HEAD = """
HloModule m
ENTRY e {
"""


def test_dot_output_follows_the_only_sharded_operand_with_contracting_dims_replicated():
    m = run("""
HloModule m
ENTRY e {
  a = f32[16,8] parameter(0), sharding={devices=[2,2]<=[4]}
  b = f32[8,12] parameter(1)
  d = f32[16,12] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[16,12]) tuple(d)
}""")
    # rows keep their 2 tiles; the two devices of a row block hold partial sums along K
    expect(m, d="{devices=[2,1,2]<=[4] last_tile_dim_replicate}")


def test_dot_with_two_sharded_operands_prefers_the_bigger_one():
    m = run("""
HloModule m
ENTRY e {
  a = f32[8,256,128] parameter(0), sharding={devices=[1,4,1]<=[4]}
  b = f32[8,128,512] parameter(1), sharding={devices=[1,1,4]<=[4]}
  d = f32[8,256,512] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
      lhs_contracting_dims={2}, rhs_contracting_dims={1}
  ROOT t = (f32[8,256,512]) tuple(d)
}""")
    # candidates [1,4,1] (from a) and [1,1,4] (from b) cannot merge; b is bigger
    expect(m, d="{devices=[1,1,4]<=[4]}")


def test_dot_lookahead_prefers_the_operand_its_user_agrees_with():
    m = run("""
HloModule m
ENTRY e {
  a = f32[8,256,128] parameter(0), sharding={devices=[1,4,1]<=[4]}
  b = f32[8,128,512] parameter(1), sharding={devices=[1,1,4]<=[4]}
  d = f32[8,256,512] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
      lhs_contracting_dims={2}, rhs_contracting_dims={1}
  n = f32[8,256,512] negate(d)
  c = f32[8,256,512] copy(n), sharding={devices=[1,4,1]<=[4]}
  ROOT t = (f32[8,256,512]) tuple(c)
}""")
    # the single-user chain d -> n -> c ends at [1,4,1], a sub-tiling of a's candidate only
    expect(m, d="{devices=[1,4,1]<=[4]}")


def test_dot_partial_candidates_from_both_operands_merge():
    m = run("""
HloModule m
ENTRY e {
  a = f32[16,8] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  b = f32[8,12] parameter(1), sharding={devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}
  d = f32[16,12] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[16,12]) tuple(d)
}""")
    # rows from a (row block i on {2i,2i+1}), columns from b (col block j on {j,j+2})
    expect(m, d="{devices=[2,2]<=[4]}")


def test_dot_backward_from_the_output():
    m = run("""
HloModule m
ENTRY e {
  p0 = f32[8,256,128] parameter(0)
  a = f32[8,256,128] copy(p0)
  p1 = f32[8,128,512] parameter(1)
  b = f32[8,128,512] copy(p1)
  ROOT d = f32[8,256,512] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
      lhs_contracting_dims={2}, rhs_contracting_dims={1}, sharding={devices=[1,2,2]<=[4]}
}""")
    # lhs keeps the M split (devices {0,1} / {2,3}), replicated over the N split; rhs keeps the
    # N split (devices {0,2} / {1,3}), replicated over the M split
    expect(m, a="{devices=[1,2,1,2]<=[4] last_tile_dim_replicate}",
           b="{devices=[1,1,2,2]0,2,1,3 last_tile_dim_replicate}")


def test_dot_backward_from_the_other_operand_through_contracting_dims():
    m = run("""
HloModule m
ENTRY e {
  p0 = f32[16,8] parameter(0)
  a = f32[16,8] copy(p0)
  b = f32[8,12] parameter(1), sharding={devices=[2,1]<=[2]}
  d = f32[16,12] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[16,12]) tuple(d)
}""")
    # K is split in b: a's K dim gets the same split (the output d carries partial sums)
    expect(m, a="{devices=[1,2]<=[2]}", d="{replicated}")


CONV = """
HloModule m
ENTRY e {{
  lhs = f32[8,32,32,16] parameter(0), sharding={lhs}
  rhs = f32[{k},{k},16,24] parameter(1)
  c = f32[8,{o},{o},24] convolution(lhs, rhs), window={{size={k}x{k} pad={p}_{p}x{p}_{p}}},
      dim_labels=b01f_01io->b01f
  ROOT t = (f32[8,{o},{o},24]) tuple(c)
}}"""


def test_small_kernel_convolution_follows_the_input_spatially():
    m = run(CONV.format(lhs="{devices=[2,2,1,1]<=[4]}", k=3, p=1, o=32))
    expect(m, c="{devices=[2,2,1,1]<=[4]}")


def test_small_kernel_convolution_with_sharded_features_gives_nothing():
    m = run(CONV.format(lhs="{devices=[1,2,1,2]<=[4]}", k=3, p=1, o=32))
    expect(m, c=None)


def test_large_kernel_convolution_keeps_only_the_batch_split():
    # a 32x32 kernel over a 32x32 input with padding 15: output 31x31, kernel >= output
    m = run(CONV.format(lhs="{devices=[2,2,1,1]<=[4]}", k=32, p=15, o=31))
    expect(m, c="{devices=[2,1,1,1,2]<=[4] last_tile_dim_replicate}")


def test_one_by_one_convolution_is_a_dot():
    m = run("""
HloModule m
ENTRY e {
  x = f32[8,16] parameter(0), sharding={devices=[2,1]<=[2]}
  w = f32[16,4] parameter(1)
  c = f32[8,4] convolution(x, w), dim_labels=bf_io->bf
  ROOT t = (f32[8,4]) tuple(c)
}""")
    expect(m, c="{devices=[2,1]<=[2]}")


def test_dimension_parsing():
    m = parse_module("""
HloModule m
ENTRY e {
  a = f32[2,3,4,5] parameter(0)
  b = f32[2,5,6] parameter(1)
  ROOT d = f32[2,3,4,6] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
      lhs_contracting_dims={3}, rhs_contracting_dims={1}
}""")
    dims = dot_dims(m.entry.root)
    assert [(d.lhs, d.rhs, d.output) for d in dims.batch] == [(0, 0, 0)]
    assert [(d.lhs, d.rhs) for d in dims.contracting] == [(3, 1)]
    assert [(d.lhs, d.output) for d in dims.lhs_non_contracting] == [(1, 1), (2, 2)]
    assert [(d.rhs, d.output) for d in dims.rhs_non_contracting] == [(2, 3)]


def test_convolution_spatial_dims_that_are_really_dot_dims():
    m = parse_module("""
HloModule m
ENTRY e {
  lhs = f32[32,24,64] parameter(0)
  rhs = f32[32,16,64] parameter(1)
  ROOT c = f32[1,24,16] convolution(lhs, rhs), window={size=32},
      dim_labels=0bf_0oi->0bf
}""")
    dims = convolution_dims(find(m, "c"))
    # the 32-wide spatial dim is contracted completely (window = input, no padding)
    assert [(d.lhs, d.rhs, d.output) for d in dims.contracting] == [(2, 2, -1), (0, 0, 0)]
    assert not dims.conv_spatial
