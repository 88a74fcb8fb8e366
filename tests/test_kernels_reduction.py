"""Reductions (reduce, reduce-window, select-and-scatter, map) against references written from the
definitions with explicit Python loops over small arrays."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from hlo_text import hlo_module, max_magnitude_reducer, reducer
from interpreter_helpers import run_hlo

RNG = np.random.default_rng(3)

ADD = reducer("add")
MAX = """
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] maximum(b, a)
}"""
# not a plain ufunc: evaluated vectorised (max of magnitudes; associative and commutative)
MAXABS = max_magnitude_reducer("maxabs")
# JAX's arg-max reducer: (value, index) pairs, NaN wins, ties go to the smaller index
ARGMAX = """
argmax {
  v0 = f32[] parameter(0)
  i0 = s32[] parameter(1)
  v1 = f32[] parameter(2)
  i1 = s32[] parameter(3)
  gt = pred[] compare(v0, v1), direction=GT
  nan = pred[] compare(v0, v0), direction=NE
  first = pred[] or(gt, nan)
  v = f32[] select(first, v0, v1)
  eq = pred[] compare(v0, v1), direction=EQ
  lt = pred[] compare(i0, i1), direction=LT
  tie = pred[] and(eq, lt)
  pick = pred[] or(first, tie)
  i = s32[] select(pick, i0, i1)
  ROOT r = (f32[], s32[]) tuple(v, i)
}"""


def module(body: str, *computations: str) -> str:
    return hlo_module(body, "\n".join(computations))


def argmax_step(a, b):
    (v0, i0), (v1, i1) = a, b
    first = v0 > v1 or v0 != v0
    pick = first or (v0 == v1 and i0 < i1)
    return (v0 if first else v1, i0 if pick else i1)


# ----------------------------------------------------------------------------------- reduce

def test_reduce_sum_over_two_dims_adds_init_once():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    text = module("""
  p = f32[3,4,5] parameter(0)
  c = f32[] constant(10)
  ROOT r = f32[4] reduce(p, c), dimensions={0,2}, to_apply=add""", ADD)
    np.testing.assert_allclose(run_hlo(text, x), x.sum(axis=(0, 2)) + 10, rtol=1e-5)


def test_reduce_max_propagates_nan_and_uses_init():
    x = np.array([[1, 5, -2], [np.nan, 0, 1], [-7, -8, -9]], np.float32)
    text = module("""
  p = f32[3,3] parameter(0)
  c = f32[] constant(-5)
  ROOT r = f32[3] reduce(p, c), dimensions={1}, to_apply=max""", MAX)
    out = run_hlo(text, x)
    assert out[0] == 5 and np.isnan(out[1]) and out[2] == -5


@pytest.mark.parametrize("reducer, name", [(ADD, "add"), (MAXABS, "maxabs")], ids=["add", "maxabs"])
def test_reduce_of_an_empty_dimension_is_the_init(reducer, name):
    text = module(f"""
  p = f32[0,3] parameter(0)
  c = f32[] constant(-4)
  ROOT r = f32[3] reduce(p, c), dimensions={{0}}, to_apply={name}""", reducer)
    np.testing.assert_array_equal(run_hlo(text, np.zeros((0, 3), np.float32)), [-4, -4, -4])


def test_reduce_over_no_dimensions_combines_each_element_with_init():
    x = np.array([-3, 1, 2], np.float32)
    text = module("""
  p = f32[3] parameter(0)
  c = f32[] constant(-2.5)
  ROOT r = f32[3] reduce(p, c), dimensions={}, to_apply=maxabs""", MAXABS)
    np.testing.assert_array_equal(run_hlo(text, x), [3, 2.5, 2.5])


def test_reduce_with_a_non_ufunc_reducer_matches_a_sequential_fold():
    x = RNG.standard_normal((4, 7, 3)).astype(np.float32)
    text = module("""
  p = f32[4,7,3] parameter(0)
  c = f32[] constant(0.5)
  ROOT r = f32[7] reduce(p, c), dimensions={0,2}, to_apply=maxabs""", MAXABS)
    expected = [max([0.5] + [abs(float(v)) for v in x[:, j, :].ravel()]) for j in range(7)]
    np.testing.assert_array_equal(run_hlo(text, x), np.float32(expected))


def test_variadic_reduce_arg_max_with_ties_and_nan():
    x = np.array([[1, 3, 3, 2, 0],
                  [5, 1, np.nan, 7, np.nan],
                  [-1, -1, -1, -1, -1],
                  [0, 9, 2, 9, 9]], np.float32)
    text = module("""
  p = f32[4,5] parameter(0)
  iota = s32[4,5] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[4], s32[4]) reduce(p, iota, ninf, zero), dimensions={1}, to_apply=argmax""",
                  ARGMAX)
    values, indices = run_hlo(text, x)
    for row in range(4):
        acc = (np.float32(-np.inf), 0)
        for j in range(5):
            acc = argmax_step(acc, (x[row, j], j))
        np.testing.assert_array_equal(values[row], acc[0])
        assert indices[row] == acc[1]
    np.testing.assert_array_equal(indices, [1, 2, 0, 1])


def test_reduce_bf16_sum_rounds_every_step_in_xla_cpu_order():
    # 257 elements: 9 windows of 32, the padding (31) split 15 low / 16 high. Window 0 holds 1.0
    # then 16 x 2^-8: 1 + 2^-8 is a tie between bf16 neighbours 1 and 1 + 2^-7 and rounds to
    # even, so the window stays 1.0; windows 1-7 sum 32 x 2^-8 = 2^-3 exactly, window 8 holds
    # 16 x 2^-8 = 2^-4; then 1 + 7 x 2^-3 + 2^-4 = 1.9375 exactly. (Rounding once would give 2.)
    x = np.array([1.0] + [2.0 ** -8] * 256, ml_dtypes.bfloat16)
    text = module("""
  p = bf16[257] parameter(0)
  c = bf16[] constant(0)
  ROOT r = bf16[] reduce(p, c), dimensions={0}, to_apply=add""",
                  ADD.replace("f32", "bf16"))
    out = run_hlo(text, x)
    assert out.dtype == ml_dtypes.bfloat16 and float(out) == 1.9375


def test_reduce_integer_sum_wraps_in_its_own_type():
    x = np.full(3, 100, np.int8)
    text = module("""
  p = s8[3] parameter(0)
  c = s8[] constant(0)
  ROOT r = s8[] reduce(p, c), dimensions={0}, to_apply=add""", ADD.replace("f32", "s8"))
    assert run_hlo(text, x) == np.int8(44)


# ------------------------------------------------------------------------------ reduce-window

def reduce_window_reference(x, init, fn, size, stride, low, high, base, dilation):
    """Fold each window in row-major order, skipping padding and base-dilation holes."""
    extent = [lo + (n - 1) * b + 1 + hi if n else lo + hi
              for n, lo, hi, b in zip(x.shape, low, high, base)]
    out_dims = [(e - ((k - 1) * d + 1)) // s + 1 for e, k, d, s in zip(extent, size, dilation, stride)]
    out = np.empty(out_dims, x.dtype)
    for o in itertools.product(*map(range, out_dims)):
        acc = init
        for w in itertools.product(*map(range, size)):
            pos = [oi * s + wi * d - lo for oi, wi, s, d, lo in zip(o, w, stride, dilation, low)]
            if all(p % b == 0 and 0 <= p // b < n for p, b, n in zip(pos, base, x.shape)):
                acc = fn(acc, x[tuple(p // b for p, b in zip(pos, base))])
        out[o] = acc
    return out


def window_text(size, stride, low, high, base, dilation):
    join = "x".join
    return (f"window={{size={join(map(str, size))} stride={join(map(str, stride))} "
            f"pad={join(f'{a}_{b}' for a, b in zip(low, high))} "
            f"lhs_dilate={join(map(str, base))} rhs_dilate={join(map(str, dilation))}}}")


WINDOWS = [
    # size, stride, low, high, base dilation, window dilation
    ((2, 2), (2, 2), (0, 0), (0, 0), (1, 1), (1, 1)),
    ((3, 2), (1, 1), (1, 0), (1, 1), (1, 1), (1, 1)),
    ((2, 3), (2, 1), (2, 1), (0, 3), (2, 1), (1, 2)),
    ((3, 3), (3, 2), (0, 2), (1, 0), (2, 3), (2, 1)),
    ((1, 5), (1, 1), (0, 4), (0, 0), (1, 1), (1, 1)),    # cumulative-sum style
    ((17, 17), (1, 1), (8, 8), (8, 8), (1, 1), (1, 1)),  # more elements per window than _TAPS
]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("reducer, name, fn, init", [
    (ADD, "add", lambda a, b: a + b, 1.0),           # non-identity init: combined once
    (MAX, "max", max, -np.inf),
    (MAXABS, "maxabs", lambda a, b: max(abs(a), abs(b)), 0.25),
], ids=["add", "max", "maxabs"])
def test_reduce_window_matches_definition(window, reducer, name, fn, init):
    x = RNG.standard_normal((5, 6)).astype(np.float64)
    expected = reduce_window_reference(x, init, fn, *window)
    text = module(f"""
  p = f64[5,6] parameter(0)
  c = f64[] constant({init})
  ROOT r = f64[{expected.shape[0]},{expected.shape[1]}] reduce-window(p, c), {window_text(*window)}, to_apply={name}""",
                  reducer.replace("f32", "f64"))
    np.testing.assert_allclose(run_hlo(text, x), expected, rtol=1e-12, atol=1e-12)


def test_variadic_reduce_window_arg_max():
    x = RNG.integers(0, 4, (4, 6)).astype(np.float32)
    idx = np.arange(24, dtype=np.int32).reshape(4, 6)
    window = ((2, 3), (1, 2), (0, 1), (1, 0), (1, 1), (1, 1))
    pairs = np.empty(x.shape, object)
    for i, j in itertools.product(range(4), range(6)):
        pairs[i, j] = (x[i, j], idx[i, j])
    expected = reduce_window_reference(pairs, (np.float32(-np.inf), 0), argmax_step, *window)
    rows, cols = expected.shape
    text = module(f"""
  p = f32[4,6] parameter(0)
  i = s32[4,6] parameter(1)
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[{rows},{cols}], s32[{rows},{cols}]) reduce-window(p, i, ninf, zero), {window_text(*window)}, to_apply=argmax""",
                  ARGMAX)
    values, indices = run_hlo(text, x, idx)
    np.testing.assert_array_equal(values, [[v for v, _ in row] for row in expected])
    np.testing.assert_array_equal(indices, [[k for _, k in row] for row in expected])


def test_reduce_window_max_pool_int():
    x = RNG.integers(-50, 50, (1, 6, 6, 2)).astype(np.int32)
    text = module("""
  p = s32[1,6,6,2] parameter(0)
  c = s32[] constant(-2147483648)
  ROOT r = s32[1,3,3,2] reduce-window(p, c), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=max""",
                  MAX.replace("f32", "s32"))
    expected = x.reshape(1, 3, 2, 3, 2, 2).max(axis=(2, 4))
    np.testing.assert_array_equal(run_hlo(text, x), expected)


# -------------------------------------------------------------------------- select-and-scatter

GE = """
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=GE
}"""


def select_and_scatter_reference(x, source, init, size, stride, low,
                                 scatter=lambda old, new: old + new):
    out = np.full(x.shape, init, x.dtype)
    for o in itertools.product(*map(range, source.shape)):
        chosen = None
        for w in itertools.product(*map(range, size)):
            pos = tuple(oi * s + wi - lo for oi, wi, s, lo in zip(o, w, stride, low))
            if all(0 <= p < n for p, n in zip(pos, x.shape)):
                if chosen is None or not x[chosen] >= x[pos]:
                    chosen = pos
        if chosen is not None:
            out[chosen] = scatter(out[chosen], source[o])
    return out


@pytest.mark.parametrize("size, stride, low, high", [
    ((3, 3), (1, 1), (1, 1), (1, 1)),     # heavily overlapping windows with padding
    ((2, 3), (2, 2), (0, 1), (1, 1)),
    ((2, 2), (2, 2), (0, 0), (0, 0)),     # max-pool gradient
])
def test_select_and_scatter_with_overlapping_windows(size, stride, low, high):
    x = RNG.integers(0, 3, (5, 6)).astype(np.float32)    # many ties: the first maximum wins
    extent = [n + lo + hi for n, lo, hi in zip(x.shape, low, high)]
    out_dims = [(e - k) // s + 1 for e, k, s in zip(extent, size, stride)]
    source = RNG.integers(1, 10, out_dims).astype(np.float32)
    expected = select_and_scatter_reference(x, source, 0.5, size, stride, low)
    window = (f"window={{size={size[0]}x{size[1]} stride={stride[0]}x{stride[1]} "
              f"pad={low[0]}_{high[0]}x{low[1]}_{high[1]}}}")
    text = module(f"""
  p = f32[5,6] parameter(0)
  s = f32[{out_dims[0]},{out_dims[1]}] parameter(1)
  c = f32[] constant(0.5)
  ROOT r = f32[5,6] select-and-scatter(p, s, c), {window}, select=ge, scatter=add""", GE, ADD)
    np.testing.assert_array_equal(run_hlo(text, x, source), expected)


# ------------------------------------------------------------------------------------- map

def test_map_applies_a_computation_elementwise():
    a, b = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32)
    text = module("""
  p = f32[2,3] parameter(0)
  q = f32[2,3] parameter(1)
  ROOT r = f32[2,3] map(p, q), dimensions={0,1}, to_apply=fma""", """
fma {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  m = f32[] multiply(x, y)
  c = f32[] constant(1)
  ROOT r = f32[] add(m, c)
}""")
    np.testing.assert_allclose(run_hlo(text, a, b), a * b + 1, rtol=1e-6)


def test_map_of_a_constant_computation_broadcasts():
    text = module("""
  p = f32[4] parameter(0)
  ROOT r = f32[4] map(p), dimensions={0}, to_apply=seven""", """
seven {
  x = f32[] parameter(0)
  ROOT c = f32[] constant(7)
}""")
    np.testing.assert_array_equal(run_hlo(text, np.zeros(4, np.float32)), [7, 7, 7, 7])


def test_select_and_scatter_applies_an_order_dependent_scatter_window_by_window():
    """scatter(old, new) = 2 * old + new: repeated selections must combine in window order."""
    x = RNG.integers(0, 2, (4, 5)).astype(np.float32)
    source = RNG.integers(1, 4, (4, 5)).astype(np.float32)
    expected = select_and_scatter_reference(x, source, 1.0, (3, 3), (1, 1), (1, 1),
                                            scatter=lambda old, new: 2 * old + new)
    text = module("""
  p = f32[4,5] parameter(0)
  s = f32[4,5] parameter(1)
  c = f32[] constant(1)
  ROOT r = f32[4,5] select-and-scatter(p, s, c), window={size=3x3 pad=1_1x1_1}, select=ge, scatter=twice_plus""",
                  GE, """
twice_plus {
  old = f32[] parameter(0)
  new = f32[] parameter(1)
  two = f32[] constant(2)
  d = f32[] multiply(old, two)
  ROOT r = f32[] add(d, new)
}""")
    np.testing.assert_array_equal(run_hlo(text, x, source), expected)


# cumulative windows (JAX's cumsum): run as a cumulative ufunc, in the window loop's order

def cumulative_module(dtype: str, shape, axis: int, reverse: bool, reducer_text: str,
                      name: str, init: str = "0") -> str:
    n = shape[axis]
    size = "x".join(str(n) if d == axis else "1" for d in range(len(shape)))
    pad = "x".join((f"0_{n - 1}" if reverse else f"{n - 1}_0") if d == axis else "0_0"
                   for d in range(len(shape)))
    dims = ",".join(map(str, shape))
    return module(f"""
  p = {dtype}[{dims}] parameter(0)
  c = {dtype}[] constant({init})
  ROOT r = {dtype}[{dims}] reduce-window(p, c), window={{size={size} pad={pad}}}, to_apply={name}""",
                  reducer_text.replace("f32", dtype))


def test_cumulative_sum_window_is_the_sequential_prefix_sum_bit_for_bit():
    x = (RNG.standard_normal((3, 16, 4)) * 10.0 ** RNG.integers(-3, 4, (3, 16, 4))).astype(np.float32)
    x[0, 3, 0] = -0.0
    got = run_hlo(cumulative_module("f32", x.shape, 1, False, ADD, "add"), x)
    expected = np.empty_like(x)
    for i, k in itertools.product(range(3), range(4)):
        acc = np.float32(-0.0)              # the padding: adding it changes nothing
        for j in range(16):
            acc = np.float32(acc + x[i, j, k])
            expected[i, j, k] = acc
    assert got.tobytes() == expected.tobytes()


def test_cumulative_sum_window_adds_the_init_after_the_prefix():
    x = RNG.standard_normal((5, 7)).astype(np.float64)
    got = run_hlo(cumulative_module("f64", x.shape, 1, False, ADD, "add", "0.5"), x)
    np.testing.assert_array_equal(got, np.cumsum(x, axis=1) + 0.5)


@pytest.mark.parametrize("reverse", [False, True])
def test_cumulative_integer_sum_and_max_windows_in_both_directions(reverse):
    x = RNG.integers(-50, 50, (6, 9)).astype(np.int32)
    prefix = (lambda f, v: np.flip(f(np.flip(v, 0), axis=0), 0)) if reverse else \
        (lambda f, v: f(v, axis=0))
    got = run_hlo(cumulative_module("s32", x.shape, 0, reverse, ADD, "add"), x)
    np.testing.assert_array_equal(got, prefix(np.cumsum, x))
    got = run_hlo(cumulative_module("s32", x.shape, 0, reverse, MAX, "max", "-2147483648"), x)
    np.testing.assert_array_equal(got, prefix(np.maximum.accumulate, x))


def test_reverse_cumulative_float_sum_keeps_the_window_order():
    x = (RNG.standard_normal(12) * 10.0 ** RNG.integers(-4, 5, 12)).astype(np.float32)
    got = run_hlo(cumulative_module("f32", x.shape, 0, True, ADD, "add"), x)
    expected = np.empty_like(x)
    for i in range(12):
        acc = np.float32(x[i])              # window elements x[i], x[i+1], ... left to right
        for j in range(i + 1, 12):
            acc = np.float32(acc + x[j])
        expected[i] = acc
    assert got.tobytes() == expected.tobytes()


def test_a_shorter_window_padded_like_a_prefix_is_a_sliding_sum():
    x = RNG.standard_normal((2, 20)).astype(np.float64)
    text = module("""
  p = f64[2,20] parameter(0)
  c = f64[] constant(0)
  ROOT r = f64[2,20] reduce-window(p, c), window={size=1x16 pad=0_0x15_0}, to_apply=add""",
                  ADD.replace("f32", "f64"))
    expected = reduce_window_reference(x, 0.0, lambda a, b: a + b, (1, 16), (1, 1), (0, 15),
                                       (0, 0), (1, 1), (1, 1))
    np.testing.assert_allclose(run_hlo(text, x), expected, rtol=1e-12, atol=1e-12)
