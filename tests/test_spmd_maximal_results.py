"""Every op whose result is `{maximal device=k}` runs on device k (its operands moved there from
their tilings), whatever partitioning rule it has: convolution like dot, sort and reduce-window,
and every other rule and the default action alike. Checked against the unpartitioned program on
the reference interpreter (uneven padding filled with garbage)."""
from __future__ import annotations

import pytest

from spmd_partition_helpers import check_equivalent
from hlo_text import reducer

COMPUTATIONS = reducer("add") + """
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=GE
}

less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LT
}

double {
  x = f32[6,4] parameter(0)
  ROOT r = f32[6,4] add(x, x)
}

loop_cond {
  s = (s32[], f32[6,4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  three = s32[] constant(3)
  ROOT c = pred[] compare(i, three), direction=LT
}

loop_body {
  s = (s32[], f32[6,4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[6,4] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[6,4] add(x, x)
  ROOT t = (s32[], f32[6,4]) tuple(j, y)
}
"""

ROW = "{devices=[2,1]<=[2]}"
COL = "{devices=[1,2]<=[2]}"
ON1 = "{maximal device=1}"

#: opcode -> entry body; `x` is f32[6,4] tiled on rows, `y` f32[6,4] tiled on columns, the result
#: of the named instruction is on device 1
PROGRAMS = {
    "convolution": f"""
  a = f32[2,9,4] parameter(0), sharding={{devices=[1,2,1]<=[2]}}
  k = f32[3,4,5] parameter(1), sharding={{devices=[1,1,2]<=[2]}}
  ROOT r = f32[2,7,5] convolution(a, k), window={{size=3}}, dim_labels=b0f_0io->b0f, sharding={ON1}""",
    "convolution-2d-batch-tiled": f"""
  a = f32[2,5,5,3] parameter(0), sharding={{devices=[2,1,1,1]<=[2]}}
  k = f32[3,3,3,4] parameter(1), sharding={{replicated}}
  ROOT r = f32[2,5,5,4] convolution(a, k), window={{size=3x3 pad=1_1x1_1}}, dim_labels=b01f_01io->b01f, sharding={ON1}""",
    "dot": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  w = f32[4,3] parameter(1), sharding={{devices=[2,1]<=[2]}}
  ROOT r = f32[6,3] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={ON1}""",
    "add": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  y = f32[6,4] parameter(1), sharding={COL}
  ROOT r = f32[6,4] add(x, y), sharding={ON1}""",
    "broadcast": f"""
  v = f32[4] parameter(0), sharding={{devices=[2]<=[2]}}
  ROOT r = f32[6,4] broadcast(v), dimensions={{1}}, sharding={ON1}""",
    "transpose": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  ROOT r = f32[4,6] transpose(x), dimensions={{1,0}}, sharding={ON1}""",
    "reshape": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  ROOT r = f32[3,8] reshape(x), sharding={ON1}""",
    "iota": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  i = f32[6,4] iota(), iota_dimension=0, sharding={ON1}
  ROOT r = f32[6,4] add(x, i), sharding={ON1}""",
    "reduce": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  z = f32[] constant(0)
  ROOT r = f32[4] reduce(x, z), dimensions={{0}}, to_apply=add, sharding={ON1}""",
    "reduce-window": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  z = f32[] constant(0)
  ROOT r = f32[5,4] reduce-window(x, z), window={{size=2x1}}, to_apply=add, sharding={ON1}""",
    "select-and-scatter": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  s = f32[5,3] parameter(1), sharding={COL}
  z = f32[] constant(0)
  ROOT r = f32[6,4] select-and-scatter(x, s, z), window={{size=2x2}}, select=ge, scatter=add, sharding={ON1}""",
    "slice": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  ROOT r = f32[2,4] slice(x), slice={{[1:5:2], [0:4]}}, sharding={ON1}""",
    "pad": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  z = f32[] constant(0)
  ROOT r = f32[9,4] pad(x, z), padding=1_2x0_0, sharding={ON1}""",
    "concatenate": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  y = f32[6,4] parameter(1), sharding={COL}
  ROOT r = f32[12,4] concatenate(x, y), dimensions={{0}}, sharding={ON1}""",
    "reverse": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  ROOT r = f32[6,4] reverse(x), dimensions={{0}}, sharding={ON1}""",
    "dynamic-slice": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  i = s32[] parameter(1), sharding={{replicated}}
  z = s32[] constant(0)
  ROOT r = f32[3,4] dynamic-slice(x, i, z), dynamic_slice_sizes={{3,4}}, sharding={ON1}""",
    "dynamic-update-slice": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  u = f32[2,4] parameter(1), sharding={COL}
  i = s32[] parameter(2), sharding={{replicated}}
  z = s32[] constant(0)
  ROOT r = f32[6,4] dynamic-update-slice(x, u, i, z), sharding={ON1}""",
    "gather": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  i = s32[3,1] parameter(1), sharding={{devices=[2,1]<=[2]}}
  ROOT r = f32[3,4] gather(x, i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,4}}, sharding={ON1}""",
    "scatter": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  i = s32[3,1] parameter(1), sharding={{devices=[2,1]<=[2]}}
  u = f32[3,4] parameter(2), sharding={COL}
  ROOT r = f32[6,4] scatter(x, i, u), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=add, sharding={ON1}""",
    "sort": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  ROOT r = f32[6,4] sort(x), dimensions={{0}}, to_apply=less, sharding={ON1}""",
    "topk": f"""
  x = f32[6,4] parameter(0), sharding={COL}
  ROOT r = (f32[6,2], s32[6,2]) topk(x), k=2, largest=true, sharding={{{ON1}, {ON1}}}""",
    "cholesky": f"""
  x = f32[2,3,3] parameter(0), sharding={{devices=[2,1,1]<=[2]}}
  t = f32[2,3,3] transpose(x), dimensions={{0,2,1}}
  m = f32[2,3,3] dot(x, t), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_contracting_dims={{1}}
  e = f32[2,3,3] iota(), iota_dimension=1
  f = f32[2,3,3] iota(), iota_dimension=2
  d = pred[2,3,3] compare(e, f), direction=EQ
  three = f32[] constant(3)
  b = f32[2,3,3] broadcast(three), dimensions={{}}
  zero = f32[] constant(0)
  zz = f32[2,3,3] broadcast(zero), dimensions={{}}
  g = f32[2,3,3] select(d, b, zz)
  s = f32[2,3,3] add(m, g)
  ROOT r = f32[2,3,3] cholesky(s), lower=true, sharding={ON1}""",
    "fft": f"""
  x = c64[2,8] parameter(0), sharding={{devices=[2,1]<=[2]}}
  ROOT r = c64[2,8] fft(x), fft_type=FFT, fft_length={{8}}, sharding={ON1}""",
    "ragged-dot": f"""
  a = f32[8,4] parameter(0), sharding={{devices=[2,1]<=[2]}}
  w = f32[3,4,5] parameter(1), sharding={{devices=[1,2,1]<=[2]}}
  g = s32[3] constant({{3, 2, 3}})
  ROOT d = f32[8,5] ragged-dot(a, w, g), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}, lhs_ragged_dims={{0}}, rhs_group_dims={{0}}, sharding={ON1}""",
    "rng-bit-generator": f"""
  s = u64[2] parameter(0), sharding={{devices=[2]<=[2]}}
  ROOT r = (u64[2], u32[6,4]) rng-bit-generator(s), algorithm=rng_three_fry, sharding={{{ON1}, {ON1}}}""",
    "map-default-action": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  ROOT r = f32[6,4] call(x), to_apply=double, sharding={ON1}""",
    "while": f"""
  x = f32[6,4] parameter(0), sharding={ROW}
  zero = s32[] constant(0)
  s = (s32[], f32[6,4]) tuple(zero, x)
  w = (s32[], f32[6,4]) while(s), condition=loop_cond, body=loop_body, sharding={{{ON1}, {ON1}}}
  ROOT r = f32[6,4] get-tuple-element(w), index=1, sharding={ON1}""",
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_an_op_with_a_maximal_result_runs_on_its_device(name):
    text = f"HloModule m, num_partitions=2\n{COMPUTATIONS}\nENTRY e {{{PROGRAMS[name]}\n}}\n"
    check_equivalent(text, 2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_an_op_with_a_maximal_result_after_propagation(name):
    text = f"HloModule m, num_partitions=2\n{COMPUTATIONS}\nENTRY e {{{PROGRAMS[name]}\n}}\n"
    check_equivalent(text, 2, propagate=True, rtol=1e-4, atol=1e-4)
