"""Command-line values are checked while the command line is parsed: a bad number or an output
path that cannot be written is an argparse error (exit 2, `argument X: ...`) before any work,
never an internal error."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspmdc.cli import main

GSPMDC = Path(sys.executable).with_name("gspmdc")
PROGRAM = "HloModule m, num_partitions=2\nENTRY e {\n  p = f32[4] parameter(0)\n" \
          "  ROOT n = f32[4] negate(p)\n}\n"


@pytest.fixture
def program(tmp_path) -> Path:
    path = tmp_path / "p.hlo"
    path.write_text(PROGRAM)
    return path


def usage_error(capsys, argv) -> str:
    """The message of an argparse error (exit 2) for `argv`."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    return err


@pytest.mark.parametrize("command", ["eval", "run"])
@pytest.mark.parametrize("seed", ["-1", "-7"])
def test_a_negative_seed_is_refused(program, capsys, command, seed):
    err = usage_error(capsys, [command, program, "--seed", seed])
    assert f"argument --seed: must be a non-negative integer, got {seed}" in err


POSITIVE = "must be a positive integer (at most 2^63-1)"
PARTITIONS = "must be a number of partitions from 1 to 16777216 (2^24)"


@pytest.mark.parametrize("argv, message", [
    (["compile", "{p}", "-n", "0"], f"argument -n/--num-partitions: {PARTITIONS}, got 0"),
    (["run", "{p}", "-n", "-2"], f"argument -n/--num-partitions: {PARTITIONS}, got -2"),
    (["run", "{p}", "-n", str(10**23)], f"argument -n/--num-partitions: {PARTITIONS}, got 10"),
    # found by make fuzz's neighbour: 2^32 partitions started 2^32 threads (out of memory, exit 3)
    (["run", "{p}", "-n", str(2**32)], f"argument -n/--num-partitions: {PARTITIONS}, got 4294967296"),
    (["run", "{p}", "--repeat", "0"], f"argument --repeat: {POSITIVE}, got 0"),
    (["run", "{p}", "--timeout", "0"], "argument --timeout: must be a positive number, got 0"),
    (["run", "{p}", "--timeout", "nan"], "argument --timeout: must be a positive number, got nan"),
    (["run", "{p}", "--timeout", "soon"], "argument --timeout: expected a number, got 'soon'"),
    (["compile", "{p}", "-n", "2", "--windowed-einsum-threshold", "-1"],
     "argument --windowed-einsum-threshold: must be a non-negative integer, got -1"),
    (["explain", "{p}", "n", "-n", "0"], f"argument -n: {POSITIVE}, got 0"),
    (["opt", "{p}", "-p", "propagate", "-n", "0"],
     f"argument -n/--num-partitions: {PARTITIONS}, got 0"),
    (["eval", "{p}", "--seed", "x"], "argument --seed: expected an integer, got 'x'"),
])
def test_numbers_out_of_range(program, capsys, argv, message):
    assert message in usage_error(capsys, [a.format(p=program) for a in argv])


@pytest.mark.parametrize("argv", [
    ["parse", "{p}", "-o", "{d}"],
    ["compile", "{p}", "-n", "2", "-o", "{d}"],
    ["propagate", "{p}", "-o", "{d}"],
    ["opt", "{p}", "-p", "propagate", "-o", "{d}"],
    ["eval", "{p}", "--outputs", "{d}"],
    ["run", "{p}", "--backend", "local", "--outputs", "{d}"],
])
def test_an_output_file_naming_a_directory_is_refused(program, tmp_path, capsys, argv):
    directory = tmp_path / "outdir"
    directory.mkdir()
    err = usage_error(capsys, [a.format(p=program, d=directory) for a in argv])
    assert f"{directory} is a directory; give the name of a file" in err
    assert list(directory.iterdir()) == []


def test_an_output_file_under_a_regular_file_is_refused(program, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    err = usage_error(capsys, ["compile", program, "-n", "2", "-o", blocker / "sub" / "out.hlo"])
    assert f"{blocker} is not a directory" in err


def test_an_output_file_in_a_new_directory_is_created(program, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "out.hlo"
    assert main(["compile", str(program), "-n", "2", "-o", str(out)]) == 0
    assert "partition-id" in out.read_text() or "negate" in out.read_text()


@pytest.mark.parametrize("under", [False, True])
@pytest.mark.parametrize("command", [["compile", "-n", "2"], ["opt", "-p", "propagate"]])
def test_a_dump_dir_naming_a_file_is_refused(program, tmp_path, capsys, under, command):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    dump = blocker / "dumps" if under else blocker
    err = usage_error(capsys, [command[0], program, *command[1:], "--dump-dir", dump])
    assert "argument --dump-dir" in err and "is not a directory" in err
    assert blocker.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_output_in_a_read_only_directory_is_refused(program, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    err = usage_error(capsys, ["compile", program, "-n", "2", "-o", locked / "out.hlo"])
    assert "permission denied" in err


def test_the_console_script_reports_a_negative_seed_in_one_line(program):
    proc = subprocess.run([str(GSPMDC), "run", str(program), "--seed", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "gspmdc run: error: argument --seed: must be a non-negative integer, got -1"
