"""Output files of every command are created like any file the user's shell would create: a new
file gets 0666 minus the umask, an existing one keeps its mode; MPI ranks write with the umask of
the `gspmdc run` that started them."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gspmdc.cli import main

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
PROGRAM = "HloModule m, num_partitions=2\nENTRY e {\n  p = f32[4] parameter(0), " \
          "sharding={devices=[2]<=[2]}\n  ROOT n = f32[4] negate(p)\n}\n"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def program(tmp_path) -> Path:
    path = tmp_path / "p.hlo"
    path.write_text(PROGRAM)
    return path


def commands(program: Path, out: Path) -> dict[str, list[str]]:
    return {
        "parse": ["parse", str(program), "-o", str(out)],
        "propagate": ["propagate", str(program), "-o", str(out)],
        "compile": ["compile", str(program), "-n", "2", "-o", str(out)],
        "opt": ["opt", str(program), "-p", "propagate", "-o", str(out)],
        "eval": ["eval", str(program), "-q", "--outputs", str(out)],
        "run": ["run", str(program), "--backend", "local", "-q", "--outputs", str(out)],
    }


@pytest.mark.parametrize("command", ["parse", "propagate", "compile", "opt", "eval", "run"])
@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_new_outputs_honour_the_umask(program, tmp_path, capsys, command, mask):
    out = tmp_path / "out"
    old = os.umask(mask)
    try:
        assert main(commands(program, out)[command]) == 0, capsys.readouterr().err
    finally:
        os.umask(old)
    assert _mode(out) == 0o666 & ~mask


@pytest.mark.parametrize("command", ["parse", "propagate", "compile", "opt", "eval", "run"])
def test_an_existing_output_keeps_its_mode(program, tmp_path, capsys, command):
    out = tmp_path / "out"
    out.write_bytes(b"old")
    os.chmod(out, 0o604)
    assert main(commands(program, out)[command]) == 0, capsys.readouterr().err
    assert _mode(out) == 0o604 and out.read_bytes() != b"old"


def test_dumps_honour_the_umask(program, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    old = os.umask(0o022)
    try:
        assert main(["compile", str(program), "-n", "2", "--dump-dir", str(dumps)]) == 0
    finally:
        os.umask(old)
    assert {_mode(p) for p in dumps.iterdir()} == {0o644}


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
def test_mpi_ranks_write_with_the_umask_of_the_run(program, tmp_path):
    out = tmp_path / "out.npz"
    proc = subprocess.run([str(GSPMDC), "run", str(program), "-q", "--outputs", str(out)],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    assert _mode(out) == 0o640


def test_compile_spmd_refuses_a_dump_dir_that_is_a_file(program, tmp_path):
    from gspmdc import api
    from gspmdc.errors import GspmdcError
    from gspmdc.passes.pipeline import compile_spmd
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(GspmdcError, match="exists and is not a directory"):
        compile_spmd(api.load(program), 2, dump_dir=blocker)
    with pytest.raises(GspmdcError, match="cannot create the dump directory .*: Not a directory"):
        compile_spmd(api.load(program), 2, dump_dir=blocker / "dumps")
    assert blocker.read_text() == "x"
