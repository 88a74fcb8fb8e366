"""Fuzzing, CI-sized: random valid programs × random shardings (tests/fuzz) through every
command — parse, propagate (with the case's options), explain, compile, explain a collective,
run on the local backend (garbage in the padding of every other case) and, on a smaller
sample, on MPI ranks — must exit 0 with the values of the unpartitioned program. The commands
run in this process (`gspmdc.cli.main`), a few through the installed command. `make fuzz` runs
the same checks on thousands of programs."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import case, cases
from fuzz.checks import check_case
from fuzz.known import known_defect

LOCAL_SEEDS = range(100)
MPI_SEEDS = range(500, 506)
SUBPROCESS_SEEDS = range(600, 602)


def expect_ok(verdict) -> None:
    if verdict.outcome == "ok":
        return
    defect = known_defect(verdict.detail)
    if defect is not None:
        pytest.xfail(defect)
    pytest.fail(f"{verdict.outcome}:\n{verdict.detail}", pytrace=False)


@pytest.mark.parametrize("seed", LOCAL_SEEDS)
def test_generated_program_runs_and_matches_locally(seed, tmp_path):
    c = case(seed)
    expect_ok(check_case(c, tmp_path, backend="local", garbage=seed % 2 == 1, seed=seed))


@pytest.mark.parametrize("seed", MPI_SEEDS)
def test_generated_program_runs_and_matches_on_mpi_ranks(seed, tmp_path):
    c = case(seed)
    expect_ok(check_case(c, tmp_path, backend="mpi", seed=seed))


@pytest.mark.parametrize("seed", SUBPROCESS_SEEDS)
def test_generated_program_through_the_installed_command(seed, tmp_path):
    c = case(seed)
    expect_ok(check_case(c, tmp_path, backend="local", seed=seed, subprocess_cli=True))


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(c=cases())
def test_hypothesis_programs_run_and_match(c, tmp_path_factory):
    expect_ok(check_case(c, tmp_path_factory.mktemp("case"), backend="local", garbage=True))
