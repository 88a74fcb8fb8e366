"""Contraction kernels: dot, ragged-dot, triangular-solve, cholesky, fft (convolution is in
`convolution.py`).

Numerics (as XLA's CPU backend): products are accumulated in the result type, except that bf16/f16
results are accumulated in f32 and rounded once at the end; integer results wrap around (two's
complement); a pred result is the OR of ANDs. Operands of other types are converted to the
accumulation type first (`dot(s8, s8) -> s32` multiplies in s32).
"""
from __future__ import annotations

from math import prod

import numpy as np

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS

from ..allocation import ALIGNED_BYTES, aligned_empty
from .specialising import SpecialisedKernel
from .tile_sharing import TileQueue, share_tiles

#: the multiply-adds of a tile of a batched product (a run of batch items, at least one): a
#: product of several tiles shares them among the threads the BLAS ran (`tile_sharing`), each
#: item's product on one BLAS thread; one of fewer multiply-adds is one `np.matmul` on the BLAS's
#: threads. About a millisecond of one core (the threads' hand-over costs about 0.1 ms); with
#: AVX-512 kernels a batch of `[512, 64] x [64, 512]` products ran 15% faster on two cores this
#: way than with two BLAS threads, which wait for each other within each item's product
TILE_MULTIPLY_ADDS = 1 << 27


def accumulation_dtype(element_type: str) -> np.dtype:
    """The numpy type a contraction with result `element_type` accumulates in."""
    if element_type in ("bf16", "f16"):
        return np.dtype(np.float32)
    if element_type == "pred":
        return np.dtype(np.int64)
    return dtypes.numpy_dtype(element_type)


def to_result(value: np.ndarray, element_type: str) -> np.ndarray:
    """Round an accumulated value to the result type (pred: any nonzero count is true)."""
    if element_type == "pred":
        return value != 0
    return value.astype(dtypes.numpy_dtype(element_type), copy=False)


def dot_general(lhs: np.ndarray, rhs: np.ndarray, lhs_batch, lhs_contracting, rhs_batch,
                rhs_contracting, acc: np.dtype) -> np.ndarray:
    """XLA's DotGeneral in type `acc`: result dims are batch dims (in `lhs_batch` order), then lhs
    free dims, then rhs free dims (each in operand order). One batched `np.matmul`, whose items
    are shared among threads when they make several tiles (`TILE_MULTIPLY_ADDS`): numpy
    multiplies a batch one item at a time, so the values are those of one `np.matmul` on one
    BLAS thread. A result of more than `allocation.ALIGNED_BYTES` is written into memory aligned
    to a cache line (`allocation.aligned_empty`: the kernels' vector stores then stay within
    one; the values are the same)."""
    return dot_general_of(lhs.shape, rhs.shape, lhs_batch, lhs_contracting, rhs_batch,
                          rhs_contracting, acc)(lhs, rhs)


def dot_general_of(lhs_shape, rhs_shape, lhs_batch, lhs_contracting, rhs_batch, rhs_contracting,
                   acc: np.dtype):
    """`dot_general` for operands of shapes `lhs_shape` and `rhs_shape`, as a function of the
    two operands (the permutations and shapes worked out once)."""
    lhs_batch, lhs_contracting = list(lhs_batch), list(lhs_contracting)
    rhs_batch, rhs_contracting = list(rhs_batch), list(rhs_contracting)
    lhs_free = [d for d in range(len(lhs_shape)) if d not in lhs_batch and d not in lhs_contracting]
    rhs_free = [d for d in range(len(rhs_shape)) if d not in rhs_batch and d not in rhs_contracting]
    batch_shape = [lhs_shape[d] for d in lhs_batch]
    lhs_free_shape = [lhs_shape[d] for d in lhs_free]
    rhs_free_shape = [rhs_shape[d] for d in rhs_free]
    b, m, n = prod(batch_shape), prod(lhs_free_shape), prod(rhs_free_shape)
    k = prod(lhs_shape[d] for d in lhs_contracting)
    lhs_order = tuple(lhs_batch + lhs_free + lhs_contracting)
    rhs_order = tuple(rhs_batch + rhs_contracting + rhs_free)
    result_shape = tuple(batch_shape + lhs_free_shape + rhs_free_shape)
    items = max(1, -(-TILE_MULTIPLY_ADDS // max(m * n * k, 1)))       # batch items per tile
    tiles = [slice(i, min(i + items, b)) for i in range(0, b, items)]

    aligned = b * m * n * acc.itemsize > ALIGNED_BYTES

    def product(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        a = lhs.astype(acc, copy=False).transpose(lhs_order).reshape(b, m, k)
        c = rhs.astype(acc, copy=False).transpose(rhs_order).reshape(b, k, n)
        if len(tiles) < 2 and not aligned:
            return np.matmul(a, c).reshape(result_shape)
        out = aligned_empty((b, m, n), acc)
        if len(tiles) < 2:
            np.matmul(a, c, out=out)
        else:
            share_tiles(tiles, lambda queue: _multiply_items(queue, a, c, out))
        return out.reshape(result_shape)
    return product


def _multiply_items(queue: TileQueue, a: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """`out[t] = a[t] @ c[t]` for the tiles `t` (slices of the batch) this thread takes."""
    while (tile := queue.take()) is not None:
        np.matmul(a[tile], c[tile], out=out[tile])


def _dims(inst, name: str) -> tuple[int, ...]:
    return tuple(inst.attr(name, ()))


def _dot_of(inst, shapes):
    """The kernel of dot `inst` on operands of `shapes`: `dot(lhs, rhs)` with
    `lhs/rhs_batch_dims` and `lhs/rhs_contracting_dims` (precision and algorithm attributes are
    hints and do not change the result here)."""
    if len(shapes) != 2:
        raise UnsupportedError(f"{inst.name}: sparse dot (with {len(shapes) - 2} metadata "
                               "operands) is not supported")
    t = inst.shape.element_type
    product = dot_general_of(shapes[0], shapes[1],
                             _dims(inst, "lhs_batch_dims"), _dims(inst, "lhs_contracting_dims"),
                             _dims(inst, "rhs_batch_dims"), _dims(inst, "rhs_contracting_dims"),
                             accumulation_dtype(t))
    if t == "pred" or accumulation_dtype(t) != dtypes.numpy_dtype(t):
        return lambda inst, args, ctx: to_result(product(*args), t)
    return lambda inst, args, ctx: product(*args)


def dot(inst, args, ctx):
    return _dot_of(inst, [a.shape for a in args])(inst, args, ctx)


def _dot_for(inst):
    return _dot_of(inst, [op.shape.dims for op in inst.operands])


KERNELS.add(SpecialisedKernel(dot, _dot_for), "dot")


# ---------------------------------------------------------------------------------------------
# ragged-dot


def _group_ids(group_sizes: np.ndarray, coords_shape: tuple[int, ...], extent: int) -> np.ndarray:
    """Group id of each position along a ragged dimension of length `extent`: positions are
    assigned to groups consecutively by `group_sizes[..., g]` (leading dims index `coords_shape`);
    positions past the last group get id `g` (no group). Shape: coords_shape + [extent]."""
    sizes = np.maximum(group_sizes.astype(np.int64), 0)
    g = sizes.shape[-1]
    sizes = np.broadcast_to(sizes, tuple(coords_shape) + (g,))
    ends = np.cumsum(sizes, axis=-1)
    return (np.arange(extent) >= ends[..., None]).sum(axis=-2)


def _outer_dims(dims, ragged: int) -> list[int]:
    """The dims of `dims` that come before the ragged dim in the lhs, in dimension order."""
    return sorted(d for d in dims if d < ragged)


@KERNELS.register("ragged-dot")
def ragged_dot(inst, args, ctx):
    """`ragged-dot(lhs, rhs, group_sizes)` in XLA's three modes, chosen by the kind of the lhs
    ragged dimension `r` (`lhs_ragged_dims={r}`), with `g` groups of consecutive positions on `r`:

    1. `r` free in lhs (rhs has `rhs_group_dims={G}`): each lhs row uses rhs slice `G = its group`;
       rows past the last group are zero. `group_sizes` is `[g]` or `[batch..., outer free..., g]`.
    2. `r` contracting: the result gets a leading `[g]` dim; entry `i` contracts only the positions
       of group `i`. `group_sizes` is `[g]` or `[batch..., outer contracting..., g]`.
    3. `r` a batch dim: an ordinary dot (batches are independent, so grouping does not matter).
    """
    lhs, rhs, group_sizes = args
    t = inst.shape.element_type
    acc = accumulation_dtype(t)
    lb, lc = list(_dims(inst, "lhs_batch_dims")), list(_dims(inst, "lhs_contracting_dims"))
    rb, rc = list(_dims(inst, "rhs_batch_dims")), list(_dims(inst, "rhs_contracting_dims"))
    ragged_dims, group_dims = _dims(inst, "lhs_ragged_dims"), _dims(inst, "rhs_group_dims")
    if len(ragged_dims) != 1:
        raise VerificationError(f"{inst.name}: ragged-dot needs exactly one lhs ragged dim")
    r = ragged_dims[0]
    lhs_free = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    batch_shape = tuple(lhs.shape[d] for d in lb)
    if r in lb:
        return to_result(dot_general(lhs, rhs, lb, lc, rb, rc, acc), t)
    if r in lc:
        if group_dims:
            raise VerificationError(f"{inst.name}: a contracting ragged dim takes no rhs group dim")
        outer = batch_shape + tuple(lhs.shape[d] for d in _outer_dims(lc, r))
        ids = _group_ids(group_sizes, outer, lhs.shape[r])
        g = group_sizes.shape[-1]
        # ids: [batch..., outer contracting..., K_r]; entry i zeroes the lhs outside group i
        lhs_order = lb + _outer_dims(lc, r) + [r]
        rest = [d for d in range(lhs.ndim) if d not in lhs_order]
        moved = lhs.transpose(lhs_order + rest)
        back = np.argsort(lhs_order + rest)
        parts = []
        for i in range(g):
            mask = (ids == i).reshape(ids.shape + (1,) * len(rest))
            masked = np.where(mask, moved, np.zeros((), lhs.dtype)).transpose(back)
            parts.append(dot_general(masked, rhs, lb, lc, rb, rc, acc))
        out = np.stack(parts) if parts else np.zeros(inst.shape.dims, acc)
        return to_result(out.reshape(inst.shape.dims), t)
    if len(group_dims) != 1:
        raise VerificationError(f"{inst.name}: a free ragged dim needs one rhs group dim")
    gdim = group_dims[0]
    renumber = [d - (d > gdim) for d in range(rhs.ndim)]
    rb2, rc2 = [renumber[d] for d in rb], [renumber[d] for d in rc]
    outer_free = _outer_dims(lhs_free, r)
    outer = batch_shape + tuple(lhs.shape[d] for d in outer_free)
    ids = _group_ids(group_sizes, outer, lhs.shape[r])
    # ids [batch..., outer free..., r] aligned with the result [batch..., lhs free..., rhs free...]
    rhs_free_rank = rhs.ndim - 1 - len(rb) - len(rc)
    later_free = len(lhs_free) - len(outer_free) - 1
    ids = ids.reshape(ids.shape + (1,) * (later_free + rhs_free_rank))
    out_axis = len(lb) + lhs_free.index(r)
    out = np.zeros(inst.shape.dims, acc)
    for i in range(rhs.shape[gdim]):
        # only the span of positions along r that some row of group i occupies is computed
        other_axes = tuple(a for a in range(ids.ndim) if a != len(outer))
        rows = np.flatnonzero((ids == i).any(axis=other_axes))
        if not rows.size:
            continue
        span = slice(rows[0], rows[-1] + 1)
        part = dot_general(lhs[(slice(None),) * r + (span,)], np.take(rhs, i, axis=gdim),
                           lb, lc, rb2, rc2, acc)
        region = (slice(None),) * out_axis + (span,)
        out[region] = np.where(ids[(slice(None),) * len(outer) + (span,)] == i, part, out[region])
    return to_result(out, t)


# ---------------------------------------------------------------------------------------------
# linear algebra


def _float_work_dtype(dtype: np.dtype) -> np.dtype:
    """f16/bf16 are computed in f32 (numpy's linalg has no half precision)."""
    return np.dtype(np.float32) if dtype.itemsize < 4 and dtype.kind != "c" else dtype


def _swap_last(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


@KERNELS.register("triangular-solve")
def triangular_solve(inst, args, ctx):
    """Solve `op(a) x = b` (`left_side=true`) or `x op(a) = b` for x, batched over leading dims.
    Only the triangle of `a` named by `lower` is read; `unit_diagonal=true` assumes ones on the
    diagonal without reading it; `transpose_a` is NO_TRANSPOSE, TRANSPOSE or ADJOINT. Row-by-row
    substitution (vectorised over batch and right-hand sides), so singular systems give inf/nan as
    XLA does rather than an error."""
    a, b = args
    work = _float_work_dtype(b.dtype)
    a, b = a.astype(work), b.astype(work)
    lower = bool(inst.attr("lower", False))
    tri = np.tril(a) if lower else np.triu(a)
    if inst.attr("unit_diagonal", False):
        m = tri.shape[-1]
        tri[..., np.arange(m), np.arange(m)] = 1
    transpose = str(inst.attr("transpose_a", "NO_TRANSPOSE"))
    if transpose in ("TRANSPOSE", "ADJOINT"):
        tri, lower = _swap_last(tri), not lower
        if transpose == "ADJOINT":
            tri = np.conj(tri)
    elif transpose != "NO_TRANSPOSE":
        raise VerificationError(f"{inst.name}: unknown transpose_a={transpose}")
    left = bool(inst.attr("left_side", False))
    if not left:  # x A = b  <=>  A^T x^T = b^T
        tri, b, lower = _swap_last(tri), _swap_last(b), not lower
    m = tri.shape[-1]
    x = np.zeros_like(b)
    rows = range(m) if lower else range(m - 1, -1, -1)
    for r in rows:
        partial = np.matmul(tri[..., r:r + 1, :], x)[..., 0, :]
        x[..., r, :] = (b[..., r, :] - partial) / tri[..., r, r:r + 1]
    if not left:
        x = _swap_last(x)
    return x.astype(dtypes.numpy_dtype(inst.shape.element_type))


@KERNELS.register("cholesky")
def cholesky(inst, args, ctx):
    """Cholesky factor of Hermitian positive-definite matrices (batched over leading dims), read
    from the `lower` triangle (`a = l l^H`) or the upper one (`a = u^H u`). The other triangle of
    the result is zero; a matrix that is not positive definite gives NaNs (XLA: implementation-
    defined)."""
    (a,) = args
    work = _float_work_dtype(a.dtype)
    a = a.astype(work)
    lower = bool(inst.attr("lower", False))
    if not lower:
        a = np.conj(_swap_last(a))
    sym = np.tril(a) + np.conj(_swap_last(np.tril(a, -1)))
    flat = sym.reshape((-1,) + sym.shape[-2:])
    try:
        factor = np.linalg.cholesky(flat)
    except np.linalg.LinAlgError:
        factor = np.stack([_cholesky_or_nan(m) for m in flat]) if len(flat) else flat
    factor = factor.reshape(sym.shape)
    if not lower:
        factor = np.conj(_swap_last(factor))
    return factor.astype(dtypes.numpy_dtype(inst.shape.element_type))


def _cholesky_or_nan(matrix: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        return np.full_like(matrix, np.nan)


@KERNELS.register("fft")
def fft(inst, args, ctx):
    """`fft_type` FFT / IFFT (complex -> complex), RFFT (real -> complex, last dim n//2+1) and
    IRFFT (complex -> real, last dim fft_length[-1]) over the trailing `len(fft_length)` dims."""
    (x,) = args
    kind = str(inst.attr("fft_type"))
    length = tuple(inst.attr("fft_length", ()))
    axes = tuple(range(x.ndim - len(length), x.ndim))
    if kind == "FFT":
        y = np.fft.fftn(x, s=length, axes=axes)
    elif kind == "IFFT":
        y = np.fft.ifftn(x, s=length, axes=axes)
    elif kind == "RFFT":
        y = np.fft.rfftn(x, s=length, axes=axes)
    elif kind == "IRFFT":
        y = np.fft.irfftn(x, s=length, axes=axes)
    else:
        raise VerificationError(f"{inst.name}: unknown fft_type={kind}")
    return y.astype(dtypes.numpy_dtype(inst.shape.element_type))
