"""Kernels for the less common opcodes: topk, domain, get-dimension-size, count-leading-zeros."""
from __future__ import annotations

import numpy as np

from interpreter_helpers import run_hlo


def test_topk_largest_and_smallest_are_stable_along_the_last_dim():
    x = np.array([[3, 1, 3, 2], [0, 5, 5, 1]], np.float32)
    values, indices = run_hlo("""
ENTRY e {
  x = f32[2,4] parameter(0)
  ROOT t = (f32[2,3], s32[2,3]) topk(x), k=3, largest=true
}""", x)
    np.testing.assert_array_equal(values, [[3, 3, 2], [5, 5, 1]])
    np.testing.assert_array_equal(indices, [[0, 2, 3], [1, 2, 3]])
    values, indices = run_hlo("""
ENTRY e {
  x = f32[2,4] parameter(0)
  ROOT t = (f32[2,2], s32[2,2]) topk(x), k=2, largest=false
}""", x)
    np.testing.assert_array_equal(values, [[1, 2], [0, 1]])
    np.testing.assert_array_equal(indices, [[1, 3], [0, 3]])


def test_domain_and_get_dimension_size():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = run_hlo("""
ENTRY e {
  x = s32[2,3] parameter(0)
  d = s32[2,3] domain(x), domain={kind="sharding", entry={maximal device=0}, exit={replicated}}
  n = s32[] get-dimension-size(d), dimensions={1}
  ROOT t = (s32[2,3], s32[]) tuple(d, n)
}""", x)
    np.testing.assert_array_equal(out[0], x)
    assert out[1] == 3 and out[1].dtype == np.int32


def test_count_leading_zeros_against_python_bit_length():
    x = np.array([0, 1, 2, 255, 256, 2**31 - 1, -1, -2**31], np.int32)
    got = run_hlo("""
ENTRY e {
  x = s32[8] parameter(0)
  ROOT c = s32[8] count-leading-zeros(x)
}""", x)
    want = [32 - (int(v) & 0xFFFFFFFF).bit_length() for v in x]
    np.testing.assert_array_equal(got, want)
