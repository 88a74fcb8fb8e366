"""Bit-for-bit equality of runtime values, for the tests that compare two executions of one
program (importable by name from the tests: the tests folder is on the path)."""
from __future__ import annotations

import numpy as np


def assert_same_bits(got, want) -> None:
    """`got` and `want` (arrays, or tuples of them, nested alike) hold the same values bit for
    bit: the same dtype and shape, and the same bytes (NaN payloads and the sign of zero
    included)."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_bits(g, w)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.frombuffer(got.tobytes(), np.uint8),
                                  np.frombuffer(want.tobytes(), np.uint8))
