"""A rank of `gspmdc run` holds the runtime only: never the parser (nor `lark`), the printer, the
verifier or the partitioner's passes. Checked on a real job: a test-only custom-call (a
`sitecustomize.py` on PYTHONPATH registers it in every process) writes the modules its rank has
loaded; the program is partitioned by `gspmdc run` and checked (`--check`), so rank 0 also runs
the reference. Ranks on the launcher's machine are forked from the rank server, which loaded the
runtime on top of what `gspmdc run` had loaded when it forked the server (before it imported the
partitioner); ranks on other hosts (`--hostfile`) start as `python -m gspmdc.runtime.rank` and
import the runtime themselves: both are checked (a hostfile naming this machine)."""
from __future__ import annotations

import os
import socket
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
  d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  ROOT y = f32[8,4] custom-call(d), custom_call_target="gspmdc_test.modules"
}
"""

#: registers `gspmdc_test.modules`: the identity, writing the rank's loaded modules to a file
PLUGIN = '''
import os, sys
from pathlib import Path
if "GSPMDC_TEST_DIR" in os.environ:
    from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS

    def _modules(inst, args, ctx):
        name = f"modules-{os.getpid()}"
        Path(os.environ["GSPMDC_TEST_DIR"], name).write_text("\\n".join(sorted(sys.modules)))
        return args[0]
    CUSTOM_CALL_TARGETS["gspmdc_test.modules"] = _modules
'''

#: module names (and their submodules) a rank must never hold
COMPILER = ("lark", "networkx", "gspmdc.ir.parser", "gspmdc.ir.printer", "gspmdc.ir.verifier",
            "gspmdc.passes.propagation", "gspmdc.passes.spmd", "gspmdc.passes.pipeline",
            "gspmdc.prepare")


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
@pytest.mark.parametrize("placement", ["rank server", "hostfile"])
def test_ranks_hold_neither_the_parser_nor_the_passes(tmp_path, placement):
    program = tmp_path / "matmul.hlo"
    program.write_text(PROGRAM)
    (tmp_path / "sitecustomize.py").write_text(PLUGIN)
    extra = []
    if placement == "hostfile":
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"{socket.gethostname()}:2\n")
        extra = ["--hostfile", str(hostfile)]
    env = dict(os.environ, PYTHONPATH=str(tmp_path), GSPMDC_TEST_DIR=str(tmp_path))
    proc = subprocess.run([str(GSPMDC), "run", str(program), "--check", "-q", *extra],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "check out0" in proc.stdout and " ok" in proc.stdout
    listings = list(tmp_path.glob("modules-*"))
    assert len(listings) == 2                   # one per rank
    for listing in listings:
        loaded = set(listing.read_text().split())
        # what the ranks did load, so the listing is real
        assert {"numpy", "mpi4py.MPI", "gspmdc.runtime.interpreter",
                "gspmdc.runtime.backends.mpi"} <= loaded
        assert sorted(name for name in loaded
                      if any(name == c or name.startswith(c + ".") for c in COMPILER)) == []
