"""The variadic reducer forms `reduce` runs as whole-array operations (`runtime/reducer_forms.py`):
which spellings are recognised, and the results against folds written here with Python scalars
(sequential and pairwise), bit for bit, on inputs full of ties, signed zeros, NaNs and repeated
indices."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime import reducer_forms
from hlo_text import hlo_module
from interpreter_helpers import run_hlo

RNG = np.random.default_rng(16)


def arg_reducer(value_type="f32", index_type="s32", *, value_pick="or(gt, nan)",
                index_pick="or(first, tie)", better="GT", value_select="select(first, v0, v1)",
                tie_index="LT") -> str:
    """JAX's argmax / argmin reducer (`better` GT / LT), with pieces replaceable to spell it
    differently or to change it."""
    return f"""
red {{
  v0 = {value_type}[] parameter(0)
  i0 = {index_type}[] parameter(1)
  v1 = {value_type}[] parameter(2)
  i1 = {index_type}[] parameter(3)
  gt = pred[] compare(v0, v1), direction={better}
  nan = pred[] compare(v0, v0), direction=NE
  first = pred[] {value_pick}
  notfirst = pred[] not(first)
  v = {value_type}[] {value_select}
  eq = pred[] compare(v0, v1), direction=EQ
  lt = pred[] compare(i0, i1), direction={tie_index}
  tie = pred[] and(eq, lt)
  pick = pred[] {index_pick}
  i = {index_type}[] select(pick, i0, i1)
  ROOT r = ({value_type}[], {index_type}[]) tuple(v, i)
}}"""


def form_of(reducer_text: str):
    module = parse_module(hlo_module("  ROOT c = f32[] constant(0)", reducer_text))
    computation = module.computation("red")
    return reducer_forms.arg_selection(computation) or reducer_forms.elementwise_ufuncs(computation)


# ------------------------------------------------------------------------------ recognition

@pytest.mark.parametrize("text, largest", [
    (arg_reducer(), True),
    (arg_reducer(better="LT"), False),
    # operands of the comparison mirrored, the value select written with the negated condition
    (arg_reducer(value_pick="or(nan, gt)", value_select="select(notfirst, v1, v0)"), True),
    (arg_reducer(index_pick="or(tie, first)"), True),
    # `ai <= bi` instead of `ai < bi`: the same index wherever the indices differ
    (arg_reducer(tie_index="LE"), True),
    # xor differs from or only where both hold, never: a NaN v0 is not greater than v1
    (arg_reducer(value_pick="xor(gt, nan)"), True),
    (arg_reducer("s32", "s32"), True),
    (arg_reducer("u8", "s64", better="LT"), False),
])
def test_argmax_and_argmin_spellings_are_recognised(text, largest):
    assert form_of(text) == reducer_forms.ArgSelection(largest)


@pytest.mark.parametrize("text", [
    arg_reducer(value_pick="or(gt, gt)"),                 # floats without the NaN rule
    arg_reducer(better="GE"),                             # ties keep the left value
    arg_reducer(tie_index="GT"),                          # ties go to the larger index
    arg_reducer(index_pick="or(first, eq)"),              # not an index tie-break
    arg_reducer(value_select="select(first, v1, v0)"),    # selects the other side
    arg_reducer(value_pick="and(gt, nan)"),
])
def test_other_selection_reducers_are_not_taken_for_argmax(text):
    assert form_of(text) is None


def test_a_tuple_of_ufuncs_is_recognised_output_by_output():
    text = """
red {
  a = f32[] parameter(0)
  b = s32[] parameter(1)
  c = f32[] parameter(2)
  d = s32[] parameter(3)
  s = f32[] add(c, a)
  m = s32[] maximum(b, d)
  ROOT r = (f32[], s32[]) tuple(s, m)
}"""
    assert form_of(text) == (np.add, np.maximum)
    crossed = text.replace("add(c, a)", "add(a, d)").replace("s32[] maximum(b, d)",
                                                               "s32[] maximum(b, b)")
    assert form_of(crossed) is None


# ------------------------------------------------------------------------------ results

def argmax_step(a, b, largest: bool):
    """The reducer, on Python pairs of numpy scalars, as the HLO computes it."""
    (v0, i0), (v1, i1) = a, b
    first = (v0 > v1 if largest else v0 < v1) or v0 != v0
    pick = first or (v0 == v1 and i0 < i1)
    return (v0 if first else v1, i0 if pick else i1)


def sequential_fold(init, pairs, largest):
    acc = init
    for pair in pairs:
        acc = argmax_step(acc, pair, largest)
    return acc


def pairwise_fold(init, pairs, largest):
    level = list(pairs)
    while len(level) > 1:
        level = [argmax_step(level[k], level[k + 1], largest) if k + 1 < len(level)
                 else level[k] for k in range(0, len(level), 2)]
    return argmax_step(init, level[0], largest)


def awkward_values(shape, dtype):
    """Few distinct values: many ties, signed zeros, infinities and NaNs (floats)."""
    if np.dtype(dtype).kind not in "iu":
        pool = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan, 2.0], dtype)
    else:
        info = np.iinfo(dtype)
        pool = np.array([0, 1, 2, info.min, info.max], dtype)
    return pool[RNG.integers(0, len(pool), shape)]


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("value_type, dtype", [("f32", np.float32), ("f64", np.float64),
                                               ("bf16", ml_dtypes.bfloat16), ("s32", np.int32)])
@pytest.mark.parametrize("nan_rate", [0.0, 0.3])
def test_argmax_and_argmin_equal_the_folds_bit_for_bit(largest, value_type, dtype, nan_rate):
    rows, count = 300, 7
    values = awkward_values((rows, count), dtype)
    floating = np.dtype(dtype).kind not in "iu"
    if floating:
        values = np.where(values != values, dtype(0.5), values)
        values = np.where(RNG.random((rows, count)) < nan_rate, dtype(np.nan), values)
    indices = RNG.integers(0, 4, (rows, count)).astype(np.int32)   # repeated, not in order
    init_value = dtype(-np.inf if largest else np.inf) if floating \
        else np.iinfo(dtype).min if largest else np.iinfo(dtype).max
    text = hlo_module(f"""
  p = {value_type}[{rows},{count}] parameter(0)
  q = s32[{rows},{count}] parameter(1)
  init = {value_type}[] parameter(2)
  zero = s32[] constant(0)
  ROOT r = ({value_type}[{rows}], s32[{rows}]) reduce(p, q, init, zero), dimensions={{1}}, to_apply=red""",
                      arg_reducer(value_type, better="GT" if largest else "LT"))
    got_values, got_indices = run_hlo(text, values, indices, np.asarray(init_value, dtype))
    for row in range(rows):
        pairs = list(zip(values[row], indices[row]))
        init = (dtype(init_value), np.int32(0))
        want = pairwise_fold(init, pairs, largest)
        # the reducer is associative: the sequential fold agrees
        assert _bits(want[0]) == _bits(sequential_fold(init, pairs, largest)[0])
        assert _bits(got_values[row]) == _bits(want[0]), (row, values[row], indices[row])
        assert got_indices[row] == want[1], (row, values[row], indices[row])


def test_argmax_over_iota_is_numpys_first_maximum_with_nan_first():
    x = RNG.standard_normal((64, 9)).astype(np.float32).round(0)      # many ties
    x[RNG.random(x.shape) < 0.05] = np.nan
    text = hlo_module("""
  p = f32[64,9] parameter(0)
  iota = s32[64,9] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[64], s32[64]) reduce(p, iota, ninf, zero), dimensions={1}, to_apply=red""",
                      arg_reducer())
    values, indices = run_hlo(text, x)
    np.testing.assert_array_equal(indices, np.argmax(x, axis=1))     # NaN counts as largest
    np.testing.assert_array_equal(values, np.max(x, axis=1))


def test_argmax_over_leading_dimensions():
    x = RNG.integers(-3, 3, (4, 5, 6)).astype(np.float32)
    text = hlo_module("""
  p = f32[4,5,6] parameter(0)
  iota = s32[4,5,6] iota(), iota_dimension=0
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[5], s32[5]) reduce(p, iota, ninf, zero), dimensions={0,2}, to_apply=red""",
                      arg_reducer())
    values, indices = run_hlo(text, x)
    for j in range(5):
        pairs = [(x[a, j, c], np.int32(a)) for a in range(4) for c in range(6)]
        want = pairwise_fold((np.float32(-np.inf), np.int32(0)), pairs, True)
        assert values[j] == want[0] and indices[j] == want[1]


def test_a_tuple_of_ufuncs_reduces_each_operand():
    x = RNG.standard_normal((6, 5)).astype(np.float32)
    y = RNG.integers(-100, 100, (6, 5)).astype(np.int32)
    text = hlo_module("""
  p = f32[6,5] parameter(0)
  q = s32[6,5] parameter(1)
  a = f32[] constant(1)
  b = s32[] constant(7)
  ROOT r = (f32[6], s32[6]) reduce(p, q, a, b), dimensions={1}, to_apply=red""", """
red {
  a = f32[] parameter(0)
  b = s32[] parameter(1)
  c = f32[] parameter(2)
  d = s32[] parameter(3)
  s = f32[] add(a, c)
  m = s32[] maximum(d, b)
  ROOT r = (f32[], s32[]) tuple(s, m)
}""")
    sums, maxima = run_hlo(text, x, y)
    np.testing.assert_allclose(sums, 1 + x.astype(np.float64).sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(maxima, np.maximum(7, y.max(axis=1)))


def _bits(value) -> bytes:
    return np.asarray(value).tobytes()
