"""A rank of `gspmdc run` imports the runtime only: never the parser (nor `lark`), the printer, the
verifier or the partitioner's passes. Checked on a real job: a wrapper given as `--mpiexec` starts
every rank under `python -X importtime`, which reports each module the rank imports on its stderr
(relayed by `gspmdc run`); the program is partitioned by `gspmdc run` and checked (`--check`), so
rank 0 also runs the reference."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).with_name("mpiexec")
GSPMDC = MPIEXEC.with_name("gspmdc")

PROGRAM = """HloModule matmul, num_partitions=2

ENTRY main {
  x = f32[8,16] parameter(0), sharding={devices=[1,2]<=[2]}
  w = f32[16,4] parameter(1), sharding={devices=[2,1]<=[2]}
  ROOT y = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""

#: `gspmdc run` starts `MPIEXEC -n N PYTHON -m gspmdc.runtime.rank ADDRESS TOKEN`
WRAPPER = """#!/bin/sh
n=$2; python=$3; shift 3
exec {mpiexec} -n "$n" "$python" -X importtime "$@"
"""

#: module names (and their submodules) a rank must never import
COMPILER = ("lark", "networkx", "gspmdc.ir.parser", "gspmdc.ir.printer", "gspmdc.ir.verifier",
            "gspmdc.passes", "gspmdc.commands")
#: what only profiling needs (`--profile`, `--profile-json`): the ranks of this run, which does
#: not profile, import none of it
PROFILING = ("gspmdc.runtime.profile", "gspmdc.ir.cost", "gspmdc.ir.liveness", "gspmdc.ir.flops")


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
def test_ranks_import_neither_the_parser_nor_the_passes(tmp_path):
    program = tmp_path / "matmul.hlo"
    program.write_text(PROGRAM)
    wrapper = tmp_path / "mpiexec"
    wrapper.write_text(WRAPPER.format(mpiexec=MPIEXEC))
    wrapper.chmod(0o755)
    proc = subprocess.run([str(GSPMDC), "run", str(program), "--check", "-q",
                           "--mpiexec", str(wrapper)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "check out0" in proc.stdout and " ok" in proc.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and line.count("|") == 2}
    # what the ranks did import, so the listing is real
    assert {"numpy", "mpi4py.MPI", "gspmdc.runtime.interpreter", "gspmdc.runtime.backends.mpi",
            "gspmdc.runtime.compare"} <= imported
    assert sorted(name for name in imported
                  if any(name == c or name.startswith(c + ".") for c in COMPILER + PROFILING)) \
        == []
