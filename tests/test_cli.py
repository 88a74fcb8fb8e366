"""The `gspmdc` command line: parse/eval behaviour, npz conventions, random inputs, exit codes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gspmdc.cli import main
from gspmdc.ir.parser import parse_module
from gspmdc.runtime import io

EXAMPLE = Path(__file__).resolve().parents[1] / "gspmdc" / "examples" / "mlp.hlo"

TUPLES = """
HloModule tuples
ENTRY e {
  p = (f32[2], (s32[3], pred[])) parameter(0)
  a = f32[2] get-tuple-element(p), index=0
  inner = (s32[3], pred[]) get-tuple-element(p), index=1
  b = s32[3] get-tuple-element(inner), index=0
  c = pred[] get-tuple-element(inner), index=1
  twice = f32[2] add(a, a)
  ROOT r = (f32[2], (s32[3], pred[])) tuple(twice, inner)
}
"""

GATHER = """
HloModule g
ENTRY e {
  table = f32[5,3] parameter(0)
  idx = s32[4] parameter(1)
  idx2 = s32[4,1] reshape(idx)
  ROOT g = f32[4,3] gather(table, idx2), offset_dims={1}, collapsed_slice_dims={0},
      start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}
}
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_parse_prints_canonical_text_that_reparses_identically(tmp_path, capsys):
    code, out, _ = run(capsys, "parse", str(EXAMPLE))
    assert code == 0
    assert parse_module(out).difference(parse_module(EXAMPLE.read_text())) is None
    assert "%a_sharded = f32[16,256] custom-call(%a)" in out


def test_parse_error_reports_position_caret_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.hlo"
    bad.write_text("ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] add(p p)\n}\n")
    code, out, err = run(capsys, "parse", str(bad))
    assert code == 2 and out == ""
    assert f"{bad}:3:25: expected ')' or ',', found 'p'" in err
    assert err.rstrip().endswith("^") and "Traceback" not in err


@pytest.mark.parametrize("line, problem", [
    ("  ROOT r = f32[5] negate(p)", "result shape f32[5] is incompatible"),
    ("  ROOT r = f32[4] negate(p), sharding={devices=[3]<=[3]}", "invalid sharding"),
    ("  ROOT r = f32[4] fft(p)", "missing attribute fft_type"),
])
def test_a_verifier_error_gives_the_instruction_position(tmp_path, capsys, line, problem):
    # found by fuzzing: shape, attribute and sharding problems the verifier finds named the
    # computation and instruction but not where they are in the file
    src = tmp_path / "bad.hlo"
    src.write_text(f"HloModule m, num_partitions=2\nENTRY e {{\n  p = f32[4] parameter(0)\n"
                   f"{line}\n}}\n")
    assert main(["parse", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gspmdc: error: {src}:4:8: computation e, instruction r: ")
    assert problem in err and err.rstrip().endswith("^")
    assert err.splitlines()[1] == line


def test_missing_file_is_a_clear_error(capsys):
    code, _, err = run(capsys, "parse", "/nonexistent/x.hlo")
    assert code == 2 and "cannot read" in err


def test_eval_with_inputs_matches_numpy_and_writes_outputs(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x, w1 = rng.standard_normal((16, 64), np.float32), rng.standard_normal((64, 256), np.float32)
    b1, w2 = rng.standard_normal(256, np.float32), rng.standard_normal((256, 64), np.float32)
    np.savez(tmp_path / "in.npz", arg0=x, arg1=w1, arg2=b1, arg3=w2)
    code, _, _ = run(capsys, "eval", str(EXAMPLE), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "out.npz"), "-q")
    assert code == 0
    want = np.maximum(x @ w1 + b1, 0) @ w2
    got = np.load(tmp_path / "out.npz")
    assert list(got.files) == ["out0"]
    np.testing.assert_allclose(got["out0"], want, rtol=1e-5, atol=1e-4)


def test_eval_input_mismatches_are_exit_2(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", arg0=np.zeros((16, 64), np.float64))
    code, _, err = run(capsys, "eval", str(EXAMPLE), "--inputs", str(tmp_path / "in.npz"))
    assert code == 2 and "dtype float64 does not match parameter x" in err
    np.savez(tmp_path / "in.npz", arg0=np.zeros((16, 64), np.float32))
    code, _, err = run(capsys, "eval", str(EXAMPLE), "--inputs", str(tmp_path / "in.npz"))
    assert code == 2 and "missing input 'arg1'" in err


def test_failed_eval_leaves_no_output_file(tmp_path, capsys):
    module = tmp_path / "io.hlo"
    module.write_text("ENTRY e {\n  t = token[] after-all()\n"
                      "  ROOT i = ((f32[2], u32[]), token[]) infeed(t)\n}\n")
    code, _, err = run(capsys, "eval", str(module), "--outputs", str(tmp_path / "out.npz"))
    assert code == 2 and "infeed" in err
    assert list(tmp_path.iterdir()) == [module]


def test_tuple_parameters_and_results_use_dotted_keys(tmp_path):
    module = parse_module(TUPLES)
    args = io.random_inputs(module, seed=3)
    assert isinstance(args[0], tuple) and isinstance(args[0][1], tuple)
    assert [k for k, _ in io.leaf_keys("arg0", module.entry.parameters[0].shape)] == \
        ["arg0.0", "arg0.1.0", "arg0.1.1"]
    np.savez(tmp_path / "in.npz", **{"arg0.0": np.array([1, 2], np.float32),
                                     "arg0.1.0": np.array([4, 5, 6], np.int32),
                                     "arg0.1.1": np.array(True)})
    from gspmdc import api
    outputs = io.output_arrays(module, api.evaluate(module, io.read_inputs(tmp_path / "in.npz",
                                                                          module)))
    assert sorted(outputs) == ["out0", "out1.0", "out1.1"]
    np.testing.assert_array_equal(outputs["out0"], [2, 4])
    np.testing.assert_array_equal(outputs["out1.0"], [4, 5, 6])
    assert outputs["out1.1"] == np.array(True)


def test_random_indices_stay_inside_the_indexed_dimension():
    module = parse_module(GATHER)
    for seed in range(20):
        table, idx = io.random_inputs(module, seed)
        assert table.dtype == np.float32 and idx.dtype == np.int32
        assert idx.min() >= 0 and idx.max() < 5


def test_random_inputs_are_deterministic_per_seed():
    module = parse_module(GATHER)
    a, b = io.random_inputs(module, 7), io.random_inputs(module, 7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = io.random_inputs(module, 8)
    assert not np.array_equal(a[0], c[0])


def test_console_script_runs_as_module_and_never_shows_a_traceback(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0), sharding={devices=[3]0,1}\n}\n")
    proc = subprocess.run([sys.executable, "-m", "gspmdc", "parse", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and f"{bad}:3:" in proc.stderr


@pytest.mark.parametrize("argv", [["--help"], ["parse", "--help"], ["eval", "--help"]])
def test_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0


def test_scalar_outputs_compare():
    from gspmdc.runtime.compare import compare_outputs
    assert compare_outputs({"out0": np.float32(1.0)}, {"out0": np.array(1.0, np.float32)}) is None
    assert compare_outputs({"out0": np.float32(1.0)}, {"out0": np.array(2.0, np.float32)}) \
        is not None


def test_run_takes_the_partition_count_from_the_shardings(tmp_path, capsys):
    text = EXAMPLE.read_text().replace(", num_partitions=8", "")
    assert "num_partitions" not in text
    module = tmp_path / "mlp.hlo"
    module.write_text(text)
    from gspmdc.prepare import devices_named_by_shardings
    assert devices_named_by_shardings(parse_module(text)) == 8
    assert main(["run", str(module), "--backend", "local", "--check", "-q"]) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize("error, code, message", [
    (MemoryError("Unable to allocate 24.0 GiB"), 3,
     "gspmdc: error: out of memory (Unable to allocate 24.0 GiB)"),
    (KeyboardInterrupt(), 3, "gspmdc: interrupted"),
    (ZeroDivisionError("boom"), 3, "gspmdc: internal error: ZeroDivisionError: boom"),
])
def test_failures_outside_gspmdc_errors_are_one_message(monkeypatch, capsys, tmp_path, error,
                                                        code, message):
    from gspmdc import cli
    from gspmdc.commands import basic

    def fail(args):
        raise error
    monkeypatch.setattr(basic, "cmd_parse", fail)
    program = tmp_path / "p.hlo"
    program.write_text("HloModule m\nENTRY e {\n  ROOT c = f32[] constant(1)\n}\n")
    assert cli.main(["parse", str(program)]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_parameter_numbering_error_points_at_the_parameter(tmp_path, capsys):
    src = tmp_path / "bad.hlo"
    src.write_text("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n"
                   "  q = f32[4] parameter(2)\n  ROOT r = f32[4] add(p, q)\n}\n")
    assert main(["parse", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gspmdc: error: {src}:4:3: computation e: parameter numbers [0, 2] "
                          "are not 0..n-1")


@pytest.mark.parametrize("command", [["parse"], ["run", "--backend", "local"]])
def test_a_byte_that_is_not_utf8_is_located(tmp_path, capsys, command):
    # found by fuzzing: the error gave a byte offset ("position 38") instead of a place
    src = tmp_path / "bad.hlo"
    src.write_bytes(b"HloModule m\nENTRY e {\n  p = f32[4] par\xffameter(0)\n}\n")
    assert main([*command, str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gspmdc: error: {src}:3:17: not UTF-8 text: byte 0xff")


def _chain(length: int) -> str:
    """A module of `length` elementwise ops on a tiled parameter (enough objects that a compile
    with the collector running collects several times)."""
    lines = ["HloModule chain, num_partitions=4", "ENTRY e {",
             "  v0 = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}"]
    lines += [f"  v{i} = f32[8,16] add(v{i - 1}, v{i - 1})" for i in range(1, length)]
    lines += [f"  ROOT r = f32[8,16] negate(v{length - 1})", "}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("argv", [["compile", "-n", "4"], ["opt", "-p", "propagate", "-n", "4"],
                                  ["propagate"]])
def test_compiling_commands_run_without_a_garbage_collection(tmp_path, argv):
    """`compile`, `opt` and `propagate` pause the cyclic collector from reading the file to
    writing the result and freeze what is alive at the end (`gc_pause`): no collection scans the
    module between the parser, the passes and the printer, nor right after the command."""
    import gc
    from gspmdc.cli import build_parser
    source = tmp_path / "chain.hlo"
    source.write_text(_chain(400))
    args = build_parser().parse_args(argv[:1] + [str(source), "-o", str(tmp_path / "out.hlo")]
                                     + argv[1:])
    args.run(args)                      # imports and lazily built tables: a first run
    started: list[int] = []

    def collection(phase, info):
        if phase == "start":
            started.append(info["generation"])
    gc.collect()
    gc.callbacks.append(collection)
    try:
        assert args.run(args) == 0
    finally:
        gc.callbacks.remove(collection)
        gc.unfreeze()                   # the test process goes on collecting as before
    assert started == []
    assert "ROOT %r = f32[" in (tmp_path / "out.hlo").read_text()
