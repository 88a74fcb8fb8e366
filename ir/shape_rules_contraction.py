"""Shape rules of contractions and linear algebra: dot, ragged-dot, convolution, fft, cholesky,
triangular-solve.

dot and convolution may produce a different element type from their operands (XLA's
`preferred_element_type`, e.g. bf16 x bf16 -> f32, s8 x s8 -> s32): the given result element type is
accepted unless it is narrower than a non-floating operand type.
"""
from __future__ import annotations

from . import dtypes
from .attributes import ConvDimLabels, Window
from .module import Instruction, Module
from .ops import SHAPE_RULES
from .shape_rules_common import (
    attr_bool, attr_ident, attr_int, attr_ints, attr_value, check_dimension_list, fail,
    given_element_type, operand_array, require_same_element_type, strip, window_output_dims,
)
from .shapes import ArrayShape, Shape


def _result_type(inst: Instruction, a: ArrayShape, b: ArrayShape) -> str:
    """The given result element type if any, else the operands' (which must then agree). As in
    XLA's MaybeUpcast, a given type may not be narrower than a non-floating operand type."""
    preferred = given_element_type(inst)
    if preferred is None:
        return require_same_element_type([a, b], "operands")
    for x in (a, b):
        if not (dtypes.is_float(x.element_type) or x.element_type == preferred
                or dtypes.bit_width(preferred) >= dtypes.bit_width(x.element_type)):
            fail(f"result element type {preferred} is narrower than the operand {x}")
    return preferred


def _dot_dims(inst: Instruction, lhs: ArrayShape, rhs: ArrayShape,
              rhs_excluded: tuple[int, ...] = ()) -> tuple[int, ...]:
    """dot_general result dims: batch dims, then lhs free dims, then rhs free dims (in order);
    `rhs_excluded` are rhs dims that belong to none of these (ragged-dot's group dim)."""
    lb, rb = attr_ints(inst, "lhs_batch_dims", ()), attr_ints(inst, "rhs_batch_dims", ())
    lc = attr_ints(inst, "lhs_contracting_dims", ())
    rc = attr_ints(inst, "rhs_contracting_dims", ())
    if len(lb) != len(rb):
        fail(f"lhs_batch_dims {list(lb)} and rhs_batch_dims {list(rb)} "
             "differ in length")
    if len(lc) != len(rc):
        fail(f"lhs_contracting_dims {list(lc)} and rhs_contracting_dims "
             f"{list(rc)} differ in length")
    check_dimension_list(lb + lc, lhs.rank, "lhs batch/contracting dimension")
    check_dimension_list(rb + rc + rhs_excluded, rhs.rank, "rhs batch/contracting dimension")
    for kind, ls, rs in (("batch", lb, rb), ("contracting", lc, rc)):
        for l, r in zip(ls, rs):
            if lhs.dims[l] != rhs.dims[r]:
                fail(f"{kind} dimension sizes differ: lhs dim {l} of {lhs} vs rhs dim {r} of {rhs}")
    lhs_free = [d for d in range(lhs.rank) if d not in lb + lc]
    rhs_free = [d for d in range(rhs.rank) if d not in rb + rc + rhs_excluded]
    return tuple([lhs.dims[d] for d in lb] + [lhs.dims[d] for d in lhs_free]
                 + [rhs.dims[d] for d in rhs_free])


@SHAPE_RULES.register("dot")
def dot(inst: Instruction, module: Module) -> Shape:
    """dot_general with lhs/rhs batch and contracting dimension numbers."""
    lhs, rhs = operand_array(inst, 0), operand_array(inst, 1)
    return ArrayShape(_result_type(inst, lhs, rhs), _dot_dims(inst, lhs, rhs))


@SHAPE_RULES.register("ragged-dot")
def ragged_dot(inst: Instruction, module: Module) -> Shape:
    """ragged-dot(lhs, rhs, group_sizes) with `lhs_ragged_dims={r}` (StableHLO ragged_dot):

    - r a non-contracting lhs dim: rhs has a group dim (`rhs_group_dims={g}`) that is otherwise
      ignored; result = dot_general(lhs, rhs without g); group_sizes' last dim = rhs dim g.
    - r a contracting dim: result = [G] + dot_general(lhs, rhs), G = group_sizes' last dim.
    - r a batch dim: result = dot_general(lhs, rhs).
    """
    lhs, rhs, groups = (operand_array(inst, i) for i in range(3))
    if not (dtypes.is_integer(groups.element_type) and groups.rank >= 1):
        fail(f"group_sizes must be an integral array, found {groups}")
    ragged = attr_ints(inst, "lhs_ragged_dims")
    if len(ragged) != 1:
        fail(f"lhs_ragged_dims must name one dimension, found {list(ragged)}")
    (r,) = ragged
    if not 0 <= r < lhs.rank:
        fail(f"lhs ragged dimension {r} is out of range for {lhs}")
    group_dims = attr_ints(inst, "rhs_group_dims", ())
    element_type = _result_type(inst, lhs, rhs)
    contracting = attr_ints(inst, "lhs_contracting_dims", ())
    batch = attr_ints(inst, "lhs_batch_dims", ())
    if r in contracting or r in batch:
        if group_dims:
            fail("rhs_group_dims is only allowed when the ragged dimension is a "
                 "non-contracting dimension")
        dims = _dot_dims(inst, lhs, rhs)
        if r in contracting:
            dims = (groups.dims[-1],) + dims
        return ArrayShape(element_type, dims)
    if len(group_dims) != 1:
        fail("a ragged non-contracting dimension needs one rhs_group_dims "
             f"entry, found {list(group_dims)}")
    g = group_dims[0]
    if not 0 <= g < rhs.rank:
        fail(f"rhs group dimension {g} is out of range for {rhs}")
    if groups.dims[-1] != rhs.dims[g]:
        fail(f"group_sizes {groups} must end in the number of groups {rhs.dims[g]}")
    return ArrayShape(element_type, _dot_dims(inst, lhs, rhs, rhs_excluded=(g,)))


def _check_labels(labels: str, rank: int, special: str, num_spatial: int, what: str) -> None:
    expected = sorted(special + "".join(str(k) for k in range(num_spatial)))
    if not (sorted(labels) == expected and len(labels) == rank):
        fail(f"convolution {what} labels {labels!r} do not describe a rank-{rank} operand "
             f"with {num_spatial} spatial dimensions")


@SHAPE_RULES.register("convolution")
def convolution(inst: Instruction, module: Module) -> Shape:
    """Output batch = lhs batch / batch_group_count, output feature = rhs output feature, output
    spatial k = window output size over lhs spatial k (`window_output_dims`). Requires
    lhs feature = rhs input feature * feature_group_count, window size k = rhs spatial k, and
    feature_group_count / batch_group_count dividing the sizes they split."""
    lhs, rhs = operand_array(inst, 0), operand_array(inst, 1)
    labels = attr_value(inst, "dim_labels")
    if not isinstance(labels, ConvDimLabels):
        fail(f"convolution needs dim_labels=..._...->..., found {labels!r}")
    n = lhs.rank - 2
    if not n >= 0:
        fail(f"convolution lhs {lhs} needs rank >= 2")
    _check_labels(labels.lhs, lhs.rank, "bf", n, "lhs")
    _check_labels(labels.rhs, rhs.rank, "io", n, "rhs")
    _check_labels(labels.out, lhs.rank, "bf", n, "output")
    fgc = attr_int(inst, "feature_group_count", 1)
    bgc = attr_int(inst, "batch_group_count", 1)
    if not (fgc >= 1 and bgc >= 1 and (fgc == 1 or bgc == 1)):
        fail(f"invalid feature_group_count={fgc}, batch_group_count={bgc} (positive, not both > 1)")
    batch, in_features = lhs.dims[labels.lhs_batch], lhs.dims[labels.lhs_feature]
    kernel_in = rhs.dims[labels.rhs_input_feature]
    kernel_out = rhs.dims[labels.rhs_output_feature]
    if not (in_features % fgc == 0 and in_features // fgc == kernel_in):
        fail(f"lhs feature size {in_features} must equal rhs input feature size {kernel_in} "
             f"times feature_group_count {fgc}")
    if kernel_out % fgc != 0:
        fail(f"rhs output feature size {kernel_out} is not divisible by "
             f"feature_group_count {fgc}")
    if not (batch % bgc == 0 and kernel_out % bgc == 0):
        fail(f"batch_group_count {bgc} must divide "
             f"the lhs batch size {batch} and the rhs output feature size {kernel_out}")
    window = attr_value(inst, "window", None)
    if window is None:
        if n != 0:
            fail("convolution with spatial dimensions needs a window attribute")
        spatial: tuple[int, ...] = ()
    else:
        if not (isinstance(window, Window) and len(window.dims) == n):
            fail(f"window {window!r} must have one entry per spatial dimension ({n})")
        for k, (w, d) in enumerate(zip(window.dims, labels.rhs_spatial)):
            if w.size != rhs.dims[d]:
                fail(f"window size {w.size} of spatial dimension {k} "
                     f"differs from the kernel's {rhs.dims[d]}")
        spatial = window_output_dims(window, tuple(lhs.dims[d] for d in labels.lhs_spatial),
                                     "convolution")
    dims = [0] * lhs.rank
    dims[labels.out_batch] = batch // bgc
    dims[labels.out_feature] = kernel_out
    for k, d in enumerate(labels.out_spatial):
        dims[d] = spatial[k]
    return ArrayShape(_result_type(inst, lhs, rhs), tuple(dims))


_FFT_TYPES = frozenset({"FFT", "IFFT", "RFFT", "IRFFT"})


@SHAPE_RULES.register("fft")
def fft(inst: Instruction, module: Module) -> Shape:
    """fft over the trailing len(fft_length) dims. FFT/IFFT: complex -> same shape. RFFT: real ->
    complex, last dim L//2+1. IRFFT: complex with last dim L//2+1 -> real with last dim L."""
    x = operand_array(inst, 0)
    kind = attr_ident(inst, "fft_type", _FFT_TYPES)
    lengths = attr_ints(inst, "fft_length")
    n = len(lengths)
    if not (1 <= n <= 3 and x.rank >= n):
        fail(f"fft_length {list(lengths)} needs 1 to 3 entries and at most the rank of {x}")
    trailing = x.dims[x.rank - n:]
    half = lengths[-1] // 2 + 1
    if kind in ("FFT", "IFFT"):
        if not dtypes.is_complex(x.element_type):
            fail(f"{kind} needs a complex operand, found {x}")
        if trailing != lengths:
            fail(f"fft_length {list(lengths)} differs from the trailing "
                 f"dims of {x}")
        return strip(x)
    if kind == "RFFT":
        if x.element_type not in ("f32", "f64"):
            fail(f"RFFT needs an f32/f64 operand, found {x}")
        if trailing != lengths:
            fail(f"fft_length {list(lengths)} differs from the trailing "
                 f"dims of {x}")
        return ArrayShape("c64" if x.element_type == "f32" else "c128", x.dims[:-1] + (half,))
    if x.element_type not in ("c64", "c128"):
        fail(f"IRFFT needs a complex operand, found {x}")
    if trailing != lengths[:-1] + (half,):
        fail(f"IRFFT with fft_length {list(lengths)} needs "
             f"trailing dims {list(lengths[:-1] + (half,))}, found {x}")
    return ArrayShape("f32" if x.element_type == "c64" else "f64", x.dims[:-1] + (lengths[-1],))


def _square_matrices(x: ArrayShape, what: str) -> None:
    if not (dtypes.is_float(x.element_type) or dtypes.is_complex(x.element_type)):
        fail(f"{what} must be floating or complex, found {x}")
    if not (x.rank >= 2 and x.dims[-1] == x.dims[-2]):
        fail(f"{what} must be (a batch of) square matrices, found {x}")


@SHAPE_RULES.register("cholesky")
def cholesky(inst: Instruction, module: Module) -> Shape:
    x = operand_array(inst, 0)
    _square_matrices(x, "cholesky operand")
    attr_bool(inst, "lower")
    return strip(x)


_TRANSPOSE_KINDS = frozenset({"NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"})


@SHAPE_RULES.register("triangular-solve")
def triangular_solve(inst: Instruction, module: Module) -> Shape:
    """Solve op(a) x = b (left_side) or x op(a) = b: a is [..., m, m], b is [..., m, n] (left) or
    [..., n, m]; the result is b's shape."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _square_matrices(a, "triangular-solve a")
    require_same_element_type([a, b], "triangular-solve operands")
    if not (b.rank == a.rank and b.dims[:-2] == a.dims[:-2]):
        fail(f"triangular-solve b {b} must have the batch dims of a {a}")
    left = attr_bool(inst, "left_side")
    attr_ident(inst, "transpose_a", _TRANSPOSE_KINDS, "NO_TRANSPOSE")
    solved = b.dims[-2] if left else b.dims[-1]
    if solved != a.dims[-1]:
        fail(f"triangular-solve a {a} does not match b {b} "
             f"(left_side={'true' if left else 'false'})")
    return strip(b)
