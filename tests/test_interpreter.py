"""The interpreter: argument validation, error reporting, result checking, memory release, and
end-to-end runs of the JAX programs against JAX's own outputs."""
from __future__ import annotations

import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

from gspmdc.errors import EXIT_BAD_INPUT, EXIT_RUNTIME, GspmdcError, RuntimeFailure, UnsupportedError
from gspmdc.ir.attributes import SliceDim
from gspmdc.ir.parser import parse_module
from gspmdc.runtime.collectives import SinglePartitionBackend
from gspmdc.runtime.interpreter import evaluate
from gspmdc.runtime.io import output_arrays
from gspmdc.runtime.kernels import KERNELS

from interpreter_helpers import run_hlo, single_op

SHARED = Path(__file__).resolve().parents[2] / "shared"

TWO_PARAMS = """
HloModule m
ENTRY main {
  x = f32[2,3] parameter(0)
  t = (s32[], pred[2]) parameter(1)
  i = s32[] get-tuple-element(t), index=0
  ROOT r = (f32[2,3], s32[]) tuple(x, i)
}"""


def test_arguments_are_checked_against_the_entry_parameters():
    module = parse_module(TWO_PARAMS)
    good = [np.zeros((2, 3), np.float32), (np.array(4, np.int32), np.ones(2, bool))]
    x, i = evaluate(module, good)
    assert i == 4
    cases = [
        ([good[0]], "has 2 parameters, got 1 arguments"),
        ([np.zeros((2, 3)), good[1]], r"argument 0 \(parameter x\): expected f32\[2,3\], got f64\[2,3\]"),
        ([np.zeros((3, 2), np.float32), good[1]], r"expected f32\[2,3\], got f32\[3,2\]"),
        ([good[0], np.zeros(2)], r"argument 1 \(parameter t\): expected a tuple"),
        ([good[0], (np.array(4, np.int64), np.ones(2, bool))], r"argument 1 \(parameter t\) element 0"),
        (["text", good[1]], r"got a str"),
    ]
    for args, message in cases:
        with pytest.raises(GspmdcError, match=message) as info:
            evaluate(module, args)
        assert info.value.exit_code == EXIT_BAD_INPUT
        assert not isinstance(info.value, RuntimeFailure)


def test_unknown_opcode_is_unsupported():
    with pytest.raises(UnsupportedError, match="opcode frobnicate is not supported by the interpreter"):
        single_op("frobnicate", ("f32", (2,)), [np.zeros(2, np.float32)])


def test_kernel_failures_become_runtime_failures_naming_the_instruction():
    with pytest.raises(RuntimeFailure, match=r"main/result: reshape failed: ValueError") as info:
        single_op("reshape", ("s32", (4,)), [np.arange(6, dtype=np.int32)])
    assert info.value.exit_code == EXIT_RUNTIME


def test_results_that_contradict_the_instruction_shape_are_reported():
    with pytest.raises(RuntimeFailure, match=r"slice kernel produced shape \[2\] instead of "
                                             r"\[3\] \(the instruction's shape is s32\[3\]\)"):
        single_op("slice", ("s32", (3,)), [np.arange(6, dtype=np.int32)], slice=(SliceDim(0, 2),))


def test_arithmetic_raises_no_numpy_warnings():
    text = """
HloModule m
ENTRY main {
  x = f32[3] parameter(0)
  z = f32[3] constant({0, 0, 0})
  d = f32[3] divide(x, z)
  l = f32[3] log(x)
  ROOT r = (f32[3], f32[3]) tuple(d, l)
}"""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quotient, log = run_hlo(text, np.array([1, -1, 0], np.float32))
    np.testing.assert_array_equal(quotient, [np.inf, -np.inf, np.nan])
    np.testing.assert_array_equal(log, [0, np.nan, -np.inf])


def test_values_are_released_after_their_last_use():
    """A chain of 12 adds on a 4 MB array keeps only a few arrays alive at once."""
    chain = "\n".join(f"  a{k + 1} = f32[1048576] add(a{k}, a{k})" for k in range(12))
    text = f"HloModule m\nENTRY main {{\n  a0 = f32[1048576] parameter(0)\n{chain}\n" \
           "  ROOT r = f32[1048576] negate(a12)\n}"
    module = parse_module(text)
    x = np.ones(1 << 20, np.float32)
    tracemalloc.start()
    try:
        out = evaluate(module, [x])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out[0] == -4096
    assert peak < 4 * x.nbytes, f"peak {peak / x.nbytes:.1f} arrays"


def test_partition_id_must_agree_with_the_backend():
    module = parse_module(TWO_PARAMS)
    args = [np.zeros((2, 3), np.float32), (np.array(1, np.int32), np.ones(2, bool))]
    evaluate(module, args, backend=SinglePartitionBackend(), partition_id=0)
    with pytest.raises(GspmdcError, match="does not match the backend's partition 0"):
        evaluate(module, args, partition_id=3)


def test_several_replicas_are_unsupported():
    module = parse_module(TWO_PARAMS.replace("HloModule m", "HloModule m, replica_count=2"))
    with pytest.raises(UnsupportedError, match="replica_count=2"):
        evaluate(module, [np.zeros((2, 3), np.float32), (np.array(1, np.int32), np.ones(2, bool))])


# ------------------------------------------------------------------------- JAX programs

def _jax_programs():
    if not (SHARED / "jax-programs").is_dir():
        return []
    return sorted(p for p in (SHARED / "jax-programs").iterdir() if (p / "program.hlo").is_file())


@pytest.mark.parametrize("folder", _jax_programs(), ids=lambda p: p.name)
def test_jax_program_reproduces_jax_outputs(folder):
    module = parse_module((folder / "program.hlo").read_text(), filename=str(folder / "program.hlo"))
    missing = sorted({inst.opcode for _, inst in module.all_instructions()
                      if inst.opcode != "parameter" and inst.opcode not in KERNELS})
    if missing:
        pytest.skip(f"kernels not implemented yet: {missing}")
    with np.load(folder / "inputs.npz") as inputs:
        args = [inputs[f"arg{p.parameter_number}"] for p in module.entry.parameters]
    outputs = output_arrays(module, evaluate(module, args))
    with np.load(folder / "outputs.npz") as expected:
        assert sorted(outputs) == sorted(expected.files)
        for key in expected.files:
            np.testing.assert_allclose(outputs[key], expected[key], rtol=2e-5, atol=2e-5,
                                       err_msg=f"{folder.name} {key}")


def test_jax_programs_are_present_or_skipped():
    if not _jax_programs():
        pytest.skip("../shared/jax-programs is absent")
    assert len(_jax_programs()) >= 1


FOLDING = """
HloModule folding

body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[4] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  half = f32[] constant(0.5)
  halves = f32[4] broadcast(half), dimensions={}
  pid = u32[] partition-id()
  pf = f32[] convert(pid)
  pids = f32[4] broadcast(pf), dimensions={}
  step = f32[4] add(halves, pids)
  y = f32[4] add(x, step)
  ROOT t = (s32[], f32[4]) tuple(j, y)
}

cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  big = f32[] constant(2)
  bigs = f32[512,1024] broadcast(big), dimensions={}
  bigm = f32[512,1024] multiply(bigs, bigs)
  s = (s32[], f32[4]) tuple(zero, x)
  w = (s32[], f32[4]) while(s), condition=cond, body=body
  r = f32[4] get-tuple-element(w), index=1
  corner = f32[1,1] slice(bigm), slice={[0:1], [0:1]}
  c = f32[] reshape(corner)
  cs = f32[4] broadcast(c), dimensions={}
  ROOT out = f32[4] add(r, cs)
}"""



def counted_kernel_calls(monkeypatch, *opcodes: str) -> dict[str, int]:
    """The kernels of `opcodes` wrapped to count their calls: the counts, by opcode."""
    calls = dict.fromkeys(opcodes, 0)
    for opcode in opcodes:
        kernel = KERNELS[opcode]

        def spy(inst, args, ctx, kernel=kernel, opcode=opcode):
            calls[opcode] += 1
            return kernel(inst, args, ctx)
        monkeypatch.setitem(KERNELS.rules, opcode, spy)
    return calls

def test_constants_are_folded_once_per_executable(monkeypatch):
    """Instructions computed from constants and partition-id run in the first iteration of the
    first execution only; the values stay right (x + 5 * (0.5 + partition id) + 2 * 2). A value
    holding more than FOLD_BYTES of memory (a 2 MiB product, and the views of it) is computed
    again in every execution."""
    from gspmdc.runtime.collectives import SinglePartitionBackend
    from gspmdc.runtime.interpreter import Executable
    calls = counted_kernel_calls(monkeypatch, "broadcast", "multiply", "partition-id")

    class Partition3(SinglePartitionBackend):
        def partition_id(self):
            return 3
    exe = Executable(parse_module(FOLDING), Partition3())
    x = np.arange(4, dtype=np.float32)
    for execution in range(3):
        np.testing.assert_array_equal(exe([x]), x + 5 * (0.5 + 3) + 4)
    # first execution: halves and pids (loop iteration 1), bigs and cs; later executions: cs
    # only (a view of the product, which is not kept)
    assert calls == {"broadcast": 4 + 2 * 1, "multiply": 3, "partition-id": 1}


HOISTING = """
HloModule hoisting

body {
  s = (s32[], f32[4], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[4] get-tuple-element(s), index=1
  w = f32[4] get-tuple-element(s), index=2
  v = f32[4] get-tuple-element(s), index=3
  one = s32[] constant(1)
  j = s32[] add(i, one)
  two = f32[] constant(2)
  twos = f32[4] broadcast(two), dimensions={}
  ww = f32[4] multiply(w, twos)
  scale = f32[4] exponential(ww)
  xs = f32[4] multiply(x, scale)
  vs = f32[4] multiply(v, twos)
  ROOT t = (s32[], f32[4], f32[4], f32[4]) tuple(j, xs, w, vs)
}

cond {
  s = (s32[], f32[4], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[4] parameter(0)
  w = f32[4] parameter(1)
  zero = s32[] constant(0)
  s = (s32[], f32[4], f32[4], f32[4]) tuple(zero, x, w, w)
  l = (s32[], f32[4], f32[4], f32[4]) while(s), condition=cond, body=body
  a = f32[4] get-tuple-element(l), index=1
  b = f32[4] get-tuple-element(l), index=3
  ROOT out = f32[4] add(a, b)
}"""


def test_loop_invariant_values_are_computed_in_the_first_iteration_only(monkeypatch):
    """`exponential(w * 2)` reads only the state element `w`, which the body passes through: it
    runs in the first of the 4 iterations of each execution (`v * 2` reads `v`, which changes,
    so it runs in each); the values are numpy's: x * exp(2w)^4 + w * 2^4. The loop state's
    elements are bound to the `get-tuple-element`s of the body's and condition's parameter
    without running them (those of the loop's result run). With a value hook watching, every
    iteration computes everything."""
    from gspmdc.runtime.interpreter import Executable
    calls = counted_kernel_calls(monkeypatch, "exponential", "multiply", "get-tuple-element")
    module = parse_module(HOISTING)
    x = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    w = np.array([0.1, -0.3, 0.0, 0.25], np.float32)
    scale = np.exp(w * np.float32(2))
    expected = x * scale * scale * scale * scale + w * np.float32(16)
    exe = Executable(module)
    for execution in range(2):
        np.testing.assert_array_equal(exe([x, w]), expected)
    # per execution: exponential and `w * 2` once, `x * scale` and `v * 2` in every iteration
    assert calls == {"exponential": 2, "multiply": 2 * (1 + 4 + 4), "get-tuple-element": 2 * 2}
    for opcode in calls:
        calls[opcode] = 0
    seen = []
    np.testing.assert_array_equal(
        evaluate(module, [x, w], on_value=lambda inst, value: seen.append(inst.name)), expected)
    assert calls == {"exponential": 4, "multiply": 3 * 4,
                     "get-tuple-element": 4 * 4 + 5 + 2}
    assert seen.count("scale") == 4


IDENTITIES = """
HloModule identities
ENTRY main {
  x = f32[2,3] parameter(0)
  y = f32[2,3] parameter(1)
  c = f32[2,3] copy(x)
  r = f32[2,3] reshape(c)
  b = f32[2,3] broadcast(r), dimensions={0,1}
  t = f32[2,3] transpose(b), dimensions={0,1}
  flipped = f32[3,2] transpose(t), dimensions={1,0}
  back = f32[2,3] transpose(flipped), dimensions={1,0}
  s = f32[2,3] add(t, y)
  ROOT out = (f32[2,3], f32[2,3], f32[2,3]) tuple(s, back, r)
}"""


@pytest.mark.parametrize("hooked", [False, True])
def test_identity_instructions_are_not_executed_unless_values_are_watched(monkeypatch, hooked):
    """A copy, a reshape or broadcast to the operand's own dimensions and an identity transpose
    give their operand's value: without a value hook or live-array count their readers read the
    operand and they do not run (a profile reports them with no time); with one they run and are
    reported like any instruction. A transpose that moves dimensions runs either way."""
    from gspmdc.runtime.interpreter import Executable
    from gspmdc.runtime.live_arrays import LiveArrays
    ran = []
    for opcode in ("copy", "reshape", "broadcast", "transpose"):
        kernel = KERNELS[opcode]

        def spy(inst, args, ctx, kernel=kernel):
            ran.append(inst.name)
            return kernel(inst, args, ctx)
        monkeypatch.setitem(KERNELS.rules, opcode, spy)
    steps, values = {}, {}
    exe = Executable(parse_module(IDENTITIES), on_step=lambda inst, t: steps.update({inst.name: t}),
                     on_value=(lambda inst, v: values.update({inst.name: v})) if hooked else None,
                     live_arrays=LiveArrays() if hooked else None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 10, np.float32)
    s, back, r = exe([x, y])
    np.testing.assert_array_equal(s, x + 10)
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(r, x)
    if hooked:
        assert ran == ["c", "r", "b", "t", "flipped", "back"]
        assert set(values) >= {"c", "r", "b", "t", "flipped", "back"}
    else:
        assert ran == ["flipped", "back"]
        assert {name: steps[name] for name in "crbt"} == {name: 0.0 for name in "crbt"}
    assert steps["flipped"] > 0 and steps["back"] > 0
