"""Elementwise fusions (`ir/elementwise.py`): which fusions count as elementwise (XLA's
IsElementwise of a fusion, as XLA applies it to a module read from text), and that the
partitioner runs such a fusion on local shards with the values of the unpartitioned program.

What XLA answers for each fused computation below was read off XLA's propagation
(`tests/conformance/oracle.py`) on a dead fusion of a sharded parameter: it gives the fusion
the parameter's sharding exactly when the fusion is elementwise."""
from __future__ import annotations

import pytest

from gspmdc import api
from gspmdc.ir.elementwise import is_elementwise_fusion

from spmd_partition_helpers import check_equivalent, opcodes

#: fused computation bodies over `a`, `b` (f32[8,4] parameters) -> whether XLA counts the
#: fusion as elementwise
BODIES = {
    "ROOT r = f32[8,4] add(a, b)": True,
    "m = f32[8,4] multiply(a, a)\n  ROOT r = f32[8,4] add(m, b)": True,    # a read twice
    "c = f32[8,4] constant({...})\n  ROOT r = f32[8,4] add(a, c)": True,   # an array constant
    "ROOT r = s32[8,4] convert(a)": True,
    "ROOT r = s32[8,4] bitcast-convert(a)": True,                          # same bit width
    "ROOT r = f32[8,4] map(a, b), dimensions={0,1}, to_apply=add": True,
    "ROOT r = f32[8,4] reduce-precision(a), exponent_bits=5, mantissa_bits=2": True,
    # no-ops XLA's HLO import folds away
    "t = f32[8,4] transpose(a), dimensions={0,1}\n  ROOT r = f32[8,4] add(t, b)": True,
    "t = f32[8,4] reshape(a)\n  ROOT r = f32[8,4] add(t, b)": True,
    "t = f32[8,4] broadcast(a), dimensions={0,1}\n  ROOT r = f32[8,4] add(t, b)": True,
    "t = f32[8,4] slice(a), slice={[0:8], [0:4]}\n  ROOT r = f32[8,4] add(t, b)": True,
    "t = f32[8,4] reverse(a), dimensions={}\n  ROOT r = f32[8,4] add(t, b)": True,
    "z = f32[] constant(0)\n  t = f32[8,4] pad(a, z), padding=0_0x0_0\n  ROOT r = f32[8,4] add(t, b)":
        True,
    # dead instructions do not count (XLA's verifier refuses them; its import removes them)
    "z = f32[] constant(0)\n  d = f32[8] reduce(a, z), dimensions={1}, to_apply=add\n"
    "  ROOT r = f32[8,4] add(a, b)": True,
    # not elementwise
    "c = f32[] constant(2)\n  k = f32[8,4] broadcast(c), dimensions={}\n"
    "  ROOT r = f32[8,4] multiply(a, k)": False,
    "lo = f32[] constant(0)\n  hi = f32[] constant(1)\n  ROOT r = f32[8,4] clamp(lo, a, hi)": False,
    "t = f32[8,4] reverse(a), dimensions={0}\n  ROOT r = f32[8,4] add(t, b)": False,
    "i = f32[8,4] iota(), iota_dimension=0\n  ROOT r = f32[8,4] add(a, i)": False,
    "z = f32[] constant(0)\n  ROOT r = f32[8] reduce(a, z), dimensions={1}, to_apply=add": False,
    "ROOT r = f32[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}": False,
    "e = f32[8,4] exponential(a)\n  ROOT r = (f32[8,4], f32[8,4]) tuple(e, b)": False,
}


def _module(body: str) -> str:
    root_shape = body.rsplit("ROOT r = ", 1)[1].split(" ", 1)[0]
    if root_shape.startswith("("):
        root_shape = body.rsplit("ROOT r = ", 1)[1].split(") ", 1)[0] + ")"
    body = body.replace("constant({...})", "constant(" + "{" + ",".join(
        ["{1,2,3,4}"] * 8) + "})")
    return f"""HloModule m
add {{
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}}
fused {{
  a = f32[8,4] parameter(0)
  b = f32[8,4] parameter(1)
  {body}
}}
ENTRY main {{
  p = f32[8,4] parameter(0)
  q = f32[8,4] parameter(1)
  ROOT f = {root_shape} fusion(p, q), kind=kLoop, calls=fused
}}"""


@pytest.mark.parametrize("body", sorted(BODIES))
def test_which_fusions_are_elementwise(body):
    module = api.parse(_module(body))
    assert is_elementwise_fusion(module.entry.root, module.computations) is BODIES[body]


def test_a_fusion_returning_a_parameter_is_elementwise():
    module = api.parse("""HloModule m
fused {
  a = f32[8,4] parameter(0)
  ROOT b = f32[8,4] parameter(1)
}
ENTRY main {
  p = f32[8,4] parameter(0)
  q = f32[8,4] parameter(1)
  ROOT f = f32[8,4] fusion(p, q), kind=kLoop, calls=fused
}""")
    assert is_elementwise_fusion(module.entry.root, module.computations)


FUSED = """
HloModule m, num_partitions=4
fused {
  a = f32[5,6] parameter(0)
  i = s32[5,6] parameter(1)
  c = f32[5,6] constant({{1,2,3,4,5,6},{7,8,9,10,11,12},{13,14,15,16,17,18},{19,20,21,22,23,24},{25,26,27,28,29,30}})
  half = f32[5,6] constant({{0.5,0.5,0.5,0.5,0.5,0.5},{0.5,0.5,0.5,0.5,0.5,0.5},{0.5,0.5,0.5,0.5,0.5,0.5},{0.5,0.5,0.5,0.5,0.5,0.5},{0.5,0.5,0.5,0.5,0.5,0.5}})
  k = f32[5,6] convert(i)
  m = f32[5,6] multiply(a, c)
  s = f32[5,6] subtract(m, k)
  ROOT r = f32[5,6] multiply(s, half)
}
ENTRY main {
  x = f32[5,6] parameter(0), sharding=%s
  y = s32[5,6] parameter(1)
  f = f32[5,6] fusion(x, y), kind=kLoop, calls=fused
  ROOT n = f32[5,6] negate(f), sharding=%s
}"""


@pytest.mark.parametrize("sharding", ["{devices=[2,2]<=[4]}", "{devices=[4,1]<=[4]}",
                                      "{devices=[1,2,2]<=[4] last_tile_dim_replicate}",
                                      "{replicated}"])
def test_an_elementwise_fusion_runs_on_local_shards(sharding):
    spmd = check_equivalent(FUSED % (sharding, sharding), 4, propagate=True)
    fusion = next(i for i in spmd.entry.instructions if i.opcode == "fusion")
    assert fusion.shape == fusion.sharding.shard_shape(api.parse(
        FUSED % (sharding, sharding)).entry.instruction("f").shape)
    # the fused computation runs where the data is: no collective at all
    assert not {"all-gather", "all-reduce", "all-to-all", "collective-permute"} & set(opcodes(spmd))


def test_a_fusion_that_is_not_elementwise_runs_whole():
    text = """
HloModule m, num_partitions=2
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
fused {
  a = f32[8,4] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(a, z), dimensions={1}, to_apply=add
}
ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  f = f32[8] fusion(x), kind=kInput, calls=fused
  ROOT n = f32[8] negate(f)
}"""
    spmd = check_equivalent(text, 2, propagate=True)
    fusion = next(i for i in spmd.entry.instructions if i.opcode == "fusion")
    assert fusion.operands[0].shape.dims == (8, 4)      # the whole operand, gathered
