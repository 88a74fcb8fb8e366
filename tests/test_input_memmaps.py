"""Inputs read from an uncompressed npz (`np.savez`) are memory maps (`np.memmap`, an ndarray
subclass); pass-through kernels (copy, slice, reshape, transpose, reverse, dynamic-slice,
convert to the same type, opt-barrier, Sharding, get-tuple-element, ...)
return their operand or a view of it. The interpreter takes every argument as a plain ndarray
view, so such programs run on both backends and give numpy's answer; its own check of a kernel's
result names what differs (the type, the shape or the element type)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.cli import main
from gspmdc.errors import RuntimeFailure
from gspmdc.runtime import interpreter
from gspmdc.runtime.interpreter import evaluate

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
needs_mpi = pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")

#: every pass-through kernel, on an unsharded and on a tiled parameter (whose shards are views of
#: the memory map on the local backend)
PASS_THROUGH = """HloModule pass_through, num_partitions=2
ENTRY e {
  p = f32[4,6] parameter(0)
  q = f32[4,6] parameter(1), sharding={devices=[2,1]<=[2]}
  i = s32[] parameter(2)
  tp = (f32[4,6]) parameter(3)
  c = f32[4,6] copy(p)
  s = f32[2,6] slice(p), slice={[1:3], [0:6]}
  r = f32[24] reshape(p)
  t = f32[6,4] transpose(p), dimensions={1,0}
  v = f32[4,6] reverse(p), dimensions={0}
  d = f32[2,6] dynamic-slice(p, i, i), dynamic_slice_sizes={2,6}
  cq = f32[4,6] copy(q), sharding={devices=[2,1]<=[2]}
  rq = f32[4,6] reshape(q), sharding={devices=[2,1]<=[2]}
  cv = f32[4,6] convert(p)
  ob = f32[4,6] opt-barrier(p)
  sh = f32[4,6] custom-call(p), custom_call_target="Sharding", sharding={replicated}
  g = f32[4,6] get-tuple-element(tp), index=0
  ROOT out = (f32[4,6], f32[2,6], f32[24], f32[6,4], f32[4,6], f32[2,6], f32[4,6], f32[4,6], f32[4,6], f32[4,6], f32[4,6], f32[4,6]) tuple(c, s, r, t, v, d, cq, rq, cv, ob, sh, g)
}
"""


def _inputs(tmp_path: Path):
    p = np.arange(24, dtype=np.float32).reshape(4, 6)
    q = -p - 1
    i = np.int32(1)
    path = tmp_path / "in.npz"
    np.savez(path, **{"arg0": p, "arg1": q, "arg2": i, "arg3.0": p * 2})  # uncompressed: mapped
    want = [p, p[1:3], p.reshape(24), p.T, p[::-1], p[1:3], q, q, p, p, p, p * 2]
    return path, want


def _check_outputs(path: Path, want) -> None:
    with np.load(path) as data:
        assert sorted(data.files) == sorted(f"out{k}" for k in range(len(want)))
        for k, w in enumerate(want):
            np.testing.assert_array_equal(data[f"out{k}"], w)


def test_pass_through_kernels_on_mapped_inputs_local_backend(tmp_path, capsys):
    program = tmp_path / "p.hlo"
    program.write_text(PASS_THROUGH)
    inputs, want = _inputs(tmp_path)
    out = tmp_path / "out.npz"
    code = main(["run", str(program), "--backend", "local", "--inputs", str(inputs),
                 "--outputs", str(out), "--check", "-q"])
    assert code == 0, capsys.readouterr().err
    _check_outputs(out, want)


@needs_mpi
def test_pass_through_kernels_on_mapped_inputs_mpi_backend(tmp_path):
    program = tmp_path / "p.hlo"
    program.write_text(PASS_THROUGH)
    inputs, want = _inputs(tmp_path)
    out = tmp_path / "out.npz"
    proc = subprocess.run([str(GSPMDC), "run", str(program), "--inputs", str(inputs),
                           "--outputs", str(out), "--check", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _check_outputs(out, want)


def test_evaluate_takes_memory_mapped_arguments(tmp_path):
    """The API: an argument that is an ndarray subclass (a memory-mapped .npy) works."""
    module = api.parse(PASS_THROUGH)
    p = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.save(tmp_path / "p.npy", p)
    mapped = np.load(tmp_path / "p.npy", mmap_mode="r")
    assert type(mapped) is np.memmap
    got = evaluate(module, [mapped, mapped, np.int32(0), (mapped,)])
    np.testing.assert_array_equal(got[3], p.T)
    assert all(type(v) is np.ndarray for v in got)


@pytest.mark.parametrize("value, says", [
    (np.ma.masked_array(np.zeros(4, np.float32)), "a MaskedArray (an ndarray subclass) instead of "
                                                  "a numpy.ndarray"),
    (np.zeros(5, np.float32), "shape [5] instead of [4]"),
    (np.zeros(4, np.float64), "element type f64 instead of f32"),
    ([0.0] * 4, "a list instead of an array"),
])
def test_a_kernel_result_that_does_not_fit_says_what_differs(monkeypatch, value, says):
    module = api.parse("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n"
                       "  ROOT c = f32[4] copy(p)\n}\n")
    monkeypatch.setitem(interpreter.KERNELS.rules, "copy", lambda inst, args, ctx: value)
    with pytest.raises(RuntimeFailure) as error:
        evaluate(module, [np.zeros(4, np.float32)])
    assert f"e/c: the copy kernel produced {says}" in str(error.value)
