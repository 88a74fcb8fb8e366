"""Common-subexpression elimination (`passes/spmd/cleanup.py`): which instructions merge, checked
against the merges worked out by hand from its rule (the same opcode, shape and operands, after
earlier merges, the same attributes but `channel_id` and `metadata`, equal literals; a root
equal to an earlier instruction stays the root)."""
from gspmdc.ir.parser import parse_module
from gspmdc.passes.spmd.cleanup import eliminate_common_subexpressions

from hlo_text import hlo_module


def _cse(body: str):
    comp = parse_module(hlo_module(body), "<test>").entry
    eliminate_common_subexpressions(comp)
    return [i.name for i in comp.instructions], comp


def _operands(comp, name: str) -> list[str]:
    return [o.name for o in next(i for i in comp.instructions if i.name == name).operands]


def test_equal_ops_merge_and_so_do_their_users_then():
    names, comp = _cse("""
  p = f32[4] parameter(0)
  a = f32[4] exponential(p)
  b = f32[4] exponential(p)
  c = f32[4] negate(a)
  d = f32[4] negate(b)
  ROOT r = f32[4] add(c, d)""")
    assert names == ["p", "a", "c", "r"]
    assert _operands(comp, "r") == ["c", "c"]


def test_same_opcode_and_operands_with_other_attributes_or_shapes_stay_apart():
    # `t` and `u` differ in their dimensions, `b1` and `b2` in their shapes; `v` is `t` again
    names, comp = _cse("""
  p = f32[4,4] parameter(0)
  t = f32[4,4] transpose(p), dimensions={1,0}
  u = f32[4,4] transpose(p), dimensions={0,1}
  v = f32[4,4] transpose(p), dimensions={1,0}
  b1 = f32[2,4,4] broadcast(p), dimensions={1,2}
  b2 = f32[3,4,4] broadcast(p), dimensions={1,2}
  w = f32[4,4] add(t, u)
  x = f32[4,4] add(w, v)
  ROOT r = (f32[4,4], f32[2,4,4], f32[3,4,4]) tuple(x, b1, b2)""")
    assert names == ["p", "t", "u", "b1", "b2", "w", "x", "r"]
    assert _operands(comp, "x") == ["w", "t"]


def test_equal_literals_merge_other_literals_do_not():
    names, comp = _cse("""
  one = f32[] constant(1)
  two = f32[] constant(2)
  again = f32[] constant(1)
  s = f32[] add(one, two)
  ROOT r = f32[] add(s, again)""")
    assert names == ["one", "two", "s", "r"]
    assert _operands(comp, "r") == ["s", "one"]


def test_a_root_equal_to_an_earlier_op_stays_the_root():
    names, comp = _cse("""
  p = f32[4] parameter(0)
  a = f32[4] exponential(p)
  ROOT b = f32[4] exponential(p)""")
    assert names == ["p", "a", "b"] and comp.root.name == "b"


def test_equal_rng_bit_generators_merge_rng_ops_do_not():
    # `rng-bit-generator`'s bits are a function of its state: two with one state give one value;
    # `rng` draws from the module's generator state, a side effect, so its instances stay apart
    names, comp = _cse("""
  s = u64[2] parameter(0)
  g1 = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_three_fry
  g2 = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_three_fry
  g3 = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_philox
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  r1 = f32[4] rng(lo, hi), distribution=rng_uniform
  r2 = f32[4] rng(lo, hi), distribution=rng_uniform
  ROOT t = ((u64[2], u32[4]), (u64[2], u32[4]), (u64[2], u32[4]), f32[4], f32[4]) tuple(g1, g2, g3, r1, r2)""")
    assert names == ["s", "g1", "g3", "lo", "hi", "r1", "r2", "t"]
    assert _operands(comp, "t") == ["g1", "g1", "g3", "r1", "r2"]
