"""A launcher that fails is reported as such: `gspmdc run --mpiexec X` whose X ends without the
ranks having finished (or reported their own failure) exits 3 naming X and how it ended, never
with X's exit code passed off as the job's (exit 1 would claim a numeric mismatch)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
needs_mpi = pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
PROGRAM = "HloModule m, num_partitions=2\nENTRY e {\n  p = f32[4] parameter(0), " \
          "sharding={devices=[2]<=[2]}\n  ROOT n = f32[4] negate(p), sharding={replicated}\n}\n"


def run(tmp_path: Path, launcher: str, *extra: str) -> subprocess.CompletedProcess:
    program = tmp_path / "p.hlo"
    program.write_text(PROGRAM)
    return subprocess.run([str(GSPMDC), "run", str(program), "-q", "--mpiexec", launcher,
                           *extra], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return f"./{name}"                       # relative, as a user would type it


@pytest.mark.parametrize("launcher, status", [("/bin/false", "exit status 1"),
                                              ("/bin/true", "exit status 0")])
def test_a_launcher_that_starts_no_rank_is_exit_3_naming_it(tmp_path, launcher, status):
    proc = run(tmp_path, launcher)
    assert proc.returncode == 3
    assert f"gspmdc: error: mpiexec failed ({status}) before any rank started; the launcher " \
           f"was {launcher}" in proc.stderr


@pytest.mark.parametrize("body, status", [("exit 3", "exit status 3"), ("exit 2", "exit status 2"),
                                          ("kill -9 $$", "killed by signal 9")])
def test_every_exit_of_a_failing_launcher_is_exit_3(tmp_path, body, status):
    proc = run(tmp_path, script(tmp_path, "launcher.sh", body))
    assert proc.returncode == 3
    assert f"mpiexec failed ({status}) before any rank started; the launcher was " \
           f"{tmp_path / 'launcher.sh'}" in proc.stderr


def test_a_launcher_that_cannot_be_executed_is_exit_3(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("not a program")
    bad.chmod(0o755)
    proc = run(tmp_path, "./bad.sh")
    assert proc.returncode == 3
    assert f"cannot start {bad}: [Errno 8] Exec format error" in proc.stderr


@needs_mpi
def test_a_relative_launcher_path_runs_the_job(tmp_path):
    proc = run(tmp_path, script(tmp_path, "wrap.sh", f'exec {MPIEXEC} "$@"'))
    assert proc.returncode == 0, proc.stderr


@needs_mpi
def test_a_check_mismatch_on_mpi_is_still_exit_1(tmp_path, capsys, monkeypatch):
    """The ranks' own exit code 1 (a --check mismatch) passes through: a partitioner bug in
    miniature, the program copies p instead of negating it."""
    from gspmdc.cli import main
    from gspmdc.ir.parser import parse_module
    from gspmdc import prepare
    program = tmp_path / "p.hlo"
    program.write_text(PROGRAM)
    wrong = parse_module("HloModule m, num_partitions=2, spmd_global_signature={(f32[4])->f32[4]}"
                         "\nENTRY e {\n  p = f32[2] parameter(0), sharding={devices=[2]<=[2]}\n"
                         "  ROOT c = f32[2] copy(p), sharding={devices=[2]<=[2]}\n}\n")
    monkeypatch.setattr(prepare, "_partition", lambda *args, **kwargs: wrong)
    assert main(["run", str(program), "-q", "--check"]) == 1
    assert "differ from the unpartitioned reference" in capsys.readouterr().err
