"""`gspmdc run` end to end: unpartitioned programs (partitioned on the fly) and hand-written SPMD
programs on the local and MPI backends against numpy written here, --check (pass, mismatch, and
the programs it must refuse), input-file checks before launching, --profile, random inputs that
agree across backends, and the output comparison rules."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gspmdc.cli import main
from gspmdc.ir.parser import parse_module
from gspmdc import prepare
from gspmdc.runtime.mpi_processes import process_started_at
from gspmdc.runtime.compare import (
    Bound, check_tolerance, compare_output_arrays, compare_outputs, path_precision,
)
from hlo_text import reducer

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
MLP = Path(__file__).resolve().parents[1] / "gspmdc" / "examples" / "mlp.hlo"
needs_mpi = pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")


def mlp_inputs(tmp_path: Path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w1 = rng.standard_normal((64, 256)).astype(np.float32) / 8
    b1 = rng.standard_normal(256).astype(np.float32)
    w2 = rng.standard_normal((256, 64)).astype(np.float32) / 16
    path = tmp_path / "in.npz"
    np.savez(path, arg0=x, arg1=w1, arg2=b1, arg3=w2)
    want = np.maximum(x.astype(np.float64) @ w1 + b1, 0) @ w2
    return path, want


def run_cli(*args) -> int:
    return main(["run", *map(str, args)])


def run_subprocess(*args, timeout=120, env=None):
    return subprocess.run([str(GSPMDC), "run", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_local_backend_partitions_runs_checks_and_writes(tmp_path, capsys):
    inputs, want = mlp_inputs(tmp_path)
    out = tmp_path / "out.npz"
    assert run_cli(MLP, "--backend", "local", "--inputs", inputs, "--outputs", out,
                   "--check", "--profile") == 0
    text = capsys.readouterr().out
    assert "check out0: max abs error" in text and " ok" in text
    assert "interpretation(s)" in text and "all-reduce" in text
    with np.load(out) as data:
        assert data.files == ["out0"]
        np.testing.assert_allclose(data["out0"], want, rtol=1e-4, atol=1e-4)


@needs_mpi
def test_mpi_backend_on_eight_ranks(tmp_path):
    inputs, want = mlp_inputs(tmp_path)
    out = tmp_path / "out.npz"
    proc = run_subprocess(MLP, "--inputs", inputs, "--outputs", out, "--check", "--profile")
    assert proc.returncode == 0, proc.stderr
    assert "check out0" in proc.stdout and "bytes sent" in proc.stdout
    assert proc.stdout.count("\n        7 ") == 1          # a profile row for each of 8 ranks
    with np.load(out) as data:
        np.testing.assert_allclose(data["out0"], want, rtol=1e-4, atol=1e-4)


SPMD_UNEVEN = """HloModule by_hand, num_partitions=4, spmd_global_signature={(f32[10,3], s32[])->(f32[10,3], f32[3], s32[])}

""" + reducer("add") + """
ENTRY main {
  x = f32[3,3] parameter(0), sharding={devices=[4,1]<=[4]}
  k = s32[] parameter(1), sharding={replicated}
  n = f32[3,3] negate(x)
  zero = f32[] constant(0)
  partial = f32[3] reduce(x, zero), dimensions={0}, to_apply=add
  total = f32[3] all-reduce(partial), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[3,3], f32[3], s32[]) tuple(n, total, k), sharding={{devices=[4,1]<=[4]}, {replicated}, {maximal device=2}}
}
"""


@pytest.mark.parametrize("backend,timeout", [("local", 5), pytest.param("mpi", 20, marks=needs_mpi)])
def test_timeout_counts_from_when_the_command_started(tmp_path, capsys, backend, timeout):
    """`--timeout` counts from the `started_at` given to `main` (the `gspmdc` command gives its
    process's start): a command said to have started long ago is already out of time, whatever
    its backend; a call without one counts from the call, however old this process is."""
    inputs, _ = mlp_inputs(tmp_path)
    argv = ["run", str(MLP), "--backend", backend, "--inputs", str(inputs),
            "--timeout", str(timeout)]
    start = time.monotonic()
    assert main(argv, started_at=time.time() - 100) == 3
    assert f"the run timed out after {timeout} s" in capsys.readouterr().err
    assert time.monotonic() - start < timeout
    age = time.time() - process_started_at()
    if age < timeout + 1:
        time.sleep(timeout + 1 - age)            # this process is now older than the timeout
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("backend", ["local", pytest.param("mpi", marks=needs_mpi)])
def test_hand_written_spmd_program_with_uneven_shards(tmp_path, backend):
    program = tmp_path / "spmd.hlo"
    program.write_text(SPMD_UNEVEN)
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    np.savez(tmp_path / "in.npz", arg0=x, arg1=np.int32(5))
    out = tmp_path / "out.npz"
    args = [program, "--backend", backend, "--inputs", tmp_path / "in.npz", "--outputs", out]
    code = run_cli(*args) if backend == "local" else run_subprocess(*args).returncode
    assert code == 0
    with np.load(out) as data:
        np.testing.assert_array_equal(data["out0"], -x)
        # zero padding of the last shard (rows 10, 11) does not change the column sums
        np.testing.assert_array_equal(data["out1"], x.sum(axis=0))
        assert data["out2"] == 5


REPEAT_LINE = re.compile(r"^repeat: 3 runs after the first: median ([0-9.]+) ms per run, "
                         r"quartiles ([0-9.]+) ms - ([0-9.]+) ms, fastest ([0-9.]+) ms, "
                         r"slowest ([0-9.]+) ms(; BLAS: OpenBLAS's (\w+) kernels, (\d+) threads? "
                         r"per partition)?$", re.M)


@pytest.mark.parametrize("backend", ["local", pytest.param("mpi", marks=needs_mpi)])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_repeat_times_the_runs_after_the_first_and_keeps_the_results(tmp_path, backend,
                                                                     threads):
    """`--repeat 3`: four executions, the last three timed and profiled (the all-reduce runs
    once per execution: the profile counts 3 calls), the outputs still numpy's. The line names
    the BLAS the runs used where it is an OpenBLAS: its kernels (those a child of this
    environment runs) and the threads of each partition (the count the user set, which the
    runs set in the library, beyond the cores too)."""
    import os
    from gspmdc.runtime.blas import blas_kernels
    program = tmp_path / "spmd.hlo"
    program.write_text(SPMD_UNEVEN)
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    np.savez(tmp_path / "in.npz", arg0=x, arg1=np.int32(5))
    out = tmp_path / "out.npz"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    proc = run_subprocess(program, "--backend", backend, "--inputs", tmp_path / "in.npz",
                          "--outputs", out, "--repeat", "3", "--profile", "-q",
                          env={**env, "OPENBLAS_NUM_THREADS": threads})
    assert proc.returncode == 0, proc.stderr
    line = REPEAT_LINE.search(proc.stdout)
    median, q1, q3, fastest, slowest = [float(t) for t in line.groups()[:5]]
    assert 0 < fastest <= q1 <= median <= q3 <= slowest
    kernels = subprocess.run([sys.executable, "-c", "import numpy\n"
                              "from gspmdc.runtime.blas import blas_kernels\n"
                              "print(blas_kernels())"], capture_output=True, text=True,
                             timeout=120, check=True).stdout.strip()
    if blas_kernels() is None:
        assert line.group(6) is None
    else:
        assert (line.group(7), line.group(8)) == (kernels, threads), line.group(0)
    calls = re.search(r"^total +all-reduce +4 +(\d+) ", proc.stdout, re.M)
    assert calls is not None and calls.group(1) == "3", proc.stdout
    with np.load(out) as data:
        np.testing.assert_array_equal(data["out0"], -x)
        np.testing.assert_array_equal(data["out1"], x.sum(axis=0))


def test_run_times_line_gives_the_quartiles_of_the_runs():
    from gspmdc.runtime.profile import format_run_times
    # sorted 1, 2, 3, 4 ms: median 2.5, quartiles at positions 0.75 and 2.25 of the sorted runs
    assert format_run_times([0.004, 0.001, 0.003, 0.002]) == (
        "repeat: 4 runs after the first: median 2.500 ms per run, quartiles 1.750 ms - "
        "3.250 ms, fastest 1.000 ms, slowest 4.000 ms")
    assert format_run_times([0.001], ("SkylakeX", 1)) == (
        "repeat: 1 run after the first: median 1.000 ms per run, quartiles 1.000 ms - 1.000 ms, "
        "fastest 1.000 ms, slowest 1.000 ms; BLAS: OpenBLAS's SkylakeX kernels, 1 thread per "
        "partition")
    assert format_run_times([0.001], ("Haswell", 2)).endswith(
        "; BLAS: OpenBLAS's Haswell kernels, 2 threads per partition")


@needs_mpi
def test_random_inputs_agree_between_backends_bit_for_bit(tmp_path):
    local, mpi = tmp_path / "local.npz", tmp_path / "mpi.npz"
    assert run_cli(MLP, "--backend", "local", "--seed", "3", "--outputs", local, "-q") == 0
    proc = run_subprocess(MLP, "--seed", "3", "--deterministic", "--outputs", mpi, "-q")
    assert proc.returncode == 0, proc.stderr
    with np.load(local) as a, np.load(mpi) as b:
        np.testing.assert_array_equal(a["out0"], b["out0"])


def test_check_refuses_an_already_partitioned_program(tmp_path, capsys):
    program = tmp_path / "spmd.hlo"
    program.write_text(SPMD_UNEVEN)
    assert run_cli(program, "--backend", "local", "--check") == 2
    assert "already partitioned" in capsys.readouterr().err


CROSS_REPLICA = """HloModule cross_replica, num_partitions=2

""" + reducer("add") + """
ENTRY main {
  x = f32[6,4] parameter(0), sharding={devices=[2,1]<=[2]}
  s = f32[6,4] all-reduce(x), to_apply=add, sharding={devices=[2,1]<=[2]}
  ROOT r = f32[6,4] multiply(s, s), sharding={devices=[2,1]<=[2]}
}
"""


def test_a_cross_replica_all_reduce_does_not_make_a_program_partitioned(tmp_path, capsys):
    """No channel_id: it combines replicas (one here), so the program has a reference."""
    program = tmp_path / "cross_replica.hlo"
    program.write_text(CROSS_REPLICA)
    assert run_cli(program, "--backend", "local", "--check", "-q") == 0
    assert "ok" in capsys.readouterr().out


IO_PROGRAM = """HloModule io, num_partitions=2

ENTRY main {
  x = f32[4] parameter(0)
  tok = token[] after-all()
  of = token[] outfeed(x, tok), outfeed_shape=f32[4]
  ROOT r = f32[4] negate(x)
}
"""

MANUAL_PROGRAM = """HloModule manual, num_partitions=2

ENTRY main {
  x = f32[4] parameter(0), sharding={manual}
  ROOT r = f32[4] negate(x), sharding={manual}
}
"""


MANUAL_RESULT_PROGRAM = """HloModule m, num_partitions=4
ENTRY main {
  c = f32[] constant(1), sharding={replicated}
  b = f32[2,2] broadcast(c), dimensions={}, sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  ROOT r = f32[2,2] add(b, b), sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
}
"""


@pytest.mark.parametrize("text, message", [
    (IO_PROGRAM, "I/O instructions (outfeed)"),
    (MANUAL_RESULT_PROGRAM, "a result (r) with a manual sharding"),
    (MANUAL_PROGRAM, "entry parameter 0 (x), which has a manual sharding"),
])
def test_check_refuses_io_and_manual_parameters(tmp_path, capsys, text, message):
    program = tmp_path / "p.hlo"
    program.write_text(text)
    assert run_cli(program, "--backend", "local", "--check") == 2
    assert message in capsys.readouterr().err


UNREDUCED_RESULT_PROGRAM = """HloModule m, num_partitions=4
ENTRY e {
  a = f32[8,6] parameter(0), sharding={devices=[2,2]<=[4]}
  b = f32[6,5] parameter(1), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  ROOT d = f32[8,5] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[2,1,2]<=[4] last_tile_dims={unreduced}}
}
"""


@pytest.mark.parametrize("backend", ["local", "mpi"])
def test_an_unreduced_result_is_assembled_by_summing_its_parts(tmp_path, capsys, backend):
    """XLA's SubgroupUnreducedAndReplicated form: each partition returns its partial dot."""
    if backend == "mpi" and not MPIEXEC.exists():
        pytest.skip("mpiexec not installed in the venv")
    program = tmp_path / "p.hlo"
    program.write_text(UNREDUCED_RESULT_PROGRAM)
    assert run_cli(program, "--backend", backend, "--check", "--garbage-padding", "-q") == 0
    assert "out0" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["local", "mpi"])
def test_scalar_outputs_keep_their_shape(tmp_path, backend):
    # found by fuzzing: on MPI ranks, --outputs wrote a scalar result as an array of shape (1,)
    if backend == "mpi" and not MPIEXEC.exists():
        pytest.skip("mpiexec not installed in the venv")
    program = tmp_path / "p.hlo"
    program.write_text("HloModule s, num_partitions=2\nENTRY e {\n  x = f32[] parameter(0)\n"
                       "  y = f32[] parameter(1)\n  c = c64[] complex(x, y)\n"
                       "  ROOT t = (c64[], f32[]) tuple(c, y)\n}\n")
    out = tmp_path / "out.npz"
    proc = run_subprocess(program, "--backend", backend, "--outputs", out, "-q")
    assert proc.returncode == 0, proc.stderr
    with np.load(out) as got:
        assert got["out0"].shape == () and got["out0"].dtype == np.complex64
        assert got["out1"].shape == ()


def test_check_reports_a_mismatch_with_exit_1(tmp_path, capsys, monkeypatch):
    program = tmp_path / "p.hlo"
    program.write_text("""HloModule m, num_partitions=2

ENTRY main {
  x = f32[4,2] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT n = f32[4,2] negate(x), sharding={devices=[2,1]<=[2]}
}
""")

    def bad_partition(module, n, windowed_einsum_threshold):
        """A partitioner bug in miniature: the program copies x instead of negating it."""
        return parse_module("""HloModule m, num_partitions=2, spmd_global_signature={(f32[4,2])->f32[4,2]}

ENTRY main {
  x = f32[2,2] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT c = f32[2,2] copy(x), sharding={devices=[2,1]<=[2]}
}
""")
    monkeypatch.setattr(prepare, "_partition", bad_partition)
    assert run_cli(program, "--backend", "local", "--check", "-q") == 1
    captured = capsys.readouterr()
    assert "check out0: max abs error" in captured.out and "MISMATCH" in captured.out
    assert "differ from the unpartitioned reference" in captured.err


def test_partition_count_must_match_a_partitioned_program(tmp_path, capsys):
    program = tmp_path / "spmd.hlo"
    program.write_text(SPMD_UNEVEN)
    assert run_cli(program, "--backend", "local", "-n", "2") == 2
    assert "partitioned for 4 partitions, cannot run it on 2" in capsys.readouterr().err


@pytest.mark.parametrize("arrays, message", [
    ({"arg0": np.zeros((16, 63), np.float32)}, "arg0: float32[16, 63] does not match"),
    ({"arg0": np.zeros((16, 64), np.float32), "extra": np.zeros(1)}, "unexpected inputs"),
    ({"arg0": np.zeros((16, 64), np.float32)}, "no array 'arg1'"),
])
def test_bad_input_files_fail_before_launching(tmp_path, arrays, message):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    # the MPI backend checks inputs in this process, before starting mpiexec: a stand-in
    # "mpiexec" that could not run the job shows that it is never started
    proc = run_subprocess(MLP, "--inputs", inputs, "--mpiexec", sys.executable, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr


def test_missing_mpiexec_is_a_clear_error(tmp_path):
    proc = run_subprocess(MLP, "--mpiexec", tmp_path / "nowhere", timeout=60)
    assert proc.returncode == 2 and "mpiexec not found" in proc.stderr


# ---------------------------------------------------------------------- comparison rules

def test_compare_outputs_contract():
    a = {"out0": np.array([1.0, np.nan], np.float32), "out1": np.array([1, 2], np.int32)}
    assert compare_outputs(a, {k: v.copy() for k, v in a.items()}) is None
    off = {"out0": np.array([1.001, np.nan], np.float32), "out1": a["out1"]}
    assert "out0" in compare_outputs(a, off)
    assert "1 of 2 elements differ" in compare_outputs(a, {**a, "out1": np.array([1, 3])
                                                            .astype(np.int32)})
    assert "missing" in compare_outputs({}, a)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_comparison_in_chunks_counts_every_element(monkeypatch, dtype):
    """Huge outputs are compared a chunk at a time: counts, errors and NaN rules still span
    every element (chunk of 3 over 10 elements, errors in the first and last chunks)."""
    from gspmdc.runtime import compare
    monkeypatch.setattr(compare, "COMPARE_CHUNK", 3)
    want = np.arange(10, dtype=dtype).reshape(2, 5)
    want[1, 4] = np.nan
    got = want.copy()
    got[0, 0] += 0.5
    got[1, 3] += 2.0
    (result,) = compare_output_arrays({"o": got}, {"o": want}, lambda _name, _want: Bound(1e-6, 1e-6))
    assert not result.ok and result.problem == "2 of 10 elements outside tolerance"
    assert result.max_abs_error == pytest.approx(2.0)
    scalar = compare_output_arrays({"o": np.float32(1)}, {"o": np.float32(1)},
                                   lambda _name, _want: Bound(0.0, 0.0))
    assert scalar[0].ok


def _dot_program(k: int, element_type: str = "f32", output_type: str = "f32") -> str:
    convert = (f"ROOT c = {output_type}[4,4] convert(d)" if output_type != element_type else "")
    return f"""HloModule dot
ENTRY main {{
  a = {element_type}[4,{k}] parameter(0)
  b = {element_type}[{k},4] parameter(1)
  {"" if convert else "ROOT "}d = {element_type}[4,4] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  {convert}
}}
"""


def test_check_tolerance_scales_with_the_reduction_length():
    want = np.array([100.0, 1e-3], np.float32)
    short = check_tolerance(parse_module(_dot_program(4)))
    long_ = check_tolerance(parse_module(_dot_program(4096)))
    bound = short("out0", want)
    assert bound.rtol == pytest.approx(8 * 4 * np.finfo(np.float32).eps)
    assert bound.atol == pytest.approx(bound.rtol * 100)
    got = want + np.float32(0.01)      # 1e-4 of the largest value: fine for 4096 terms only
    assert not compare_output_arrays({"out0": got}, {"out0": want}, short)[0].ok
    assert compare_output_arrays({"out0": got}, {"out0": want}, long_)[0].ok


def test_reduction_length_of_the_mlp_example():
    precision = path_precision(parse_module(MLP.read_text()))["out0"]
    assert precision.terms == 256 and precision.reduction == "y"
