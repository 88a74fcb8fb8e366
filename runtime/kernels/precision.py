"""Precision-changing elementwise kernels: reduce-precision and stochastic-convert.

Semantics are XLA's (the CPU backend's elemental emitter and its stochastic-convert expansion):

- `reduce-precision(x), exponent_bits=e, mantissa_bits=m` rounds a float to the nearest value
  with `m` mantissa bits (ties to even, on the bit pattern), then maps exponents above the
  `e`-bit range to infinity and those at or below its bottom to zero of the same sign (values
  below the smallest normal of the narrow format, its denormals included, become zero). A NaN
  stays the same NaN (bit for bit, whatever `m`; checked against XLA's CPU backend).
- `stochastic-convert(x, random)` (checked bit for bit against XLA's CPU backend for f16, bf16,
  f32 and f64 operands) converts a float to a signed integer rounding the fraction
  *up* when `random` (an unsigned integer of x's width) is below the fraction scaled to
  `2^width`, else down, toward zero for the magnitude and then restoring the sign; values at or
  beyond the integer range (compared in x's type) give its minimum or maximum, NaN gives 0.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from gspmdc.ir.ops import KERNELS

from .structural import convert_array


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{dtype.itemsize}")


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """XLA's reduce-precision of a float array (see the module docstring)."""
    with np.errstate(over="ignore"):                 # the rounding add wraps at the top, as in XLA
        return _reduce_precision_bits(np.asarray(x), exponent_bits, mantissa_bits)


def _reduce_precision_bits(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    u = _unsigned(x.dtype)
    nbits = 8 * x.dtype.itemsize
    src_mantissa = int(ml_dtypes.finfo(x.dtype).nmant)
    src_exponent = nbits - 1 - src_mantissa
    sign_mask = 1 << (nbits - 1)
    exponent_mask = ((1 << src_exponent) - 1) << src_mantissa
    bits = x.view(u)
    is_nan = (bits & u.type(~sign_mask & (2**nbits - 1))) > exponent_mask
    if mantissa_bits < src_mantissa:
        shift = src_mantissa - mantissa_bits
        last_bit = (bits >> u.type(shift)) & u.type(1)
        bias = last_bit + u.type((1 << (shift - 1)) - 1)
        bits = (bits + bias) & u.type(~((1 << shift) - 1) & (2**nbits - 1))
    if exponent_bits < src_exponent:
        bias = (1 << (src_exponent - 1)) - 1
        reduced = (1 << (exponent_bits - 1)) - 1
        exponent = bits & u.type(exponent_mask)
        signed_zero = bits & u.type(sign_mask)
        bits = np.where(exponent > u.type((bias + reduced) << src_mantissa),
                        signed_zero | u.type(exponent_mask), bits)
        bits = np.where(exponent <= u.type((bias - reduced) << src_mantissa), signed_zero, bits)
    return np.where(is_nan, x, np.asarray(bits, u).view(x.dtype))


@KERNELS.register("reduce-precision")
def _reduce_precision_kernel(inst, args, ctx):
    return reduce_precision(args[0], int(inst.attrs["exponent_bits"]),
                            int(inst.attrs["mantissa_bits"]))


def stochastic_convert(x: np.ndarray, random: np.ndarray, element_type: str) -> np.ndarray:
    """XLA's stochastic-convert of a float array to the signed `element_type` (see the module
    docstring). The arithmetic runs in f64, where every step is exact for x's type."""
    with np.errstate(over="ignore", invalid="ignore"):     # integers wrap; a bound may be inf
        return _stochastic_convert(np.asarray(x), np.asarray(random), element_type)


def _stochastic_convert(x: np.ndarray, random: np.ndarray, element_type: str) -> np.ndarray:
    wide = x.astype(np.float64)
    magnitude = np.abs(wide)
    whole = np.floor(magnitude)
    scaled = (magnitude - whole) * np.float64(2.0 ** (8 * random.dtype.itemsize))
    round_up = random < convert_array(scaled, f"u{8 * random.dtype.itemsize}")
    result = convert_array(whole, element_type)
    result = np.where(round_up, result + np.ones((), result.dtype), result)
    result = np.where(wide < 0, -result, result)
    limits = np.iinfo(result.dtype)
    low, high = (np.array(v).astype(x.dtype) for v in (limits.min, limits.max))
    result = np.where(x <= low, limits.min, result)
    return np.where(x >= high, limits.max, result).astype(result.dtype)


@KERNELS.register("stochastic-convert")
def _stochastic_convert_kernel(inst, args, ctx):
    return stochastic_convert(args[0], args[1], inst.shape.element_type)
