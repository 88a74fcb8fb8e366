"""Kernels specialised to their instruction (`runtime/kernels/specialising.py`) give bit for bit
the generic kernel's value, which is computed from the operands as they come: checked for every
specialised opcode on operands of the instruction's shapes, including the cases a specialisation
decides at plan time (bf16 widening, TOTALORDER keys, scalar selects, accumulation types, starts
clamped from either side, vector starts, non-contiguous broadcast operands)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.kernels import KERNELS
from gspmdc.runtime.kernels.specialising import SpecialisedKernel

PROGRAM = """
HloModule specialised

ENTRY main {
  a = f32[3,4] parameter(0)
  b = f32[3,4] parameter(1)
  h = bf16[3,4] parameter(2)
  k = bf16[3,4] parameter(3)
  s = s32[] parameter(4)
  t = s32[] parameter(5)
  p = pred[] parameter(6)
  i8 = s8[2,3,4] parameter(7)
  j8 = s8[2,4,5] parameter(8)
  m = f32[2,3,4] parameter(9)
  n = f32[2,4,5] parameter(10)
  v = s32[2] parameter(11)
  q = pred[3,4] parameter(12)
  add = f32[3,4] add(a, b)
  addh = bf16[3,4] add(h, k)
  mulh = bf16[3,4] multiply(h, k)
  tanh = f32[3,4] tanh(a)
  exph = bf16[3,4] exponential(h)
  maxs = s32[] maximum(s, t)
  adds = s32[] add(s, t)
  lt = pred[3,4] compare(a, b), direction=LT
  total = pred[3,4] compare(a, b), direction=LT, type=TOTALORDER
  eqh = pred[3,4] compare(h, k), direction=EQ
  sel = s32[] select(p, s, t)
  sela = f32[3,4] select(q, a, b)
  dot = f32[2,3,5] dot(m, n), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  doti = s32[2,3,5] dot(i8, j8), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  dotp = f32[4,4] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ds = f32[2,3] dynamic-slice(a, s, t), dynamic_slice_sizes={2,3}
  dsv = f32[2,3] dynamic-slice(a, v), dynamic_slice_sizes={2,3}
  dus = f32[3,4] dynamic-update-slice(a, ds, t, s)
  dusv = f32[3,4] dynamic-update-slice(a, ds, v)
  bc = f32[4,3,2] broadcast(a), dimensions={1,0}
  bs = s32[5] broadcast(s), dimensions={}
  rs = f32[2,6] reshape(a)
  sl = f32[2,2] slice(a), slice={[1:3], [0:4:2]}
  ROOT r = (f32[3,4]) tuple(add)
}
"""


def _arguments(starts: tuple[int, int], pick: bool, rng) -> list[np.ndarray]:
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    a[0, 0], b[0, 0], a[1, 1], b[1, 1] = np.nan, 1.0, -0.0, 0.0
    h = a.astype(ml_dtypes.bfloat16)
    k = b.astype(ml_dtypes.bfloat16)
    return [a, b, h, k, np.array(starts[0], np.int32), np.array(starts[1], np.int32),
            np.array(pick), rng.integers(-128, 128, (2, 3, 4)).astype(np.int8),
            rng.integers(-128, 128, (2, 4, 5)).astype(np.int8),
            rng.standard_normal((2, 3, 4)).astype(np.float32),
            rng.standard_normal((2, 4, 5)).astype(np.float32),
            np.array(starts, np.int32), rng.random((3, 4)) < 0.5]


@pytest.mark.parametrize("starts, pick", [((0, 0), True), ((-5, 2), False), ((1, 9), True),
                                          ((2147483647, -2147483648), False)])
def test_specialised_kernels_give_the_generic_kernels_values(starts, pick):
    module = parse_module(PROGRAM)
    rng = np.random.default_rng(sum(starts) % 1000)
    entry = module.entry
    values = dict(zip(entry.parameters, _arguments(starts, pick, rng)))
    checked = set()
    for inst in entry.instructions:
        kernel = KERNELS.get(inst.opcode)
        if inst.opcode == "parameter" or type(kernel) is not SpecialisedKernel:
            continue
        args = [values[op] for op in inst.operands]
        generic = kernel(inst, list(args), None)
        special = kernel.specialise(inst)(inst, list(args), None)
        generic, special = np.asarray(generic), np.asarray(special)
        assert special.dtype == generic.dtype and special.shape == generic.shape, inst.name
        assert special.tobytes() == generic.tobytes(), inst.name
        values[inst] = generic
        checked.add(inst.opcode)
    assert checked == {"add", "multiply", "tanh", "exponential", "maximum", "compare", "select",
                       "dot", "dynamic-slice", "dynamic-update-slice", "broadcast", "reshape",
                       "slice"}


def test_a_broadcast_of_a_strided_operand():
    """The generic and specialised broadcast of a non-contiguous view (`np.broadcast_to` path)."""
    module = parse_module("""
HloModule m
ENTRY main {
  a = f32[3,4] parameter(0)
  ROOT bc = f32[4,2,3] broadcast(a), dimensions={2,0}
}
""")
    inst = module.entry.root
    a = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]
    kernel = KERNELS.get("broadcast")
    expected = np.broadcast_to(a.T[:, None, :], (4, 2, 3))
    np.testing.assert_array_equal(kernel(inst, [a], None), expected)
    np.testing.assert_array_equal(kernel.specialise(inst)(inst, [a], None), expected)
