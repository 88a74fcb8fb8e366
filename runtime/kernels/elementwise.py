"""Elementwise kernels: unary and binary arithmetic, bitwise ops and shifts, reduce-precision,
compare, select, clamp.

Semantics are XLA's (operation semantics and the CPU backend's elemental emitter):
- integers wrap on overflow; `divide`/`remainder` truncate toward zero; `x / 0` is -1 (all bits set,
  so the maximum for unsigned types) and `x % 0` is `x`; `INT_MIN / -1` is `INT_MIN` and
  `INT_MIN % -1` is 0; integer `power` with a negative exponent is 1 for base 1, else 0;
- shift amounts are read as unsigned; an amount >= the bit width gives 0 (`shift-left`,
  `shift-right-logical`) or the sign fill (`shift-right-arithmetic`);
- `maximum`/`minimum` propagate NaN; float `remainder` is C's fmod;
- `compare` supports every direction; `type=TOTALORDER` orders floats
  -NaN < -inf < ... < -0 < +0 < ... < inf < NaN (and compares NaN bit patterns);
- `round-nearest-afz` rounds halves away from zero, `round-nearest-even` to even; `sign` keeps the sign
  of zeros and NaN;
- bf16 arithmetic is computed in f32 and rounded back once per op (what XLA's CPU backend does).

Every kernel here is shape-agnostic (numpy broadcasting; scalars broadcast), which is what lets
`computation_patterns` evaluate scalar computations vectorised over whole arrays.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.shapes import ArrayShape

from .specialising import SpecialisedKernel


_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)

class _Widened:
    """`fn` over arrays, computing bf16 operands in f32 and rounding a float result back to bf16
    (`fn` itself for other types)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *xs):
        if xs[0].dtype == _BF16:
            result = self.fn(*(x.astype(_F32) for x in xs))
            return result.astype(_BF16) if result.dtype == _F32 else result
        return self.fn(*xs)



def _register(opcode: str, fn) -> None:
    """`fn(*operands)` as the kernel of `opcode`; specialised to an instruction whose first
    operand is not bf16, a `_Widened` function is the function it widens; in place
    (`_in_place`) where that is one ufunc."""
    def generic(inst, args, ctx):
        return fn(*args)

    def specialise(inst):
        if type(fn) is _Widened and inst.operands[0].shape.element_type != "bf16":
            plain = fn.fn
            return lambda inst, args, ctx: plain(*args)
        return generic
    KERNELS.add(SpecialisedKernel(generic, specialise, lambda inst, k: _in_place(inst, k, fn)),
                opcode)


def _in_place(inst, k: int, fn):
    """The kernel of `inst` (kernel function `fn`) that writes its result into operand `k`, or
    None when `fn` for these types is not one numpy ufunc whose result has operand `k`'s type:
    the ufunc's own values, with operand `k` as its output."""
    element_type = inst.shape.element_type
    if element_type == "bf16" or inst.operands[k].shape.element_type != element_type:
        return None                 # bf16 is computed in f32 (`_Widened`)
    if type(fn) is _Widened:
        fn = fn.fn
    if inst.opcode in _FLOAT_UFUNCS and dtypes.is_float(element_type):
        fn = _FLOAT_UFUNCS[inst.opcode]
    if type(fn) is not np.ufunc or fn.nout != 1 or fn.nin != len(inst.operands):
        return None
    return lambda inst, args, ctx: fn(*args, out=args[k])


#: the float kernels that are one ufunc (`_divide`, `_remainder` and `_power` for floats; their
#: integer kernels are not)
_FLOAT_UFUNCS = {"divide": np.true_divide, "remainder": np.fmod, "power": np.power}


def _is_int(x) -> bool:
    return x.dtype.kind in "iu"


def _all_ones(dtype: np.dtype) -> np.ndarray:
    return np.array(-1, np.int64).astype(dtype)


# ---------------------------------------------------------------------------------------- integers

def _int_divide_and_remainder(a, b):
    """Truncating integer division and remainder with XLA's results for `/0` and `MIN / -1`."""
    zero = b == 0
    trap = zero
    if a.dtype.kind == "i":
        trap = zero | ((a == np.iinfo(a.dtype).min) & (b == -1))
    safe = np.where(trap, np.ones((), b.dtype), b)
    remainder = np.fmod(a, safe)                    # C remainder: sign of the dividend
    quotient = (a - remainder) // safe              # exact, so floor == truncation
    return (np.where(zero, _all_ones(a.dtype), quotient),
            np.where(zero, a, remainder))


def _divide(a, b):
    if _is_int(a):
        return _int_divide_and_remainder(a, b)[0]
    return np.true_divide(a, b)


def _remainder(a, b):
    if _is_int(a):
        return _int_divide_and_remainder(a, b)[1]
    return np.fmod(a, b)


def _int_power(base, exponent):
    """Wrapping exponentiation by squaring; a negative exponent gives 1 for base 1, else 0."""
    base, exponent = np.broadcast_arrays(base, exponent)
    negative = exponent < 0
    bits = np.where(negative, np.zeros((), exponent.dtype), exponent).astype(np.uint64)
    result = np.ones(base.shape, base.dtype)
    square = base.copy()
    while bits.any():
        result = np.where((bits & np.uint64(1)) != 0, result * square, result)
        square = square * square
        bits = bits >> np.uint64(1)
    return np.where(negative, (base == 1).astype(base.dtype), result)


def _power(a, b):
    if _is_int(a):
        return _int_power(a, b)
    return np.power(a, b)


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{dtype.itemsize}")


def _signed(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"i{dtype.itemsize}")


def _shift(a, b, kind: str):
    """Shifts on the bit pattern; out-of-range amounts saturate (0, or the sign fill)."""
    width = 8 * a.dtype.itemsize
    amount = np.asarray(b).view(_unsigned(b.dtype))
    in_range = amount < width
    amount = np.where(in_range, amount, np.zeros((), amount.dtype))
    if kind == "left":
        bits = np.asarray(a).view(_unsigned(a.dtype))
        shifted, fill = bits << amount.astype(bits.dtype), np.zeros((), bits.dtype)
    elif kind == "logical":
        bits = np.asarray(a).view(_unsigned(a.dtype))
        shifted, fill = bits >> amount.astype(bits.dtype), np.zeros((), bits.dtype)
    else:
        bits = np.asarray(a).view(_signed(a.dtype))
        shifted = bits >> amount.astype(bits.dtype)
        fill = np.where(bits < 0, np.full((), -1, bits.dtype), np.zeros((), bits.dtype))
    return np.where(in_range, shifted, fill).view(a.dtype)


def _popcount(x):
    return np.bitwise_count(x).astype(x.dtype)


def _count_leading_zeros(x):
    """Bit width minus the bit length (smear the highest set bit down, then count bits)."""
    u = np.asarray(x).view(_unsigned(x.dtype))
    width = 8 * x.dtype.itemsize
    shift = 1
    while shift < width:
        u = u | (u >> np.array(shift, u.dtype))
        shift *= 2
    return (width - np.bitwise_count(u).astype(np.int64)).astype(x.dtype)


def _not(x):
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


# ------------------------------------------------------------------------------------------- floats

def _round_half_away_from_zero(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _sign(x):
    if _is_int(x):
        return np.sign(x)
    return np.where(x == 0, x, np.sign(x))      # keeps -0, +0 and NaN


def _logistic(x):
    return 1 / (1 + np.exp(-x))


def _erf(x):
    """erf to about 1e-16 in f64, rounded to the input type: a positive-term series for |x| < 3,
    the continued fraction of erfc beyond (no cancellation in either)."""
    a = np.abs(np.asarray(x, np.float64))
    out = np.empty_like(a)
    small = a < 3.0
    s = a[small]
    term, total, two_s2 = s.copy(), s.copy(), 2.0 * s * s
    for n in range(1, 64):
        term = term * two_s2 / (2 * n + 1)
        total = total + term
    out[small] = 2.0 / np.sqrt(np.pi) * np.exp(-s * s) * total
    big = a[~small]
    t = big.copy()
    for k in range(100, 0, -1):
        t = big + (k / 2.0) / t
    out[~small] = 1.0 - np.exp(-big * big) / np.sqrt(np.pi) / t
    return np.copysign(out, x).astype(np.result_type(x))


def _complex(re, im):
    dtype = np.result_type(re, np.complex64)
    out = np.empty(np.broadcast_shapes(np.shape(re), np.shape(im)), dtype)
    out.real, out.imag = re, im
    return out


def _rsqrt(x):
    return 1 / np.sqrt(x)


# ------------------------------------------------------------------------------------------ compare

_DIRECTIONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
               "GT": np.greater, "GE": np.greater_equal}


def total_order_key(x: np.ndarray) -> np.ndarray:
    """Signed integers that order floats as TOTALORDER does (-NaN < -inf < -0 < +0 < inf < NaN)."""
    bits = np.asarray(x).view(_signed(x.dtype))
    magnitude = np.array(np.iinfo(bits.dtype).max, bits.dtype)
    return np.where(bits < 0, bits ^ magnitude, bits)


def _compare_for(inst):
    """The compare kernel of `inst`: its direction's function, on TOTALORDER keys for floats."""
    fn = _DIRECTIONS[str(inst.attrs["direction"])]
    if inst.attrs.get("type") == "TOTALORDER" and dtypes.is_float(inst.operands[0].shape.element_type):
        return lambda inst, args, ctx: fn(total_order_key(args[0]), total_order_key(args[1]))
    return lambda inst, args, ctx: fn(*args)


def _compare(inst, args, ctx):
    return _compare_for(inst)(inst, args, ctx)


KERNELS.add(SpecialisedKernel(_compare, _compare_for), "compare")


def _select(inst, args, ctx):
    return np.where(*args)


def _select_for(inst):
    """The select kernel of `inst`: with a scalar predicate and scalar operands, a copy of the
    chosen one (what `np.where` gives, without its broadcasting machinery)."""
    if len(inst.operands) == 3 and \
            all(isinstance(op.shape, ArrayShape) and op.shape.dims == () for op in inst.operands):
        return lambda inst, args, ctx: (args[1] if args[0] else args[2]).copy()
    return _select


KERNELS.add(SpecialisedKernel(_select, _select_for), "select")


@KERNELS.register("clamp")
def _clamp(inst, args, ctx):
    low, x, high = args
    return np.minimum(np.maximum(x, low), high)


_KERNEL_FUNCTIONS = {
    # arithmetic (bf16 through f32)
    "add": _Widened(np.add), "subtract": _Widened(np.subtract),
    "multiply": _Widened(np.multiply), "divide": _Widened(_divide),
    "remainder": _Widened(_remainder), "power": _Widened(_power),
    "atan2": _Widened(np.arctan2), "complex": _complex,
    "maximum": np.maximum, "minimum": np.minimum,
    # bitwise and shifts
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shift-left": lambda a, b: _shift(a, b, "left"),
    "shift-right-logical": lambda a, b: _shift(a, b, "logical"),
    "shift-right-arithmetic": lambda a, b: _shift(a, b, "arithmetic"),
    "not": _not, "popcnt": _popcount, "count-leading-zeros": _count_leading_zeros,
    # unary arithmetic
    "negate": np.negative, "abs": np.abs, "sign": _Widened(_sign),
    "floor": _Widened(np.floor), "ceil": _Widened(np.ceil),
    "round-nearest-afz": _Widened(_round_half_away_from_zero),
    "round-nearest-even": _Widened(np.rint),
    "exponential": _Widened(np.exp), "exponential-minus-one": _Widened(np.expm1),
    "log": _Widened(np.log), "log-plus-one": _Widened(np.log1p),
    "logistic": _Widened(_logistic), "sqrt": _Widened(np.sqrt), "rsqrt": _Widened(_rsqrt),
    "cbrt": _Widened(np.cbrt), "sine": _Widened(np.sin), "cosine": _Widened(np.cos),
    "tan": _Widened(np.tan), "tanh": _Widened(np.tanh), "erf": _Widened(_erf),
    "is-finite": _Widened(np.isfinite), "real": np.real, "imag": np.imag,
}
for _opcode, _fn in _KERNEL_FUNCTIONS.items():
    _register(_opcode, _fn)

#: the opcodes of this module whose kernels return arrays in memory of their own (not an
#: operand's, nor a view of one; `real` and `imag` return views)
ELEMENTWISE_FRESH = frozenset(_KERNEL_FUNCTIONS) - {"real", "imag"} | \
    frozenset({"compare", "select", "clamp"})
