"""Structural kernels against independent truths: index maps written out with explicit loops over
small arrays (pad, slice, broadcast, transpose, bitcast with layouts), hand-computed values
(conversions), and numpy's own reinterpretation of bytes (bitcast-convert)."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import Literal, PadDim, SliceDim
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.runtime.kernels import TOKEN

from interpreter_helpers import run_hlo, single_op

RNG = np.random.default_rng(11)


def ints(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)


# ------------------------------------------------------------------------------ pad and slice

def _pad_by_definition(x, value, pads):
    """Place x[i] at low + i * (interior + 1) of a canvas of the output size, dropping positions
    outside it (negative padding crops)."""
    out_dims = [p.low + n + max(n - 1, 0) * p.interior + p.high for n, p in zip(x.shape, pads)]
    out = np.full(out_dims, value, x.dtype)
    for index in itertools.product(*(range(n) for n in x.shape)):
        target = [p.low + i * (p.interior + 1) for i, p in zip(index, pads)]
        if all(0 <= t < d for t, d in zip(target, out_dims)):
            out[tuple(target)] = x[index]
    return out


@pytest.mark.parametrize("pads", [
    [PadDim(1, 2), PadDim(0, 3)],
    [PadDim(-1, 2), PadDim(2, -3)],
    [PadDim(0, 0, 2), PadDim(1, 1, 1)],
    [PadDim(-2, -1, 1), PadDim(-3, 4, 2)],
    [PadDim(-1, -1), PadDim(0, -2)],
    [PadDim(0, 0), PadDim(0, 0)],
])
def test_pad_low_high_negative_and_interior(pads):
    x = ints(3, 4) + 1
    expected = _pad_by_definition(x, -7, pads)
    out = single_op("pad", ("s32", expected.shape), [x, np.array(-7, np.int32)], padding=tuple(pads))
    np.testing.assert_array_equal(out, expected)


def test_pad_of_an_empty_dimension():
    x = np.zeros((0, 2), np.float32)
    out = single_op("pad", ("f32", (3, 2)), [x, np.array(5, np.float32)],
                    padding=(PadDim(1, 2, 3), PadDim(0, 0)))
    np.testing.assert_array_equal(out, np.full((3, 2), 5.0))


def test_slice_with_strides():
    x = ints(7, 9)
    spec = (SliceDim(1, 7, 2), SliceDim(0, 9, 4))
    expected = np.array([[x[i, j] for j in range(0, 9, 4)] for i in range(1, 7, 2)])
    out = single_op("slice", ("s32", expected.shape), [x], slice=spec)
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------------- shapes

def test_broadcast_maps_operand_dims_to_output_dims():
    x = ints(2, 3)
    out = single_op("broadcast", ("s32", (3, 4, 2)), [x], dimensions=(2, 0))
    for i, j, k in itertools.product(range(3), range(4), range(2)):
        assert out[i, j, k] == x[k, i]
    out = single_op("broadcast", ("s32", (4, 2, 3)), [x], dimensions=(1, 2))
    for i, j, k in itertools.product(range(4), range(2), range(3)):
        assert out[i, j, k] == x[j, k]


def test_broadcast_scalar():
    out = single_op("broadcast", ("f32", (2, 2)), [np.array(3.5, np.float32)], dimensions=())
    np.testing.assert_array_equal(out, np.full((2, 2), 3.5))


def test_transpose_output_dim_i_is_operand_dim_perm_i():
    x = ints(2, 3, 4)
    out = single_op("transpose", ("s32", (4, 2, 3)), [x], dimensions=(2, 0, 1))
    for i, j, k in itertools.product(range(4), range(2), range(3)):
        assert out[i, j, k] == x[j, k, i]


def test_reshape_is_row_major_and_reverse_flips():
    x = ints(2, 6)
    np.testing.assert_array_equal(single_op("reshape", ("s32", (3, 4)), [x]),
                                  [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    np.testing.assert_array_equal(single_op("reverse", ("s32", (2, 6)), [x], dimensions=(0, 1)),
                                  x[::-1, ::-1])


def test_concatenate_along_a_dimension_including_empty_operands():
    a, b, c = ints(2, 3), ints(2, 0), ints(2, 1) + 100
    out = single_op("concatenate", ("s32", (2, 4)), [a, b, c], dimensions=(1,))
    np.testing.assert_array_equal(out, [[0, 1, 2, 100], [3, 4, 5, 101]])


def test_iota_along_each_dimension_and_type():
    out = single_op("iota", ("s32", (2, 3)), [], iota_dimension=1)
    np.testing.assert_array_equal(out, [[0, 1, 2], [0, 1, 2]])
    out = single_op("iota", ("f32", (3, 2)), [], iota_dimension=0)
    np.testing.assert_array_equal(out, [[0, 0], [1, 1], [2, 2]])
    assert single_op("iota", ("bf16", (4,)), [], iota_dimension=0).dtype == ml_dtypes.bfloat16


# --------------------------------------------------------------------------------- conversions

def test_convert_float_to_int_truncates_saturates_and_maps_nan_to_zero():
    x = np.array([2.7, -2.7, np.nan, 1e10, -1e10, np.inf, -np.inf, 127.9, -128.9], np.float32)
    np.testing.assert_array_equal(single_op("convert", ("s8", x.shape), [x]),
                                  [2, -2, 0, 127, -128, 127, -128, 127, -128])
    np.testing.assert_array_equal(single_op("convert", ("u8", x.shape), [x]),
                                  [2, 0, 0, 255, 0, 255, 0, 127, 0])
    big = np.array([2.0 ** 63, -2.0 ** 63, 2.0 ** 62, np.nan])
    np.testing.assert_array_equal(single_op("convert", ("s64", big.shape), [big]),
                                  [2 ** 63 - 1, -2 ** 63, 2 ** 62, 0])
    np.testing.assert_array_equal(single_op("convert", ("u32", (2,)), [np.array([5e9, 3.5])]),
                                  [2 ** 32 - 1, 3])


def test_convert_to_and_from_pred():
    x = np.array([0.0, -0.0, 0.5, np.nan, -3.0], np.float32)
    np.testing.assert_array_equal(single_op("convert", ("pred", x.shape), [x]),
                                  [False, False, True, True, True])
    p = np.array([True, False])
    np.testing.assert_array_equal(single_op("convert", ("f32", (2,)), [p]), [1.0, 0.0])
    np.testing.assert_array_equal(single_op("convert", ("s32", (2,)), [p]), [1, 0])


def test_convert_between_integers_wraps_and_floats_round_to_nearest_even():
    x = np.array([300, -1, 128], np.int32)
    np.testing.assert_array_equal(single_op("convert", ("s8", (3,)), [x]), [44, -1, -128])
    np.testing.assert_array_equal(single_op("convert", ("u8", (3,)), [x]), [44, 255, 128])
    # 1 + 2^-8 lies exactly between two bf16 neighbours: ties go to the even mantissa
    f = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8], np.float32)
    out = single_op("convert", ("bf16", (2,)), [f])
    np.testing.assert_array_equal(out.astype(np.float32), [1.0, 1 + 2 ** -6])
    out = single_op("convert", ("s32", (2,)), [np.array([1.5, -1.5], ml_dtypes.bfloat16)])
    np.testing.assert_array_equal(out, [1, -1])


def test_bitcast_convert_same_and_different_widths():
    f = np.array([1.0, -2.0], np.float32)
    out = single_op("bitcast-convert", ("s32", (2,)), [f])
    np.testing.assert_array_equal(out, [0x3F800000, -0x40000000])
    as_bytes = single_op("bitcast-convert", ("u8", (2, 4)), [f])
    np.testing.assert_array_equal(as_bytes, f.view(np.uint8).reshape(2, 4))
    back = single_op("bitcast-convert", ("f32", (2,)), [as_bytes])
    np.testing.assert_array_equal(back, f)


def test_bitcast_with_layouts_reinterprets_the_physical_buffer():
    x = ints(2, 3)
    # f32[2,3]{1,0} -> [3,2]{0,1}: the physical buffers coincide, so result[i, j] = x[j, i]
    source = ArrayShape("s32", (2, 3), "1,0")
    target = ArrayShape("s32", (3, 2), "0,1")
    text = f"""
HloModule m
ENTRY main {{
  p = {source} parameter(0)
  ROOT b = {target} bitcast(p)
}}"""
    np.testing.assert_array_equal(run_hlo(text, x), x.T)
    default = ArrayShape("s32", (3, 2))
    text = text.replace(str(target), str(default))
    np.testing.assert_array_equal(run_hlo(text, x), x.reshape(3, 2))


# ------------------------------------------------------------------------ tuples, ids, tokens

def test_constants_tuples_and_get_tuple_element():
    text = """
HloModule m
ENTRY main {
  c = s32[2,2] constant({{1,2},{3,4}})
  t = (s32[2,2], f32[]) constant(({{5,6},{7,8}}, 2.5))
  p = f32[3] parameter(0)
  x = (f32[3], s32[2,2]) tuple(p, c)
  a = s32[2,2] get-tuple-element(x), index=1
  b = s32[2,2] get-tuple-element(t), index=0
  s = s32[2,2] add(a, b)
  f = f32[] get-tuple-element(t), index=1
  ROOT r = (s32[2,2], f32[], f32[3]) tuple(s, f, p)
}"""
    s, f, p = run_hlo(text, np.ones(3, np.float32))
    np.testing.assert_array_equal(s, [[6, 8], [10, 12]])
    assert f == np.float32(2.5) and f.dtype == np.float32
    np.testing.assert_array_equal(p, np.ones(3))


def test_partition_and_replica_ids_barrier_and_tokens():
    text = """
HloModule m
ENTRY main {
  p = f32[2] parameter(0)
  id = u32[] partition-id()
  rid = u32[] replica-id()
  tok = token[] after-all()
  t = (f32[2], u32[]) tuple(p, id)
  b = (f32[2], u32[]) opt-barrier(t)
  ROOT r = (u32[], u32[], (f32[2], u32[]), token[]) tuple(id, rid, b, tok)
}"""
    pid, rid, (value, same_id), tok = run_hlo(text, np.array([1, 2], np.float32))
    assert pid.dtype == np.uint32 and pid == 0 and rid == 0 and same_id == 0
    np.testing.assert_array_equal(value, [1, 2])
    assert tok is TOKEN


@pytest.mark.parametrize("opcode", ["infeed", "outfeed", "send", "recv"])
def test_host_io_is_unsupported(opcode):
    shape = TupleShape((ArrayShape("f32", (2,)), ArrayShape("token", ())))
    with pytest.raises(UnsupportedError, match=f"host I/O \\({opcode}\\)"):
        single_op(opcode, shape, [])


def test_elided_constant_cannot_run():
    with pytest.raises(UnsupportedError, match="elided"):
        single_op("constant", ("f32", (4,)), [], literal=Literal(elided=True))
