"""The convolution kernel: XLA's ConvGeneralDilated as one matrix product per tile of output
positions.

Layout: the input is viewed channels-last, `[N, S..., C]`, and the kernel as `[K..., I, O]` (views:
for JAX's `b01f` / `01io` layouts nothing moves). The input is base-dilated and padded once, in
its own type, only when the window asks for it; every output position's patch is then a strided
window of it (`sliding_window_view`: window strides, window dilation), ordered `[K..., I]` so
that the input's contiguous channel runs stay contiguous. Output positions are cut into tiles of
about `TILE_BYTES` of patches (at most `IM2COL_BYTES`); a tile's patches are copied once, straight
into a contiguous buffer of the accumulation type (f32 for bf16 and f16; one buffer reused by
every tile), and multiplied by the kernel matrix
`[K * I, O / G]` into the tile's rows of the result, which is itself channels-last `[N', P..., O]`.
A group (`feature_group_count`: the channels and output features split group-major;
`batch_group_count`: the batch and output features split group-major) is one such product per
tile on its slice of the channels or the batch, except when every group reads one channel
(depthwise convolutions): then each kernel tap multiplies one strided slice of the input into the
whole output at once.

Numerics as the other contractions (`contraction.py`): products accumulate in the result type,
bf16/f16 in f32 rounded once, integers wrap, a pred result is the OR of ANDs.
"""
from __future__ import annotations

from math import prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir.attributes import Window
from gspmdc.ir.ops import KERNELS

from .. import spill
from .contraction import accumulation_dtype, to_result

#: the most patch bytes one tile copies (the memory a convolution needs beyond its input and
#: output)
IM2COL_BYTES = 64 << 20
#: the patch bytes a tile copies when they make at least `MIN_TILE_ROWS` rows: a tile the size of
#: a core's L2 cache is still there when the matrix product reads it (a tile of the whole
#: output streams its patches through memory twice: a third slower on ResNet's 3x3 layers)
TILE_BYTES = 1 << 20
#: the fewest patches a tile holds (within `IM2COL_BYTES`): a product of a few rows would read
#: the whole kernel matrix for each of them
MIN_TILE_ROWS = 256


@KERNELS.register("convolution")
def convolution(inst, args, ctx):
    """XLA's ConvGeneralDilated: any `dim_labels` permutation, window strides, padding (negative =
    cropping), lhs (base) and rhs (window) dilation, window reversal, `feature_group_count` and
    `batch_group_count` (see the module docstring). Output size per spatial dim:
    `(dilated_in + lo + hi - dilated_window) // stride + 1` (0 if negative)."""
    lhs, rhs = args
    labels = inst.attr("dim_labels")
    window = inst.attr("window") or Window(())
    fgc = inst.attr("feature_group_count", 1)
    bgc = inst.attr("batch_group_count", 1)
    if fgc > 1 and bgc > 1:
        raise UnsupportedError(f"{inst.name}: feature_group_count and batch_group_count both > 1")
    t = inst.shape.element_type
    acc = accumulation_dtype(t)
    x = _to_canonical(lhs, [labels.lhs_batch, *labels.lhs_spatial, labels.lhs_feature])
    w = _to_canonical(rhs, [*labels.rhs_spatial, labels.rhs_input_feature,
                            labels.rhs_output_feature])
    nsp = x.ndim - 2
    if len(window.dims) != nsp:
        raise VerificationError(f"{inst.name}: window has {len(window.dims)} dims, "
                                f"the convolution has {nsp} spatial dims")
    reversed_axes = tuple(k for k, d in enumerate(window.dims) if d.window_reversal)
    if reversed_axes:
        w = np.flip(w, reversed_axes)
    x = _dilate_and_pad(x, range(1, 1 + nsp), window)
    n, c = x.shape[0], x.shape[-1]
    kernel_sizes, i, o = w.shape[:nsp], w.shape[nsp], w.shape[nsp + 1]
    groups = fgc * bgc
    if c != i * fgc or o % groups or n % bgc:
        raise VerificationError(
            f"{inst.name}: {c} input features, {i} kernel input features, {o} output features and "
            f"batch {n} do not fit feature_group_count={fgc}, batch_group_count={bgc}")
    dilated_kernel = [(k - 1) * d.window_dilation + 1 if k else 0
                      for k, d in zip(kernel_sizes, window.dims)]
    positions = [(s - dk) // d.stride + 1 if s >= dk else 0
                 for s, dk, d in zip(x.shape[1:1 + nsp], dilated_kernel, window.dims)]
    out_batch = n // bgc
    out = np.zeros((out_batch, *positions, o), acc)
    if out.size and i and all(kernel_sizes):
        # [N, P..., C, K...]: the windows at the strided positions, their dilated taps
        view = sliding_window_view(x, dilated_kernel, axis=tuple(range(1, 1 + nsp)))
        view = view[(slice(None),) + tuple(slice(None, None, d.stride) for d in window.dims)
                    + (slice(None),)
                    + tuple(slice(None, None, d.window_dilation) for d in window.dims)]
        # [N, P..., K..., C]: a patch in the order of the kernel matrix's rows
        view = view.transpose([0, *range(1, 1 + nsp), *range(2 + nsp, 2 + 2 * nsp), 1 + nsp])
        og = o // groups
        if fgc > 1 and i == 1:
            _depthwise(view, w.astype(acc, copy=False), out.reshape(*out.shape[:-1], fgc, og),
                       nsp)
            return to_result(_from_canonical(out, [labels.out_batch, *labels.out_spatial,
                                                   labels.out_feature], len(labels.out)), t)
        matrix = w.astype(acc, copy=False).reshape(prod(kernel_sizes) * i, o)
        rows = out.reshape(out_batch * prod(positions), o)
        for g in range(groups):
            batch = slice(g * out_batch, (g + 1) * out_batch) if bgc > 1 else slice(None)
            features = slice(g * i, (g + 1) * i) if fgc > 1 else slice(None)
            _multiply_tiles(view[batch, ..., features], 1 + nsp, matrix[:, g * og:(g + 1) * og],
                            rows[:, g * og:(g + 1) * og], acc)
    result = _from_canonical(out, [labels.out_batch, *labels.out_spatial, labels.out_feature],
                             len(labels.out))
    return to_result(result, t)


def _multiply_tiles(patches: np.ndarray, lead_rank: int, matrix: np.ndarray, out: np.ndarray,
                    acc: np.dtype) -> None:
    """`out[r] = patch r @ matrix` for the patches of `patches` (`[lead..., K..., I]`: the first
    `lead_rank` axes number the patches, row-major), a tile of rows at a time (`_tiles`, sized
    by `TILE_BYTES`, `MIN_TILE_ROWS` and `IM2COL_BYTES`). A tile is copied once into a contiguous
    buffer of type `acc` (the same for every tile), unless it already is one (1x1 kernels at
    stride 1)."""
    width = matrix.shape[0]
    row_bytes = max(width * acc.itemsize, 1)
    max_rows = max(1, min(max(TILE_BYTES // row_bytes, MIN_TILE_ROWS), IM2COL_BYTES // row_bytes))
    buffer = None
    for index, span in _tiles(patches.shape[:lead_rank], max_rows):
        tile = patches[index]
        if tile.dtype != acc or not tile.flags.c_contiguous:
            if buffer is None:
                buffer = np.empty(min(max_rows, out.shape[0]) * width, acc)
            copy = buffer[:tile.size].reshape(tile.shape)
            copy[...] = tile
            tile = copy
        np.matmul(tile.reshape(-1, width), matrix, out=out[span])


def _depthwise(view: np.ndarray, w: np.ndarray, out: np.ndarray, nsp: int) -> None:
    """A convolution whose groups each read one channel (`feature_group_count` = channels):
    `out[..., g, j] += tap[..., g] * w[tap, 0, g * og + j]` for every kernel tap, each over the
    whole output at once (a matrix product per group would have one row of kernel per tap)."""
    product = np.empty(out.shape, out.dtype)
    for tap in np.ndindex(*w.shape[:nsp]):
        x = view[(Ellipsis, *tap, slice(None))][..., None]          # [N, P..., G, 1]
        np.multiply(x, w[tap + (0,)].reshape(out.shape[-2:]), out=product)
        out += product


def _tiles(lead: tuple[int, ...], max_rows: int):
    """Blocks of the row-major index space `lead` holding at most `max_rows` rows (at least one),
    each as (index into the leading axes, the rows it covers): whole trailing axes, a range of
    one axis, fixed indices before it."""
    total = prod(lead)
    if total <= max_rows:
        yield (slice(None),) * len(lead), slice(0, total)
        return
    axis = next(a for a in range(len(lead)) if prod(lead[a + 1:]) <= max_rows)
    inner = prod(lead[axis + 1:])
    step = max(1, max_rows // inner)
    row = 0
    for outer in np.ndindex(*lead[:axis]):
        for start in range(0, lead[axis], step):
            stop = min(start + step, lead[axis])
            yield outer + (slice(start, stop),), slice(row, row + (stop - start) * inner)
            row += (stop - start) * inner


def _dilate_and_pad(x: np.ndarray, axes, window: Window) -> np.ndarray:
    """Base-dilate (`lhs_dilate`: d-1 zeros between elements) then pad each spatial axis by
    `padding_low/high` (negative values crop), XLA's order of the two steps; `x` itself when the
    window does neither."""
    if all(w.base_dilation == 1 and w.padding_low == w.padding_high == 0 for w in window.dims):
        return x
    shape = list(x.shape)
    placed = [slice(None)] * x.ndim
    crop = [slice(None)] * x.ndim
    for axis, w in zip(axes, window.dims):
        n = x.shape[axis]
        dilated = (n - 1) * w.base_dilation + 1 if n else 0
        lo, hi = max(w.padding_low, 0), max(w.padding_high, 0)
        shape[axis] = lo + dilated + hi
        placed[axis] = slice(lo, lo + dilated, w.base_dilation)
        stop = shape[axis] - max(-w.padding_high, 0)
        crop[axis] = slice(max(-w.padding_low, 0), max(stop, max(-w.padding_low, 0)))
    out = spill.zeros(shape, x.dtype)
    out[tuple(placed)] = x
    return out[tuple(crop)]


def _to_canonical(x: np.ndarray, order: list[int]) -> np.ndarray:
    """Transpose `x` so that the axes in `order` come first, dropping the remaining size-1 axes
    (the `?` labels of dim_labels)."""
    rest = [d for d in range(x.ndim) if d not in order]
    return x.transpose(order + rest).reshape([x.shape[d] for d in order])


def _from_canonical(y: np.ndarray, order: list[int], rank: int) -> np.ndarray:
    """Inverse of `_to_canonical`: axis i of `y` goes to position order[i] of a rank-`rank`
    result whose other axes have size 1."""
    rest = [d for d in range(rank) if d not in order]
    full = y.reshape(y.shape + (1,) * len(rest))
    return full.transpose(np.argsort(order + rest))
