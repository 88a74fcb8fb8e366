"""autoshard on JAX programs of ../shared/jax-programs (skipped when absent), as the benchmark
`bench/bench_autoshard.py` does for all of them: the plan's modelled step time is at most the
expert annotation's, the plan runs on MPI reproducing the global program, and the bytes each
partition sends, measured by the runtime, are the modelled ones."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT.parent / "shared" / "jax-programs"


def bench():
    """bench/bench_autoshard.py, loaded once (its dataclasses need it in sys.modules)."""
    found = sys.modules.get("bench_autoshard")
    if found is None:
        spec = importlib.util.spec_from_file_location("bench_autoshard",
                                                      ROOT / "bench" / "bench_autoshard.py")
        found = importlib.util.module_from_spec(spec)
        sys.modules["bench_autoshard"] = found
        spec.loader.exec_module(found)
    return found


def program(name: str) -> Path:
    folder = PROGRAMS / name
    if not (folder / "program.hlo").is_file():
        pytest.skip(f"../shared/jax-programs/{name} is absent")
    return folder


def test_the_mlp_plan_beats_the_megatron_annotation_of_its_expert():
    result = bench().plan_program(program("mlp_megatron"), run=False)
    assert result.status == "optimal"
    # the batch of 16 over x, weights whole: no communication at all, where the expert's
    # Megatron split all-reduces the output
    assert result.bytes_modelled == 0
    assert result.ratio is not None and result.ratio < 1


def test_the_attention_plan_runs_on_mpi_and_sends_the_modelled_bytes():
    result = bench().plan_program(program("attention_long_seq"), run=True)
    assert result.checked, result.note
    assert result.ratio is not None and result.ratio <= 1 + 1e-9
    assert result.bytes_modelled > 0
    assert result.bytes_measured == pytest.approx(result.bytes_modelled, rel=0.01)
