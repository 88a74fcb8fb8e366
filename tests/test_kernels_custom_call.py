"""custom-call targets through the parser and interpreter: annotations are the identity, shape-
changing manual boundaries and unknown targets are rejected clearly, TopK against a sort written
here (Python's stable `sorted` on a total-order key)."""
from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest

from gspmdc.errors import UnsupportedError
from gspmdc.ir.custom_call_targets import ANNOTATIONS
from gspmdc.ir.parser import parse_module
from gspmdc.runtime.interpreter import evaluate
from gspmdc.runtime.kernels.custom_call import top_k


def run(text, *args):
    return evaluate(parse_module(text), list(args))


def unary_custom_call(target, in_shape, out_shape, extra=""):
    return f"""HloModule c
ENTRY e {{
  p = {in_shape} parameter(0)
  ROOT c = {out_shape} custom-call(p), custom_call_target="{target}"{extra}
}}
"""


@pytest.mark.parametrize("target", sorted(ANNOTATIONS - {"xla.sdy.ShardingGroup"}) + [
    "SPMDFullToShardShape", "SPMDShardToFullShape", "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape"])
def test_annotations_are_the_identity(target):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run(unary_custom_call(target, "f32[2,3]", "f32[2,3]"), x)
    np.testing.assert_array_equal(out, x)


def test_sharding_with_attributes_inside_a_program():
    text = """HloModule c
ENTRY e {
  p = s32[4,2] parameter(0)
  s = s32[4,2] custom-call(p), custom_call_target="Sharding", sharding={devices=[2,1]<=[2]}, backend_config="unspecified_dims=[1]"
  f = s32[4,2] custom-call(s), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true
  ROOT n = s32[4,2] negate(f)
}
"""
    x = np.arange(8, dtype=np.int32).reshape(4, 2)
    np.testing.assert_array_equal(run(text, x), -x)


def test_sharding_group_has_no_result():
    text = """HloModule c
ENTRY e {
  p = f32[3] parameter(0)
  g = () custom-call(p), custom_call_target="xla.sdy.ShardingGroup", custom_call_has_side_effect=true
  ROOT n = f32[3] negate(p)
}
"""
    np.testing.assert_array_equal(run(text, np.ones(3, np.float32)), -np.ones(3))


def test_shape_changing_manual_boundary_is_rejected():
    with pytest.raises(UnsupportedError, match="SPMDFullToShardShape.*partition the program"):
        run(unary_custom_call("SPMDFullToShardShape", "f32[8,2]", "f32[4,2]",
                              ", sharding={manual}"), np.zeros((8, 2), np.float32))


def test_unknown_target_is_rejected_by_name():
    with pytest.raises(UnsupportedError, match="'my_kernel'"):
        run(unary_custom_call("my_kernel", "f32[2]", "f32[2]"), np.zeros(2, np.float32))


# ----------------------------------------------------------------------------------------- TopK

def float_total_order(v: float) -> tuple:
    """Sort key of HLO's total order, from the IEEE bits (sign, then magnitude bits)."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    negative = bits >> 31
    return (0, -(bits & 0x7FFFFFFF)) if negative else (1, bits)


def top_k_reference(row, k, key=lambda v: v):
    order = sorted(range(len(row)), key=lambda i: key(row[i]), reverse=True)
    # Python's sort is stable, but reverse=True keeps equal elements in their original order
    return [row[i] for i in order[:k]], order[:k]


def test_top_k_custom_call_with_comparator():
    text = """HloModule t
comparator {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT gt = pred[] compare(a, b), direction=GT, type=TOTALORDER
}
ENTRY e {
  p = f32[2,6] parameter(0)
  ROOT t = (f32[2,3], s32[2,3]) custom-call(p), custom_call_target="TopK", called_computations={comparator}
}
"""
    x = np.array([[1, 5, 3, 5, -2, 0], [math.nan, -0.0, 0.0, -math.inf, math.inf, 2]], np.float32)
    values, indices = run(text, x)
    assert indices.dtype == np.int32
    for r in range(2):
        expected_values, expected_indices = top_k_reference(list(x[r]), 3, float_total_order)
        np.testing.assert_array_equal(values[r], np.array(expected_values, np.float32))
        assert list(indices[r]) == expected_indices
    assert list(indices[0]) == [1, 3, 2]       # the tie 5, 5 keeps index order
    assert list(indices[1]) == [0, 4, 5]       # NaN above +inf


def test_top_k_orders_signed_zero_and_negative_values():
    x = np.array([-0.0, 0.0, -1.0, -math.nan, -math.inf], np.float32)
    values, indices = top_k(x, 5)
    assert list(indices) == [1, 0, 2, 4, 3]
    assert math.copysign(1, values[0]) == 1 and math.copysign(1, values[1]) == -1


def test_top_k_integers_and_bf16():
    ints = np.array([[3, -1, 3, 7, 0]], np.int32)
    values, indices = top_k(ints, 2)
    np.testing.assert_array_equal(values, [[7, 3]])
    np.testing.assert_array_equal(indices, [[3, 0]])
    unsigned = np.array([1, 2**32 - 1, 5], np.uint32)
    assert list(top_k(unsigned, 3)[1]) == [1, 2, 0]
    halves = np.array([0.5, -2.0, 3.0, 0.5], ml_dtypes.bfloat16)
    values, indices = top_k(halves, 3)
    assert values.dtype == ml_dtypes.bfloat16
    assert list(indices) == [2, 0, 3]


def test_top_k_of_zero_elements():
    values, indices = top_k(np.zeros((3, 4), np.float32), 0)
    assert values.shape == (3, 0) and indices.shape == (3, 0)
