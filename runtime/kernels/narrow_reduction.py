"""bf16 and f16 sums and products in `reduce` and `reduce-window`, as XLA's CPU backend computes them.

A reducer on a 16-bit float type rounds after every step (its `add` or `multiply` has a bf16 or
f16 result), so the order of the steps shows in the result. XLA:CPU's order:

- `reduce`: while a reduced dimension is longer than 32, the reduced dimensions are cut into
  windows of `min(size, 32)` elements (the last windows padded evenly on both sides, the padding
  skipped), each window is reduced starting from the init value, and the windows' results take the
  place of the operand; then every output element is `init` combined with the remaining elements
  one at a time, in row-major order of the reduced indices. (The init value therefore joins every
  window, which matters only when it is not the reducer's identity.)
- `reduce-window`: each window is `init` combined with its elements one at a time, in row-major
  order of the window, padding and dilation holes skipped.

Each step computes in f32 and rounds to the element type, which is the correctly rounded 16-bit
result.
"""
from __future__ import annotations

from math import ceil

import ml_dtypes
import numpy as np

#: the float types whose sums and products round at every step here
NARROW_FLOATS = frozenset({np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)})
#: the window XLA:CPU cuts long reduced dimensions into
TREE_WINDOW = 32

_F32 = np.dtype(np.float32)


def reduce(x: np.ndarray, dims, ufunc: np.ufunc, init: np.ndarray,
           identity: np.ndarray) -> np.ndarray:
    """`x` reduced over `dims` with `ufunc` (np.add or np.multiply) from `init`, rounding after
    every step, in XLA:CPU's order (see the module docstring). `identity` combines with any value
    to that value exactly (-0 for sums, 1 for products): padding with it is skipping."""
    dims = tuple(sorted(dims))
    while any(x.shape[d] > TREE_WINDOW for d in dims):
        x = _window_level(x, dims, ufunc, init, identity)
    return sequential(np.moveaxis(x, dims, range(x.ndim - len(dims), x.ndim)), len(dims),
                      ufunc, init)


def sequential(windows: np.ndarray, count: int, ufunc: np.ufunc, init) -> np.ndarray:
    """Each element of the leading dims of `windows` is `init` combined one at a time with the
    elements of its trailing `count` dims, in row-major order, rounding after every step."""
    lead = windows.shape[:windows.ndim - count]
    acc = np.broadcast_to(np.asarray(init, windows.dtype), lead)
    for index in np.ndindex(*windows.shape[windows.ndim - count:]):
        acc = ufunc(acc.astype(_F32), windows[(Ellipsis, *index)].astype(_F32)).astype(
            windows.dtype)
    return np.asarray(acc)


def _window_level(x: np.ndarray, dims: tuple[int, ...], ufunc: np.ufunc, init,
                  identity: np.ndarray) -> np.ndarray:
    """One level of the tree: windows of `min(size, TREE_WINDOW)` along each reduced dim, each
    reduced from `init`; the result has the windows' count in place of each reduced dim."""
    pads, split = [], []
    for d, size in enumerate(x.shape):
        if d not in dims:
            pads.append((0, 0))
            split.append(size)
            continue
        window = min(size, TREE_WINDOW)
        count = ceil(size / window)
        low = (count * window - size) // 2
        pads.append((low, count * window - size - low))
        split += [count, window]
    padded = np.pad(x, pads, constant_values=identity)
    window_axes = [d + i + 1 for i, d in enumerate(dims)]
    windows = np.moveaxis(padded.reshape(split), window_axes,
                          range(len(split) - len(dims), len(split)))
    return sequential(windows, len(dims), ufunc, init)
