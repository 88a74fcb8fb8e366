"""The interpreter's two bf16 semantics (`runtime/rounding.py`) against numpy with the rounding
written out here: `"xla"` (XLA:CPU's default: a convert to f32 and a bf16 all-reduce or
reduce-scatter read the f32 value of the arithmetic op before them) and `"per-op"` (every result
rounded to its type); the bf16 collectives summing in f32 and the 16-bit reductions rounding every
step in XLA:CPU's order; `gspmdc eval/run --rounding`."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gspmdc.cli import main
from gspmdc.errors import GspmdcError
from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.interpreter import evaluate

from interpreter_helpers import run_hlo
from hlo_text import reducer

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32


def bf16(x) -> np.ndarray:
    """Round to bf16 (numpy's conversion rounds to nearest, ties to even)."""
    return np.asarray(x, F32).astype(BF16)


def bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).view(np.uint16 if np.asarray(x).dtype.itemsize == 2 else np.uint32)


def same(got, want) -> bool:
    """Equal bit for bit (dtype included)."""
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and np.array_equal(bits(got), bits(want))


def operands(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [bf16(rng.standard_normal(s) * np.exp(rng.standard_normal(s))) for s in shapes]


ELEMENTWISE = """HloModule elementwise
ENTRY main {
  a = bf16[64] parameter(0)
  b = bf16[64] parameter(1)
  m = bf16[64] multiply(a, b)
  c = f32[64] convert(m)
  e = bf16[64] tanh(m)
  s = bf16[64] add(m, b)
  cs = f32[64] convert(s)
  r = bf16[64] reshape(m)
  cr = f32[64] convert(r)
  ROOT t = (f32[64], bf16[64], f32[64], f32[64], bf16[64]) tuple(c, e, cs, cr, m)
}
"""


def test_xla_rounding_converts_read_the_unrounded_f32_value():
    a, b = operands(64, 64)
    product = a.astype(F32) * b.astype(F32)                  # exact in f32
    c, e, cs, cr, m = run_hlo(ELEMENTWISE, a, b, rounding="xla")
    assert same(c, product)                                  # m's f32 value, unrounded
    assert same(m, bf16(product))                            # the root's m is rounded
    assert same(e, bf16(np.tanh(bf16(product).astype(F32))))  # tanh reads the rounded m
    # an add reading the rounded m; its own f32 value goes to the convert
    assert same(cs, bf16(product).astype(F32) + b.astype(F32))
    assert same(cr, bf16(product).astype(F32))               # a reshape in between rounds
    assert not same(c, bf16(product).astype(F32))            # the inputs make it show


def test_per_op_rounding_rounds_every_result():
    a, b = operands(64, 64)
    product = bf16(a.astype(F32) * b.astype(F32))
    c, e, cs, cr, m = run_hlo(ELEMENTWISE, a, b, rounding="per-op")
    assert same(c, product.astype(F32)) and same(m, product) and same(cr, product.astype(F32))
    assert same(cs, bf16(product.astype(F32) + b.astype(F32)).astype(F32))
    assert same(e, bf16(np.tanh(product.astype(F32))))


def test_f16_has_no_excess_precision():
    # XLA:CPU computes f16 natively: a convert reads the rounded f16 value in both semantics
    text = ELEMENTWISE.replace("bf16", "f16")
    a, b = (x.astype(np.float16) for x in operands(64, 64))
    c = run_hlo(text, a, b, rounding="xla")[0]
    assert same(c, (a.astype(F32) * b.astype(F32)).astype(np.float16).astype(F32))


def dot_program(lhs: str, rhs: str, result: str, dims: str) -> str:
    return f"""HloModule dot
ENTRY main {{
  a = bf16[{lhs}] parameter(0)
  b = bf16[{rhs}] parameter(1)
  d = bf16[{result}] dot(a, b), {dims}
  ROOT c = f32[{result}] convert(d)
}}
"""


@pytest.mark.parametrize("lhs, rhs, result, dims, unrounded", [
    ("8,32", "32,4", "8,4", "lhs_contracting_dims={1}, rhs_contracting_dims={0}", True),
    ("3,8,32", "3,32,4", "3,8,4", "lhs_batch_dims={0}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0}, rhs_contracting_dims={1}", True),
    # XLA:CPU reshapes these dots before it computes them in f32, and the reshape rounds:
    # two free dimensions in an operand, a batch dimension not leading, a batch dimension of 1
    ("2,8,32", "32,4", "2,8,4", "lhs_contracting_dims={2}, rhs_contracting_dims={0}", False),
    ("8,3,32", "3,32,4", "3,8,4", "lhs_batch_dims={1}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0}, rhs_contracting_dims={1}", False),
    ("1,8,32", "1,32,4", "1,8,4", "lhs_batch_dims={0}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0}, rhs_contracting_dims={1}", False),
])
def test_a_convert_reads_a_dot_unrounded_when_xla_computes_it_as_written(lhs, rhs, result, dims,
                                                                         unrounded):
    a, b = operands(tuple(map(int, lhs.split(","))), tuple(map(int, rhs.split(","))))
    text = dot_program(lhs, rhs, result, dims)
    rounded = run_hlo(text, a, b, rounding="per-op")
    got = run_hlo(text, a, b, rounding="xla")
    assert same(got, bf16(got).astype(F32)) != unrounded    # f32 values not all bf16 ones
    assert same(bf16(got), bf16(rounded)) and same(rounded, bf16(rounded).astype(F32))


ALL_REDUCE = """HloModule all_reduce, num_partitions=4
""" + reducer("add", element_type="bf16") + """
ENTRY main {
  a = bf16[8,16] parameter(0)
  b = bf16[16,8] parameter(1)
  d = bf16[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT r = bf16[8,8] OPCODE(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add ATTRS
}
"""


@pytest.mark.parametrize("opcode, attrs", [("all-reduce", ""),
                                           ("reduce-scatter", ", dimensions={0}")])
@pytest.mark.parametrize("rounding", ["xla", "per-op"])
def test_bf16_collectives_sum_in_f32(opcode, attrs, rounding):
    text = ALL_REDUCE.replace("OPCODE", opcode).replace("ATTRS", attrs)
    if opcode == "reduce-scatter":
        text = text.replace("ROOT r = bf16[8,8]", "ROOT r = bf16[2,8]")
    module = parse_module(text)
    pieces = [operands((8, 16), (16, 8), seed=p) for p in range(4)]
    results = run_local(module, pieces, 4, rounding=rounding)
    partials = [a.astype(F32) @ b.astype(F32) for a, b in pieces]     # exact products, f32 sums
    if rounding == "per-op":
        partials = [bf16(p).astype(F32) for p in partials]
    want = bf16(partials[0] + partials[1] + partials[2] + partials[3])
    for p, got in enumerate(results):
        assert same(got, want if opcode == "all-reduce" else want[2 * p:2 * p + 2])
    rounded_each_step = bf16(bf16(bf16(bf16(partials[0]).astype(F32) + partials[1]).astype(F32)
                                  + partials[2]).astype(F32) + partials[3])
    assert not same(want, rounded_each_step)                    # the inputs make it show


REDUCE_WINDOW = """HloModule reduce_window
""" + reducer("add", element_type="bf16") + """
ENTRY main {
  p = bf16[6] parameter(0)
  z = bf16[] constant(0)
  ROOT r = bf16[2] reduce-window(p, z), window={size=3 stride=3 pad=0_0}, to_apply=add
}
"""


def test_bf16_reduce_window_rounds_every_step_in_window_order():
    # window [1, 2^-8, 2^-8]: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and rounds to even (1),
    # twice; window [2^-8, 2^-8, 1]: 2^-7 exactly, then 1 + 2^-7 is a bf16 number
    x = bf16([1.0, 2.0 ** -8, 2.0 ** -8, 2.0 ** -8, 2.0 ** -8, 1.0])
    for rounding in ("xla", "per-op"):
        assert same(run_hlo(REDUCE_WINDOW, x, rounding=rounding), bf16([1.0, 1.0 + 2.0 ** -7]))


def test_unknown_rounding_is_refused():
    with pytest.raises(GspmdcError, match="unknown rounding 'exact'"):
        evaluate(parse_module(ELEMENTWISE), operands(64, 64), rounding="exact")


def test_eval_command_takes_the_rounding(tmp_path, capsys):
    a, b = operands(64, 64)
    path = tmp_path / "elementwise.hlo"
    path.write_text(ELEMENTWISE)
    np.savez(tmp_path / "in.npz", arg0=a, arg1=b)
    outputs = {}
    for rounding in ("xla", "per-op"):
        out = tmp_path / f"{rounding}.npz"
        assert main(["eval", str(path), "--inputs", str(tmp_path / "in.npz"), "--outputs",
                     str(out), "--rounding", rounding, "-q"]) == 0
        outputs[rounding] = np.load(out)["out0"]
    product = a.astype(F32) * b.astype(F32)
    assert same(outputs["xla"], product) and same(outputs["per-op"], bf16(product).astype(F32))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(path), "--rounding", "exact"])
    assert exit_info.value.code == 2 and "invalid choice: 'exact'" in capsys.readouterr().err


CONVOLUTION = """HloModule convolution
ENTRY main {
  x = bf16[1,8,1] parameter(0)
  k = bf16[3,1,1] parameter(1)
  y = bf16[1,6,1] convolution(x, k), window={size=3}, dim_labels=b0f_0io->b0f
  ROOT c = f32[1,6,1] convert(y)
}
"""


def test_a_convert_reads_a_convolution_unrounded():
    # (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 needs 15 bits: exact in f32, not in bf16; sums of three
    # such products stay exact in f32
    x = bf16(1 + 2.0 ** -7 * np.arange(1, 9)).reshape(1, 8, 1)
    k = bf16([1 + 2.0 ** -7, 1 - 2.0 ** -6, 1 + 2.0 ** -5]).reshape(3, 1, 1)
    xs, ks = x.astype(np.float64)[0, :, 0], k.astype(np.float64)[:, 0, 0]
    exact = np.array([xs[i:i + 3] @ ks for i in range(6)]).reshape(1, 6, 1)
    assert same(run_hlo(CONVOLUTION, x, k, rounding="xla"), exact.astype(F32))
    assert same(run_hlo(CONVOLUTION, x, k, rounding="per-op"), bf16(exact).astype(F32))
    assert not same(bf16(exact).astype(F32), exact.astype(F32))
