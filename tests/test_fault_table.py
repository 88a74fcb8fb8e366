"""Every row of docs/runtime.md's fault table (`fault_table.py` measures it): a fault in any phase
of a `gspmdc run` job on MPI ends it with exit code 3 (the launcher itself killed: by the signal)
within 10 s, names what failed, and leaves no process, temporary file, shared-memory segment or
output file behind."""
from __future__ import annotations

import pytest

from fault_table import FAULTS, HUNG, MPIEXEC, PHASES, TIMEOUT, VICTIM, run_case

#: the bound every row must meet, seconds (exit, and everything gone)
BOUND = 10.0


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_ends_the_job_cleanly(fault, phase, tmp_path):
    result = run_case(fault, phase, tmp_path)
    if fault == "SIGKILL launcher":
        assert result.exit_code == -9
    else:
        assert result.exit_code == 3, result.stderr
    assert result.seconds_to_exit < BOUND, result.row()
    assert result.seconds_to_clean < BOUND, result.row()
    assert result.leftovers == [], result.row()
    if fault.endswith("rank"):
        how = "killed by SIGKILL" if fault.startswith("SIGKILL") else "crashed with SIGSEGV"
        assert f"rank {VICTIM[phase]} (pid {result.victim_pid}) terminated unexpectedly ({how}) " \
            "while " in result.stderr, result.stderr
    elif fault.startswith("hang"):
        assert f"the run timed out after {TIMEOUT:g} s: " in result.stderr
        assert HUNG[phase] in result.stderr, result.stderr
    elif fault == "SIGTERM launcher":
        assert "stopped by SIGTERM; all ranks were stopped" in result.stderr
    elif fault == "SIGINT launcher":
        assert "interrupted by SIGINT; all ranks were stopped" in result.stderr
