"""gspmdc's bf16 semantics against XLA itself (the `[xla]` extra; skipped without jax): each
program runs on XLA:CPU with `--xla_allow_excess_precision=true` (its default) and `=false`, and
gspmdc's `"xla"` and `"per-op"` rounding must give the same bits. Unpartitioned programs run on 2
devices without shardings (XLA then runs the whole program on each); partitioned ones run as each
compiler partitions them."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.sharded_io import assemble_outputs, flatten_value, spmd_signature, split_inputs

from conformance.oracle import XlaOracle, xla_available
from hlo_text import reducer

pytestmark = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

BF16 = np.dtype(ml_dtypes.bfloat16)
#: gspmdc's rounding for each setting of XLA's flag
ROUNDING = {True: "xla", False: "per-op"}


@pytest.fixture(scope="module", params=[True, False], ids=["excess", "no-excess"])
def xla(request):
    with XlaOracle(excess_precision=request.param) as oracle:
        yield oracle


def inputs(module, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    values = []
    for p in module.entry.parameters:
        x = rng.standard_normal(p.shape.dims) * np.exp(rng.standard_normal(p.shape.dims))
        values.append(x.astype(BF16 if p.shape.element_type == "bf16" else
                               np.dtype(p.shape.element_type.replace("f", "float"))))
    return values


def leaves(module, value) -> list[np.ndarray]:
    return [np.asarray(v) for v in flatten_value(value, module.entry.root.shape)]


def xla_outputs(xla, text: str, args, n: int) -> list[np.ndarray]:
    module = api.parse(text)
    answer = xla.partition(text, n, to_output=False, to_parameters=False, inputs=args,
                           output_shapes=[leaf.dims for leaf in module.entry.root.shape.leaves()])
    assert answer.ok, answer.error
    return [np.asarray(o) for o in answer.outputs]


def assert_same_bits(got: list, want: list):
    for g, w in zip(got, want, strict=True):
        w = w.view(g.dtype) if w.dtype.kind == "V" else w
        assert g.dtype == w.dtype and g.shape == w.shape
        equal = g.view(f"u{g.dtype.itemsize}") == w.view(f"u{w.dtype.itemsize}")
        assert equal.all(), f"{np.count_nonzero(~equal)} of {g.size} elements differ"


ELEMENTWISE = """HloModule elementwise
ENTRY main {
  a = bf16[256] parameter(0)
  b = bf16[256] parameter(1)
  m = bf16[256] multiply(a, b)
  s = bf16[256] subtract(m, b)
  q = bf16[256] divide(s, a)
  t = bf16[256] tanh(q)
  e = bf16[256] exponential(t)
  l = bf16[256] log(e)
  r = bf16[256] add(l, m)
  cm = f32[256] convert(m)
  cq = f32[256] convert(q)
  cr = f32[256] convert(r)
  h = bf16[16,16] reshape(r)
  ch = f32[16,16] convert(h)
  ROOT out = (f32[256], f32[256], f32[256], f32[16,16], bf16[256]) tuple(cm, cq, cr, ch, r)
}
"""

DOTS = """HloModule dots
ENTRY main {
  a = bf16[8,64] parameter(0)
  b = bf16[64,8] parameter(1)
  c = bf16[2,8,64] parameter(2)
  d = bf16[4,8,64] parameter(3)
  e = bf16[4,64,8] parameter(4)
  plain = bf16[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  three_d = bf16[2,8,8] dot(c, b), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  batched = bf16[4,8,8] dot(d, e), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  c1 = f32[8,8] convert(plain)
  c2 = f32[2,8,8] convert(three_d)
  c3 = f32[4,8,8] convert(batched)
  ROOT out = (f32[8,8], f32[2,8,8], f32[4,8,8]) tuple(c1, c2, c3)
}
"""

REDUCTIONS = """HloModule reductions
""" + reducer("add", element_type="bf16") + reducer("mul16", "add", "f16") + """
ENTRY main {
  a = bf16[40,100] parameter(0)
  b = f16[3,1000] parameter(1)
  z = bf16[] constant(0)
  one = bf16[] constant(1.5)
  z16 = f16[] constant(0)
  rows = bf16[40] reduce(a, z), dimensions={1}, to_apply=add
  all = bf16[] reduce(a, z), dimensions={0,1}, to_apply=add
  init = bf16[100] reduce(a, one), dimensions={0}, to_apply=add
  half = f16[3] reduce(b, z16), dimensions={1}, to_apply=mul16
  window = bf16[13,33] reduce-window(a, z), window={size=5x4 stride=3x3 pad=1_2x0_1}, to_apply=add
  ROOT out = (bf16[40], bf16[], bf16[100], f16[3], bf16[13,33]) tuple(rows, all, init, half, window)
}
"""


@pytest.mark.parametrize("text", [ELEMENTWISE, REDUCTIONS], ids=["elementwise", "reductions"])
def test_unpartitioned_programs_match_xla_bit_for_bit(xla, text):
    module = api.parse(text)
    args = inputs(module, seed=1)
    want = xla_outputs(xla, text, args, 2)
    got = leaves(module, api.evaluate(module, args, rounding=ROUNDING[xla.excess_precision]))
    assert_same_bits(got, want)


def test_dots_read_by_converts_match_xla(xla):
    """Bit for bit where the dots' results are rounded to bf16; where XLA hands the convert the
    f32 sum (the 2-d and the batched dot, not the one with a 3-d operand, which it reshapes
    first), gspmdc does too, and the sums agree to f32 rounding (numpy's and XLA's matrix
    products add in different orders)."""
    module = api.parse(DOTS)
    args = inputs(module, seed=1)
    want = xla_outputs(xla, DOTS, args, 2)
    got = leaves(module, api.evaluate(module, args, rounding=ROUNDING[xla.excess_precision]))
    unrounded = [xla.excess_precision, False, xla.excess_precision]
    for g, w, f32_sum in zip(got, want, unrounded, strict=True):
        assert is_bf16(w) != f32_sum and is_bf16(g) != f32_sum
        if f32_sum:
            np.testing.assert_allclose(g, w, rtol=0, atol=64 * np.finfo(np.float32).eps
                                       * float(np.max(np.abs(w))))
        else:
            assert_same_bits([g], [w])


CONVOLUTIONS = """HloModule convolutions
ENTRY main {
  x = bf16[2,16,8] parameter(0)
  k = bf16[3,8,4] parameter(1)
  x2 = bf16[2,6,6,8] parameter(2)
  k2 = bf16[3,3,8,4] parameter(3)
  kg = bf16[3,2,8] parameter(4)
  xn = bf16[2,8,16] parameter(5)
  kn = bf16[4,8,3] parameter(6)
  xb = bf16[4,16,8] parameter(7)
  one_d = bf16[2,14,4] convolution(x, k), window={size=3}, dim_labels=b0f_0io->b0f
  two_d = bf16[2,4,4,4] convolution(x2, k2), window={size=3x3}, dim_labels=b01f_01io->b01f
  grouped = bf16[2,14,8] convolution(x, kg), window={size=3}, dim_labels=b0f_0io->b0f, feature_group_count=4
  nchw = bf16[2,4,14] convolution(xn, kn), window={size=3 pad=0_0}, dim_labels=bf0_oi0->bf0
  batch_groups = bf16[1,14,4] convolution(xb, k), window={size=3}, dim_labels=b0f_0io->b0f, batch_group_count=4
  c1 = f32[2,14,4] convert(one_d)
  c2 = f32[2,4,4,4] convert(two_d)
  c3 = f32[2,14,8] convert(grouped)
  c4 = f32[2,4,14] convert(nchw)
  c5 = f32[1,14,4] convert(batch_groups)
  ROOT out = (f32[2,14,4], f32[2,4,4,4], f32[2,14,8], f32[2,4,14], f32[1,14,4]) tuple(c1, c2, c3, c4, c5)
}
"""


def test_convolutions_read_by_converts_match_xla(xla):
    """XLA:CPU computes a bf16 convolution in f32 as written, whatever its layout and groups,
    and with its default flags hands a convert the f32 sums: gspmdc too. Under the flag both
    round them, bit for bit; with it, the sums agree to f32 rounding (different addition
    orders)."""
    module = api.parse(CONVOLUTIONS)
    args = inputs(module, seed=1)
    want = xla_outputs(xla, CONVOLUTIONS, args, 2)
    got = leaves(module, api.evaluate(module, args, rounding=ROUNDING[xla.excess_precision]))
    for g, w in zip(got, want, strict=True):
        assert is_bf16(w) != xla.excess_precision and is_bf16(g) != xla.excess_precision
        if xla.excess_precision:
            np.testing.assert_allclose(g, w, rtol=0, atol=64 * np.finfo(np.float32).eps
                                       * float(np.max(np.abs(w))))
        else:
            assert_same_bits([g], [w])


def is_bf16(x: np.ndarray) -> bool:
    """Whether every element of the f32 array `x` is a bf16 number."""
    return bool(np.array_equal(x, x.astype(BF16).astype(np.float32)))


PARTITIONED_DOT = """HloModule partitioned_dot, num_partitions=4
ENTRY main {
  a = bf16[16,64] parameter(0), sharding={devices=[1,4]<=[4]}
  b = bf16[64,32] parameter(1), sharding={devices=[4,1]<=[4]}
  d = bf16[16,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding=RESULT
  ROOT c = f32[16,32] convert(d), sharding=RESULT
}
"""


@pytest.mark.parametrize("result", ["{replicated}", "{devices=[4,1]<=[4]}"],
                         ids=["all-reduce", "reduce-scatter"])
def test_partitioned_bf16_partial_sums_match_xla_bit_for_bit(xla, result):
    """A dot contracting a split dimension: XLA sums the partial results with an all-reduce (and
    a dynamic-slice for a split result), gspmdc with an all-reduce or a reduce-scatter; both in
    f32, from partial sums rounded to bf16 under per-op rounding only."""
    text = PARTITIONED_DOT.replace("RESULT", result)
    module = api.parse(text)
    args = inputs(module, seed=2)
    want = xla_outputs(xla, text, args, 4)
    spmd = compile_spmd(api.parse(text), 4)
    assert ("reduce-scatter(" if "devices" in result else "all-reduce(") in api.to_text(spmd)
    signature = spmd_signature(spmd, 4)
    results = run_local(spmd, split_inputs(signature, args), 4,
                        rounding=ROUNDING[xla.excess_precision])
    assert_same_bits(leaves(module, assemble_outputs(signature, results)), want)
