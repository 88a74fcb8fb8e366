"""Elementwise kernels against independent truths: numpy formulas, Python's math module, and
exhaustive small-integer tables computed with plain Python integers (C semantics written out)."""
from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

from interpreter_helpers import single_op

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(7)


def binary(opcode, a, b, out_type=None, **attrs):
    from gspmdc.ir.dtypes import element_type_of
    out_type = out_type or element_type_of(a.dtype)
    return single_op(opcode, (out_type, np.broadcast_shapes(a.shape, b.shape)), [a, b], **attrs)


def unary(opcode, x, out_type=None):
    from gspmdc.ir.dtypes import element_type_of
    return single_op(opcode, (out_type or element_type_of(x.dtype), x.shape), [x])


def normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------------- floats

@pytest.mark.parametrize("opcode, formula", [
    ("add", lambda a, b: a + b), ("subtract", lambda a, b: a - b),
    ("multiply", lambda a, b: a * b), ("divide", lambda a, b: a / b),
    ("atan2", np.arctan2), ("power", lambda a, b: np.abs(a) ** b),
])
def test_float_binary_matches_numpy(opcode, formula):
    a, b = normal(5, 6), normal(5, 6)
    if opcode == "power":
        a = np.abs(a)
    out = binary(opcode, a, b)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, formula(a, b), rtol=1e-6)


def test_float_remainder_is_c_fmod_with_sign_of_dividend():
    a = np.array([5.5, -5.5, 5.5, -5.5, 1.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 0.0], np.float32)
    out = binary("remainder", a, b)
    np.testing.assert_array_equal(out[:4], [1.5, -1.5, 1.5, -1.5])
    assert np.isnan(out[4])


def test_maximum_and_minimum_propagate_nan_from_either_side():
    a = np.array([np.nan, 1.0, 2.0, -0.0], np.float32)
    b = np.array([1.0, np.nan, 3.0, 0.0], np.float32)
    mx, mn = binary("maximum", a, b), binary("minimum", a, b)
    assert np.isnan(mx[:2]).all() and np.isnan(mn[:2]).all()
    assert mx[2] == 3.0 and mn[2] == 2.0


@pytest.mark.parametrize("opcode, reference", [
    ("exponential", math.exp), ("exponential-minus-one", math.expm1), ("log", math.log),
    ("log-plus-one", math.log1p), ("sqrt", math.sqrt), ("rsqrt", lambda x: 1 / math.sqrt(x)),
    ("cbrt", lambda x: math.copysign(abs(x) ** (1 / 3), x)), ("tanh", math.tanh),
    ("sine", math.sin), ("cosine", math.cos), ("tan", math.tan),
    ("logistic", lambda x: 1 / (1 + math.exp(-x))), ("erf", math.erf),
    ("floor", math.floor), ("ceil", math.ceil), ("abs", abs), ("negate", lambda x: -x),
])
def test_float_unary_matches_math_module(opcode, reference):
    x = np.abs(normal(64, dtype=np.float64)) + 0.01
    if opcode not in ("log", "sqrt", "rsqrt", "log-plus-one"):
        x = x * np.where(np.arange(64) % 2, 1.0, -1.0)
    out = unary(opcode, x)
    np.testing.assert_allclose(out, [reference(v) for v in x], rtol=1e-13, atol=1e-15)


def test_erf_over_its_whole_range_in_f64_and_f32():
    x = np.concatenate([np.linspace(-7, 7, 2001), [0.0, -0.0, np.inf, -np.inf]])
    np.testing.assert_allclose(unary("erf", x), [math.erf(v) for v in x], rtol=0, atol=2e-15)
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(unary("erf", x32), [math.erf(v) for v in x32], rtol=0, atol=1e-7)
    assert np.isnan(unary("erf", np.array([np.nan])))[0]


def test_round_nearest_afz_rounds_halves_away_and_even_rounds_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.3, 3.7], np.float32)
    np.testing.assert_array_equal(unary("round-nearest-afz", x), [1, 2, 3, -1, -3, 0, -0.0, 4])
    np.testing.assert_array_equal(unary("round-nearest-even", x), [0, 2, 2, -0.0, -2, 0, -0.0, 4])
    assert np.signbit(unary("round-nearest-afz", np.array([-0.3], np.float32)))[0]


def test_sign_keeps_signed_zeros_and_nan():
    out = unary("sign", np.array([-0.0, 0.0, np.nan, -3.0, 7.0], np.float32))
    assert np.signbit(out[0]) and not np.signbit(out[1]) and np.isnan(out[2])
    np.testing.assert_array_equal(out[3:], [-1, 1])
    np.testing.assert_array_equal(unary("sign", np.array([-5, 0, 9], np.int32)), [-1, 0, 1])


def test_is_finite_gives_pred():
    out = unary("is-finite", np.array([1.0, np.inf, -np.inf, np.nan], np.float32), "pred")
    np.testing.assert_array_equal(out, [True, False, False, False])


def test_bf16_arithmetic_is_f32_rounded_once():
    a = normal(100).astype(BF16)
    b = normal(100).astype(BF16)
    for opcode, fn in [("add", np.add), ("multiply", np.multiply), ("divide", np.divide),
                       ("subtract", np.subtract)]:
        expected = fn(a.astype(np.float32), b.astype(np.float32)).astype(BF16)
        out = binary(opcode, a, b)
        assert out.dtype == BF16
        np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    out = unary("tanh", a)
    np.testing.assert_array_equal(out.view(np.uint16),
                                  np.tanh(a.astype(np.float32)).astype(BF16).view(np.uint16))


def test_f16_arithmetic_stays_f16():
    a, b = normal(10, dtype=np.float16), normal(10, dtype=np.float16)
    out = binary("add", a, b)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16))


# ---------------------------------------------------------------------------------- integers

def _c_divide(a, b, lo):
    if b == 0:
        return -1, a
    if a == lo and b == -1:
        return lo, 0
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return q, a - b * q


def test_signed_divide_and_remainder_exhaustive_s8():
    values = np.arange(-128, 128, dtype=np.int8)
    a, b = (g.ravel() for g in np.meshgrid(values, values, indexing="ij"))
    q, r = binary("divide", a, b), binary("remainder", a, b)
    expected = np.array([_c_divide(int(x), int(y), -128) for x, y in zip(a, b)])
    np.testing.assert_array_equal(q, expected[:, 0])
    np.testing.assert_array_equal(r, expected[:, 1])


def test_unsigned_divide_by_zero_is_all_ones_and_remainder_is_dividend():
    a = np.array([7, 200, 0, 9], np.uint8)
    b = np.array([0, 0, 0, 4], np.uint8)
    np.testing.assert_array_equal(binary("divide", a, b), [255, 255, 255, 2])
    np.testing.assert_array_equal(binary("remainder", a, b), [7, 200, 0, 1])


def test_signed_division_s32_extremes():
    lo = np.iinfo(np.int32).min
    a = np.array([lo, lo, 7, -7], np.int32)
    b = np.array([-1, 0, 0, 2], np.int32)
    np.testing.assert_array_equal(binary("divide", a, b), [lo, -1, -1, -3])
    np.testing.assert_array_equal(binary("remainder", a, b), [0, lo, 7, -1])


def test_integer_overflow_wraps():
    a = np.array([127, -128, 100], np.int8)
    b = np.array([1, -1, 3], np.int8)
    np.testing.assert_array_equal(binary("add", a, b), [-128, 127, 103])
    np.testing.assert_array_equal(binary("multiply", a, b), [127, -128, 44])
    np.testing.assert_array_equal(unary("negate", np.array([-128], np.int8)), [-128])
    np.testing.assert_array_equal(unary("abs", np.array([-128], np.int8)), [-128])


def _shift_reference(x, s, kind, bits=8):
    u = x & 0xFF
    amount = s & 0xFF
    if amount >= bits:
        return -1 if (kind == "arithmetic" and x < 0) else 0
    if kind == "left":
        r = (u << amount) & 0xFF
    elif kind == "logical":
        r = u >> amount
    else:
        r = (x >> amount) & 0xFF
    return r - 256 if r >= 128 else r


@pytest.mark.parametrize("opcode, kind", [("shift-left", "left"),
                                          ("shift-right-logical", "logical"),
                                          ("shift-right-arithmetic", "arithmetic")])
def test_shifts_exhaustive_s8_with_out_of_range_amounts(opcode, kind):
    values = np.arange(-128, 128, dtype=np.int8)
    amounts = np.array(list(range(-3, 12)) + [127, -128], np.int8)
    a, b = (g.ravel() for g in np.meshgrid(values, amounts, indexing="ij"))
    expected = [_shift_reference(int(x), int(s), kind) for x, s in zip(a, b)]
    np.testing.assert_array_equal(binary(opcode, a, b), expected)


def test_shifts_on_unsigned_use_the_bit_pattern():
    a = np.array([0x80, 0x80, 0x81], np.uint8)
    b = np.array([1, 8, 7], np.uint8)
    np.testing.assert_array_equal(binary("shift-right-arithmetic", a, b), [0xC0, 0xFF, 0xFF])
    np.testing.assert_array_equal(binary("shift-right-logical", a, b), [0x40, 0, 1])


def test_integer_power_wraps_and_negative_exponents():
    base = np.array([2, 3, 1, -1, 0, 5, -2, 7], np.int32)
    exp = np.array([10, 21, -5, -3, 0, -1, 3, 0], np.int32)
    expected = [1024, (3 ** 21 + 2 ** 31) % 2 ** 32 - 2 ** 31, 1, 0, 1, 0, -8, 1]
    np.testing.assert_array_equal(binary("power", base, exp), expected)


def test_bitwise_ops_and_not():
    a = np.array([0b1100, -1, 0], np.int32)
    b = np.array([0b1010, 5, 0], np.int32)
    np.testing.assert_array_equal(binary("and", a, b), a & b)
    np.testing.assert_array_equal(binary("or", a, b), a | b)
    np.testing.assert_array_equal(binary("xor", a, b), a ^ b)
    np.testing.assert_array_equal(unary("not", a), ~a)
    p = np.array([True, False])
    np.testing.assert_array_equal(unary("not", p), [False, True])
    np.testing.assert_array_equal(binary("xor", p, np.array([True, True])), [False, True])


def test_popcnt_and_count_leading_zeros():
    x = np.array([0, 1, 255, 128, 15, 0x7F], np.uint8)
    np.testing.assert_array_equal(unary("popcnt", x), [bin(v).count("1") for v in x])
    np.testing.assert_array_equal(unary("count-leading-zeros", x),
                                  [8 - int(v).bit_length() for v in x])
    y = np.array([-1, 0, 1, 1 << 40], np.int64)
    np.testing.assert_array_equal(unary("count-leading-zeros", y), [0, 64, 63, 23])


# ---------------------------------------------------------------------------------- compare

DIRECTIONS = {"EQ": lambda a, b: a == b, "NE": lambda a, b: a != b, "LT": lambda a, b: a < b,
              "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b}


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_compare_float_every_direction_with_nan(direction):
    values = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 2.0, np.inf], np.float32)
    a, b = (g.ravel() for g in np.meshgrid(values, values, indexing="ij"))
    out = binary("compare", a, b, "pred", direction=direction)
    expected = [DIRECTIONS[direction](float(x), float(y)) for x, y in zip(a, b)]
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16, np.float16])
@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_compare_totalorder(dtype, direction):
    ordered = [-np.nan, -np.inf, -1.5, -0.0, 0.0, 1.5, np.inf, np.nan]
    values = np.array(ordered, np.float64).astype(dtype)
    values[0] = -np.abs(values[0])         # make sure the first NaN is negative
    assert np.signbit(values[0]) and not np.signbit(values[-1])
    rank = np.arange(len(ordered))
    i, j = (g.ravel() for g in np.meshgrid(rank, rank, indexing="ij"))
    out = binary("compare", values[i], values[j], "pred", direction=direction, type="TOTALORDER")
    np.testing.assert_array_equal(out, DIRECTIONS[direction](i, j))


def test_compare_unsigned_and_pred():
    a = np.array([200, 1], np.uint8)
    b = np.array([100, 2], np.uint8)
    np.testing.assert_array_equal(binary("compare", a, b, "pred", direction="GT"), [True, False])
    p = np.array([False, True])
    np.testing.assert_array_equal(binary("compare", p, ~p, "pred", direction="LT"), [True, False])


# -------------------------------------------------------------------------------- ternary etc.

def test_select_with_array_and_scalar_predicates():
    a, b = normal(3, 4), normal(3, 4)
    mask = RNG.integers(0, 2, (3, 4)).astype(bool)
    out = single_op("select", ("f32", (3, 4)), [mask, a, b])
    np.testing.assert_array_equal(out, np.where(mask, a, b))
    out = single_op("select", ("f32", (3, 4)), [np.array(False), a, b])
    np.testing.assert_array_equal(out, b)


def test_clamp_with_scalar_and_array_bounds():
    x = normal(20)
    out = single_op("clamp", ("f32", (20,)), [np.float32(-0.5) * np.ones((), np.float32), x,
                                               np.full((), 0.5, np.float32)])
    np.testing.assert_array_equal(out, np.minimum(np.maximum(x, -0.5), 0.5))
    lo, hi = np.full(20, -1.0, np.float32), np.full(20, 1.0, np.float32)
    x[3] = np.nan
    out = single_op("clamp", ("f32", (20,)), [lo, x, hi])
    assert np.isnan(out[3])


def test_complex_real_imag_and_abs():
    re, im = normal(5), normal(5)
    z = single_op("complex", ("c64", (5,)), [re, im])
    assert z.dtype == np.complex64
    np.testing.assert_array_equal(z, re + 1j * im)
    np.testing.assert_array_equal(unary("real", z, "f32"), re)
    np.testing.assert_array_equal(unary("imag", z, "f32"), im)
    np.testing.assert_allclose(unary("abs", z, "f32"), np.hypot(re, im), rtol=1e-6)
    w = single_op("multiply", ("c64", (5,)), [z, z])
    np.testing.assert_allclose(w, z * z, rtol=1e-6)


def test_integer_ops_keep_every_integer_type():
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
        a = np.array([5, 9], dtype)
        b = np.array([2, 4], dtype)
        for opcode in ("add", "subtract", "multiply", "divide", "remainder", "maximum", "power"):
            out = binary(opcode, a, b)
            assert out.dtype == dtype, (opcode, dtype)
        np.testing.assert_array_equal(binary("divide", a, b), [2, 2])
        np.testing.assert_array_equal(binary("power", a, b), np.array([25, 6561]).astype(dtype))


@pytest.mark.parametrize("x, y", list(itertools.product([0.0, -0.0, 1.0], [0.0, -0.0])))
def test_float_division_by_zero_follows_ieee(x, y):
    out = binary("divide", np.array([x], np.float32), np.array([y], np.float32))[0]
    if x == 0:
        assert np.isnan(out)
    else:
        assert out == math.copysign(math.inf, y)


# --------------------------------------------------------------------------- reduce-precision

def reduce_precision(x, exponent_bits, mantissa_bits):
    from gspmdc.ir.dtypes import element_type_of
    return single_op("reduce-precision", (element_type_of(x.dtype), x.shape), [x],
                     exponent_bits=exponent_bits, mantissa_bits=mantissa_bits)


@pytest.mark.parametrize("target, exponent_bits, mantissa_bits", [
    (BF16, 8, 7), (np.float16, 5, 10)])
def test_reduce_precision_rounds_as_the_narrower_format_does(target, exponent_bits,
                                                            mantissa_bits):
    # in the narrower format's normal range, rounding to it and back is the same as a cast
    # (round to nearest, ties to even), ties included
    info = ml_dtypes.finfo(target)
    x = normal(4096) * np.float32(8)
    x = np.concatenate([x, np.float32([1 + 2.0 ** -(mantissa_bits + 1),      # tie, rounds down
                                       1 + 3 * 2.0 ** -(mantissa_bits + 1),  # tie, rounds up
                                       float(info.max), -float(info.tiny)])])
    x = x[np.abs(x) >= float(info.tiny)]
    got = reduce_precision(x.astype(np.float32), exponent_bits, mantissa_bits)
    np.testing.assert_array_equal(got, x.astype(target).astype(np.float32))


def test_reduce_precision_overflows_to_inf_flushes_small_values_and_keeps_nan():
    x = np.float32([70000.0, -70000.0, 1e-6, -1e-6, np.nan, np.inf, 0.0])
    got = reduce_precision(x, 5, 10)
    np.testing.assert_array_equal(got[:4], np.float32([np.inf, -np.inf, 0.0, -0.0]))
    assert np.signbit(got[3]) and np.isnan(got[4]) and got[5] == np.inf and got[6] == 0
    # f64 and a format wider than the input (nothing to do)
    y = np.float64([1 / 3, 1e300])
    np.testing.assert_array_equal(reduce_precision(y, 8, 23), [float(np.float32(1 / 3)), np.inf])
    np.testing.assert_array_equal(reduce_precision(x[:4], 11, 52), x[:4])
