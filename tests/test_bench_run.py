"""The run-side benchmark's kernel environments (`bench/bench_run.py`, section 4): where the
environment sets OpenBLAS's kernel variables, the figures run `gspmdc run` with both unset together,
then as set; the kernels each names are the ones a child with that environment runs; the BLAS
threads the gspmdc runs used are read from their `--repeat` lines."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_run  # noqa: E402


@pytest.mark.parametrize("forced", [{"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
                                    {"OPENBLAS_L2_SIZE": "256"}, {}])
def test_kernel_figures_run_with_both_variables_unset_then_as_set(monkeypatch, forced):
    for name in bench_run.OPENBLAS_KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in forced.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GSPMDC_TEST_KEPT", "yes")
    environments = bench_run.kernel_environments()
    if not forced:
        assert environments == [("this environment", None)]
        return
    (unset_label, unset), (as_set_label, as_set) = environments
    assert as_set is None
    assert unset == {k: v for k, v in os.environ.items() if k not in forced}
    assert unset["GSPMDC_TEST_KEPT"] == "yes"
    assert not set(bench_run.OPENBLAS_KERNEL_VARIABLES) & set(unset)
    for name, value in forced.items():
        assert f"{name}={value}" in unset_label and f"{name}={value}" in as_set_label


@pytest.mark.parametrize("kernels", ["Sandybridge", "Haswell"])
def test_the_kernels_named_are_the_childs(kernels):
    """The kernels the section names come from a child with the environment given (these two
    run on any x86-64 CPU with AVX2), not from this process (whose kernels stay)."""
    from gspmdc.runtime.blas import blas_kernels, loaded_blas
    if loaded_blas() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS")
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx2 " not in flags.replace("\n", " "):
        pytest.skip("Haswell's kernels need an x86-64 CPU with AVX2")
    ours = blas_kernels()
    named = bench_run._blas({**os.environ, "OPENBLAS_CORETYPE": kernels})
    assert named == f"numpy's OpenBLAS runs its {kernels} kernels"
    assert blas_kernels() == ours


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_blas_of_a_gspmdc_run_is_read_from_its_repeat_line(tmp_path, threads):
    import jax_programs
    from gspmdc.runtime.blas import blas_kernels
    path = tmp_path / "program.hlo"
    path.write_text("HloModule m\nENTRY e {\n  x = f32[8,8] parameter(0)\n"
                    "  ROOT d = f32[8,8] dot(x, x), lhs_contracting_dims={1}, "
                    "rhs_contracting_dims={0}\n}\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    seconds, blas = jax_programs.gspmdc_execution(path, 1, None, 2, "local",
                                                  {**env, "OPENBLAS_NUM_THREADS": threads})
    assert 0 < seconds < 60
    if blas_kernels() is None:
        assert blas is None
        return
    kernels = bench_run._blas(env).removeprefix("numpy's OpenBLAS runs its ").removesuffix(
        " kernels")
    plural = "s" if threads != "1" else ""
    assert blas == f"OpenBLAS's {kernels} kernels, {threads} thread{plural} per partition"
