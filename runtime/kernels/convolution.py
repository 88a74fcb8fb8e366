"""The convolution kernel: XLA's ConvGeneralDilated as one matrix product per tile of output
positions.

Layout: the input is viewed channels-last, `[N, S..., C]`, and the kernel as `[K..., I, O]` (views:
for JAX's `b01f` / `01io` layouts nothing moves). The input is base-dilated and padded once, in
its own type, only when the window asks for it; every output position's patch is then a strided
window of it (`sliding_window_view`: window strides, window dilation), ordered `[K..., I]` so
that the input's contiguous channel runs stay contiguous. Output positions are cut into tiles of
about `TILE_BYTES` of patches (at most `IM2COL_BYTES`); a tile's patches are copied once, straight
into a contiguous buffer of the accumulation type (f32 for bf16 and f16; one buffer per thread,
reused by its tiles), and multiplied by the kernel matrix
`[K * I, O / G]` into the tile's rows of the result, which is itself channels-last `[N', P..., O]`.
The copy moves the runs a patch has in the input (its channels, with the taps of the last
spatial dim when they are adjacent: a 7x7 stem on 3 channels has runs of 21 elements) into
patch-major rows (`[rows, K..., I]`), unless the output's last spatial dim is longer than those
runs: then the input is dilated and padded straight into a layout with each channel's rows along
that dim contiguous, split by position modulo the stride, and the tile is copied tap-major
(`[K..., I, rows]`, runs along the output's last dim, every tile holding whole such rows) and
multiplied transposed; the product sums each row in the same order either way. When the BLAS
runs several threads, the tiles are shared among as many threads of the kernel, each copying and
multiplying its own tiles with one BLAS thread (see `_multiply_tiles`).
A group (`feature_group_count`: the channels and output features split group-major;
`batch_group_count`: the batch and output features split group-major) is one such product per
tile on its slice of the channels or the batch, except when every group reads one channel
(depthwise convolutions): then each kernel tap multiplies one strided slice of the input into the
whole output at once.

Numerics as the other contractions (`contraction.py`): products accumulate in the result type,
bf16/f16 in f32 rounded once, integers wrap, a pred result is the OR of ANDs.
"""
from __future__ import annotations

from math import gcd, prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir.attributes import Window
from gspmdc.ir.ops import KERNELS

from .. import spill
from .contraction import accumulation_dtype, to_result
from .tile_sharing import TileQueue, share_tiles

#: the most patch bytes one tile copies (the memory a convolution needs beyond its input and
#: output)
IM2COL_BYTES = 64 << 20
#: the patch bytes a tile copies when they make at least `MIN_TILE_ROWS` rows: a tile about the
#: size of a core's L2 cache is still mostly there when the matrix product reads it (a tile of
#: the whole output streams its patches through memory twice: a third slower on ResNet's 3x3
#: layers; 2 MiB ran 2-3% faster than 1 MiB on a core of 1 MiB with tiles shared by threads)
TILE_BYTES = 2 << 20
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
    padding = [_padding(size, d) for size, d in zip(x.shape[1:1 + nsp], window.dims)]
    n, c = x.shape[0], x.shape[-1]
    kernel_sizes, i, o = w.shape[:nsp], w.shape[nsp], w.shape[nsp + 1]
    groups = fgc * bgc
    if c != i * fgc or o % groups or n % bgc:
        raise VerificationError(
            f"{inst.name}: {c} input features, {i} kernel input features, {o} output features and "
            f"batch {n} do not fit feature_group_count={fgc}, batch_group_count={bgc}")
    dilated_kernel = [(k - 1) * d.window_dilation + 1 if k else 0
                      for k, d in zip(kernel_sizes, window.dims)]
    positions = [(crop.stop - crop.start - dk) // d.stride + 1
                 if crop.stop - crop.start >= dk else 0
                 for (_, _, crop), dk, d in zip(padding, dilated_kernel, window.dims)]
    out_batch = n // bgc
    out_shape = (out_batch, *positions, o)
    if not (prod(out_shape) and i and all(kernel_sizes)):
        return _result(np.zeros(out_shape, acc), labels, t)
    og = o // groups
    depthwise = fgc > 1 and i == 1
    # patches copied tap-major when a patch's longest run in the input (its channels, with the
    # taps of the last spatial dim when they are adjacent) is shorter than the output's last
    # dim, unless the input is its own patch matrix (1x1 kernels at stride 1)
    adjacent = nsp > 0 and fgc == 1 and window.dims[-1].window_dilation == 1
    in_place = all(k == 1 for k in kernel_sizes) and all(d.stride == 1 for d in window.dims) \
        and x.dtype == acc
    planar = nsp > 0 and not depthwise and not in_place \
        and positions[-1] > i * (kernel_sizes[-1] if adjacent else 1)
    if planar:
        laid_out, offset = _planar(x, padding, window)
    else:
        x = _dilate_and_pad(x, padding)
        # [N, P..., C, K...]: the windows at the strided positions, their dilated taps
        view = sliding_window_view(x, dilated_kernel, axis=tuple(range(1, 1 + nsp)))
        view = view[(slice(None),) + tuple(slice(None, None, d.stride) for d in window.dims)
                    + (slice(None),)
                    + tuple(slice(None, None, d.window_dilation) for d in window.dims)]
        # [N, P..., K..., C]: a patch in the order of the kernel matrix's rows
        view = view.transpose([0, *range(1, 1 + nsp), *range(2 + nsp, 2 + 2 * nsp), 1 + nsp])
    if depthwise:
        out = np.zeros(out_shape, acc)
        _depthwise(view, w.astype(acc, copy=False), out.reshape(*out.shape[:-1], fgc, og), nsp)
        return _result(out, labels, t)
    out = np.empty(out_shape, acc)
    matrix = w.astype(acc, copy=False).reshape(prod(kernel_sizes) * i, o)
    rows = out.reshape(out_batch * prod(positions), o)
    for g in range(groups):
        batch = slice(g * out_batch, (g + 1) * out_batch) if bgc > 1 else slice(None)
        features = slice(g * i, (g + 1) * i) if fgc > 1 else slice(None)
        if planar:
            pieces = _planar_pieces(laid_out[batch, ..., features, :, :], offset, window,
                                    kernel_sizes, positions)
        else:
            pieces = [(slice(None), view[batch, ..., features])]
        _multiply_tiles(pieces, planar, (out_batch, *positions), (*kernel_sizes, i),
                        matrix[:, g * og:(g + 1) * og], rows[:, g * og:(g + 1) * og], acc)
    return _result(out, labels, t)


def _result(out: np.ndarray, labels, t) -> np.ndarray:
    """The channels-last accumulator `out` in the instruction's output layout and type."""
    return to_result(_from_canonical(out, [labels.out_batch, *labels.out_spatial,
                                           labels.out_feature], len(labels.out)), t)


def _multiply_tiles(pieces, planar: bool, lead: tuple[int, ...], patch: tuple[int, ...],
                    matrix: np.ndarray, out: np.ndarray, acc: np.dtype) -> None:
    """`out[r] = patch r @ matrix` for the patches numbered row-major by `lead` (`[N, P...]`),
    each of shape `patch` (`[K..., I]`), a tile of rows at a time (`_tiles`, sized by
    `TILE_BYTES`, `MIN_TILE_ROWS` and `IM2COL_BYTES`; with `planar`, whole rows of the last
    output axis). Several tiles are shared among as many threads as the BLAS ran
    (`tile_sharing.share_tiles`), each thread copying and multiplying the tiles it takes with one
    BLAS thread: a tile stays in the cache of the core that copied it (a product on two BLAS
    threads reads half of it from the other core, and the next copy writes over lines that core
    holds)."""
    width = matrix.shape[0]
    row_bytes = max(width * acc.itemsize, 1)
    max_rows = max(1, min(max(TILE_BYTES // row_bytes, MIN_TILE_ROWS), IM2COL_BYTES // row_bytes))
    if planar:
        max_rows = max(max_rows, lead[-1])
    rows = min(max_rows, out.shape[0])
    share_tiles(list(_tiles(lead, max_rows)),
                lambda queue: _multiply(queue, pieces, planar, patch, matrix, out, acc, rows))


def _multiply(queue: TileQueue, pieces, planar: bool, patch: tuple[int, ...],
              matrix: np.ndarray, out: np.ndarray, acc: np.dtype, rows: int) -> None:
    """The products of `_multiply_tiles` for the tiles this thread takes from `queue` ((index
    into the patches' leading axes, the rows of `out` it covers)), with one copy buffer of
    `rows` patches. A tile is copied once into the buffer (type `acc`) and multiplied from
    there: row-major (`[rows, K..., I]`, one piece), unless the tile already is such an array
    (1x1 kernels at stride 1); or with `planar`, tap-major (`[K..., I, rows]`, runs along the
    last output axis) and multiplied transposed."""
    width = matrix.shape[0]
    buffer = None
    while (taken := queue.take()) is not None:
        index, span = taken
        parts = [(taps, view[index]) for taps, view in pieces]
        tile = parts[0][1]
        if not planar and tile.dtype == acc and tile.flags.c_contiguous:
            np.matmul(tile.reshape(-1, width), matrix, out=out[span])
            continue
        if buffer is None:
            buffer = np.empty(rows * width, acc)
        copy = buffer[:(span.stop - span.start) * width]
        if planar:
            tile_lead = tile.shape[:tile.ndim - len(patch)]
            patches = copy.reshape(*patch, *tile_lead).transpose(
                [*range(len(patch), len(patch) + len(tile_lead)), *range(len(patch))])
            for taps, part in parts:
                patches[(Ellipsis, taps, slice(None))] = part
            np.matmul(copy.reshape(width, -1).T, matrix, out=out[span])
        else:
            copy.reshape(tile.shape)[...] = tile
            np.matmul(copy.reshape(-1, width), matrix, out=out[span])


def _planar(x: np.ndarray, padding, window: Window) -> tuple[np.ndarray, int]:
    """`x` (`[N, S..., C]`) dilated and padded (`padding`: `_padding` of each spatial dim), laid
    out with each channel's rows along the last spatial dim contiguous and split by position
    modulo that dim's stride `s`: `[N, S'[:-1]..., C, s, ceil(L / s)]`, element `[..., c, p, q]`
    at position `q * s + p` of the last dim padded but not cropped (length `L`), with the cropped
    start of that dim (the other dims cropped)."""
    *lead, (length, placed, crop) = padding
    last = window.dims[-1]
    stride, dilation = last.stride, last.base_dilation
    laid_out = spill.zeros((x.shape[0], *(full for full, _, _ in lead), x.shape[-1], stride,
                            -(-length // stride)), x.dtype)
    # input elements j, j + m, ... fall on one phase, every `step`-th position of it
    m = stride // gcd(stride, dilation)
    step = dilation * m // stride
    for first in range(min(m, x.shape[-2])):
        start, phase = divmod(placed.start + first * dilation, stride)
        part = np.moveaxis(x[..., first::m, :], -1, -2)
        laid_out[(slice(None), *(p for _, p, _ in lead), slice(None), phase,
                  slice(start, start + (part.shape[-1] - 1) * step + 1, step))] = part
    return laid_out[(slice(None), *(c for _, _, c in lead))], crop.start


def _planar_pieces(planar: np.ndarray, offset: int, window: Window, kernel_sizes, positions):
    """The patches of a convolution of the input `planar` (`_planar`'s layout, its last dim's
    cropped start `offset`) as pieces for `_multiply_tiles`: per position phase `p` of the last
    dim, the taps `k` whose position `offset + window_dilation * k` is `p` modulo the stride
    (every `m`-th tap from the first), as a view `[N, P..., K[:-1]..., taps, C]` whose runs
    along the last output dim are contiguous."""
    *dims, last = window.dims
    nsp = len(window.dims)
    step = last.stride // gcd(last.stride, last.window_dilation)
    pieces = []
    for first in range(min(step, kernel_sizes[-1])):
        start, phase = divmod(offset + last.window_dilation * first, last.stride)
        taps = len(range(first, kernel_sizes[-1], step))
        spacing = last.window_dilation * step // last.stride
        source = planar[..., phase, start:]
        sizes = [(k - 1) * d.window_dilation + 1 for k, d in zip(kernel_sizes, dims)]
        # [N, P[:-1]..., C, Q, K[:-1]..., taps]
        view = sliding_window_view(source, (*sizes, (taps - 1) * spacing + 1),
                                   axis=(*range(1, nsp), nsp + 1))
        view = view[(slice(None),) + tuple(slice(None, None, d.stride) for d in dims)
                    + (slice(None), slice(0, positions[-1]))
                    + tuple(slice(None, None, d.window_dilation) for d in dims)
                    + (slice(None, None, spacing),)]
        view = view.transpose([0, *range(1, nsp), nsp + 1, *range(nsp + 2, 2 * nsp + 2), nsp])
        pieces.append((slice(first, None, step), view))
    return pieces


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
    one axis, fixed indices before it; the ranges of that axis as even as the fewest blocks
    allow (threads sharing the tiles finish together)."""
    total = prod(lead)
    if total <= max_rows:
        yield (slice(None),) * len(lead), slice(0, total)
        return
    axis = next(a for a in range(len(lead)) if prod(lead[a + 1:]) <= max_rows)
    inner = prod(lead[axis + 1:])
    blocks = -(-lead[axis] // max(1, max_rows // inner))
    step = -(-lead[axis] // blocks)
    row = 0
    for outer in np.ndindex(*lead[:axis]):
        for start in range(0, lead[axis], step):
            stop = min(start + step, lead[axis])
            yield outer + (slice(start, stop),), slice(row, row + (stop - start) * inner)
            row += (stop - start) * inner


def _padding(size: int, w) -> tuple[int, slice, slice]:
    """One spatial dim of `size` elements base-dilated (`lhs_dilate`: d-1 zeros between
    elements) then padded by `padding_low/high` (negative values crop), XLA's order of the two
    steps: (the length padded but not cropped, where the elements go in it, the crop)."""
    dilated = (size - 1) * w.base_dilation + 1 if size else 0
    lo, hi = max(w.padding_low, 0), max(w.padding_high, 0)
    full = lo + dilated + hi
    start = max(-w.padding_low, 0)
    return full, slice(lo, lo + dilated, w.base_dilation), \
        slice(start, max(full - max(-w.padding_high, 0), start))


def _dilate_and_pad(x: np.ndarray, padding) -> np.ndarray:
    """`x` (`[N, S..., C]`) dilated, padded and cropped as `padding` (`_padding` of each spatial
    dim) says; `x` itself when that changes nothing."""
    if all(placed == slice(0, full, 1) and crop == slice(0, full)
           for full, placed, crop in padding):
        return x
    out = spill.zeros((x.shape[0], *(full for full, _, _ in padding), x.shape[-1]), x.dtype)
    out[(slice(None), *(placed for _, placed, _ in padding))] = x
    return out[(slice(None), *(crop for _, _, crop in padding))]


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
