"""Shape rules, one group of tests per opcode family. Expected shapes are computed by hand from
XLA's operation semantics (the arithmetic is spelled out next to each case)."""
from __future__ import annotations

import pytest

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir.attributes import (
    ComputationRef, ConvDimLabels, Ident, PadDim, ReplicaGroups, SliceDim, Window, WindowDim,
)
from gspmdc.ir.module import Module
from gspmdc.ir.ops import SHAPE_RULES
from gspmdc.ir.shape_inference import check_shape, infer_shape

from shape_test_builders import S, computation, module_of, op, param, scalar_computation

EMPTY = Module("empty", [], "main")


def infer(inst, module=EMPTY) -> str:
    return str(infer_shape(inst, module))


def rejects(inst, fragment: str, module=EMPTY) -> None:
    with pytest.raises(VerificationError, match=fragment):
        infer_shape(inst, module)


def window(*dims: WindowDim) -> Window:
    return Window(tuple(dims))


# ---- table and entry points ---------------------------------------------------------------------

def test_table_covers_corpus_and_jax_opcodes():
    needed = {
        "abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt",
        "rsqrt", "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "floor", "ceil",
        "round-nearest-afz", "round-nearest-even", "sign", "not", "is-finite", "real", "imag",
        "popcnt", "count-leading-zeros", "add", "subtract", "multiply", "divide", "remainder", "power", "maximum",
        "minimum", "and", "or", "xor", "shift-left", "shift-right-arithmetic",
        "shift-right-logical", "atan2", "complex", "compare", "select", "clamp", "broadcast",
        "reshape", "transpose", "copy", "convert", "bitcast-convert", "bitcast", "concatenate",
        "slice", "dynamic-slice", "dynamic-update-slice", "pad", "reverse", "iota", "constant",
        "parameter", "tuple", "get-tuple-element", "dot", "convolution", "reduce", "reduce-window",
        "select-and-scatter", "gather", "scatter", "sort", "map", "while", "conditional", "call",
        "custom-call", "fusion", "call-start", "call-done", "opt-barrier", "rng",
        "rng-bit-generator", "rng-get-and-update-state", "partition-id", "replica-id",
        "after-all", "infeed", "outfeed", "send", "send-done", "recv", "recv-done", "all-reduce",
        "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "cholesky",
        "triangular-solve", "fft", "topk", "ragged-dot", "domain", "add-dependency",
        "get-dimension-size",
    }
    assert needed <= set(SHAPE_RULES.rules)


def test_unknown_opcode_is_unsupported():
    with pytest.raises(UnsupportedError, match="unknown opcode frobnicate"):
        infer_shape(op("frobnicate", param("f32[2]"), shape="f32[2]"), EMPTY)


def test_operand_count_is_checked():
    with pytest.raises(VerificationError, match=r"instruction a\.1: add takes 2 operands, found 1"):
        infer_shape(op("add", param("f32[2]"), name="a.1"), EMPTY)
    with pytest.raises(VerificationError, match="takes at least 2 operands"):
        infer_shape(op("reduce", param("f32[2]"), dimensions=(0,)), EMPTY)


def test_check_shape_message_names_instruction_and_both_shapes():
    x = param("f32[8]")
    inst = op("add", x, x, shape="f32[4]", name="add.3")
    with pytest.raises(VerificationError) as info:
        check_shape(inst, EMPTY)
    assert str(info.value) == ("instruction add.3: result shape f32[4] is incompatible with "
                               "inferred f32[8]")


def test_check_shape_ignores_layouts_and_accepts_given_shapes():
    x = param("f32[2,3]")
    inst = op("negate", x, shape="f32[2,3]")
    inst.shape = S("f32[2,3]{0,1}")
    check_shape(inst, EMPTY)
    check_shape(op("reshape", x, shape="f32[3,2]"), EMPTY)
    with pytest.raises(VerificationError, match="missing result shape"):
        check_shape(op("negate", x), EMPTY)


# ---- elementwise --------------------------------------------------------------------------------

def test_unary_ops_keep_shape_or_change_type_as_specified():
    f, c = param("f32[2,3]"), param("c64[4]")
    assert infer(op("negate", f)) == "f32[2,3]"
    assert infer(op("tanh", f)) == "f32[2,3]"
    assert infer(op("is-finite", f)) == "pred[2,3]"
    assert infer(op("abs", c)) == "f32[4]"
    assert infer(op("real", param("c128[5]"))) == "f64[5]"
    assert infer(op("imag", c)) == "f32[4]"
    assert infer(op("exponential", c)) == "c64[4]"
    assert infer(op("abs", param("s32[3]"))) == "s32[3]"
    assert infer(op("popcnt", param("u32[3]"))) == "u32[3]"
    assert infer(op("not", param("pred[3]"))) == "pred[3]"
    assert infer(op("copy", param("(f32[2], s32[])"))) == "(f32[2], s32[])"


@pytest.mark.parametrize("opcode, shape", [
    ("floor", "s32[3]"), ("not", "f32[3]"), ("is-finite", "s32[2]"), ("abs", "u8[2]"),
    ("sqrt", "s32[2]"), ("count-leading-zeros", "f32[2]"), ("negate", "pred[2]"),
])
def test_unary_ops_reject_wrong_element_types(opcode, shape):
    rejects(op(opcode, param(shape)), "needs a")


def test_binary_ops():
    a, b = param("f32[4,5]", 0), param("f32[4,5]", 1)
    assert infer(op("add", a, b)) == "f32[4,5]"
    assert infer(op("atan2", a, b)) == "f32[4,5]"
    assert infer(op("complex", a, b)) == "c64[4,5]"
    i = param("s32[4,5]")
    assert infer(op("shift-left", i, i)) == "s32[4,5]"
    assert infer(op("and", param("pred[3]"), param("pred[3]"))) == "pred[3]"
    rejects(op("add", a, param("f32[5,4]")), "identical dimensions")
    rejects(op("add", a, i), "one element type")
    rejects(op("add", a, param("f32[]")), "identical dimensions")  # no implicit broadcast
    rejects(op("shift-left", a, b), "integral operands")
    rejects(op("xor", a, b), "integral or pred")
    rejects(op("complex", i, i), "f32 or f64")


def test_compare_select_clamp():
    a, b = param("f32[4]", 0), param("f32[4]", 1)
    assert infer(op("compare", a, b, direction=Ident("LT"))) == "pred[4]"
    assert infer(op("compare", a, b, direction=Ident("GE"), type=Ident("TOTALORDER"))) == "pred[4]"
    rejects(op("compare", a, b), "direction")
    rejects(op("compare", a, b, direction=Ident("XX")), "direction")
    p = param("pred[4]")
    assert infer(op("select", p, a, b)) == "f32[4]"
    rejects(op("select", param("pred[]"), a, b), "does not match")
    rejects(op("select", param("pred[2]"), a, b), "does not match")
    rejects(op("select", param("s32[4]"), a, b), "must be pred")
    rejects(op("select", p, a, param("s32[4]")), "one element type")
    lo = param("f32[]")
    assert infer(op("clamp", lo, a, lo)) == "f32[4]"
    assert infer(op("clamp", a, a, a)) == "f32[4]"
    rejects(op("clamp", param("f32[2]"), a, lo), "scalar or match")


def test_convert_and_bitcast_convert():
    x = param("f32[2,3]")
    assert infer(op("convert", x, shape="s32[2,3]")) == "s32[2,3]"
    rejects(op("convert", x, shape="s32[3,2]"), "operand's dims")
    rejects(op("convert", x), "requires an explicit result shape")
    rejects(op("convert", param("c64[2]"), shape="f32[2]"), "complex")
    # equal widths keep dims; f32 -> u8 appends a minor dim of 4; u8[...,4] -> f32 consumes it
    assert infer(op("bitcast-convert", x, shape="s32[2,3]")) == "s32[2,3]"
    assert infer(op("bitcast-convert", x, shape="u8[2,3,4]")) == "u8[2,3,4]"
    assert infer(op("bitcast-convert", param("u16[5,2]"), shape="u32[5]")) == "u32[5]"
    assert infer(op("bitcast-convert", param("f64[3]"), shape="u32[3,2]")) == "u32[3,2]"
    rejects(op("bitcast-convert", x, shape="u8[2,3]"), r"must give u8\[2,3,4\]")
    rejects(op("bitcast-convert", param("u8[4,3]"), shape="f32[4]"), "minor dimension of size 4")


# ---- data movement ------------------------------------------------------------------------------

def test_broadcast_reshape_bitcast():
    x = param("f32[3]")
    assert infer(op("broadcast", x, shape="f32[2,3]", dimensions=(1,))) == "f32[2,3]"
    rejects(op("broadcast", x, shape="f32[3,2]", dimensions=(1,)), "size 3.*size 2")
    rejects(op("broadcast", x, shape="f32[2,3]", dimensions=()), "one entry per operand dim")
    rejects(op("broadcast", x, shape="s32[2,3]", dimensions=(1,)), "element type")
    rejects(op("broadcast", x, shape="f32[2,3]", dimensions=(2,)), "out of range")
    y = param("f32[4,6]")
    assert infer(op("reshape", y, shape="f32[2,12]")) == "f32[2,12]"
    rejects(op("reshape", y, shape="f32[5,5]"), "element count")
    # bitcast keeps the byte size: f32[4,6] (96 bytes) as u8[96] or f64[12]
    assert infer(op("bitcast", y, shape="f64[12]")) == "f64[12]"
    rejects(op("bitcast", y, shape="f32[4,5]"), "byte size")


def test_transpose_reverse_concatenate():
    x = param("f32[2,3,4]")
    # result dim i = operand dim perm[i]: perm {2,0,1} -> [4,2,3]
    assert infer(op("transpose", x, dimensions=(2, 0, 1))) == "f32[4,2,3]"
    rejects(op("transpose", x, dimensions=(0, 0, 1)), "permutation")
    assert infer(op("reverse", x, dimensions=(0, 2))) == "f32[2,3,4]"
    rejects(op("reverse", x, dimensions=(3,)), "out of range")
    a, b, c = param("f32[2,3]"), param("f32[2,5]"), param("f32[2,1]")
    assert infer(op("concatenate", a, b, c, dimensions=(1,))) == "f32[2,9]"
    rejects(op("concatenate", a, b, dimensions=(0,)), "differ outside dimension 0")
    rejects(op("concatenate", a, param("s32[2,3]"), dimensions=(1,)), "one element type")


def test_slice_and_dynamic_slices():
    x = param("f32[10,8]")
    # [1:9:3] -> ceil(8/3) = 3 elements; [0:8:2] -> 4 elements
    spec = (SliceDim(1, 9, 3), SliceDim(0, 8, 2))
    assert infer(op("slice", x, slice=spec)) == "f32[3,4]"
    rejects(op("slice", x, slice=(SliceDim(0, 11), SliceDim(0, 8))), "invalid for dimension 0")
    rejects(op("slice", x, slice=(SliceDim(0, 10),)), "1 entries")
    i, j = param("s32[]", 1), param("s32[]", 2)
    assert infer(op("dynamic-slice", x, i, j, dynamic_slice_sizes=(4, 8))) == "f32[4,8]"
    rejects(op("dynamic-slice", x, i, dynamic_slice_sizes=(4, 8)), "needs 2 start indices")
    rejects(op("dynamic-slice", x, i, j, dynamic_slice_sizes=(4, 9)), "exceeds dimension 1")
    rejects(op("dynamic-slice", x, i, param("f32[]"), dynamic_slice_sizes=(1, 1)), "integral")
    rejects(op("dynamic-slice", x, i, param("s64[]"), dynamic_slice_sizes=(1, 1)),
            "one element type")
    u = param("f32[3,8]")
    assert infer(op("dynamic-update-slice", x, u, i, j)) == "f32[10,8]"
    rejects(op("dynamic-update-slice", x, param("f32[3,9]"), i, j), "does not fit")
    rejects(op("dynamic-update-slice", x, u, i), "needs 2 start indices")


def test_pad_with_negative_and_interior_padding():
    x, zero = param("f32[5,4]"), param("f32[]")
    # dim 0: low 2, high -1, interior 2 -> 2 - 1 + 5 + 4*2 = 14; dim 1: -1 + -1 + 4 = 2
    spec = (PadDim(2, -1, 2), PadDim(-1, -1))
    assert infer(op("pad", x, zero, padding=spec)) == "f32[14,2]"
    rejects(op("pad", x, zero, padding=(PadDim(-3, -3), PadDim(0, 0))), "negative")
    rejects(op("pad", x, zero, padding=(PadDim(0, 0, -1), PadDim(0, 0))), "interior")
    rejects(op("pad", x, param("s32[]"), padding=spec), "one element type")


def test_values_tuples_and_markers():
    assert infer(op("iota", shape="s32[4,5]", iota_dimension=1)) == "s32[4,5]"
    rejects(op("iota", shape="s32[4,5]", iota_dimension=2), "out of range")
    rejects(op("iota", shape="s32[]", iota_dimension=0), "rank >= 1")
    assert infer(op("constant", shape="f32[2]")) == "f32[2]"
    a, b = param("f32[2]", 0), param("(s32[], pred[])", 1)
    t = op("tuple", a, b)
    assert infer(t) == "(f32[2], (s32[], pred[]))"
    t.shape = infer_shape(t, EMPTY)
    assert infer(op("get-tuple-element", t, index=1)) == "(s32[], pred[])"
    rejects(op("get-tuple-element", t, index=2), "out of range")
    rejects(op("get-tuple-element", a, index=0), "tuple operand")
    assert infer(op("opt-barrier", t)) == "(f32[2], (s32[], pred[]))"
    assert infer(op("domain", a)) == "f32[2]"
    token = param("token[]", 2)
    assert infer(op("add-dependency", a, token)) == "f32[2]"
    rejects(op("add-dependency", a, a), "token")
    assert infer(op("get-dimension-size", param("f32[3,7]"), dimensions=(1,))) == "s32[]"
    assert infer(op("partition-id")) == "u32[]"
    assert infer(op("replica-id")) == "u32[]"


# ---- contractions -------------------------------------------------------------------------------

def test_dot_general():
    lhs, rhs = param("f32[2,3,4]", 0), param("f32[2,4,5]", 1)
    dnums = dict(lhs_batch_dims=(0,), rhs_batch_dims=(0,), lhs_contracting_dims=(2,),
                 rhs_contracting_dims=(1,))
    # batch [2], lhs free [3], rhs free [5]
    assert infer(op("dot", lhs, rhs, **dnums)) == "f32[2,3,5]"
    # two contracting dims paired out of order, no batch: [7,3,2] x [2,3,5] -> [7,5]
    assert infer(op("dot", param("f32[7,3,2]"), param("f32[2,3,5]"),
                    lhs_contracting_dims=(1, 2), rhs_contracting_dims=(1, 0))) == "f32[7,5]"
    # outer product (no dimension numbers)
    assert infer(op("dot", param("f32[3]"), param("f32[4]"))) == "f32[3,4]"
    # preferred element type: bf16 x bf16 -> f32
    assert infer(op("dot", param("bf16[2,3]"), param("bf16[3,4]"), shape="f32[2,4]",
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))) == "f32[2,4]"
    assert infer(op("dot", param("s8[2,3]"), param("s8[3,4]"), shape="s32[2,4]",
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))) == "s32[2,4]"
    rejects(op("dot", param("s32[2,3]"), param("s32[3,4]"), shape="s8[2,4]",
               lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)), "narrower")
    rejects(op("dot", lhs, param("f32[2,5,5]"), **dnums), "contracting dimension sizes differ")
    rejects(op("dot", lhs, rhs, lhs_contracting_dims=(2,), rhs_contracting_dims=()),
            "differ in length")
    rejects(op("dot", lhs, rhs, lhs_batch_dims=(0,), rhs_batch_dims=(0,),
               lhs_contracting_dims=(0,), rhs_contracting_dims=(1,)), "duplicates")


def test_ragged_dot_modes():
    # batch mode (the corpus case): ragged dim 0 is a batch dim -> plain dot_general shape
    a, b, g = param("f32[16,32,63]"), param("f32[16,63,8]"), param("u32[4]")
    assert infer(op("ragged-dot", a, b, g, lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                    lhs_contracting_dims=(2,), rhs_contracting_dims=(1,),
                    lhs_ragged_dims=(0,))) == "f32[16,32,8]"
    # non-contracting: lhs [m=11,k=5], rhs [g=3,k=5,n=7] with group dim 0 -> [11,7]
    lhs, rhs, sizes = param("f32[11,5]"), param("f32[3,5,7]"), param("s32[3]")
    assert infer(op("ragged-dot", lhs, rhs, sizes, lhs_contracting_dims=(1,),
                    rhs_contracting_dims=(1,), lhs_ragged_dims=(0,),
                    rhs_group_dims=(0,))) == "f32[11,7]"
    rejects(op("ragged-dot", lhs, rhs, param("s32[4]"), lhs_contracting_dims=(1,),
               rhs_contracting_dims=(1,), lhs_ragged_dims=(0,), rhs_group_dims=(0,)),
            "number of groups 3")
    # contracting: ragged k -> one [m,n] result per group: [3,11,7]
    assert infer(op("ragged-dot", lhs, param("f32[5,7]"), sizes, lhs_contracting_dims=(1,),
                    rhs_contracting_dims=(0,), lhs_ragged_dims=(1,))) == "f32[3,11,7]"


def test_convolution_output_sizes():
    lhs, rhs = param("f32[8,32,32,3]"), param("f32[5,5,3,16]")
    labels = ConvDimLabels("b01f", "01io", "b01f")
    # (32 + 2 + 2 - 5) // 2 + 1 = 16
    w = window(*[WindowDim(5, stride=2, padding_low=2, padding_high=2)] * 2)
    assert infer(op("convolution", lhs, rhs, window=w, dim_labels=labels)) == "f32[8,16,16,16]"
    # dilations: base (32-1)*2+1 = 63, padded 67; window (5-1)*2+1 = 9 -> (67-9)//2+1 = 30
    wd = window(*[WindowDim(5, stride=2, padding_low=2, padding_high=2, base_dilation=2,
                            window_dilation=2)] * 2)
    assert infer(op("convolution", lhs, rhs, window=wd, dim_labels=labels)) == "f32[8,30,30,16]"
    # other label orders: lhs bf01 [2,3,10,12], rhs oi01 [4,3,3,3], out b01f; 10-3+1, 12-3+1
    w3 = window(WindowDim(3), WindowDim(3))
    assert infer(op("convolution", param("f32[2,3,10,12]"), param("f32[4,3,3,3]"), window=w3,
                    dim_labels=ConvDimLabels("bf01", "oi01", "b01f"))) == "f32[2,8,10,4]"
    # window larger than the padded input -> 0
    assert infer(op("convolution", param("f32[1,2,1]"), param("f32[3,1,1]"),
                    window=window(WindowDim(3)),
                    dim_labels=ConvDimLabels("b0f", "0io", "b0f"))) == "f32[1,0,1]"
    rejects(op("convolution", lhs, param("f32[3,3,3,16]"), window=w, dim_labels=labels),
            "window size 5")
    rejects(op("convolution", lhs, rhs, window=w,
               dim_labels=ConvDimLabels("b01f", "01io", "b0f")), "output labels")


def test_convolution_group_counts():
    labels = ConvDimLabels("b0f", "0io", "b0f")
    w = window(WindowDim(3, padding_low=1, padding_high=1))
    # feature groups: 6 input features = 3 per group x 2 groups; 4 output features
    assert infer(op("convolution", param("f32[2,7,6]"), param("f32[3,3,4]"), window=w,
                    dim_labels=labels, feature_group_count=2)) == "f32[2,7,4]"
    rejects(op("convolution", param("f32[2,7,6]"), param("f32[3,6,4]"), window=w,
               dim_labels=labels, feature_group_count=2), "times feature_group_count 2")
    # batch groups: batch 8 / 2 = 4, output features 4 (divisible by 2)
    assert infer(op("convolution", param("f32[8,7,3]"), param("f32[3,3,4]"), window=w,
                    dim_labels=labels, batch_group_count=2)) == "f32[4,7,4]"
    rejects(op("convolution", param("f32[8,7,3]"), param("f32[3,3,5]"), window=w,
               dim_labels=labels, batch_group_count=2), "batch_group_count 2")


def test_fft_cholesky_triangular_solve():
    assert infer(op("fft", param("c64[8,16]"), fft_type=Ident("FFT"),
                    fft_length=(16,))) == "c64[8,16]"
    # RFFT keeps L//2 + 1 = 9 frequencies; IRFFT gives back 16 reals
    assert infer(op("fft", param("f32[8,16]"), fft_type=Ident("RFFT"),
                    fft_length=(16,))) == "c64[8,9]"
    assert infer(op("fft", param("c128[4,6,9]"), fft_type=Ident("IRFFT"),
                    fft_length=(6, 16))) == "f64[4,6,16]"
    rejects(op("fft", param("f32[8,16]"), fft_type=Ident("FFT"), fft_length=(16,)), "complex")
    rejects(op("fft", param("c64[8,15]"), fft_type=Ident("FFT"), fft_length=(16,)), "trailing")
    assert infer(op("cholesky", param("f32[3,4,4]"), lower=True)) == "f32[3,4,4]"
    rejects(op("cholesky", param("f32[4,5]")), "square")
    a = param("f32[10,32,32]")
    assert infer(op("triangular-solve", a, param("f32[10,32,48]"), left_side=True,
                    lower=True, transpose_a=Ident("NO_TRANSPOSE"))) == "f32[10,32,48]"
    assert infer(op("triangular-solve", a, param("f32[10,48,32]"),
                    left_side=False)) == "f32[10,48,32]"
    rejects(op("triangular-solve", a, param("f32[10,48,32]"), left_side=True), "does not match")


# ---- reductions and applied computations --------------------------------------------------------

def test_reduce_single_and_variadic():
    add = scalar_computation("add", "add", ["f32", "f32"])
    m = module_of(add, computation("main", [], [op("partition-id")]))
    x, zero = param("f32[4,5,6]"), param("f32[]")
    assert infer(op("reduce", x, zero, dimensions=(0, 2), to_apply=ComputationRef("add")),
                 m) == "f32[5]"
    # variadic arg-max style reducer: (f32, s32, f32, s32) -> (f32, s32)
    ps = [param(t, i, f"r.p{i}") for i, t in enumerate(["f32[]", "s32[]", "f32[]", "s32[]"])]
    body = op("tuple", ps[0], ps[1], shape="(f32[], s32[])")
    argmax = computation("argmax", ps, [body])
    m2 = module_of(argmax, computation("main", [], [op("partition-id")]))
    v, i = param("f32[4,5]"), param("s32[4,5]")
    inst = op("reduce", v, i, param("f32[]"), param("s32[]"), dimensions=(1,),
              to_apply=ComputationRef("argmax"))
    assert infer(inst, m2) == "(f32[4], s32[4])"
    # the accumulator takes the init value's type; floating precisions may differ (XLA)
    assert infer(op("reduce", param("bf16[4,5,6]"), zero, dimensions=(1,),
                    to_apply=ComputationRef("add")), m) == "f32[4,6]"
    rejects(op("reduce", x, param("s32[]"), dimensions=(0,), to_apply=ComputationRef("add")),
            "reducer add parameter 0 must be a s32", m)
    rejects(op("reduce", v, i, param("f32[]"), param("s32[]"), dimensions=(1,),
               to_apply=ComputationRef("add")), "must take 4 scalar parameters", m)
    rejects(op("reduce", x, zero, dimensions=(3,), to_apply=ComputationRef("add")),
            "out of range", m)
    rejects(op("reduce", x, zero, dimensions=(0,), to_apply=ComputationRef("nope")),
            "unknown computation nope", m)


def test_reduce_window_and_select_and_scatter():
    add = scalar_computation("add", "add", ["f32", "f32"])
    ge = scalar_computation("ge", "compare", ["f32", "f32"], direction=Ident("GE"))
    m = module_of(add, ge, computation("main", [], [op("partition-id")]))
    zero = param("f32[]")
    # (4 + 2 + 2 - 5) // 3 + 1 = 2 (XLA's ReduceWindowTiled2D case)
    w = window(*[WindowDim(5, stride=3, padding_low=2, padding_high=2)] * 2, WindowDim(1),
               WindowDim(1))
    assert infer(op("reduce-window", param("f32[4,4,2,2]"), zero, window=w,
                    to_apply=ComputationRef("add")), m) == "f32[2,2,2,2]"
    rejects(op("reduce-window", param("f32[4,4]"), zero, window=w,
               to_apply=ComputationRef("add")), "window has 4 dims", m)
    # 2x3 windows with strides 2x3 over [4,6] -> source [2,2]
    w2 = window(WindowDim(2, stride=2), WindowDim(3, stride=3))
    sas = dict(window=w2, select=ComputationRef("ge"), scatter=ComputationRef("add"))
    assert infer(op("select-and-scatter", param("f32[4,6]"), param("f32[2,2]"), zero, **sas),
                 m) == "f32[4,6]"
    rejects(op("select-and-scatter", param("f32[4,6]"), param("f32[2,3]"), zero, **sas),
            "window output dims", m)
    bad = dict(sas, select=ComputationRef("add"))
    rejects(op("select-and-scatter", param("f32[4,6]"), param("f32[2,2]"), zero, **bad),
            "must return pred", m)


def test_sort_map_topk():
    lt = scalar_computation("lt", "compare", ["f32", "f32", "s32", "s32"], direction=Ident("LT"))
    lt.root.operands = lt.root.operands[:2]
    add = scalar_computation("add", "add", ["f32", "f32"])
    m = module_of(lt, add, computation("main", [], [op("partition-id")]))
    k, v = param("f32[3,8]"), param("s32[3,8]")
    assert infer(op("sort", k, v, dimensions=(1,), to_apply=ComputationRef("lt")),
                 m) == "(f32[3,8], s32[3,8])"
    rejects(op("sort", k, dimensions=(1,), to_apply=ComputationRef("lt")),
            "must take 2 scalar parameters", m)
    rejects(op("sort", k, dimensions=(1,), to_apply=ComputationRef("add")),
            "must return pred", m)
    rejects(op("sort", k, param("s32[3,7]"), dimensions=(1,), to_apply=ComputationRef("lt")),
            "identical dims", m)
    assert infer(op("map", k, k, dimensions=(0, 1), to_apply=ComputationRef("add")),
                 m) == "f32[3,8]"
    rejects(op("map", k, v, to_apply=ComputationRef("add")), "parameter 1 must be a s32", m)
    assert infer(op("topk", k, k=3, largest=True)) == "(f32[3,3], s32[3,3])"
    rejects(op("topk", k, k=9), "between 0 and")


# ---- gather and scatter -------------------------------------------------------------------------

def test_gather_shapes():
    # embedding lookup: indices [4,16] (index_vector_dim 2 = rank: implicit trailing 1)
    table, ids = param("f32[128,32]"), param("s32[4,16]")
    assert infer(op("gather", table, ids, offset_dims=(2,), collapsed_slice_dims=(0,),
                    start_index_map=(0,), index_vector_dim=2,
                    slice_sizes=(1, 32))) == "f32[4,16,32]"
    # offset dims interleaved with batch dims: window [3,4] goes to result dims 0 and 2,
    # the one index batch dim (6) to result dim 1
    assert infer(op("gather", param("f32[10,9,8]"), param("s32[6,2]"), offset_dims=(0, 2),
                    collapsed_slice_dims=(0,), start_index_map=(0, 1), index_vector_dim=1,
                    slice_sizes=(1, 3, 4))) == "f32[3,6,4]"
    # batching dims: operand dim 0 pairs with indices dim 0 (size 3)
    assert infer(op("gather", param("f32[3,10,8]"), param("s32[3,5,1]"), offset_dims=(2,),
                    collapsed_slice_dims=(1,), start_index_map=(1,), index_vector_dim=2,
                    operand_batching_dims=(0,), start_indices_batching_dims=(0,),
                    slice_sizes=(1, 1, 8))) == "f32[3,5,8]"
    rejects(op("gather", param("f32[4,10,8]"), param("s32[3,5,1]"), offset_dims=(2,),
               collapsed_slice_dims=(1,), start_index_map=(1,), index_vector_dim=2,
               operand_batching_dims=(0,), start_indices_batching_dims=(0,),
               slice_sizes=(1, 1, 8)), "differ in size")
    rejects(op("gather", table, ids, offset_dims=(2,), collapsed_slice_dims=(0,),
               start_index_map=(0,), index_vector_dim=2, slice_sizes=(2, 32)), "at most 1")
    rejects(op("gather", table, ids, offset_dims=(2,), collapsed_slice_dims=(0,),
               start_index_map=(0, 1), index_vector_dim=2, slice_sizes=(1, 32)),
            "one entry per index vector element")
    rejects(op("gather", table, param("f32[4,16]"), offset_dims=(2,), collapsed_slice_dims=(0,),
               start_index_map=(0,), index_vector_dim=2, slice_sizes=(1, 32)), "integral")


def test_scatter_single_and_variadic():
    add = scalar_computation("add", "add", ["f32", "f32"])
    ps = [param(t, i, f"c.p{i}") for i, t in enumerate(["f32[]", "s32[]", "f32[]", "s32[]"])]
    pair = computation("pair", ps, [op("tuple", ps[2], ps[3], shape="(f32[], s32[])")])
    m = module_of(add, pair, computation("main", [], [op("partition-id")]))
    x, idx, upd = param("f32[10,8]"), param("s32[4,1]"), param("f32[4,8]")
    dnums = dict(update_window_dims=(1,), inserted_window_dims=(0,),
                 scatter_dims_to_operand_dims=(0,), index_vector_dim=1)
    assert infer(op("scatter", x, idx, upd, to_apply=ComputationRef("add"), **dnums),
                 m) == "f32[10,8]"
    y, yu = param("s32[10,8]"), param("s32[4,8]")
    assert infer(op("scatter", x, y, idx, upd, yu, to_apply=ComputationRef("pair"), **dnums),
                 m) == "(f32[10,8], s32[10,8])"
    rejects(op("scatter", x, idx, param("f32[5,8]"), to_apply=ComputationRef("add"), **dnums),
            "scatter dims must equal", m)
    rejects(op("scatter", x, idx, param("f32[4,9]"), to_apply=ComputationRef("add"), **dnums),
            "exceeds operand dim 1", m)
    rejects(op("scatter", x, idx, param("s32[4,8]"), to_apply=ComputationRef("add"), **dnums),
            "does not match the element type", m)
    # batching: operand [3,10,8] dim 0 pairs with indices [3,5,1] dim 0; updates [3,5,8]
    assert infer(op("scatter", param("f32[3,10,8]"), param("s32[3,5,1]"), param("f32[3,5,8]"),
                    to_apply=ComputationRef("add"), update_window_dims=(2,),
                    inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,),
                    input_batching_dims=(0,), scatter_indices_batching_dims=(0,),
                    index_vector_dim=2), m) == "f32[3,10,8]"


# ---- control flow -------------------------------------------------------------------------------

def _loop_module(cond_result: str = "pred[]", body_result: str = "(s32[], f32[4])"):
    cp = param("(s32[], f32[4])", 0, "c.p")
    cond = computation("cond", [cp], [op("constant", shape=cond_result, name="c.k")])
    bp = param("(s32[], f32[4])", 0, "b.p")
    body = computation("body", [bp], [op("constant", shape=body_result, name="b.k")])
    return module_of(cond, body, computation("main", [], [op("partition-id")]))


def test_while():
    state = param("(s32[], f32[4])")
    loop = dict(condition=ComputationRef("cond"), body=ComputationRef("body"))
    assert infer(op("while", state, **loop), _loop_module()) == "(s32[], f32[4])"
    rejects(op("while", state, **loop), "condition cond must return pred", _loop_module("s32[]"))
    rejects(op("while", state, **loop), "body returns", _loop_module(body_result="(s32[], f32[5])"))
    rejects(op("while", param("(s32[], f32[5])"), **loop), "parameter 0 has shape", _loop_module())


def test_conditional_call_fusion_custom_call():
    def branch(name, result):
        p = param("f32[2]", 0, f"{name}.p")
        return computation(name, [p], [op("negate", p, shape=result, name=f"{name}.r")])
    m = module_of(branch("t", "f32[2]"), branch("f", "f32[2]"), branch("bad", "s32[2]"),
                  computation("main", [], [op("partition-id")]))
    a = param("f32[2]")
    pred_form = dict(true_computation=ComputationRef("t"), false_computation=ComputationRef("f"))
    assert infer(op("conditional", param("pred[]"), a, a, **pred_form), m) == "f32[2]"
    rejects(op("conditional", param("s32[]"), a, a, **pred_form), "predicate must be pred", m)
    index_form = dict(branch_computations=(ComputationRef("t"), ComputationRef("f"),
                                           ComputationRef("t")))
    assert infer(op("conditional", param("s32[]"), a, a, a, **index_form), m) == "f32[2]"
    rejects(op("conditional", param("s32[]"), a, a, **index_form), "3 branches but 2", m)
    rejects(op("conditional", param("s32[]"), a, a,
               branch_computations=(ComputationRef("t"), ComputationRef("bad"))),
            "branch bad returns", m)
    assert infer(op("call", a, to_apply=ComputationRef("t")), m) == "f32[2]"
    rejects(op("call", a, a, to_apply=ComputationRef("t")), "takes 1 parameters", m)
    assert infer(op("fusion", a, calls=ComputationRef("t"), kind=Ident("kLoop")), m) == "f32[2]"
    assert infer(op("custom-call", a, shape="(f32[3], s32[])",
                    custom_call_target="Foo")) == "(f32[3], s32[])"
    rejects(op("custom-call", a, custom_call_target="Foo"), "explicit result shape")


def test_async_call():
    p0, p1 = param("s32[8]", 0, "c.p0"), param("s32[8]", 1, "c.p1")
    callee = computation("callee", [p0, p1], [op("add", p0, p1, shape="s32[8]")])
    m = module_of(callee, computation("main", [], [op("partition-id")]))
    a, b = param("s32[8]", 0), param("s32[8]", 1)
    start = op("call-start", a, b, shape="((s32[8], s32[8]), s32[8], u32[])",
               to_apply=ComputationRef("callee"))
    assert infer(start, m) == "((s32[8], s32[8]), s32[8], u32[])"
    assert infer(op("call-done", start), m) == "s32[8]"
    rejects(op("call-start", a, b, shape="((s32[8], s32[8]), f32[8], u32[])",
               to_apply=ComputationRef("callee")), "element 1", m)


# ---- collectives --------------------------------------------------------------------------------

def _collective_module(**attrs):
    add = scalar_computation("add", "add", ["f32", "f32"])
    return module_of(add, computation("main", [], [op("partition-id")]), **attrs)


def test_all_reduce_and_group_validation():
    m = _collective_module(num_partitions=4)
    x = param("f32[4,6]")
    groups = ReplicaGroups(((0, 1), (2, 3)))
    assert infer(op("all-reduce", x, to_apply=ComputationRef("add"), replica_groups=groups,
                    channel_id=1, use_global_device_ids=True), m) == "f32[4,6]"
    assert infer(op("all-reduce", x, x, to_apply=ComputationRef("add")), m) == \
        "(f32[4,6], f32[4,6])"
    rejects(op("all-reduce", param("s32[2]"), to_apply=ComputationRef("add")), "parameter 0", m)
    rejects(op("all-reduce", x, to_apply=ComputationRef("add"),
               replica_groups=ReplicaGroups(((0, 1), (1, 2)))), "repeat", m)
    rejects(op("all-reduce", x, to_apply=ComputationRef("add"), use_global_device_ids=True),
            "needs a channel_id", m)


def test_all_gather_group_size_follows_the_group_mode():
    x = param("f32[3,5]")
    m = _collective_module(num_partitions=8)
    # flattened ids: G = group length 4 -> dim 0: 3*4
    assert infer(op("all-gather", x, dimensions=(0,), channel_id=1, use_global_device_ids=True,
                    replica_groups=ReplicaGroups(((0, 1, 2, 3), (4, 5, 6, 7)))), m) == "f32[12,5]"
    # cross-replica-and-partition: group {0} of replicas spans all 8 partitions -> 3*8
    assert infer(op("all-gather", x, dimensions=(0,), channel_id=1,
                    replica_groups=ReplicaGroups(((0,),))), m) == "f32[24,5]"
    # cross-replica with one replica: G = 1 (identity)
    assert infer(op("all-gather", x, dimensions=(1,)), m) == "f32[3,5]"
    # unknown partition count: the given shape must be a multiple along dim 0
    unknown = _collective_module()
    assert infer(op("all-gather", x, dimensions=(0,), channel_id=1, shape="f32[6,5]"),
                 unknown) == "f32[6,5]"
    rejects(op("all-gather", x, dimensions=(0,), channel_id=1, shape="f32[7,5]"),
            "cannot give", unknown)
    rejects(op("all-gather", x, dimensions=(0,), channel_id=1, use_global_device_ids=True,
               replica_groups=ReplicaGroups(((0, 1, 2), (3, 4)))), "equal size", m)


def test_reduce_scatter_all_to_all_collective_permute():
    m = _collective_module(num_partitions=4)
    x = param("f32[8,6]")
    rs = dict(to_apply=ComputationRef("add"), channel_id=1, use_global_device_ids=True)
    assert infer(op("reduce-scatter", x, dimensions=(0,), **rs,
                    replica_groups=ReplicaGroups(((0, 1, 2, 3),))), m) == "f32[2,6]"
    rejects(op("reduce-scatter", x, dimensions=(1,), **rs,
               replica_groups=ReplicaGroups(((0, 1, 2, 3),))), "not divisible", m)
    # all-to-all with a channel is cross-partition: {} = all 4 partitions
    assert infer(op("all-to-all", x, dimensions=(0,), channel_id=2), m) == "f32[8,6]"
    rejects(op("all-to-all", x, dimensions=(1,), channel_id=2,
               replica_groups=ReplicaGroups(((0, 1, 2, 3),))), "not divisible", m)
    y = param("f32[2]")
    assert infer(op("all-to-all", y, y, channel_id=2,
                    replica_groups=ReplicaGroups(((0, 1), (2, 3)))), m) == "(f32[2], f32[2])"
    rejects(op("all-to-all", y, channel_id=2, replica_groups=ReplicaGroups(((0, 1), (2, 3)))),
            "one operand per group member", m)
    pairs = ((0, 1), (1, 2), (2, 3))
    assert infer(op("collective-permute", x, channel_id=3, source_target_pairs=pairs),
                 m) == "f32[8,6]"
    rejects(op("collective-permute", x, source_target_pairs=((0, 1), (2, 1))),
            "repeats a target", m)
    rejects(op("collective-permute", x, channel_id=3, source_target_pairs=((0, 4),)),
            "num_partitions=4", m)


# ---- side effects -------------------------------------------------------------------------------

def test_tokens_io_and_rng():
    token = param("token[]", 0)
    assert infer(op("after-all")) == "token[]"
    assert infer(op("after-all", token, token)) == "token[]"
    rejects(op("after-all", param("f32[]")), "token")
    assert infer(op("infeed", token, shape="(f32[8,2], token[])")) == "(f32[8,2], token[])"
    rejects(op("infeed", token, shape="(f32[8,2], f32[])"), "end in token")
    data = param("(f32[4], s32[])", 1)
    assert infer(op("outfeed", data, token, outfeed_shape=S("(f32[4], s32[])"))) == "token[]"
    rejects(op("outfeed", data, token, outfeed_shape=S("(f32[5], s32[])")), "outfeed_shape")
    send = op("send", param("f32[3]"), token, channel_id=1)
    assert infer(send) == "(f32[3], u32[], token[])"
    send.shape = infer_shape(send, EMPTY)
    assert infer(op("send-done", send)) == "token[]"
    recv = op("recv", token, shape="(f32[], u32[], token[])", channel_id=1)
    assert infer(recv) == "(f32[], u32[], token[])"
    assert infer(op("recv-done", recv)) == "(f32[], token[])"
    lo, hi = param("s32[]", 0), param("s32[]", 1)
    assert infer(op("rng", lo, hi, shape="s32[4]", distribution=Ident("rng_uniform"))) == "s32[4]"
    rejects(op("rng", lo, hi, shape="s32[4]", distribution=Ident("rng_normal")), "floating")
    rejects(op("rng", lo, hi, shape="f32[4]", distribution=Ident("rng_uniform")),
            "parameters' type")
    seed = param("u64[2]")
    assert infer(op("rng-bit-generator", seed, shape="(u64[2], u32[16,4])",
                    algorithm=Ident("rng_default"))) == "(u64[2], u32[16,4])"
    assert infer(op("rng-bit-generator", seed, shape="u32[16,4]")) == "u32[16,4]"
    rejects(op("rng-bit-generator", seed, shape="(u64[3], u32[16])"), "state")
    assert infer(op("rng-get-and-update-state", delta=4)) == "u64[2]"
