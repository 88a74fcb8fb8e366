"""Indexing kernels: gather, scatter, dynamic-slice, dynamic-update-slice (XLA's semantics).

- gather: every dimension number, including batching dims and `index_vector_dim == rank(indices)`
  (an implicit trailing index vector of length 1). Start indices are CLAMPED so that the whole
  slice lies inside the operand.
- scatter: variadic, every dimension number. An update whose full window does not fit inside the
  operand at its start index is SKIPPED (XLA's evaluator and ScatterExpander). Updates to the same
  element are combined in order (scatter index major, window index minor). `indices_are_sorted`
  and `unique_indices` are hints and ignored.
- dynamic-slice / dynamic-update-slice: start indices are clamped into `[0, dim - size]`; a
  dynamic-slice is a view of its operand.

All index arithmetic is vectorised: broadcast index arrays for numpy fancy indexing. The only loop
over data is the scatter fallback for a combiner that is not a plain ufunc, which runs one
vectorised round per multiplicity of the most repeated target element.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS

from .. import spill
from .specialising import SpecialisedKernel
from ..computation_patterns import apply_scalar_computation, reducer_ufunc_of


def as_index_array(a: np.ndarray) -> np.ndarray:
    """Integer indices as int64, saturating u64 values that do not fit (they clamp the same way)."""
    a = np.asarray(a)
    if a.dtype == np.uint64:
        a = np.minimum(a, np.iinfo(np.int64).max)
    return a.astype(np.int64)


def _dims(inst, name: str) -> tuple[int, ...]:
    return tuple(inst.attr(name, ()))


def _operand_starts(indices: np.ndarray, index_vector_dim: int, index_to_operand: tuple[int, ...],
                    operand_batching: tuple[int, ...], indices_batching: tuple[int, ...],
                    operand_rank: int) -> np.ndarray:
    """The unclamped operand start index of every index vector: shape [batch..., operand_rank].

    `batch...` are the dims of `indices` other than `index_vector_dim`, in order. Component
    `index_to_operand[k]` is the k-th index vector entry; operand batching dim `operand_batching[i]`
    takes the position along indices dim `indices_batching[i]`; every other component is 0."""
    indices = as_index_array(indices)
    if index_vector_dim == indices.ndim:
        vectors = indices[..., None]
    else:
        vectors = np.moveaxis(indices, index_vector_dim, -1)
    batch_shape = vectors.shape[:-1]
    starts = np.zeros(batch_shape + (operand_rank,), np.int64)
    for k, d in enumerate(index_to_operand):
        starts[..., d] = vectors[..., k]
    for operand_dim, indices_dim in zip(operand_batching, indices_batching):
        axis = indices_dim if indices_dim < index_vector_dim else indices_dim - 1
        shape = [1] * len(batch_shape)
        shape[axis] = batch_shape[axis]
        starts[..., operand_dim] = np.arange(batch_shape[axis]).reshape(shape)
    return starts


def _window_index(starts: np.ndarray, window_sizes) -> tuple[np.ndarray, ...]:
    """Broadcastable index arrays selecting, for every start ([batch..., rank]), the window of
    `window_sizes` at that start: together they index a [batch..., *window_sizes] block."""
    batch_rank, rank = starts.ndim - 1, starts.shape[-1]
    index = []
    for d in range(rank):
        start = starts[..., d].reshape(starts.shape[:-1] + (1,) * rank)
        offset_shape = [1] * (batch_rank + rank)
        offset_shape[batch_rank + d] = window_sizes[d]
        index.append(start + np.arange(window_sizes[d]).reshape(offset_shape))
    return tuple(index)


@KERNELS.register("gather")
def gather(inst, args, ctx):
    """`gather(operand, start_indices)`: for each index vector, the `slice_sizes` slice at the
    (clamped) start, with collapsed and operand-batching dims removed; result dims `offset_dims`
    hold the slice dims in order and the other result dims the indices' batch dims in order."""
    operand, indices = args
    ivd = inst.attr("index_vector_dim")
    sizes = _dims(inst, "slice_sizes")
    collapsed = _dims(inst, "collapsed_slice_dims")
    batching = _dims(inst, "operand_batching_dims")
    offset_dims = _dims(inst, "offset_dims")
    starts = _operand_starts(indices, ivd, _dims(inst, "start_index_map"), batching,
                             _dims(inst, "start_indices_batching_dims"), operand.ndim)
    starts = np.clip(starts, 0, np.subtract(operand.shape, sizes, dtype=np.int64))
    block = operand[_window_index(starts, sizes)]
    batch_rank = starts.ndim - 1
    kept = [d for d in range(operand.ndim) if d not in collapsed and d not in batching]
    block = block.reshape(block.shape[:batch_rank] + tuple(sizes[d] for d in kept))
    batch_axes, window_axes = iter(range(batch_rank)), iter(range(batch_rank, block.ndim))
    order = [next(window_axes) if p in offset_dims else next(batch_axes)
             for p in range(block.ndim)]
    return block.transpose(order).astype(dtypes.numpy_dtype(inst.shape.element_type), copy=False)


@KERNELS.register("scatter")
def scatter(inst, args, ctx):
    """`scatter(operand_1..N, scatter_indices, update_1..N)`, `to_apply` combining (operand values,
    update values) -> new operand values. Result: the updated operand, or the tuple of them."""
    n = (len(args) - 1) // 2
    operands, indices, updates = args[:n], args[n], args[n + 1:]
    window_dims = _dims(inst, "update_window_dims")
    inserted = _dims(inst, "inserted_window_dims")
    batching = _dims(inst, "input_batching_dims")
    shape = operands[0].shape
    rank = len(shape)
    starts = _operand_starts(indices, inst.attr("index_vector_dim"),
                             _dims(inst, "scatter_dims_to_operand_dims"), batching,
                             _dims(inst, "scatter_indices_batching_dims"), rank)
    window_operand_dims = [d for d in range(rank) if d not in inserted and d not in batching]
    update_shape = updates[0].shape
    window_sizes = [1] * rank
    for update_dim, operand_dim in zip(window_dims, window_operand_dims):
        window_sizes[operand_dim] = update_shape[update_dim]
    fits = np.all((starts >= 0) & (starts <= np.subtract(shape, window_sizes, dtype=np.int64)),
                  axis=-1)
    # flat operand position of every update element, ordered [scatter dims..., window dims...]
    strides = np.array([int(np.prod(shape[d + 1:])) for d in range(rank)], np.int64)
    batch_rank = starts.ndim - 1
    target = (starts * strides).sum(axis=-1).reshape(starts.shape[:-1] + (1,) * len(window_dims))
    for k, operand_dim in enumerate(window_operand_dims):
        offset_shape = [1] * (batch_rank + len(window_dims))
        offset_shape[batch_rank + k] = window_sizes[operand_dim]
        target = target + np.arange(window_sizes[operand_dim]).reshape(offset_shape) * \
            strides[operand_dim]
    block_shape = starts.shape[:-1] + tuple(window_sizes[d] for d in window_operand_dims)
    fits = np.broadcast_to(fits.reshape(fits.shape + (1,) * len(window_dims)), block_shape)
    keep = fits.reshape(-1)
    target = np.broadcast_to(target, block_shape).reshape(-1)[keep]
    scatter_dims = [d for d in range(len(update_shape)) if d not in window_dims]
    values = [u.transpose(scatter_dims + list(window_dims)).reshape(-1)[keep] for u in updates]
    flats = [np.array(x, copy=True).reshape(-1) for x in operands]
    computation = ctx.module.computation(inst.attr("to_apply").name)
    ufunc = reducer_ufunc_of(ctx, computation.name) if n == 1 else None
    if ufunc is not None:
        ufunc.at(flats[0], target, values[0])
    else:
        _combine_in_order(ctx, computation.name, flats, target, values)
    results = [flat.reshape(shape) for flat in flats]
    return results[0] if n == 1 else tuple(results)


def _combine_in_order(ctx, computation_name: str, flats: list[np.ndarray], target: np.ndarray,
                      values: list[np.ndarray]) -> None:
    """`flats[target[j]] = combine(flats[target[j]], values[j])` for j in order, in rounds: round r
    applies, all at once, the r-th update of every target element (distinct within a round)."""
    if not target.size:
        return
    order = np.argsort(target, kind="stable")
    sorted_target = target[order]
    first = np.r_[True, sorted_target[1:] != sorted_target[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(target.size), 0))
    occurrence = np.empty_like(order)
    occurrence[order] = np.arange(target.size) - group_start
    by_round = np.argsort(occurrence, kind="stable")
    bounds = np.cumsum(np.bincount(occurrence))
    for lo, hi in zip(np.r_[0, bounds[:-1]], bounds):
        chosen = by_round[lo:hi]
        where = target[chosen]
        combined = apply_scalar_computation(
            ctx, computation_name, [flat[where] for flat in flats] + [v[chosen] for v in values])
        for flat, value in zip(flats, combined if len(flats) > 1 else (combined,)):
            flat[where] = value


def _window(starts, bounds) -> tuple[slice, ...]:
    """The window of a dynamic slice or update: per dimension, the start (a scalar) clamped into
    `[0, top]` and `size` elements from it, for `bounds` of `(top, size)`."""
    window = []
    for start, (top, size) in zip(starts, bounds):
        # a Python int: an unsigned start beyond the int64 range clamps like its saturated value
        b = min(max(int(start), 0), top)
        window.append(slice(b, b + size))
    return tuple(window)


def _dynamic_slice_of(inst, shapes):
    """The kernel of dynamic-slice `inst` on operands of `shapes`: `dynamic-slice(operand,
    start...)` (scalar starts, or one rank-1 vector of them), `dynamic_slice_sizes` per dim,
    starts clamped; a view of the operand."""
    sizes = _dims(inst, "dynamic_slice_sizes")
    bounds = tuple((dim - size, size) for dim, size in zip(shapes[0], sizes))
    if len(shapes) == 2 and len(shapes[1]) == 1:
        return lambda inst, args, ctx: args[0][_window(list(args[1]), bounds)]
    return lambda inst, args, ctx: args[0][_window(args[1:], bounds)]


def dynamic_slice(inst, args, ctx):
    return _dynamic_slice_of(inst, [np.shape(a) for a in args])(inst, args, ctx)


def _dynamic_slice_for(inst):
    return _dynamic_slice_of(inst, [op.shape.dims for op in inst.operands])


KERNELS.add(SpecialisedKernel(dynamic_slice, _dynamic_slice_for), "dynamic-slice")


def dynamic_slice_of_pad_for(inst) -> Callable:
    """The kernel of `dynamic-slice(pad(x, value), start...)` without the padded array (the
    interpreter's fusion, see `runtime/interpreter.py`), made for the dynamic-slice `inst`, whose
    operand is a pad without interior padding; its `args` are `x`, `value` and the starts. The
    window is a view of `x` when it lies inside it, else a fresh array (`spill.full`) of `value`
    with `x`'s part copied in."""
    pad = inst.operands[0]
    pads = pad.attrs["padding"]
    sizes = _dims(inst, "dynamic_slice_sizes")
    x_dims = pad.operands[0].shape.dims
    padded = [p.low + n + p.high for n, p in zip(x_dims, pads)]
    bounds = tuple((dim - size, size) for dim, size in zip(padded, sizes))
    lows = [p.low for p in pads]
    vector = len(inst.operands) == 2 and len(inst.operands[1].shape.dims) == 1

    def kernel(inst, args, ctx):
        x, value = args[0], args[1]
        window = _window(list(args[2]) if vector else args[2:], bounds)
        begin = [w.start - low for w, low in zip(window, lows)]
        inside = [(max(b, 0), min(b + s, n)) for b, s, n in zip(begin, sizes, x_dims)]
        if all(lo == b and hi == b + s for (lo, hi), b, s in zip(inside, begin, sizes)):
            return x[tuple(slice(b, b + s) for b, s in zip(begin, sizes))]
        out = spill.full(sizes, value, x.dtype)
        if all(lo < hi for lo, hi in inside):
            out[tuple(slice(lo - b, hi - b) for (lo, hi), b in zip(inside, begin))] = \
                x[tuple(slice(lo, hi) for lo, hi in inside)]
        return out
    return kernel


def _dynamic_update_slice_of(shapes):
    """The dynamic-update-slice kernel for operands of `shapes`: `dynamic-update-slice(operand,
    update, start...)`, a copy of operand with update written at the clamped start."""
    bounds = tuple((dim - size, size) for dim, size in zip(shapes[0], shapes[1]))
    vector = len(shapes) == 3 and len(shapes[2]) == 1

    def kernel(inst, args, ctx):
        result = args[0].copy()
        result[_window(list(args[2]) if vector else args[2:], bounds)] = args[1]
        return result
    return kernel


def dynamic_update_slice(inst, args, ctx):
    return _dynamic_update_slice_of([np.shape(a) for a in args])(inst, args, ctx)


def _dynamic_update_slice_for(inst):
    return _dynamic_update_slice_of([op.shape.dims for op in inst.operands])


KERNELS.add(SpecialisedKernel(dynamic_update_slice, _dynamic_update_slice_for),
            "dynamic-update-slice")
