"""reduce-precision and stochastic-convert against independent truths: numpy's own f16 and
ml_dtypes' bf16 rounding, a per-element reference in plain Python floats and integers, and the
unpartitioned program (both ops were accepted by the verifier and refused by `run` before the
kernels existed)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gspmdc import api
from gspmdc.errors import VerificationError
from hlo_text import hlo_module
from interpreter_helpers import single_op
from spmd_partition_helpers import check_equivalent

RNG = np.random.default_rng(11)


def wide_f32(n: int) -> np.ndarray:
    """f32 values over the whole exponent range, both signs, with zeros, infinities, NaNs and
    f16's rounding and underflow boundaries."""
    x = RNG.standard_normal(n) * 2.0 ** RNG.integers(-149, 128, n)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, -65520, 2.0 ** -14,
               2.0 ** -14 * (1 - 2.0 ** -12), 2.0 ** -24, 1e-45, 3.4e38]
    with np.errstate(over="ignore"):
        return np.concatenate([x, special]).astype(np.float32)


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    return single_op("reduce-precision", ("f32", x.shape), [x], exponent_bits=exponent_bits,
                     mantissa_bits=mantissa_bits)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_reduce_precision_to_bf16_is_bf16_rounding():
    x = wide_f32(20000)
    got = reduce_precision(x, 8, 7)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    finite = ~np.isnan(x)
    assert same_bits(got[finite], want[finite])
    assert same_bits(got[~finite], x[~finite])           # a NaN stays the same NaN


def test_reduce_precision_to_f16_is_f16_rounding_with_denormals_flushed():
    x = wide_f32(20000)
    got = reduce_precision(x, 5, 10)
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16).astype(np.float32)
    normal = (np.abs(f16) >= 2.0 ** -14) | np.isnan(x)
    assert same_bits(got[normal & ~np.isnan(x)], f16[normal & ~np.isnan(x)])
    flushed = got[~normal]
    assert np.all(flushed == 0) and np.array_equal(np.signbit(flushed), np.signbit(x[~normal]))


def test_reduce_precision_to_the_full_width_changes_nothing():
    x = wide_f32(1000)
    assert same_bits(reduce_precision(x, 8, 23), x)


@pytest.mark.parametrize("attrs, message", [
    ({"exponent_bits": 0, "mantissa_bits": 3}, "exponent_bits must be at least 1"),
    ({"exponent_bits": 4, "mantissa_bits": -1}, "mantissa_bits must not be negative"),
])
def test_reduce_precision_checks_its_bit_counts(attrs, message):
    text = hlo_module("  p = f32[4] parameter(0)\n  ROOT r = f32[4] reduce-precision(p), "
                      + ", ".join(f"{k}={v}" for k, v in attrs.items()))
    with pytest.raises(VerificationError, match=message):
        api.parse(text)


def stochastic_convert(x: np.ndarray, random: np.ndarray, element_type: str) -> np.ndarray:
    return single_op("stochastic-convert", (element_type, x.shape), [x, random])


def stochastic_reference(x: float, r: int, bits: int, low: int, high: int) -> int:
    """One element in plain Python: round |x| up when r < floor(fraction * 2^bits)."""
    if math.isnan(x):
        return 0
    if x <= low:
        return low
    if x >= high:
        return high
    magnitude = abs(x)
    whole = math.floor(magnitude)
    up = r < math.floor((magnitude - whole) * 2 ** bits)
    value = whole + up
    return -value if x < 0 else value


@pytest.mark.parametrize("float_type, random_type, int_type", [
    (np.float32, np.uint32, "s32"), (np.float32, np.uint32, "s8"), (np.float16, np.uint16, "s16"),
    (np.float64, np.uint64, "s64"),
])
def test_stochastic_convert_matches_a_per_element_reference(float_type, random_type, int_type):
    n = 3000
    x = (RNG.standard_normal(n) * 10.0 ** RNG.integers(0, 4, n))
    x[:6] = [np.nan, np.inf, -np.inf, -0.0, 127.5, -128.5]
    x = x.astype(float_type)
    r = RNG.integers(0, np.iinfo(random_type).max, n, dtype=random_type, endpoint=True)
    got = stochastic_convert(x, r, int_type)
    info = np.iinfo(got.dtype)
    bits = 8 * np.dtype(random_type).itemsize
    # the bounds as the operand's type holds them (XLA compares in the operand's type)
    with np.errstate(over="ignore"):
        low, high = (float(np.array(v).astype(float_type)) for v in (info.min, info.max))
    want = [stochastic_reference(float(v), int(w), bits, low, high) for v, w in zip(x, r)]
    want = [min(max(v, info.min), info.max) for v in want]
    np.testing.assert_array_equal(got, np.array(want, got.dtype))


def test_stochastic_convert_rounds_up_as_often_as_the_fraction_says():
    x = np.full(20000, -2.3, np.float32)
    r = RNG.integers(0, 2**32, x.size, dtype=np.uint64).astype(np.uint32)
    got = stochastic_convert(x, r, "s32")
    assert set(np.unique(got)) == {-3, -2}
    assert abs(got.mean() - np.float64(np.float32(-2.3))) < 0.01


@pytest.mark.parametrize("operands, result, message", [
    ("s32[4], u32[4]", "s32[4]", "needs a floating operand"),
    ("f32[4], u16[4]", "s32[4]", "unsigned of the operand's width"),
    ("f32[4], u32[4]", "u32[4]", "must be a signed integer"),
])
def test_stochastic_convert_checks_its_types(operands, result, message):
    shapes = operands.split(", ")
    text = hlo_module(f"  x = {shapes[0]} parameter(0)\n  r = {shapes[1]} parameter(1)\n"
                      f"  ROOT s = {result} stochastic-convert(x, r)")
    with pytest.raises(VerificationError, match=message):
        api.parse(text)


def test_both_ops_partition_to_the_unpartitioned_result():
    text = hlo_module("""
  x = f32[8,6] parameter(0), sharding={devices=[2,2]<=[4]}
  r = u32[8,6] parameter(1), sharding={devices=[1,4]<=[4]}
  p = f32[8,6] reduce-precision(x), exponent_bits=5, mantissa_bits=2, sharding={devices=[4,1]<=[4]}
  s = s32[8,6] stochastic-convert(p, r), sharding={devices=[2,2]<=[4]}
  ROOT t = (f32[8,6], s32[8,6]) tuple(p, s), sharding={{replicated}, {devices=[4,1]<=[4]}}""")
    x = (RNG.standard_normal((8, 6)) * 100).astype(np.float32)
    r = RNG.integers(0, 2**32, (8, 6), dtype=np.uint64).astype(np.uint32)
    check_equivalent(text, 4, inputs=[x, r])
