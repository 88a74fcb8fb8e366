"""Forward and backward rules of the shape-preserving and layout-changing ops
(docs/design/propagation.md#forward-rules), on
small modules whose expected shardings are worked out by hand from the rules' semantics."""
import pytest

from propagation_helpers import expect, run, sharding_of
from hlo_text import reducer


def test_elementwise_forward_and_backward():
    m = run("""
HloModule m
ENTRY e {
  p0 = f32[8,4] parameter(0), sharding={devices=[2,2]<=[4]}
  p1 = f32[8,4] parameter(1)
  a = f32[8,4] add(p0, p1)
  p2 = f32[8,4] parameter(2)
  x = f32[8,4] exponential(p2)
  y = f32[8,4] multiply(x, a)
  ROOT r = f32[8,4] negate(y)
}""")
    # add follows p0; exponential takes multiply's sharding backward; the root and the
    # parameters keep theirs (propagation into them is off by default)
    expect(m, a="{devices=[2,2]<=[4]}", x="{devices=[2,2]<=[4]}", y="{devices=[2,2]<=[4]}",
           r=None, p1=None, p2=None)


def test_output_propagation_flag():
    text = """
HloModule m
ENTRY e {
  p0 = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT r = f32[8,4] negate(p0)
}"""
    expect(run(text, propagate_to_output=True), r="{devices=[4,1]<=[4]}")
    expect(run(text, propagate_to_output=False), r=None)


ROWS = "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"        # row block i on {2i, 2i+1}
COLS = "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"      # col block j on {j, j+2}

MERGE = f"""
HloModule m
ENTRY e {{
  p0 = f32[8,8] parameter(0)
  p1 = f32[8,8] parameter(1)
  a = f32[8,8] copy(p0), sharding={ROWS}
  b = f32[8,8] copy(p1), sharding={COLS}
  c = f32[8,8] add(a, b)
  ROOT r = f32[8,8] copy(c)
}}"""


def test_partial_shardings_of_two_operands_merge():
    # tile (i, j) lives on the device in {2i, 2i+1} and {j, j+2}: 2i + j, i.e. the iota
    expect(run(MERGE), c="{devices=[2,2]<=[4]}")


def test_non_spmd_mode_does_not_merge():
    # no merging: the most specific operand (the first of two equal ones) wins
    expect(run(MERGE, is_spmd=False), c=ROWS)


def test_broadcast_backward_replicates_and_removes_new_dims():
    m = run("""
HloModule m
ENTRY e {
  p = f32[1024] parameter(0)
  x = f32[1024] negate(p)
  b = f32[64,1024] broadcast(x), dimensions={1}
  ROOT c = f32[64,1024] copy(b), sharding={devices=[2,2]<=[4]}
}""")
    # column block j of b lives on {j, j+2}: x is split in two, each half on a column's devices
    expect(m, b="{devices=[2,2]<=[4]}", x="{devices=[2,2]0,2,1,3 last_tile_dim_replicate}")


def test_broadcast_forward_only_at_the_last_level():
    text = """
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  x = f32[8] copy(p)
  b = f32[8,3] broadcast(x), dimensions={0}
  c = f32[8,3] copy(b)%s
  ROOT t = (f32[8,3]) tuple(c)
}"""
    # nothing else decides: the broadcast follows its operand (new dim unsharded)
    expect(run(text % ""), b="{devices=[2,1]<=[2]}", c="{devices=[2,1]<=[2]}")
    # a sharded user decides first (level 2), and the operand's layout cannot override it
    expect(run(text % ", sharding={devices=[1,2]<=[2]}"), b="{devices=[1,2]<=[2]}")


def test_reshape_split_and_merge():
    m = run("""
HloModule m
ENTRY e {
  p = f32[24,8] parameter(0), sharding={devices=[4,1]<=[4]}
  x = f32[24,8] copy(p)
  s = f32[4,6,8] reshape(x)
  y = f32[4,6,8] negate(s)
  q = f32[6,16] parameter(1)
  z = f32[6,16] copy(q)
  w = f32[96] reshape(z)
  ROOT t = (f32[4,6,8], f32[96]) tuple(y, w)
}""")
    # 24 rows in 4 tiles of 6 = one tile per new major index
    expect(m, s="{devices=[4,1,1]<=[4]}", y="{devices=[4,1,1]<=[4]}", w=None)


def test_reshape_backward():
    m = run("""
HloModule m
ENTRY e {
  p = f32[2002,1] parameter(0)
  c = f32[2002,1] copy(p)
  ROOT r = f32[14,11,13] reshape(c), sharding={devices=[2,1,1]<=[2]}
}""")
    expect(m, c="{devices=[2,1]<=[2]}")


def test_transpose_forward_and_backward():
    m = run("""
HloModule m
ENTRY e {
  p = f32[4,6,8] parameter(0), sharding={devices=[2,1,3]<=[6]}
  t = f32[6,8,4] transpose(p), dimensions={1,2,0}
  q = f32[4,6] parameter(1)
  c = f32[4,6] copy(q)
  u = f32[6,4] transpose(c), dimensions={1,0}
  v = f32[6,4] copy(u), sharding={devices=[3,2]<=[6]}
  ROOT r = (f32[6,8,4], f32[6,4]) tuple(t, v)
}""")
    # output dim i is input dim dims[i]: T is transposed the same way
    expect(m, t="{devices=[1,3,2]<=[2,3]T(1,0)}", c="{devices=[2,3]<=[3,2]T(1,0)}")


def test_reduce_keeps_kept_dims_and_replicates_reduced_ones():
    m = run("""
HloModule m
""" + reducer("sum", "add") + """
ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[2,2]<=[4]}
  z = f32[] constant(0)
  r = f32[8] reduce(p, z), dimensions={0}, to_apply=sum
  q = f32[8,6] parameter(1), sharding={devices=[4,1]<=[4]}
  r2 = f32[8] reduce(q, z), dimensions={1}, to_apply=sum
  ROOT t = (f32[8], f32[8]) tuple(r, r2)
}""")
    # reducing the row dim: columns stay split, each column block on the devices of its
    # column ({j, j+2}); reducing an unsharded dim keeps the tiling as is
    expect(m, r="{devices=[2,2]0,2,1,3 last_tile_dim_replicate}", r2="{devices=[4]<=[4]}")


def test_reduce_backward_reinserts_reduced_dims():
    m = run("""
HloModule m
""" + reducer("sum", "add") + """
ENTRY e {
  p = f32[8,6] parameter(0)
  c = f32[8,6] copy(p)
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(c, z), dimensions={1}, to_apply=sum, sharding={devices=[4]<=[4]}
}""")
    expect(m, c="{devices=[4,1]<=[4]}")


def test_non_spmd_reduce_over_a_sharded_dim_is_replicated():
    m = run("""
HloModule m
""" + reducer("sum", "add") + """
ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[1,2]<=[2]}
  z = f32[] parameter(1)
  r = f32[8] reduce(p, z), dimensions={1}, to_apply=sum
  ROOT c = f32[8] copy(r)
}""", is_spmd=False)
    expect(m, r="{replicated}")


def test_slice_pad_keep_the_operand_sharding_even_on_resized_dims():
    m = run("""
HloModule m
ENTRY e {
  p = f32[17,13] parameter(0), sharding={devices=[2,2]<=[4]}
  s = f32[7,5] slice(p), slice={[1:15:2], [5:10]}
  v = f32[] constant(0)
  d = f32[20,13] pad(p, v), padding=1_2x0_0
  ROOT t = (f32[7,5], f32[20,13]) tuple(s, d)
}""")
    expect(m, s="{devices=[2,2]<=[4]}", d="{devices=[2,2]<=[4]}", v=None)


def test_pad_backward_only_to_the_padded_operand():
    m = run("""
HloModule m
ENTRY e {
  p = f32[6] parameter(0)
  x = f32[6] copy(p)
  q = f32[] parameter(1)
  v = f32[] copy(q)
  ROOT d = f32[8] pad(x, v), padding=1_1, sharding={devices=[2]<=[2]}
}""")
    expect(m, x="{devices=[2]<=[2]}", v=None)


def test_concatenate():
    m = run("""
HloModule m
ENTRY e {
  p0 = f32[4,6] parameter(0), sharding={devices=[2,1]<=[2]}
  p1 = f32[4,2] parameter(1)
  c = f32[4,8] concatenate(p0, p1), dimensions={1}
  q = f32[3,4] parameter(2)
  x = f32[3,4] copy(q)
  q2 = f32[5,4] parameter(3)
  y = f32[5,4] copy(q2)
  d = f32[8,4] concatenate(x, y), dimensions={0}
  e = f32[8,4] copy(d), sharding={devices=[1,2]<=[2]}
  ROOT t = (f32[4,8], f32[8,4]) tuple(c, e)
}""")
    # forward from the sharded operand; backward (levels >= 1) the user's sharding
    expect(m, c="{devices=[2,1]<=[2]}", x="{devices=[1,2]<=[2]}", y="{devices=[1,2]<=[2]}")


def test_concatenate_waits_for_its_user_at_level_zero():
    m = run("""
HloModule m
ENTRY e {
  p = f32[16,8] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  c = f32[32,8] concatenate(p, p), dimensions={0}
  a = f32[32,8] add(c, c), sharding={devices=[8,1]<=[8]}
  ROOT r = f32[32,8] copy(a)
}""")
    # the operand's 2-way split would otherwise block the user's 8-way one (not a sub-tiling)
    expect(m, c="{devices=[8,1]<=[8]}")


def test_reverse_flips_the_tile_assignment():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,6] parameter(0), sharding={devices=[4,1]<=[4]}
  r = f32[8,6] reverse(p), dimensions={0}
  ROOT c = (f32[8,6]) tuple(r)
}""")
    # row block i of the result is row block 3-i of the operand
    expect(m, r="{devices=[4,1]3,2,1,0}")


def test_dynamic_slice_replicates_sliced_dims():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,6,4] parameter(0), sharding={devices=[2,3,1]<=[6]}
  i = s32[] parameter(1)
  z = s32[] constant(0)
  d = f32[8,1,4] dynamic-slice(p, z, i, z), dynamic_slice_sizes={8,1,4}
  u = f32[8,1,4] parameter(2), sharding={devices=[2,1,1,3]<=[6] last_tile_dim_replicate}
  q = f32[8,6,4] parameter(3)
  b = f32[8,6,4] copy(q)
  w = f32[8,6,4] dynamic-update-slice(b, u, z, i, z)
  ROOT t = (f32[8,1,4], f32[8,6,4]) tuple(d, w)
}""")
    # the 3 column tiles become replication: rows i on devices {3i, 3i+1, 3i+2}
    rows = "{devices=[2,1,1,3]<=[6] last_tile_dim_replicate}"
    expect(m, d=rows, w=rows, b=rows, i=None, z=None)


def test_sort_moves_tiles_off_the_sort_dim():
    m = run("""
HloModule m
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}
ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  s = f32[8,16] sort(p), dimensions={1}, to_apply=lt
  q = f32[8,16] parameter(1), sharding={devices=[2,1]<=[2]}
  s2 = f32[8,16] sort(q), dimensions={1}, to_apply=lt
  ROOT t = (f32[8,16], f32[8,16]) tuple(s, s2)
}""")
    expect(m, s="{devices=[4,1]<=[4]}", s2="{devices=[2,1]<=[2]}")


def test_iota_and_constant_take_shardings_from_users():
    m = run("""
HloModule m
ENTRY e {
  i = s32[8,4] iota(), iota_dimension=0
  k = s32[8,4] constant({...})
  a = s32[8,4] add(i, k)
  ROOT r = s32[8,4] copy(a), sharding={devices=[2,2]<=[4]}
}""")
    expect(m, i="{devices=[2,2]<=[4]}", k="{devices=[2,2]<=[4]}", a="{devices=[2,2]<=[4]}")


def test_unpartitionable_ops_become_replicated_only_behind_replicated_operands():
    m = run("""
HloModule m
ENTRY e {
  p = c64[8] parameter(0), sharding={replicated}
  f = c64[8] fft(p), fft_type=FFT, fft_length={8}
  q = c64[8] parameter(1), sharding={devices=[2]<=[2]}
  g = c64[8] fft(q), fft_type=FFT, fft_length={8}
  ROOT t = (c64[8], c64[8]) tuple(f, g)
}""")
    expect(m, f="{replicated}", g=None)


def test_pass_through_custom_call():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,6] parameter(0), sharding={devices=[2,1]<=[2]}
  c = f32[8,6]{0,1} custom-call(p), custom_call_target="LayoutConstraint"
  u = f32[8,6] custom-call(p), custom_call_target="SomethingUnknown"
  ROOT t = (f32[8,6], f32[8,6]) tuple(c, u)
}""")
    expect(m, c="{devices=[2,1]<=[2]}", u=None)


def test_single_device_shardings_do_not_propagate_in_spmd_mode():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={maximal device=1}
  n = f32[8] negate(p)
  ROOT c = (f32[8]) tuple(n)
}""")
    assert sharding_of(m, "n") is None


@pytest.mark.parametrize("level_op", ["dot", "convolution"])
def test_layout_changing_ops_wait_for_level_one(level_op):
    # the contraction would give x its contracting-dim tiling [1,2] (from w); it is consulted only
    # from level 1, by when the elementwise chain has given x [2,1], which [1,2] cannot replace
    dot = 'dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}' if level_op == "dot" \
        else 'convolution(x, w), dim_labels=bf_io->bf'
    m = run(f"""
HloModule m
ENTRY e {{
  p = f32[8,4] parameter(0)
  x = f32[8,4] copy(p)
  w = f32[4,4] parameter(1), sharding={{devices=[2,1]<=[2]}}
  d = f32[8,4] {dot}
  y = f32[8,4] negate(x)
  z = f32[8,4] copy(y), sharding={{devices=[2,1]<=[2]}}
  ROOT t = (f32[8,4], f32[8,4]) tuple(d, z)
}}""")
    expect(m, x="{devices=[2,1]<=[2]}")


def test_rng_bit_generator_seed_is_replicated_though_no_user_is_sharded():
    # XLA gives the state operand of rng-bit-generator a replicated sharding from the user,
    # whether or not the user (or any other user) has a sharding; the other value, whose users
    # carry none, gets nothing from them
    m = run("""
HloModule m
ENTRY e {
  p0 = u64[2] parameter(0)
  seed = u64[2] copy(p0)
  p1 = f32[8] parameter(1)
  other = f32[8] copy(p1)
  bits = (u64[2], u32[8]) rng-bit-generator(seed), algorithm=rng_default
  n = f32[8] negate(other)
  ROOT t = ((u64[2], u32[8]), f32[8]) tuple(bits, n)
}""")
    expect(m, seed="{replicated}", other=None, n=None)


def test_an_elementwise_fusions_unread_parameter_gives_it_nothing():
    # the fused root never reads b (f32[8]): its tiles have no position in the f32[4,6] result
    # (gspmdc gave the result y's rank-1 sharding and failed at the next broadcast)
    m = run("""
HloModule m
fused {
  a = f32[4,6] parameter(0)
  b = f32[8] parameter(1)
  ROOT n = f32[4,6] negate(a)
}
ENTRY e {
  x = f32[4,6] parameter(0)
  y = f32[8] parameter(1), sharding={devices=[2]<=[2]}
  f = f32[4,6] fusion(x, y), kind=kLoop, calls=fused
  ROOT b = f32[3,4,6] broadcast(f), dimensions={1,2}
}""", propagate_to_output=True)
    expect(m, f=None, b=None)
