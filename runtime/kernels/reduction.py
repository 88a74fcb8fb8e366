"""Reductions: reduce, reduce-window, select-and-scatter, map.

Semantics are XLA's:
- `reduce(x..., init...)` over `dimensions` is `f(init, f(...))` over the reduced elements (the
  association order is unspecified; reducers matching a numpy ufunc use the ufunc's reduction,
  variadic reducers of the forms of `reducer_forms.py` (a ufunc per output, argmax/argmin) their
  whole-array equivalent, others are applied as an order-preserving pairwise tree); variadic
  reduces give tuples;
- `reduce-window` reduces each window (size, stride, padding, base dilation = `lhs_dilate`, window
  dilation = `rhs_dilate`); padding and dilation holes are *skipped*, not combined, so a non-identity
  init is combined exactly once per window; ufunc reducers combine a window's elements left to
  right, then the init; a window that makes every output a prefix along one dimension (JAX's
  cumsum) is a cumulative ufunc (`accumulate`) in that order;
- `select-and-scatter`: in each window the element chosen by iterating in row-major order and
  replacing the current choice `c` by `e` whenever `select(c, e)` is false (padding is never
  chosen); then `output = init` everywhere and `output[chosen] = scatter(output[chosen], source)`
  window by window, so overlapping windows accumulate;
- `map` applies its computation elementwise.
bf16/f16 sums and products round after every step, in XLA:CPU's order (`narrow_reduction.py`).
"""
from __future__ import annotations

from math import prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gspmdc.ir import dtypes
from gspmdc.ir.attributes import PadDim
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.shapes import TupleShape

from .. import computation_patterns as patterns
from .. import reducer_forms
from . import narrow_reduction
from .structural import pad_array


@KERNELS.register("reduce")
def _reduce(inst, args, ctx):
    n = len(args) // 2
    xs, inits = args[:n], list(args[n:])
    dims = tuple(inst.attrs["dimensions"])
    name = inst.attrs["to_apply"].name
    x = xs[0]
    kept = tuple(x.shape[d] for d in range(x.ndim) if d not in dims)
    count = prod(x.shape[d] for d in dims)
    form = _reducer_form(ctx, name, n)
    if count == 0 or prod(kept) == 0:
        results = [np.broadcast_to(init, kept) for init in inits]
    elif isinstance(form, np.ufunc):
        results = [_ufunc_reduce(form, x, dims, inits[0])]
    elif isinstance(form, tuple):
        results = [_ufunc_reduce(ufunc, v, dims, init) for ufunc, v, init in zip(form, xs, inits)]
    else:
        moved = [np.moveaxis(v, dims, range(-len(dims), 0)).reshape(kept + (count,)) for v in xs]
        if isinstance(form, reducer_forms.ArgSelection):
            folded = reducer_forms.selected_arg(form, *moved)
            results = list(reducer_forms.combined_arg(form, tuple(inits), folded))
        else:
            folded, _ = _fold_last_axis(ctx, name, moved, None)
            results = _leaves(patterns.apply_scalar_computation(ctx, name, inits + folded))
    return tuple(results) if isinstance(inst.shape, TupleShape) else results[0]


def _reducer_form(ctx, name: str, n: int):
    """How `reduce` runs the reducer `name` of `n` operands: a ufunc (one operand), a tuple of
    ufuncs (`reducer_forms.elementwise_ufuncs`), an `ArgSelection`, or None (the pairwise fold
    of the computation). Worked out once per evaluation context."""
    if n == 1:
        return patterns.reducer_ufunc_of(ctx, name)
    key = ("reducer-form", name)
    if key not in ctx.cache:
        computation = ctx.module.computation(name)
        ctx.cache[key] = reducer_forms.elementwise_ufuncs(computation) or \
            reducer_forms.arg_selection(computation)
    return ctx.cache[key]


def _ufunc_reduce(ufunc: np.ufunc, x: np.ndarray, dims: tuple[int, ...],
                  init: np.ndarray) -> np.ndarray:
    """`init` combined with the reduction of `x` over `dims` by `ufunc` (non-empty)."""
    if _rounds_every_step(ufunc, x.dtype):
        return narrow_reduction.reduce(x, dims, ufunc, init, _identity(ufunc, x.dtype))
    reduced = ufunc.reduce(x, axis=dims, dtype=x.dtype)
    return np.asarray(ufunc(init, reduced)).astype(x.dtype, copy=False)


@KERNELS.register("reduce-window")
def _reduce_window(inst, args, ctx):
    n = len(args) // 2
    xs, inits = args[:n], list(args[n:])
    window = inst.attrs["window"].dims
    name = inst.attrs["to_apply"].name
    out_dims = next(iter(inst.shape.leaves())).dims
    ufunc = patterns.reducer_ufunc_of(ctx, name) if n == 1 else None
    identity = _identity(ufunc, xs[0].dtype) if ufunc is not None else None
    if prod(out_dims) == 0:
        results = [np.broadcast_to(init, out_dims) for init in inits]
    elif identity is not None:
        x = xs[0]
        if _rounds_every_step(ufunc, x.dtype):
            view = _window_view(x, identity, window)
            results = [narrow_reduction.sequential(view, x.ndim, ufunc, inits[0])]
        else:
            axis, reverse = _prefix_axis(window, x.shape)
            if axis is not None and (not reverse or x.dtype.kind in "biu"):
                reduced = _accumulate(ufunc, x, axis, reverse)
            else:
                reduced = _reduce_windows(ufunc, x, identity, window, out_dims)
            results = [np.asarray(ufunc(inits[0], reduced)).astype(x.dtype, copy=False)]
    else:
        size = prod(w.size for w in window)
        valid = _window_view(np.ones(xs[0].shape, np.bool_), np.False_, window)
        valid = valid.reshape(out_dims + (size,))
        windows = [_window_view(x, np.zeros((), x.dtype), window).reshape(out_dims + (size,))
                   for x in xs]
        folded, valid = _fold_last_axis(ctx, name, windows, valid)
        combined = _leaves(patterns.apply_scalar_computation(ctx, name, inits + folded))
        results = [np.where(valid, c, init) for c, init in zip(combined, inits)]
    return tuple(results) if isinstance(inst.shape, TupleShape) else results[0]


@KERNELS.register("select-and-scatter")
def _select_and_scatter(inst, args, ctx):
    operand, source, init = args
    window = inst.attrs["window"].dims
    select = inst.attrs["select"].name
    output = np.full(operand.size, init, operand.dtype)
    if source.size == 0:
        return output.reshape(operand.shape)
    index_type = np.int32 if operand.size < 2 ** 31 else np.int64
    flat_index = np.arange(operand.size, dtype=index_type).reshape(operand.shape)
    positions = _window_view(flat_index, index_type(-1), window)
    values = _window_view(operand, np.zeros((), operand.dtype), window)

    def tap(view, element):     # one window element of every window: memory of the source
        return view[(Ellipsis, *element)].reshape(-1)

    elements = list(np.ndindex(*(w.size for w in window)))     # row-major window order
    chosen, chosen_value = tap(positions, elements[0]), tap(values, elements[0])
    for element in elements[1:]:
        candidate, candidate_value = tap(positions, element), tap(values, element)
        keep = patterns.apply_scalar_computation(ctx, select, [chosen_value, candidate_value])
        take = (candidate >= 0) & ((chosen < 0) | ~keep)
        chosen = np.where(take, candidate, chosen)
        chosen_value = np.where(take, candidate_value, chosen_value)
    found = chosen >= 0
    patterns.accumulate_at(ctx, inst.attrs["scatter"].name, output, chosen[found],
                           source.reshape(-1)[found])
    return output.reshape(operand.shape)


@KERNELS.register("map")
def _map(inst, args, ctx):
    result = patterns.apply_scalar_computation(ctx, inst.attrs["to_apply"].name, args)
    return np.broadcast_to(result, inst.shape.dims)


#: reduce-window combines window elements one at a time (a whole-output ufunc call each) up to
#: this many elements per window, or as many as it has windows; beyond, one ufunc reduction over
#: a view of all the windows
_TAPS = 256


def _reduce_windows(ufunc: np.ufunc, x: np.ndarray, identity: np.ndarray, window,
                    out_dims: tuple[int, ...]) -> np.ndarray:
    """`ufunc` over every window of `x` (padding and base-dilation holes are `identity`). Small
    windows: a loop over the window's elements, each combining one strided slice of the padded
    operand (one element of every window) into the result, so every operation runs over the
    whole output; large ones: one reduction over the sliding-window view."""
    taps = prod(w.size for w in window)
    if taps > max(_TAPS, prod(out_dims)):
        view = _window_view(x, identity, window)
        return ufunc.reduce(view, axis=tuple(range(x.ndim, 2 * x.ndim)), dtype=x.dtype)
    pads = [PadDim(w.padding_low, w.padding_high, w.base_dilation - 1) for w in window]
    padded = pad_array(x, identity, pads)
    result = None
    for element in np.ndindex(*(w.size for w in window)):
        tap = padded[tuple(slice(e * w.window_dilation,
                                 e * w.window_dilation + (n - 1) * w.stride + 1, w.stride)
                           for e, w, n in zip(element, window, out_dims))]
        if result is None:
            result = np.array(tap, copy=True)
        else:
            ufunc(result, tap, out=result)
    return result


def _prefix_axis(window, shape: tuple[int, ...]) -> tuple[int | None, bool]:
    """`(axis, reverse)` when the window makes every output a prefix of `axis` (a cumulative
    reduction, as JAX writes cumsum): along `axis` a window at least as long as the dimension,
    padded low (a prefix) or high (`reverse`: a suffix) by its size less one, stride and
    dilations 1; every other dimension a window of one element without padding. Else
    `(None, False)`."""
    axis, reverse = None, False
    for d, w in enumerate(window):
        if w.stride != 1 or w.base_dilation != 1 or w.window_dilation != 1:
            return None, False
        if w.size == 1 and w.padding_low == w.padding_high == 0:
            continue
        if axis is not None or w.size < shape[d] or w.size < 2:
            return None, False
        if (w.padding_low, w.padding_high) == (w.size - 1, 0):
            axis = d
        elif (w.padding_low, w.padding_high) == (0, w.size - 1):
            axis, reverse = d, True
        else:
            return None, False
    return axis, reverse


def _accumulate(ufunc: np.ufunc, x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """The cumulative `ufunc` of `x` along `axis`: `out[i] = x[0] . x[1] . ... . x[i]` (from the
    end with `reverse`), combined left to right as the window loop of `_reduce_windows` does
    (padding, the identity, first: it changes nothing), so a forward prefix is bit-exact for
    floats too. A reverse prefix is combined from the end, which only integer and boolean
    reductions allow (the caller's condition)."""
    if not reverse:
        return ufunc.accumulate(x, axis=axis, dtype=x.dtype)
    flipped = np.flip(x, axis)
    return np.flip(ufunc.accumulate(flipped, axis=axis, dtype=x.dtype), axis)


def _fold_last_axis(ctx, name: str, xs: list[np.ndarray], valid: np.ndarray | None):
    """Combine along the last axis with computation `name` as a pairwise tree of adjacent
    elements (left-to-right order kept). With `valid`, invalid elements are skipped: the result
    is (values, valid) where valid is False where no element was valid."""
    while xs[0].shape[-1] > 1:
        length = xs[0].shape[-1]
        even = length - length % 2
        left = [x[..., 0:even:2] for x in xs]
        right = [x[..., 1:even:2] for x in xs]
        combined = _leaves(patterns.apply_scalar_computation(ctx, name, left + right))
        if valid is not None:
            valid_left, valid_right = valid[..., 0:even:2], valid[..., 1:even:2]
            both = valid_left & valid_right
            combined = [np.where(both, c, np.where(valid_left, a, b))
                        for c, a, b in zip(combined, left, right)]
            next_valid = valid_left | valid_right
        if length % 2:
            combined = [np.concatenate([c, x[..., -1:]], axis=-1) for c, x in zip(combined, xs)]
            if valid is not None:
                next_valid = np.concatenate([next_valid, valid[..., -1:]], axis=-1)
        xs = combined
        if valid is not None:
            valid = next_valid
    return [x[..., 0] for x in xs], (None if valid is None else valid[..., 0])


def _window_view(x: np.ndarray, fill, window) -> np.ndarray:
    """A view of shape (window positions..., window elements...) over `x` padded and base-dilated
    with `fill`, honouring strides and window dilation."""
    pads = [PadDim(w.padding_low, w.padding_high, w.base_dilation - 1) for w in window]
    padded = pad_array(x, fill, pads)
    extent = [(w.size - 1) * w.window_dilation + 1 for w in window]
    view = sliding_window_view(padded, extent)
    return view[tuple(slice(None, None, w.stride) for w in window)
                + tuple(slice(None, None, w.window_dilation) for w in window)]


def _rounds_every_step(ufunc: np.ufunc | None, dtype: np.dtype) -> bool:
    """Whether the order of the reduction's steps shows in its result: bf16/f16 sums and
    products (each step rounds; `narrow_reduction.py`)."""
    return dtype in narrow_reduction.NARROW_FLOATS and ufunc in (np.add, np.multiply)


def _identity(ufunc: np.ufunc, dtype: np.dtype) -> np.ndarray | None:
    """The identity element of `ufunc` on `dtype` (None where there is none, e.g. complex max)."""
    element_type = dtypes.element_type_of(dtype)
    floating = dtypes.is_float(element_type)
    if ufunc is np.add:
        value = -0.0 if floating else 0
    elif ufunc is np.multiply:
        value = 1
    elif ufunc in (np.maximum, np.minimum):
        if dtypes.is_complex(element_type):
            return None
        low = ufunc is np.maximum
        if floating:
            value = -np.inf if low else np.inf
        elif element_type == "pred":
            value = not low
        else:
            info = np.iinfo(dtype)
            value = info.min if low else info.max
    elif ufunc is np.bitwise_and:
        return np.array(-1, np.int64).astype(dtype) if element_type != "pred" else np.True_
    else:
        value = 0
    return np.array(value).astype(dtype)


def _leaves(value) -> list[np.ndarray]:
    return list(value) if isinstance(value, tuple) else [value]
