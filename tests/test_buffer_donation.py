"""Buffer donation (`runtime/buffer_donation.py`): an elementwise step writes its result over an
operand only at the operand's last use, and only into memory nothing else holds. Each module
below has a value that a wrong donation would overwrite while something can still read it (a
later reader, a tuple, a view, a loop, a folded constant, a parameter, an output); the values
are checked against numpy written here and against the same interpreter with a value hook
watching (which never donates), bit for bit."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.buffer_donation import DONATED_BYTES, FRESH_RESULTS
from gspmdc.runtime.interpreter import Executable, evaluate
from gspmdc.runtime.kernels import KERNELS
from gspmdc.runtime.kernels.specialising import in_place_kernel_for

from interpreter_helpers import single_op
from same_bits import assert_same_bits

#: a shape of f32 large enough to be donated
ROWS, COLS = 128, 256
SHAPE = f"f32[{ROWS},{COLS}]"


def _inputs(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(count)]


def _run_both_ways(text: str, args: list[np.ndarray], executions: int = 2):
    """The module's values from an `Executable` run `executions` times (donating), each
    checked bit for bit against `evaluate` with a value hook (not donating); the arguments
    are checked unchanged. The last value."""
    module = parse_module(text)
    copies = [a.copy() for a in args]
    watched = evaluate(module, args, on_value=lambda inst, value: None)
    exe = Executable(module)
    for _ in range(executions):
        value = exe(args)
        assert_same_bits(value, watched)
        for arg, copy in zip(args, copies):
            np.testing.assert_array_equal(arg, copy)
    return value


@pytest.fixture
def donations_made(monkeypatch) -> list[int]:
    """The number of steps each plan the interpreter makes donates, in order (the interpreter's
    `donations` counted as it is called)."""
    from gspmdc.runtime import buffer_donation, interpreter
    made: list[int] = []

    def counted(*args):
        steps = buffer_donation.donations(*args)
        made.append(len(steps))
        return steps
    monkeypatch.setattr(interpreter, "donations", counted)
    return made


def _module(body: str, params: int = 1) -> str:
    declared = "\n".join(f"  p{k} = {SHAPE} parameter({k})" for k in range(params))
    return f"HloModule m\nENTRY main {{\n{declared}\n{body}\n}}"


def test_a_chain_of_elementwise_ops_holds_one_array_at_a_time():
    """exp, tanh, negate, sqrt(abs) of a 4 MiB array: each step writes over the one before
    (the values are numpy's), so the evaluation's traced peak is one result array, where
    fresh results (a value hook watching) hold two at once."""
    text = """HloModule m
ENTRY main {
  p = f32[1048576] parameter(0)
  e = f32[1048576] exponential(p)
  t = f32[1048576] tanh(e)
  n = f32[1048576] negate(t)
  a = f32[1048576] abs(n)
  ROOT s = f32[1048576] sqrt(a)
}"""
    module = parse_module(text)
    x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    peaks = []
    for hook in (None, lambda inst, value: None):
        tracemalloc.start()
        try:
            out = evaluate(module, [x], on_value=hook)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        expected = np.sqrt(np.abs(np.negative(np.tanh(np.exp(x)))))
        assert out.tobytes() == expected.tobytes()
        peaks.append(peak / x.nbytes)
    assert peaks[0] < 1.5 <= peaks[1], f"peaks in arrays: {peaks}"


def test_a_value_read_later_is_not_overwritten():
    """tanh(e) is not e's last use (the add reads e after it): e must keep its value."""
    x, = _inputs(1)
    out = _run_both_ways(_module(f"""  e = {SHAPE} exponential(p0)
  t = {SHAPE} tanh(e)
  ROOT r = {SHAPE} add(t, e)"""), [x])
    e = np.exp(x)
    assert out.tobytes() == (np.tanh(e) + e).tobytes()


def test_parameters_are_never_written():
    """tanh's operand is a parameter whose last use it is: the caller's array keeps its value
    (also through a get-tuple-element of a tuple parameter)."""
    text = f"""HloModule m
ENTRY main {{
  p0 = {SHAPE} parameter(0)
  p1 = ({SHAPE}, {SHAPE}) parameter(1)
  g = {SHAPE} get-tuple-element(p1), index=0
  t = {SHAPE} tanh(p0)
  u = {SHAPE} negate(g)
  ROOT r = {SHAPE} multiply(t, u)
}}"""
    x, y, z = _inputs(3)
    module = parse_module(text)
    before = [a.copy() for a in (x, y, z)]
    out = Executable(module)([x, (y, z)])
    for a, b in zip((x, y, z), before):
        np.testing.assert_array_equal(a, b)
    assert out.tobytes() == (np.tanh(x) * np.negative(y)).tobytes()


def test_an_output_is_not_overwritten():
    """e = exp(x) is an element of the output tuple after its last use by negate: not donated."""
    x, = _inputs(1)
    t, e = _run_both_ways(_module(f"""  e = {SHAPE} exponential(p0)
  t = {SHAPE} negate(e)
  ROOT r = ({SHAPE}, {SHAPE}) tuple(t, e)"""), [x])
    assert e.tobytes() == np.exp(x).tobytes() and t.tobytes() == (-np.exp(x)).tobytes()


#: instructions holding e = exp(x) (its result's type, the instruction, its value from e)
_HOLDERS = {
    "tuple": ("({0})", "tuple(e)", lambda e: (e,)),
    "reshape": ("f32[256,128]", "reshape(e)", lambda e: e.reshape(256, 128)),
    "transpose": ("f32[256,128]", "transpose(e), dimensions={{1,0}}", lambda e: e.T),
    "slice": ("f32[64,256]", "slice(e), slice={{[0:64], [0:256]}}", lambda e: e[:64]),
    "copy": ("{0}", "copy(e)", lambda e: e),
    "broadcast": ("f32[2,128,256]", "broadcast(e), dimensions={{1,2}}",
                  lambda e: np.broadcast_to(e, (2, ROWS, COLS))),
}


@pytest.mark.parametrize("holder", sorted(_HOLDERS))
def test_values_that_tuples_and_views_hold_are_not_overwritten(holder):
    """e = exp(x) is held by a tuple, a reshape, transpose, slice or broadcast of it, or a copy
    (which reads it as the same array) when an elementwise op reads it last: it is not donated,
    and the values are numpy's."""
    result_type, instruction, of = _HOLDERS[holder]
    result_type, instruction = result_type.format(SHAPE), instruction.format(SHAPE)
    x, = _inputs(1)
    held, t = _run_both_ways(_module(f"""  e = {SHAPE} exponential(p0)
  h = {result_type} {instruction}
  t = {SHAPE} tanh(e)
  ROOT r = ({result_type}, {SHAPE}) tuple(h, t)"""), [x])
    e = np.exp(x)
    expected = of(e)
    if isinstance(expected, tuple):
        held, expected = held[0], expected[0]
    assert held.tobytes() == np.ascontiguousarray(expected).tobytes()
    assert t.tobytes() == np.tanh(e).tobytes()


LOOP = f"""HloModule loop
cond {{
  s = (s32[], {SHAPE}, {SHAPE}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  s = (s32[], {SHAPE}, {SHAPE}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = {SHAPE} get-tuple-element(s), index=1
  w = {SHAPE} get-tuple-element(s), index=2
  inv = {SHAPE} exponential(w)
  half = {SHAPE} tanh(inv)
  y = {SHAPE} add(x, half)
  z = {SHAPE} tanh(y)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT r = (s32[], {SHAPE}, {SHAPE}) tuple(j, z, w)
}}

ENTRY main {{
  p0 = {SHAPE} parameter(0)
  p1 = {SHAPE} parameter(1)
  e = {SHAPE} exponential(p1)
  zero = s32[] constant(0)
  s = (s32[], {SHAPE}, {SHAPE}) tuple(zero, p0, e)
  l = (s32[], {SHAPE}, {SHAPE}) while(s), condition=cond, body=body
  t = {SHAPE} tanh(e)
  x = {SHAPE} get-tuple-element(l), index=1
  w = {SHAPE} get-tuple-element(l), index=2
  ROOT out = ({SHAPE}, {SHAPE}, {SHAPE}) tuple(x, w, t)
}}"""


def test_loop_states_and_loop_invariant_values_are_not_overwritten():
    """`inv` and `half` depend on the passed-through state element `w` alone: kept from the
    first iteration, so `add(x, half)` (half's last use) must not write over them; the loop
    passes `e` through to its result, and tanh reads `e` last after the loop: not donated; the
    body's own `y` dies at `tanh(y)` and may be written over. Three iterations, numpy's
    values."""
    x, y = _inputs(2)
    got, w, t = _run_both_ways(LOOP, [x, y / 4], executions=3)
    e = np.exp(y / 4)
    half = np.tanh(np.exp(e))
    state = x
    for _ in range(3):
        state = np.tanh(state + half)
    assert got.tobytes() == state.tobytes()
    assert w.tobytes() == e.tobytes() and t.tobytes() == np.tanh(e).tobytes()


def test_folded_constants_are_not_overwritten():
    """`t` depends on an iota alone: folded after the first execution and kept; the add that
    reads it last must not write over it, or the second and third executions would start from
    a changed constant."""
    text = f"""HloModule m
ENTRY main {{
  p0 = {SHAPE} parameter(0)
  i = {SHAPE} iota(), iota_dimension=1
  s = f32[] constant(0.01)
  b = {SHAPE} broadcast(s), dimensions={{}}
  m = {SHAPE} multiply(i, b)
  t = {SHAPE} tanh(m)
  ROOT r = {SHAPE} add(t, p0)
}}"""
    x, = _inputs(1)
    out = _run_both_ways(text, [x], executions=3)
    iota = np.broadcast_to(np.arange(COLS, dtype=np.float32), (ROWS, COLS))
    assert out.tobytes() == (np.tanh(iota * np.float32(0.01)) + x).tobytes()


def test_values_a_hook_sees_are_not_overwritten_later():
    """With a value hook the values it was given stay as they were (no donation under hooks)."""
    x, = _inputs(1)
    seen = {}
    evaluate(parse_module(_module(f"""  e = {SHAPE} exponential(p0)
  t = {SHAPE} tanh(e)
  ROOT n = {SHAPE} negate(t)""")), [x],
             on_value=lambda inst, value: seen.update({inst.name: value}))
    assert seen["e"].tobytes() == np.exp(x).tobytes()
    assert seen["t"].tobytes() == np.tanh(np.exp(x)).tobytes()


def test_binary_ops_write_over_either_dying_operand():
    """add(a, b) with both operands dying, subtract(c, a) with its second one, multiply(d, d)
    with the same array twice: numpy's values."""
    x, y = _inputs(2)
    out = _run_both_ways(_module(f"""  a = {SHAPE} exponential(p0)
  b = {SHAPE} tanh(p1)
  s = {SHAPE} add(a, b)
  c = {SHAPE} negate(p0)
  d = {SHAPE} subtract(c, s)
  ROOT m = {SHAPE} multiply(d, d)""", params=2), [x, y])
    d = np.negative(x) - (np.exp(x) + np.tanh(y))
    assert out.tobytes() == (d * d).tobytes()


@pytest.mark.parametrize("shape, donated", [(SHAPE, 1), ("f32[8,8]", 0), ("bf16[128,256]", 0),
                                           ("s32[128,256]", 0)])
def test_small_bf16_and_integer_divide_results_are_computed_fresh(donations_made, shape,
                                                                  donated):
    """`divide(exp(x), y)` (integers: `divide(x + x, y)`) writes over the dying exponential
    when it holds DONATED_BYTES or more of f32; not below, nor in bf16 (computed in f32), nor
    for integers (XLA's x / 0 rule is no single ufunc)."""
    assert 4 * 8 * 8 < DONATED_BYTES <= 4 * ROWS * COLS
    made = donations_made
    first = "add(p0, p0)" if shape.startswith("s32") else "exponential(p0)"
    text = f"""HloModule m
ENTRY main {{
  p0 = {shape} parameter(0)
  p1 = {shape} parameter(1)
  e = {shape} {first}
  ROOT d = {shape} divide(e, p1)
}}"""
    module = parse_module(text)
    from gspmdc.runtime.io import random_inputs
    args = random_inputs(module, 0)
    watched = evaluate(module, args, on_value=lambda inst, value: None)
    assert made == []                       # a value hook watching: no donation at all
    assert Executable(module)(args).tobytes() == watched.tobytes()
    assert made == [donated]


_UNARY = ["negate", "abs", "floor", "ceil", "round-nearest-even", "exponential",
          "exponential-minus-one", "log", "log-plus-one", "sqrt", "cbrt", "sine", "cosine",
          "tan", "tanh"]
_BINARY = ["add", "subtract", "multiply", "divide", "remainder", "power", "atan2", "maximum",
           "minimum"]


def _special_values(dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(4096) * 3).astype(dtype)
    values[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e30, 0.5]
    return values


@pytest.mark.parametrize("dtype", ["f16", "f32", "f64"])
@pytest.mark.parametrize("opcode", _UNARY + _BINARY)
def test_in_place_kernels_give_the_fresh_kernels_bits(opcode, dtype):
    """Every float in-place kernel returns operand k's array, holding exactly the bits the
    table's own kernel computes (NaN, infinities, signed zeros included)."""
    from gspmdc.ir import dtypes
    np_dtype = dtypes.numpy_dtype(dtype)
    arity = 2 if opcode in _BINARY else 1
    params = "\n".join(f"  p{k} = {dtype}[4096] parameter({k})" for k in range(arity))
    operands = ", ".join(f"p{k}" for k in range(arity))
    inst = parse_module(f"HloModule m\nENTRY main {{\n{params}\n  ROOT r = {dtype}[4096] "
                        f"{opcode}({operands})\n}}").entry.root
    for k in range(arity):
        args = [_special_values(np_dtype, seed) for seed in range(arity)]
        kernel = in_place_kernel_for(KERNELS[opcode], inst, k)
        assert kernel is not None
        with np.errstate(all="ignore"):
            fresh = KERNELS[opcode](inst, [a.copy() for a in args], None)
            out = kernel(inst, args, None)
        assert out is args[k]
        assert out.dtype == fresh.dtype and out.tobytes() == fresh.tobytes()


def test_integer_kernels_that_are_not_one_ufunc_are_not_done_in_place():
    """Integer divide (XLA's x / 0 rule) is no single ufunc: no in-place variant; integer add
    is, and wraps as the fresh kernel does."""
    def inst(opcode):
        return parse_module("HloModule m\nENTRY main {\n  a = s32[4096] parameter(0)\n"
                            f"  b = s32[4096] parameter(1)\n  ROOT r = s32[4096] {opcode}(a, b)\n"
                            "}").entry.root
    assert in_place_kernel_for(KERNELS["divide"], inst("divide"), 0) is None
    a = np.array([2**31 - 1, -2**31, 5, -7] * 1024, np.int32)
    b = np.array([1, -1, 0, 3] * 1024, np.int32)
    fresh = KERNELS["add"](inst("add"), [a, b], None)
    out = in_place_kernel_for(KERNELS["add"], inst("add"), 1)(inst("add"), [a, b.copy()], None)
    assert out.tobytes() == fresh.tobytes()


_FRESH_CASES = {
    "compare": ("pred", 2, ", direction=LT"),
    "select": ("f32", 3, ""),
    "clamp": ("f32", 3, ""),
    "complex": ("c64", 2, ""),
    "is-finite": ("pred", 1, ""),
    "not": ("s32", 1, ""), "popcnt": ("s32", 1, ""), "count-leading-zeros": ("s32", 1, ""),
    "and": ("s32", 2, ""), "or": ("s32", 2, ""), "xor": ("s32", 2, ""),
    "shift-left": ("s32", 2, ""), "shift-right-logical": ("s32", 2, ""),
    "shift-right-arithmetic": ("s32", 2, ""),
}


_CONTRACTIONS = {
    "dot": "f32[64,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    "convolution": "f32[64,32] convolution(a, b), dim_labels=bf_io->bf",
}


@pytest.mark.parametrize("opcode", sorted(FRESH_RESULTS))
def test_fresh_result_kernels_share_no_memory_with_their_operands(opcode):
    """What donation counts on (`FRESH_RESULTS`): the kernel's result is memory of its own,
    not an operand's nor a view of one."""
    if opcode in _CONTRACTIONS:
        module = parse_module("HloModule m\nENTRY main {\n  a = f32[64,64] parameter(0)\n"
                              f"  b = f32[64,32] parameter(1)\n  ROOT r = {_CONTRACTIONS[opcode]}"
                              "\n}")
        rng = np.random.default_rng(3)
        args = [rng.standard_normal((64, 64)).astype(np.float32),
                rng.standard_normal((64, 32)).astype(np.float32)]
        out = evaluate(module, args)
        assert out.shape == (64, 32)
        for a in args:
            assert not np.shares_memory(out, a)
        return
    result_type, arity, attrs = _FRESH_CASES.get(
        opcode, ("f32", 2 if opcode in _BINARY else 1, ""))
    if opcode == "sign" or opcode.startswith("round") or opcode in ("logistic", "rsqrt", "erf"):
        arity = 1
    types = {"compare": ["f32", "f32"], "select": ["pred", "f32", "f32"],
             "complex": ["f32", "f32"], "is-finite": ["f32"]}.get(opcode, [result_type] * arity)
    rng = np.random.default_rng(3)
    args = []
    for t in types:
        if t == "pred":
            args.append(rng.random((64, 64)) < 0.5)
        elif t == "s32":
            args.append(rng.integers(-100, 100, (64, 64), dtype=np.int32))
        else:
            args.append(rng.standard_normal((64, 64)).astype(np.float32))
    out = single_op(opcode, (result_type, (64, 64)), args, **_attrs(attrs))
    for a in args:
        assert not np.shares_memory(out, a)


def _attrs(text: str) -> dict:
    attrs = {}
    if "direction" in text:
        attrs["direction"] = "LT"
    if "contracting" in text:
        attrs["lhs_contracting_dims"] = [1]
        attrs["rhs_contracting_dims"] = [0]
    return attrs


def _leaves(value) -> list:
    if isinstance(value, tuple):
        return [leaf for element in value for leaf in _leaves(element)]
    return [value]


@pytest.mark.parametrize("first", range(0, 120, 40))
def test_random_modules_give_the_same_bits_with_every_array_donated(monkeypatch, donations_made,
                                                                    first):
    """Random modules (`fuzz`, elementwise chains, loops, conditionals, calls, tuples), with
    donation allowed at any size (made in 10 steps at least): every execution of an
    `Executable` (three each: folded constants and loop-invariant arrays kept from the first)
    gives bit for bit the values of the same interpreter with a value hook watching (which
    donates nothing), and leaves the arguments as they were."""
    import fuzz
    from gspmdc.runtime import buffer_donation
    from gspmdc.runtime.io import random_inputs
    monkeypatch.setattr(buffer_donation, "DONATED_BYTES", 0)
    donated = donations_made
    checked = 0
    for seed in range(first, first + 40):
        module = parse_module(fuzz.case(seed).reference)
        if any(i.opcode == "rng" for c in module.computations.values()
               for i in c.instructions):
            continue
        args = random_inputs(module, seed)
        copies = [[leaf.copy() for leaf in _leaves(a)] for a in args]
        watched = _leaves(evaluate(module, args, on_value=lambda inst, value: None))
        exe = Executable(module)
        for _ in range(3):
            got = _leaves(exe(args))
            assert [v.tobytes() for v in got] == [v.tobytes() for v in watched], seed
        for arg, copy in zip(args, copies):
            assert [a.tobytes() for a in _leaves(arg)] == [c.tobytes() for c in copy], seed
        checked += 1
    assert checked >= 30 and sum(donated) >= 10, (checked, sum(donated))
