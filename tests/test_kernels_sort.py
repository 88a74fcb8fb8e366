"""sort against Python's stable `sorted` with keys written out per comparator, on both paths: the
recognised lexicographic comparators (numpy argsort/lexsort) and arbitrary comparators (vectorised
merge sort)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.computation_patterns import SortKey, comparator_keys

from interpreter_helpers import run_hlo

RNG = np.random.default_rng(5)


def comparator(body: str, params: str = "f32") -> str:
    """A comparator named `less` over operands of the given element types (space separated)."""
    lines = []
    for k, t in enumerate(params.split()):
        lines.append(f"  a{k} = {t}[] parameter({2 * k})")
        lines.append(f"  b{k} = {t}[] parameter({2 * k + 1})")
    return "less {\n" + "\n".join(lines) + "\n" + body + "\n}"


def sort_module(less: str, operands: list[str], dim: int) -> str:
    params = "\n".join(f"  p{i} = {s} parameter({i})" for i, s in enumerate(operands))
    names = ", ".join(f"p{i}" for i in range(len(operands)))
    result = operands[0] if len(operands) == 1 else "(" + ", ".join(operands) + ")"
    return (f"HloModule m\n{less}\nENTRY main {{\n{params}\n  ROOT s = {result} sort({names}), "
            f"dimensions={{{dim}}}, is_stable=true, to_apply=less\n}}")


def stable_order(n, key):
    return sorted(range(n), key=key)


LT = comparator("  ROOT r = pred[] compare(a0, b0), direction=LT")
GT_FLIPPED = comparator("  ROOT r = pred[] compare(b0, a0), direction=LT")
# the same order as LT, in a form no pattern recognises: not(a >= b), via a select
NOT_GE = comparator("""  ge = pred[] compare(a0, b0), direction=GE
  t = pred[] constant(true)
  f = pred[] constant(false)
  ROOT r = pred[] select(ge, f, t)""")


@pytest.mark.parametrize("less", [LT, NOT_GE], ids=["pattern", "generic"])
@pytest.mark.parametrize("n", [1, 2, 13, 64, 100])
def test_sort_ascending_rows(less, n):
    x = RNG.integers(-20, 20, (3, n)).astype(np.float32)
    out = run_hlo(sort_module(less, [f"f32[3,{n}]"], 1), x)
    np.testing.assert_array_equal(out, np.sort(x, axis=1))


@pytest.mark.parametrize("less", [GT_FLIPPED, comparator("""  x = pred[] compare(b0, a0), direction=GE
  ROOT r = pred[] not(x)""")], ids=["pattern", "generic"])
def test_sort_descending_with_payload_is_stable(less):
    """A key-only comparator on (values, iota): equal values keep their original order."""
    n = 37
    x = RNG.integers(0, 5, (2, n)).astype(np.float32)
    idx = np.broadcast_to(np.arange(n, dtype=np.int32), (2, n)).copy()
    less = less.replace("  ROOT", "  c0 = s32[] parameter(2)\n  c1 = s32[] parameter(3)\n  ROOT")
    text = sort_module(less, [f"f32[2,{n}]", f"s32[2,{n}]"], 1)
    values, order = run_hlo(text, x, idx)
    for row in range(2):
        expected = stable_order(n, lambda i: -x[row, i])
        np.testing.assert_array_equal(order[row], expected)
        np.testing.assert_array_equal(values[row], x[row, expected])


LEXICOGRAPHIC_SELECT = comparator("""  eq = pred[] compare(a0, b0), direction=EQ
  lt0 = pred[] compare(a0, b0), direction=LT
  gt1 = pred[] compare(a1, b1), direction=GT
  ROOT r = pred[] select(eq, gt1, lt0)""", "s32 f32")
LEXICOGRAPHIC_OR = comparator("""  lt0 = pred[] compare(a0, b0), direction=LT
  eq = pred[] compare(b0, a0), direction=EQ
  gt1 = pred[] compare(a1, b1), direction=GT
  tie = pred[] and(eq, gt1)
  ROOT r = pred[] or(lt0, tie)""", "s32 f32")
# the same order computed arithmetically (no pattern): (a0 < b0) | ((a0 - b0 == 0) & (a1 > b1))
LEXICOGRAPHIC_ARITH = comparator("""  lt0 = pred[] compare(a0, b0), direction=LT
  d = s32[] subtract(a0, b0)
  z = s32[] constant(0)
  eq = pred[] compare(d, z), direction=EQ
  gt1 = pred[] compare(a1, b1), direction=GT
  tie = pred[] and(eq, gt1)
  ROOT r = pred[] or(tie, lt0)""", "s32 f32")


@pytest.mark.parametrize("less", [LEXICOGRAPHIC_SELECT, LEXICOGRAPHIC_OR, LEXICOGRAPHIC_ARITH],
                         ids=["select", "or", "generic"])
def test_variadic_sort_with_two_keys_along_dimension_0(less):
    n = 50
    k0 = RNG.integers(0, 4, (n, 3)).astype(np.int32)
    k1 = RNG.integers(0, 3, (n, 3)).astype(np.float32)
    text = sort_module(less, [f"s32[{n},3]", f"f32[{n},3]"], 0)
    s0, s1 = run_hlo(text, k0, k1)
    for col in range(3):
        expected = stable_order(n, lambda i: (k0[i, col], -k1[i, col]))
        np.testing.assert_array_equal(s0[:, col], k0[expected, col])
        np.testing.assert_array_equal(s1[:, col], k1[expected, col])


def _total_order(v: float) -> int:
    bits = struct.unpack("<i", struct.pack("<f", v))[0]
    return bits ^ 0x7FFFFFFF if bits < 0 else bits


def test_totalorder_sort_orders_nans_and_signed_zeros():
    x = np.array([0.0, -0.0, np.nan, -np.inf, 1.0, -np.nan, np.inf, -1.0, 0.0, -0.0], np.float32)
    x[5] = -np.abs(x[5])
    less = comparator("  ROOT r = pred[] compare(a0, b0), direction=LT, type=TOTALORDER")
    out = run_hlo(sort_module(less, ["f32[10]"], 0), x)
    expected = x[stable_order(10, lambda i: _total_order(float(x[i])))]
    np.testing.assert_array_equal(out.view(np.int32), expected.view(np.int32))


def test_default_float_order_treats_signed_zeros_as_equal():
    x = np.array([0.0, -0.0, 1.0, 0.0, -0.0, -1.0], np.float32)
    out = run_hlo(sort_module(LT, ["f32[6]"], 0), x)
    np.testing.assert_array_equal(np.signbit(out), [True, False, True, False, True, False])


@pytest.mark.parametrize("type_", ["s32", "u8", "pred"])
def test_integer_and_pred_keys_descending(type_):
    dtype = {"s32": np.int32, "u8": np.uint8, "pred": np.bool_}[type_]
    if type_ == "s32":
        x = np.array([3, np.iinfo(np.int32).min, -1, np.iinfo(np.int32).max, 0], np.int32)
    else:
        x = RNG.integers(0, 2 if type_ == "pred" else 256, 9).astype(dtype)
    less = comparator("  ROOT r = pred[] compare(a0, b0), direction=GT", type_)
    out = run_hlo(sort_module(less, [f"{type_}[{x.size}]"], 0), x)
    np.testing.assert_array_equal(out, np.sort(x)[::-1])


# the comparator XLA's TopK rewriter emits: float keys compared as integers, index tie-break
TOPK_COMPARATOR = """less {
  p.0.lhs = f32[] parameter(0)
  bitcast-convert = s32[] bitcast-convert(p.0.lhs)
  constant = s32[] constant(0)
  compare = pred[] compare(bitcast-convert, constant), direction=LT
  constant.1 = u32[] constant(2147483647)
  bitcast-convert.1 = u32[] bitcast-convert(p.0.lhs)
  subtract = u32[] subtract(constant.1, bitcast-convert.1)
  bitcast-convert.2 = s32[] bitcast-convert(subtract)
  select = s32[] select(compare, bitcast-convert.2, bitcast-convert)
  p.0.rhs = f32[] parameter(1)
  bitcast-convert.3 = s32[] bitcast-convert(p.0.rhs)
  compare.1 = pred[] compare(bitcast-convert.3, constant), direction=LT
  bitcast-convert.4 = u32[] bitcast-convert(p.0.rhs)
  subtract.1 = u32[] subtract(constant.1, bitcast-convert.4)
  bitcast-convert.5 = s32[] bitcast-convert(subtract.1)
  select.1 = s32[] select(compare.1, bitcast-convert.5, bitcast-convert.3)
  compare.2 = pred[] compare(select, select.1), direction=GT
  compare.258 = pred[] compare(select.1, select), direction=GT
  compare.259 = pred[] compare(compare.2, compare.258), direction=EQ
  p.1.lhs = s32[] parameter(2)
  p.1.rhs = s32[] parameter(3)
  compare.260 = pred[] compare(p.1.lhs, p.1.rhs), direction=LT
  ROOT select.86 = pred[] select(compare.259, compare.260, compare.2)
}"""


def test_topk_style_comparator_with_bit_tricks_and_index_tie_break():
    n = 300
    x = RNG.integers(-8, 8, (2, n)).astype(np.float32) / 4
    x[0, :5] = -0.0
    idx = RNG.permutation(2 * n).reshape(2, n).astype(np.int32)
    values, order = run_hlo(sort_module(TOPK_COMPARATOR, [f"f32[2,{n}]", f"s32[2,{n}]"], 1), x, idx)

    def key(v):   # the comparator's integer image of a float
        bits = struct.unpack("<i", struct.pack("<f", v))[0]
        return (0x7FFFFFFF - (bits & 0xFFFFFFFF)) - (1 << 32) if bits < 0 else bits

    for row in range(2):
        expected = stable_order(n, lambda i: (-key(float(x[row, i])), idx[row, i]))
        np.testing.assert_array_equal(order[row], idx[row, expected])
        np.testing.assert_array_equal(values[row], x[row, expected])


def test_sort_of_an_empty_dimension():
    out = run_hlo(sort_module(LT, ["f32[0,3]"], 0), np.zeros((0, 3), np.float32))
    assert out.shape == (0, 3)


# --------------------------------------------------------------------------- comparator_keys

def keys_of(less: str):
    """(key expression, descending, total order) per key; a parameter expression is its number."""
    module = parse_module(f"HloModule m\n{less}\nENTRY main {{\n  ROOT p = f32[] parameter(0)\n}}")
    keys = comparator_keys(module.computation("less"))
    if keys is None:
        return None
    return tuple((k.expression.parameter_number if k.expression.opcode == "parameter"
                  else k.expression.name, k.descending, k.total_order) for k in keys)


def test_comparator_keys_recognises_chains_and_rejects_others():
    assert keys_of(LT) == ((0, False, False),)
    assert keys_of(GT_FLIPPED) == ((0, True, False),)
    assert keys_of(LEXICOGRAPHIC_SELECT) == ((0, False, False), (2, True, False))
    assert keys_of(LEXICOGRAPHIC_OR) == ((0, False, False), (2, True, False))
    assert keys_of(comparator("  ROOT r = pred[] compare(a0, b0), direction=GT, type=TOTALORDER")) \
        == ((0, True, True),)
    # XLA's TopK comparator: an integer image of the float key, descending, then the index
    assert keys_of(TOPK_COMPARATOR) == (("select", True, False), (2, False, False))
    for generic in (NOT_GE, LEXICOGRAPHIC_ARITH,
                    comparator("  ROOT r = pred[] compare(a0, a0), direction=LT"),
                    comparator("  ROOT r = pred[] compare(a0, b1), direction=LT", "f32 f32"),
                    comparator("""  x = f32[] negate(a0)
  ROOT r = pred[] compare(x, b0), direction=LT""")):
        assert keys_of(generic) is None


SUM_KEY_THEN_SECOND = comparator("""  sa = f32[] add(a0, a1)
  sb = f32[] add(b0, b1)
  ne = pred[] compare(sa, sb), direction=NE
  lt = pred[] compare(sa, sb), direction=LT
  gt1 = pred[] compare(a1, b1), direction=GT
  ROOT r = pred[] select(ne, lt, gt1)""", "f32 f32")


def test_key_expression_over_two_operands_with_not_equal_tie_break():
    n = 40
    x0 = RNG.integers(0, 4, n).astype(np.float32)
    x1 = RNG.integers(0, 4, n).astype(np.float32)
    assert keys_of(SUM_KEY_THEN_SECOND) == (("sa", False, False), (2, True, False))
    s0, s1 = run_hlo(sort_module(SUM_KEY_THEN_SECOND, [f"f32[{n}]", f"f32[{n}]"], 0), x0, x1)
    expected = stable_order(n, lambda i: (x0[i] + x1[i], -x1[i]))
    np.testing.assert_array_equal(s0, x0[expected])
    np.testing.assert_array_equal(s1, x1[expected])
