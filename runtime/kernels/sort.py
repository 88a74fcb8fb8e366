"""sort: variadic sort along one dimension with a comparator computation.

Semantics are XLA's: `sort(x_0, ..., x_{n-1}), dimensions={d}, to_apply=less` permutes every operand
along `d` by the order `less(x_0[i], x_0[j], x_1[i], x_1[j], ...)` (parameters 2k and 2k+1 are
operand k's left and right element). The result here is always stable, which satisfies both
`is_stable=true` and the unstable contract.

Comparators that are lexicographic chains of LT/GT comparisons of per-element keys
(`computation_patterns.comparator_keys`) become a numpy stable argsort/lexsort of the key values
mapped to order-preserving integers (TOTALORDER; default float order with -0 == +0). Any other
comparator is applied vectorised inside a bottom-up merge sort: each merge pass places every element
by a binary search in the neighbouring run, evaluating the comparator on all elements at once
(O(log^2 n) comparator evaluations in total).
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.shapes import TupleShape

from .. import computation_patterns as patterns
from .elementwise import total_order_key


@KERNELS.register("sort")
def _sort(inst, args, ctx):
    dim = inst.attrs["dimensions"][0]
    name = inst.attrs["to_apply"].name
    moved = [np.moveaxis(a, dim, -1) for a in args]
    if moved[0].shape[-1] > 1 and moved[0].size:
        keys = ctx.cache.get(("comparator-keys", name), False)
        if keys is False:
            keys = ctx.cache[("comparator-keys", name)] = patterns.comparator_keys(
                ctx.module.computation(name))
        if keys is not None:
            order = _lexicographic_order(
                [patterns.sort_key_values(ctx, name, key, moved) for key in keys], keys)
        else:
            order = _comparator_order(ctx, name, moved)
        moved = [np.take_along_axis(m, order, axis=-1) for m in moved]
    results = [np.moveaxis(m, -1, dim) for m in moved]
    return tuple(results) if isinstance(inst.shape, TupleShape) else results[0]


def _lexicographic_order(values: list[np.ndarray], keys) -> np.ndarray:
    arrays = [_order_key(v, k) for v, k in zip(values, keys)]
    if len(arrays) == 1:
        return np.argsort(arrays[0], axis=-1, kind="stable")
    return np.lexsort(arrays[::-1], axis=-1)


def _order_key(x: np.ndarray, key: patterns.SortKey) -> np.ndarray:
    """Integers (or the values themselves) whose ascending order is the key's order."""
    element_type = dtypes.element_type_of(x.dtype)
    if dtypes.is_float(element_type):
        if not key.total_order:   # default float order: -0 == +0; NaNs (unordered) last
            x = np.where(np.isnan(x), np.array(np.nan).astype(x.dtype), x + np.zeros((), x.dtype))
        ordered = total_order_key(x)
    elif element_type == "pred":
        ordered = x.astype(np.int8)
    else:
        ordered = x
    return ~ordered if key.descending else ordered


def _comparator_order(ctx, name: str, operands: list[np.ndarray]) -> np.ndarray:
    """The stable sorting permutation along the last axis under comparator `name`."""
    shape = operands[0].shape
    n = shape[-1]
    rows = [o.reshape(-1, n) for o in operands]
    order = np.broadcast_to(np.arange(n), rows[0].shape).copy()
    position = np.arange(n)
    width = 1
    while width < n:
        start = position - position % (2 * width)
        in_first = position - start < width
        first_len = np.minimum(width, n - start)
        second_len = np.clip(n - start - width, 0, width)
        other_start = np.where(in_first, start + width, start)
        other_len = np.where(in_first, second_len, first_len)
        current = [np.take_along_axis(r, order, axis=-1) for r in rows]
        # first-run elements go after the second-run elements that are less than them;
        # second-run elements go after the first-run elements they are not less than
        low = np.zeros(order.shape, np.int64)
        high = np.broadcast_to(other_len, order.shape).copy()
        while True:
            active = low < high
            if not active.any():
                break
            mid = (low + high) // 2
            probe = np.minimum(other_start + np.minimum(mid, np.maximum(other_len - 1, 0)), n - 1)
            other = [np.take_along_axis(c, probe, axis=-1) for c in current]
            pairs = []
            for o, c in zip(other, current):
                pairs += [np.where(in_first, o, c), np.where(in_first, c, o)]
            less = patterns.apply_scalar_computation(ctx, name, pairs)
            after = np.where(in_first, less, ~less)
            low = np.where(active & after, mid + 1, low)
            high = np.where(active & ~after, mid, high)
        target = start + np.where(in_first, position - start, position - start - width) + low
        order = np.take_along_axis(order, np.argsort(target, axis=-1, kind="stable"), axis=-1)
        width *= 2
    return order.reshape(shape)
