"""Contraction kernels (dot, ragged-dot, convolution, triangular-solve, cholesky, fft) against
independent truths: einsum written per case, and a convolution evaluated from its definition with
explicit loops over output positions and kernel taps."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import ConvDimLabels, Ident, Window, WindowDim
from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape
from gspmdc.runtime.kernels import KERNELS

RNG = np.random.default_rng(1234)


def run(opcode, element_type, dims, args, **attrs):
    inst = Instruction("x", opcode, ArrayShape(element_type, tuple(dims)), attrs=attrs)
    with np.errstate(all="ignore"):  # as the interpreter runs kernels
        out = KERNELS[opcode](inst, list(args), None)
    assert out.shape == tuple(dims)
    return out


def normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------------------ dot

def test_dot_matrix_product():
    a, b = normal(3, 4), normal(4, 5)
    out = run("dot", "f32", (3, 5), [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    np.testing.assert_allclose(out, np.einsum("mk,kn->mn", a, b), rtol=1e-5, atol=1e-6)
    assert out.dtype == np.float32


def test_dot_batch_and_several_contracting_dims_in_any_order():
    # lhs [k1, b, m, k0], rhs [n, k0, b, k1]; contracting pairs (3<->1) and (0<->3)
    a, b = normal(2, 3, 4, 5), normal(6, 5, 3, 2)
    out = run("dot", "f32", (3, 4, 6), [a, b], lhs_batch_dims=(1,), rhs_batch_dims=(2,),
              lhs_contracting_dims=(3, 0), rhs_contracting_dims=(1, 3))
    np.testing.assert_allclose(out, np.einsum("pbmq,nqbp->bmn", a, b), rtol=1e-5, atol=1e-5)


def test_dot_two_batch_dims_and_free_dims_on_both_sides():
    a, b = normal(2, 7, 3, 4), normal(3, 4, 2, 5)
    out = run("dot", "f32", (2, 3, 7, 5), [a, b], lhs_batch_dims=(0, 2), rhs_batch_dims=(2, 0),
              lhs_contracting_dims=(3,), rhs_contracting_dims=(1,))
    np.testing.assert_allclose(out, np.einsum("amck,ckan->acmn", a, b), rtol=1e-5, atol=1e-5)


def test_dot_outer_product_without_contraction():
    a, b = normal(3), normal(4)
    np.testing.assert_allclose(run("dot", "f32", (3, 4), [a, b]), np.outer(a, b), rtol=1e-6)


def test_dot_integer_accumulates_in_result_type_with_wraparound():
    a = RNG.integers(-128, 128, (4, 6)).astype(np.int8)
    b = RNG.integers(-128, 128, (6, 3)).astype(np.int8)
    out = run("dot", "s32", (4, 3), [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
    big = np.full((1, 2), 2**30, np.int32)
    ones = np.ones((2, 1), np.int32)
    wrapped = run("dot", "s32", (1, 1), [big, ones], lhs_contracting_dims=(1,),
                  rhs_contracting_dims=(0,))
    assert wrapped[0, 0] == -(2**31)  # 2^31 wraps in s32


def test_dot_bf16_accumulates_in_f32_and_rounds_once():
    a = normal(2, 64).astype(ml_dtypes.bfloat16)
    b = normal(64, 3).astype(ml_dtypes.bfloat16)
    out = run("dot", "bf16", (2, 3), [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    assert out.dtype == ml_dtypes.bfloat16
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_array_equal(out, exact.astype(np.float32).astype(ml_dtypes.bfloat16))


def test_dot_mixed_operand_types_to_f32():
    a, b = normal(2, 3).astype(ml_dtypes.bfloat16), normal(3, 2)
    out = run("dot", "f32", (2, 2), [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    np.testing.assert_allclose(out, a.astype(np.float32) @ b, rtol=1e-6)


def test_dot_pred_is_or_of_ands():
    a = np.array([[True, False], [False, False]])
    b = np.array([[True, False], [True, True]])
    out = run("dot", "pred", (2, 2), [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    np.testing.assert_array_equal(out, [[True, False], [False, False]])


def test_dot_empty_contraction_gives_zeros_and_empty_free_dims():
    out = run("dot", "f32", (3, 2), [normal(3, 0), normal(0, 2)], lhs_contracting_dims=(1,),
              rhs_contracting_dims=(0,))
    np.testing.assert_array_equal(out, np.zeros((3, 2)))
    assert run("dot", "f32", (0, 2), [normal(0, 4), normal(4, 2)], lhs_contracting_dims=(1,),
               rhs_contracting_dims=(0,)).shape == (0, 2)


def test_dot_complex():
    a = (normal(2, 3) + 1j * normal(2, 3)).astype(np.complex64)
    b = (normal(3, 2) + 1j * normal(3, 2)).astype(np.complex64)
    out = run("dot", "c64", (2, 2), [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


@pytest.mark.parametrize("element_type", ["f32", "bf16", "s32", "c64"])
def test_dot_batch_items_shared_by_threads_give_one_threads_bits(monkeypatch, element_type):
    """With tiles of one item and a BLAS count of 3, a batched dot's items are multiplied by the
    caller and two helper threads, each with one BLAS thread; with a count of 1 by the caller
    alone. Either way: bit for bit numpy's product of the whole batch on one BLAS thread (its
    batch dims not leading, so the operands are permuted first), in the result type, and
    einsum's values. An OpenBLAS is needed to set the count."""
    import threading
    from gspmdc.ir import dtypes
    from gspmdc.runtime.blas import blas_threads_set_to, loaded_blas
    from gspmdc.runtime.kernels import contraction
    if loaded_blas() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS whose thread count can be set")
    monkeypatch.setattr(contraction, "TILE_MULTIPLY_ADDS", 1)
    names = []
    multiply = contraction._multiply_items
    monkeypatch.setattr(contraction, "_multiply_items", lambda *args: names.append(
        threading.current_thread().name) or multiply(*args))
    result, acc = dtypes.numpy_dtype(element_type), contraction.accumulation_dtype(element_type)
    # lhs [k, b0, m, b1], rhs [b1, n, b0, k]
    a, b = (normal(24, 3, 40, 4) * 4).astype(result), (normal(4, 56, 3, 24) * 4).astype(result)
    if element_type == "c64":
        a = (a + 1j * normal(*a.shape)).astype(result)
        b = (b - 1j * normal(*b.shape)).astype(result)
    with blas_threads_set_to(1):
        whole = np.matmul(a.astype(acc).transpose(1, 3, 2, 0).reshape(12, 40, 24),
                          b.astype(acc).transpose(2, 0, 3, 1).reshape(12, 24, 56))
    expected = whole.reshape(3, 4, 40, 56).astype(result)
    caller = threading.current_thread().name
    for threads in (3, 1):
        names.clear()
        with blas_threads_set_to(threads):
            out = run("dot", element_type, (3, 4, 40, 56), [a, b], lhs_batch_dims=(1, 3),
                      rhs_batch_dims=(2, 0), lhs_contracting_dims=(0,), rhs_contracting_dims=(3,))
        assert out.dtype == result
        np.testing.assert_array_equal(out, expected)
        assert names.count(caller) == 1 and len(names) == threads
        assert all(n.startswith("gspmdc-tiles") for n in names if n != caller)
    np.testing.assert_allclose(out.astype(acc), np.einsum("kamb,bnak->abmn", a.astype(acc),
                                                          b.astype(acc)), rtol=2e-2, atol=2e-1)


@pytest.mark.parametrize("element_type", ["f32", "f64", "s32"])
@pytest.mark.parametrize("tiles", ["one", "several"])
def test_dot_large_result_on_a_cache_line_with_numpys_values(monkeypatch, element_type, tiles):
    """A dot whose result holds more than `allocation.ALIGNED_BYTES` writes it into memory
    aligned to 64 bytes (`np.matmul`'s own result sits wherever `malloc` puts it); the values
    are bit for bit numpy's product of the same operands with as many BLAS threads ("one" tile),
    or on one BLAS thread when the batch's items are shared by threads ("several" tiles). Result
    shapes of several sizes, so that no chance alignment passes."""
    from gspmdc.ir import dtypes
    from gspmdc.runtime.allocation import ALIGNED_BYTES, ALIGNMENT
    from gspmdc.runtime.blas import blas_threads_set_to, loaded_blas
    from gspmdc.runtime.kernels import contraction
    if tiles == "several":
        if loaded_blas() is None:
            pytest.skip("numpy's BLAS here is not an OpenBLAS whose thread count can be set")
        monkeypatch.setattr(contraction, "TILE_MULTIPLY_ADDS", 1)
    dtype = dtypes.numpy_dtype(element_type)
    for m, n in ((512, 512 + 8), (520, 1024), (1000, 300), (257, 2048)):
        b = 2 if tiles == "several" else 1
        assert b * m * n * dtype.itemsize > ALIGNED_BYTES
        a, c = (normal(b, m, 24) * 4).astype(dtype), (normal(b, 24, n) * 4).astype(dtype)
        with blas_threads_set_to(1 if tiles == "several" else 2):
            want = np.matmul(a, c)
        with blas_threads_set_to(2):
            out = run("dot", element_type, (b, m, n), [a, c], lhs_batch_dims=(0,),
                      rhs_batch_dims=(0,), lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))
        assert out.__array_interface__["data"][0] % ALIGNMENT == 0, (m, n)
        assert out.dtype == dtype and out.flags.c_contiguous
        np.testing.assert_array_equal(out, want)


def test_sparse_dot_is_unsupported():
    inst = Instruction("x", "dot", ArrayShape("f32", (2, 2)), attrs={})
    with pytest.raises(UnsupportedError):
        KERNELS["dot"](inst, [normal(2, 2), normal(2, 2), normal(2)], None)


# ----------------------------------------------------------------------------------- ragged-dot

def test_ragged_dot_non_contracting_mode_rows_use_their_group():
    lhs, rhs = normal(7, 3), normal(3, 3, 4)
    sizes = np.array([2, 0, 3], np.int32)
    out = run("ragged-dot", "f32", (7, 4), [lhs, rhs, sizes], lhs_contracting_dims=(1,),
              rhs_contracting_dims=(1,), lhs_ragged_dims=(0,), rhs_group_dims=(0,))
    group_of_row = [0, 0, 2, 2, 2, None, None]  # rows past sum(sizes) are zero
    expected = np.stack([lhs[m] @ rhs[g] if g is not None else np.zeros(4, np.float32)
                         for m, g in enumerate(group_of_row)])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_ragged_dot_non_contracting_mode_with_batch_and_per_batch_sizes():
    # lhs [b, m, k], rhs [b, g, k, n], group_sizes [b, g]
    lhs, rhs = normal(2, 5, 3), normal(2, 2, 3, 4)
    sizes = np.array([[1, 4], [3, 1]], np.uint32)
    out = run("ragged-dot", "f32", (2, 5, 4), [lhs, rhs, sizes], lhs_batch_dims=(0,),
              rhs_batch_dims=(0,), lhs_contracting_dims=(2,), rhs_contracting_dims=(2,),
              lhs_ragged_dims=(1,), rhs_group_dims=(1,))
    groups = [[0, 1, 1, 1, 1], [0, 0, 0, 1, None]]
    expected = np.zeros((2, 5, 4), np.float32)
    for b in range(2):
        for m, g in enumerate(groups[b]):
            if g is not None:
                expected[b, m] = lhs[b, m] @ rhs[b, g]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_ragged_dot_contracting_mode_adds_a_group_dim():
    lhs, rhs = normal(2, 6), normal(6, 4)
    sizes = np.array([1, 3, 1], np.int64)
    out = run("ragged-dot", "f32", (3, 2, 4), [lhs, rhs, sizes], lhs_contracting_dims=(1,),
              rhs_contracting_dims=(0,), lhs_ragged_dims=(1,))
    spans = [(0, 1), (1, 4), (4, 5)]  # position 5 is in no group
    expected = np.stack([lhs[:, a:b] @ rhs[a:b] for a, b in spans])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_ragged_dot_batch_mode_is_an_ordinary_dot():
    lhs, rhs = normal(5, 2, 3), normal(5, 3, 4)
    out = run("ragged-dot", "f32", (5, 2, 4), [lhs, rhs, np.array([1, 2], np.int32)],
              lhs_batch_dims=(0,), rhs_batch_dims=(0,), lhs_contracting_dims=(2,),
              rhs_contracting_dims=(1,), lhs_ragged_dims=(0,))
    np.testing.assert_allclose(out, np.einsum("bmk,bkn->bmn", lhs, rhs), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------- convolution

def conv_by_definition(lhs, rhs, strides, pads, lhs_dil, rhs_dil, reversal, fgc=1, bgc=1):
    """lhs [N, C, S...], rhs [O, I, K...] -> [N/bgc, O, P...], straight from XLA's definition:
    output position p and tap k read dilated-and-padded input position p*stride + k*rhs_dil - lo,
    which is a real input element when it is a multiple of lhs_dil inside the input."""
    n, c, *spatial = lhs.shape
    o, i, *ksizes = rhs.shape
    out_sizes = []
    for s, k, st, (lo, hi), ld, rd in zip(spatial, ksizes, strides, pads, lhs_dil, rhs_dil):
        span = (s - 1) * ld + 1 + lo + hi if s else lo + hi
        window = (k - 1) * rd + 1
        out_sizes.append(max((span - window) // st + 1, 0) if span >= window else 0)
    out_batch = n // bgc
    out = np.zeros([out_batch, o] + out_sizes, np.float64)
    per_group = o // (fgc * bgc)
    for b, f in itertools.product(range(out_batch), range(o)):
        group = f // per_group
        src_batch = group * out_batch + b if bgc > 1 else b
        channel0 = group * i if fgc > 1 else 0
        for pos in itertools.product(*[range(p) for p in out_sizes]):
            total = 0.0
            for ch, taps in itertools.product(range(i), itertools.product(*map(range, ksizes))):
                coord = []
                for d, (p, k) in enumerate(zip(pos, taps)):
                    x = p * strides[d] + k * rhs_dil[d] - pads[d][0]
                    if x < 0 or x % lhs_dil[d] or x // lhs_dil[d] >= spatial[d]:
                        break
                    coord.append(x // lhs_dil[d])
                else:
                    kk = tuple(ksizes[d] - 1 - t if reversal[d] else t for d, t in enumerate(taps))
                    total += lhs[(src_batch, channel0 + ch, *coord)] * rhs[(f, ch, *kk)]
            out[(b, f, *pos)] = total
    return out


def window(sizes, strides=None, pads=None, lhs_dil=None, rhs_dil=None, reversal=None):
    n = len(sizes)
    strides, pads = strides or [1] * n, pads or [(0, 0)] * n
    lhs_dil, rhs_dil, reversal = lhs_dil or [1] * n, rhs_dil or [1] * n, reversal or [0] * n
    return Window(tuple(WindowDim(s, st, lo, hi, ld, rd, bool(r)) for s, st, (lo, hi), ld, rd, r
                        in zip(sizes, strides, pads, lhs_dil, rhs_dil, reversal)))


CONV_CASES = {
    "plain": dict(strides=[1, 1], pads=[(0, 0), (0, 0)], lhs_dil=[1, 1], rhs_dil=[1, 1],
                  reversal=[0, 0]),
    "stride_pad": dict(strides=[2, 3], pads=[(1, 2), (2, 0)], lhs_dil=[1, 1], rhs_dil=[1, 1],
                       reversal=[0, 0]),
    "negative_pad": dict(strides=[1, 2], pads=[(-1, 1), (0, -2)], lhs_dil=[1, 1],
                         rhs_dil=[1, 1], reversal=[0, 0]),
    "lhs_dilation": dict(strides=[1, 1], pads=[(1, 1), (2, 1)], lhs_dil=[2, 3], rhs_dil=[1, 1],
                         reversal=[0, 0]),
    "rhs_dilation_reversal": dict(strides=[1, 2], pads=[(2, 2), (0, 1)], lhs_dil=[1, 1],
                                  rhs_dil=[2, 2], reversal=[1, 0]),
    "everything": dict(strides=[2, 1], pads=[(-1, 3), (1, -1)], lhs_dil=[2, 1], rhs_dil=[1, 2],
                       reversal=[1, 1]),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_window_attributes(case):
    p = CONV_CASES[case]
    lhs, rhs = normal(2, 3, 6, 7), normal(4, 3, 3, 2)
    expected = conv_by_definition(lhs, rhs, **p)
    out = run("convolution", "f32", expected.shape, [lhs, rhs],
              window=window([3, 2], p["strides"], p["pads"], p["lhs_dil"], p["rhs_dil"],
                            p["reversal"]),
              dim_labels=ConvDimLabels("bf01", "oi01", "bf01"))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("budget", [1, 700, 2000])
@pytest.mark.parametrize("case", ["everything", "rhs_dilation_reversal"])
def test_convolution_in_im2col_chunks(monkeypatch, case, budget):
    """A small IM2COL_BYTES cuts the output positions into tiles (one row at a time, a range of
    a spatial axis, whole batch items); the result is unchanged."""
    from gspmdc.runtime.kernels import convolution
    monkeypatch.setattr(convolution, "IM2COL_BYTES", budget)
    test_convolution_window_attributes(case)


@pytest.mark.parametrize("rows", [1, 5, 7])
@pytest.mark.parametrize("case", ["everything", "rhs_dilation_reversal"])
def test_convolution_in_cache_sized_tiles_of_a_few_rows(monkeypatch, case, rows):
    """Tiles of `MIN_TILE_ROWS` patches when TILE_BYTES holds fewer (the last tile partial, one
    copy buffer for all): the result is unchanged."""
    from gspmdc.runtime.kernels import convolution
    monkeypatch.setattr(convolution, "TILE_BYTES", 1)
    monkeypatch.setattr(convolution, "MIN_TILE_ROWS", rows)
    test_convolution_window_attributes(case)


def test_convolution_odd_dim_labels():
    # canonical lhs [N=2, C=3, S0=5, S1=4], rhs [O=2, I=3, K0=2, K1=3]
    lhs, rhs = normal(2, 3, 5, 4), normal(2, 3, 2, 3)
    p = dict(strides=[1, 2], pads=[(1, 0), (1, 1)], lhs_dil=[1, 1], rhs_dil=[1, 1],
             reversal=[0, 0])
    expected = conv_by_definition(lhs, rhs, **p)               # [N, O, P0, P1]
    lhs_f01b = lhs.transpose(1, 2, 3, 0)                       # f01b
    rhs_i10o = rhs.transpose(1, 3, 2, 0)                       # i10o
    out = run("convolution", "f32", expected.transpose(2, 3, 0, 1).shape, [lhs_f01b, rhs_i10o],
              window=window([2, 3], p["strides"], p["pads"]),
              dim_labels=ConvDimLabels("f01b", "i10o", "01bf"))
    np.testing.assert_allclose(out, expected.transpose(2, 3, 0, 1), rtol=1e-4, atol=1e-4)


def test_convolution_feature_groups():
    lhs, rhs = normal(2, 6, 5), normal(4, 3, 2)                # 2 groups of 3 input features
    p = dict(strides=[1], pads=[(1, 1)], lhs_dil=[1], rhs_dil=[1], reversal=[0])
    expected = conv_by_definition(lhs, rhs, fgc=2, **p)
    out = run("convolution", "f32", expected.shape, [lhs, rhs], window=window([2], pads=[(1, 1)]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"), feature_group_count=2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_convolution_depthwise():
    lhs, rhs = normal(1, 4, 6), normal(8, 1, 3)                # multiplier 2
    expected = conv_by_definition(lhs, rhs, [1], [(1, 1)], [1], [1], [0], fgc=4)
    out = run("convolution", "f32", expected.shape, [lhs, rhs], window=window([3], pads=[(1, 1)]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"), feature_group_count=4)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


CHANNELS_LAST = ConvDimLabels("b01f", "01io", "b01f")           # JAX's layout


def nhwc(lhs_nchw, rhs_oihw):
    return lhs_nchw.transpose(0, 2, 3, 1), rhs_oihw.transpose(2, 3, 1, 0)


@pytest.mark.parametrize("budget", [None, 40])
def test_convolution_depthwise_channels_last_strided_dilated(monkeypatch, budget):
    """Every group reads one channel (multiplier 2): the tap-by-tap path, in JAX's layout, with
    strides, padding and window dilation; unaffected by the tile budget."""
    from gspmdc.runtime.kernels import convolution
    if budget is not None:
        monkeypatch.setattr(convolution, "IM2COL_BYTES", budget)
    lhs, rhs = normal(2, 4, 7, 6), normal(8, 1, 3, 2)
    p = dict(strides=[2, 1], pads=[(1, 1), (0, 1)], lhs_dil=[1, 1], rhs_dil=[1, 2],
             reversal=[0, 0])
    expected = conv_by_definition(lhs, rhs, fgc=4, **p).transpose(0, 2, 3, 1)
    out = run("convolution", "f32", expected.shape, list(nhwc(lhs, rhs)),
              window=window([3, 2], p["strides"], p["pads"], rhs_dil=p["rhs_dil"]),
              dim_labels=CHANNELS_LAST, feature_group_count=4)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("budget", [None, 200, 1])
def test_convolution_grouped_channels_last_in_tiles(monkeypatch, budget):
    """Two groups of three channels, stride and base dilation, tiles of one row up to all rows
    (crossing batch items and spatial rows): the same result as the definition."""
    from gspmdc.runtime.kernels import convolution
    if budget is not None:
        monkeypatch.setattr(convolution, "IM2COL_BYTES", budget)
    lhs, rhs = normal(3, 6, 5, 6), normal(4, 3, 2, 3)
    p = dict(strides=[1, 2], pads=[(1, 0), (2, 1)], lhs_dil=[2, 1], rhs_dil=[1, 1],
             reversal=[0, 1])
    expected = conv_by_definition(lhs, rhs, fgc=2, **p).transpose(0, 2, 3, 1)
    out = run("convolution", "f32", expected.shape, list(nhwc(lhs, rhs)),
              window=window([2, 3], p["strides"], p["pads"], p["lhs_dil"], reversal=p["reversal"]),
              dim_labels=CHANNELS_LAST, feature_group_count=2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_convolution_one_by_one_is_a_matrix_product():
    """A 1x1 kernel at stride 1 reads the input in place (no patch copy): an einsum."""
    lhs, rhs = normal(2, 5, 4, 3), normal(1, 1, 3, 7)
    out = run("convolution", "f32", (2, 5, 4, 7), [lhs, rhs], window=window([1, 1]),
              dim_labels=CHANNELS_LAST)
    np.testing.assert_allclose(out, np.einsum("bhwc,co->bhwo", lhs, rhs[0, 0]), rtol=1e-5,
                               atol=1e-5)


def test_convolution_bf16_in_tiles_accumulates_in_f32(monkeypatch):
    from gspmdc.runtime.kernels import convolution
    monkeypatch.setattr(convolution, "IM2COL_BYTES", 64)
    # sums of at most 18 products of magnitude <= 4: exact in bf16, so exact equality holds
    lhs = RNG.integers(-2, 2, (2, 3, 6, 5)).astype(np.float32)
    rhs = RNG.integers(-2, 2, (4, 3, 3, 2)).astype(np.float32)
    expected = conv_by_definition(lhs, rhs, [1, 1], [(1, 1), (0, 0)], [1, 1], [1, 1], [0, 0])
    lb, rb = (a.astype(ml_dtypes.bfloat16) for a in nhwc(lhs, rhs))
    out = run("convolution", "bf16", expected.transpose(0, 2, 3, 1).shape, [lb, rb],
              window=window([3, 2], pads=[(1, 1), (0, 0)]), dim_labels=CHANNELS_LAST)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float64), expected.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("rows", [None, 3])
def test_convolution_spatial_major_bf16_as_in_while_conv(monkeypatch, rows):
    """XLA's `WhileConv` layout, `0bf_io0->0bf` with a size-1 window: the spatial dim leads and
    the batch sits in the middle, so the channels-last view of the input is a transposed one and
    each tile's patches are gathered from it; bf16 accumulated in f32 and rounded once. Against
    the definition, in one tile and in tiles of 3 rows (crossing spatial positions)."""
    from gspmdc.runtime.kernels import convolution
    if rows is not None:
        monkeypatch.setattr(convolution, "TILE_BYTES", 1)
        monkeypatch.setattr(convolution, "MIN_TILE_ROWS", rows)
    # sums of 6 products of integers in [-2, 2): exact in f32 and in bf16
    lhs = RNG.integers(-2, 2, (5, 4, 6)).astype(np.float32)         # [S, N, C]
    rhs = RNG.integers(-2, 2, (6, 7, 1)).astype(np.float32)         # [I, O, K]
    expected = conv_by_definition(lhs.transpose(1, 2, 0), rhs.transpose(1, 0, 2), [1],
                                  [(0, 0)], [1], [1], [0])          # [N, O, S]
    out = run("convolution", "bf16", (5, 4, 7),
              [lhs.astype(ml_dtypes.bfloat16), rhs.astype(ml_dtypes.bfloat16)],
              window=window([1]), dim_labels=ConvDimLabels("0bf", "io0", "0bf"))
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float64), expected.transpose(2, 0, 1))


def test_convolution_batch_groups():
    lhs, rhs = normal(4, 3, 5), normal(4, 3, 2)                # 2 batch groups of 2
    expected = conv_by_definition(lhs, rhs, [1], [(0, 0)], [1], [1], [0], bgc=2)
    out = run("convolution", "f32", expected.shape, [lhs, rhs], window=window([2]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"), batch_group_count=2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    # the same values hand-derived: output feature block j reads lhs batch block j
    block0 = conv_by_definition(lhs[0:2], rhs[0:2], [1], [(0, 0)], [1], [1], [0])
    np.testing.assert_allclose(out[:, 0:2], block0, rtol=1e-4, atol=1e-4)


def test_convolution_integer_and_bf16():
    lhs = RNG.integers(-5, 5, (1, 2, 4)).astype(np.int32)
    rhs = RNG.integers(-5, 5, (3, 2, 2)).astype(np.int32)
    expected = conv_by_definition(lhs, rhs, [1], [(0, 0)], [1], [1], [0])
    out = run("convolution", "s32", expected.shape, [lhs, rhs], window=window([2]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"))
    np.testing.assert_array_equal(out, expected.astype(np.int32))
    lb, rb = lhs.astype(ml_dtypes.bfloat16), rhs.astype(ml_dtypes.bfloat16)
    out = run("convolution", "bf16", expected.shape, [lb, rb], window=window([2]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"))
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float64), expected)


PATCH_MAJOR_CASES = {
    **CONV_CASES,
    "stem": dict(strides=[2, 2], pads=[(3, 3), (3, 3)], lhs_dil=[1, 1], rhs_dil=[1, 1],
                 reversal=[0, 0]),
    "stride_3_dilation_2": dict(strides=[1, 3], pads=[(0, 1), (2, 2)], lhs_dil=[1, 1],
                                rhs_dil=[1, 2], reversal=[0, 1]),
    "stride_4_dilation_2": dict(strides=[2, 4], pads=[(1, 0), (1, 3)], lhs_dil=[1, 2],
                                rhs_dil=[2, 2], reversal=[0, 0]),
    "crop_base_dilation_3": dict(strides=[1, 2], pads=[(-1, 0), (-3, 2)], lhs_dil=[2, 3],
                                 rhs_dil=[1, 1], reversal=[0, 1]),
}


def patch_major_spy(monkeypatch):
    """Records the last dim's stride of each input the convolution kernel lays out for
    tap-major copies."""
    from gspmdc.runtime.kernels import convolution
    calls = []
    planar = convolution._planar
    monkeypatch.setattr(convolution, "_planar", lambda x, padding, window: calls.append(
        window.dims[-1].stride) or planar(x, padding, window))
    return calls


@pytest.mark.parametrize("rows", [None, 1, 7])
@pytest.mark.parametrize("case", PATCH_MAJOR_CASES)
def test_convolution_patch_major_few_channels_long_rows(monkeypatch, case, rows):
    """Two channels and a last spatial dim longer than a patch's runs of input (a stem's 7x7
    kernel on 3 channels): patches are copied patch-major, one view per position phase of the
    last dim's stride (several taps per phase, window dilation sharing a factor with the stride
    or not, reversal, cropping, base dilation), in one tile and in tiles of 1 and 7 rows (each a
    whole output row), the input dilated, padded and cropped straight into that layout; the same
    result as the definition."""
    from gspmdc.runtime.kernels import convolution
    if rows is not None:
        monkeypatch.setattr(convolution, "TILE_BYTES", 1)
        monkeypatch.setattr(convolution, "MIN_TILE_ROWS", rows)
    calls = patch_major_spy(monkeypatch)
    p = PATCH_MAJOR_CASES[case]
    lhs, rhs = normal(2, 2, 6, 41), normal(5, 2, 3, 5)
    expected = conv_by_definition(lhs, rhs, **p).transpose(0, 2, 3, 1)
    out = run("convolution", "f32", expected.shape, list(nhwc(lhs, rhs)),
              window=window([3, 5], p["strides"], p["pads"], p["lhs_dil"], p["rhs_dil"],
                            p["reversal"]),
              dim_labels=CHANNELS_LAST)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert calls == [p["strides"][1]]


@pytest.mark.parametrize("groups", ["feature_group_count", "batch_group_count"])
def test_convolution_patch_major_groups_1d_and_3d(monkeypatch, groups):
    """Patch-major copies per group (a slice of the channels, or of the batch) of one laid-out
    input, and with one and three spatial dims, in tiles of 5 rows; bf16 accumulated in f32
    (integers: exact)."""
    from gspmdc.runtime.kernels import convolution
    monkeypatch.setattr(convolution, "TILE_BYTES", 1)
    monkeypatch.setattr(convolution, "MIN_TILE_ROWS", 5)
    calls = patch_major_spy(monkeypatch)
    fgc, bgc = (2, 1) if groups == "feature_group_count" else (1, 2)
    lhs = RNG.integers(-2, 2, (4, 2 * fgc, 19)).astype(np.float32)
    rhs = RNG.integers(-2, 2, (4, 2, 4)).astype(np.float32)
    p = dict(strides=[2], pads=[(2, 1)], lhs_dil=[1], rhs_dil=[1], reversal=[0])
    expected = conv_by_definition(lhs, rhs, fgc=fgc, bgc=bgc, **p)
    out = run("convolution", "bf16", expected.shape,
              [lhs.astype(ml_dtypes.bfloat16), rhs.astype(ml_dtypes.bfloat16)],
              window=window([4], p["strides"], p["pads"]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"), **{groups: 2})
    np.testing.assert_array_equal(out.astype(np.float64), expected)
    lhs, rhs = normal(2, 1, 3, 4, 12), normal(3, 1, 2, 2, 3)
    p = dict(strides=[1, 2, 3], pads=[(0, 0), (1, 0), (1, 1)], lhs_dil=[1, 1, 1],
             rhs_dil=[1, 1, 2], reversal=[0, 1, 0])
    expected = conv_by_definition(lhs, rhs, **p)
    out = run("convolution", "f32", expected.shape, [lhs, rhs],
              window=window([2, 2, 3], p["strides"], p["pads"], rhs_dil=p["rhs_dil"],
                            reversal=p["reversal"]),
              dim_labels=ConvDimLabels("bf012", "oi012", "bf012"))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert calls == [2, 3]


@pytest.mark.parametrize("layout", ["row-major", "tap-major"])
def test_convolution_tiles_shared_by_threads_give_one_threads_bits(monkeypatch, layout):
    """With a BLAS count of 3, the tiles are taken by the caller and two helper threads, each
    product with one BLAS thread: bit for bit the result of a count of 1 (which multiplies every
    tile on the caller), and the definition's. An OpenBLAS is needed to set the count."""
    import threading
    from gspmdc.runtime.blas import blas_threads_set_to, loaded_blas
    from gspmdc.runtime.kernels import convolution
    if loaded_blas() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS whose thread count can be set")
    monkeypatch.setattr(convolution, "TILE_BYTES", 1)
    monkeypatch.setattr(convolution, "MIN_TILE_ROWS", 4)
    names = []
    multiply = convolution._multiply
    monkeypatch.setattr(convolution, "_multiply", lambda *args: names.append(
        threading.current_thread().name) or multiply(*args))
    channels, width = (8, 6) if layout == "row-major" else (2, 40)
    lhs, rhs = normal(2, channels, 5, width), normal(3, channels, 3, 3)
    p = dict(strides=[1, 2], pads=[(1, 1), (1, 0)], lhs_dil=[1, 1], rhs_dil=[1, 1],
             reversal=[0, 0])
    expected = conv_by_definition(lhs, rhs, **p).transpose(0, 2, 3, 1)
    outs = {}
    for threads in (3, 1):
        with blas_threads_set_to(threads):
            outs[threads] = run("convolution", "f32", expected.shape, list(nhwc(lhs, rhs)),
                                window=window([3, 3], p["strides"], p["pads"]),
                                dim_labels=CHANNELS_LAST)
    np.testing.assert_array_equal(outs[3], outs[1])
    np.testing.assert_allclose(outs[3], expected, rtol=1e-4, atol=1e-4)
    caller = threading.current_thread().name
    assert len(names) == 4 and names[3] == caller and names[:3].count(caller) == 1
    assert all(n.startswith("gspmdc-tiles") for n in names[:3] if n != caller)


def test_convolution_empty_output_and_window_larger_than_input():
    lhs, rhs = normal(2, 3, 2), normal(4, 3, 5)
    out = run("convolution", "f32", (2, 4, 0), [lhs, rhs], window=window([5]),
              dim_labels=ConvDimLabels("bf0", "oi0", "bf0"))
    assert out.shape == (2, 4, 0)
    out = run("convolution", "f32", (2, 4, 1), [normal(2, 0, 5), normal(4, 0, 5)],
              window=window([5]), dim_labels=ConvDimLabels("bf0", "oi0", "bf0"))
    np.testing.assert_array_equal(out, np.zeros((2, 4, 1)))


def test_convolution_without_spatial_dims_is_a_matmul():
    lhs, rhs = normal(3, 4), normal(4, 5)
    out = run("convolution", "f32", (3, 5), [lhs, rhs], window=Window(()),
              dim_labels=ConvDimLabels("bf", "io", "bf"))
    np.testing.assert_allclose(out, lhs @ rhs, rtol=1e-5, atol=1e-6)


def test_convolution_both_group_counts_is_unsupported():
    with pytest.raises(UnsupportedError):
        run("convolution", "f32", (1, 4, 1), [normal(2, 4, 1), normal(4, 2, 1)],
            window=window([1]), dim_labels=ConvDimLabels("bf0", "oi0", "bf0"),
            feature_group_count=2, batch_group_count=2)


# ------------------------------------------------------------------------------- linear algebra

def triangle(m, lower, batch=()):
    a = normal(*batch, m, m)
    a += 4 * np.eye(m, dtype=np.float32)  # well conditioned
    garbage = np.triu(np.full((m, m), 1e6, np.float32), 1) if lower else \
        np.tril(np.full((m, m), 1e6, np.float32), -1)
    return a + garbage                    # the unused triangle must be ignored


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose", ["NO_TRANSPOSE", "TRANSPOSE"])
@pytest.mark.parametrize("unit", [False, True])
def test_triangular_solve(left, lower, transpose, unit):
    a = triangle(4, lower, batch=(2,))
    b = normal(2, 4, 3) if left else normal(2, 3, 4)
    out = run("triangular-solve", "f32", b.shape, [a, b], left_side=left, lower=lower,
              unit_diagonal=unit, transpose_a=Ident(transpose))
    t = np.tril(a) if lower else np.triu(a)
    if unit:
        t[:, np.arange(4), np.arange(4)] = 1
    op = t.transpose(0, 2, 1) if transpose == "TRANSPOSE" else t
    product = op @ out if left else out @ op
    np.testing.assert_allclose(product, b, rtol=1e-4, atol=1e-4)


def test_triangular_solve_adjoint_complex():
    a = triangle(3, True).astype(np.complex64) + 1j * np.tril(normal(3, 3))
    b = (normal(3, 2) + 1j * normal(3, 2)).astype(np.complex64)
    out = run("triangular-solve", "c64", (3, 2), [a, b], left_side=True, lower=True,
              transpose_a=Ident("ADJOINT"))
    np.testing.assert_allclose(np.conj(np.tril(a)).T @ out, b, rtol=1e-4, atol=1e-4)


def test_triangular_solve_singular_gives_non_finite_values():
    a = np.tril(np.ones((2, 2), np.float32))
    a[1, 1] = 0
    out = run("triangular-solve", "f32", (2, 1), [a, np.ones((2, 1), np.float32)],
              left_side=True, lower=True, transpose_a=Ident("NO_TRANSPOSE"))
    assert out[0, 0] == 1 and not np.isfinite(out[1, 0])


@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_reads_one_triangle(lower):
    m = normal(3, 4, 4)
    spd = m @ m.transpose(0, 2, 1) + 4 * np.eye(4, dtype=np.float32)
    garbage = np.triu(np.full((4, 4), 7.0, np.float32), 1) if lower else \
        np.tril(np.full((4, 4), 7.0, np.float32), -1)
    src = np.where(garbage != 0, garbage, spd)
    out = run("cholesky", "f32", spd.shape, [src], lower=lower)
    factor = np.tril(out) if lower else np.triu(out)
    product = factor @ factor.transpose(0, 2, 1) if lower else factor.transpose(0, 2, 1) @ factor
    np.testing.assert_allclose(product, spd, rtol=1e-4, atol=1e-4)


def test_cholesky_not_positive_definite_gives_nan_for_that_matrix_only():
    good = np.eye(2, dtype=np.float32) * 4
    bad = -np.eye(2, dtype=np.float32)
    out = run("cholesky", "f32", (2, 2, 2), [np.stack([good, bad])], lower=True)
    np.testing.assert_allclose(out[0], 2 * np.eye(2))
    assert np.isnan(out[1]).all()


# ------------------------------------------------------------------------------------------ fft

def test_fft_kinds():
    x = (normal(2, 8) + 1j * normal(2, 8)).astype(np.complex64)
    np.testing.assert_allclose(run("fft", "c64", (2, 8), [x], fft_type=Ident("FFT"),
                                   fft_length=(8,)), np.fft.fft(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run("fft", "c64", (2, 8), [x], fft_type=Ident("IFFT"),
                                   fft_length=(8,)), np.fft.ifft(x), rtol=1e-4, atol=1e-5)
    r = normal(3, 4, 6)
    spectrum = run("fft", "c64", (3, 4, 4), [r], fft_type=Ident("RFFT"), fft_length=(4, 6))
    np.testing.assert_allclose(spectrum, np.fft.rfft2(r), rtol=1e-4, atol=1e-4)
    back = run("fft", "f32", (3, 4, 6), [spectrum], fft_type=Ident("IRFFT"), fft_length=(4, 6))
    np.testing.assert_allclose(back, r, rtol=1e-4, atol=1e-4)


def test_convolution_and_dot_from_hlo_text():
    from gspmdc.ir.parser import parse_module
    from gspmdc.runtime.interpreter import evaluate
    text = """HloModule c
ENTRY e {
  x = f32[2,6,5,3] parameter(0)
  k = f32[3,2,3,4] parameter(1)
  w = f32[4,5] parameter(2)
  c = f32[2,6,2,4] convolution(x, k), window={size=3x2 stride=2x1 pad=1_2x0_-1 lhs_dilate=2x1 rhs_dilate=1x2 rhs_reversal=1x0}, dim_labels=b01f_01io->b01f
  ROOT d = f32[2,6,2,5] dot(c, w), lhs_contracting_dims={3}, rhs_contracting_dims={0}
}
"""
    x, k, w = normal(2, 6, 5, 3), normal(3, 2, 3, 4), normal(4, 5)
    conv = conv_by_definition(x.transpose(0, 3, 1, 2), k.transpose(3, 2, 0, 1), strides=[2, 1],
                              pads=[(1, 2), (0, -1)], lhs_dil=[2, 1], rhs_dil=[1, 2],
                              reversal=[1, 0]).transpose(0, 2, 3, 1)
    out = evaluate(parse_module(text), [x, k, w])
    np.testing.assert_allclose(out, np.einsum("abcf,fg->abcg", conv, w), rtol=1e-4, atol=1e-4)
