"""The local backend sets the thread count of the OpenBLAS numpy loaded for the length of a run
(runtime/blas.py): a process that imported numpy before it ran partitions (the API, the
scorers) must not leave each partition thread driving a pool of spinning BLAS threads. Checked
with the library's own getter, from inside the run. A count the user sets is the one every
reader sees, the one OpenBLAS read at load (runtime/cores.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.blas import blas_threads_set_to, loaded_blas, one_blas_thread
from gspmdc.runtime.cores import BLAS_THREAD_VARIABLES, chosen_blas_threads, with_blas_threads

PROGRAM = """HloModule m, num_partitions=2
ENTRY main {
  a = f32[64,64] parameter(0)
  ROOT d = f32[64,64] dot(a, a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.fixture
def library():
    library = loaded_blas()
    if library is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS whose thread count can be set")
    before = library.get()
    yield library
    library.set(before)


def test_a_run_uses_the_chosen_count_and_restores_the_one_before(library, monkeypatch):
    for name in BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    library.set(2)
    seen = []
    a = np.eye(64, dtype=np.float32) * 2
    out = run_local(parse_module(PROGRAM), [[a], [a]], 2,
                    on_value=[lambda inst, value: seen.append(library.get())] * 2)
    np.testing.assert_array_equal(out[0], a @ a)
    assert seen and set(seen) == {3}
    assert library.get() == 2


def test_without_a_variable_many_partitions_get_one_thread_each(library, monkeypatch):
    for name in BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert chosen_blas_threads(1 << 20) == 1
    library.set(2)
    with blas_threads_set_to(1):
        assert library.get() == 1
    assert library.get() == 2


def test_one_blas_thread_blocks_in_several_threads_share_the_count_before(library):
    """Two overlapping blocks (two partitions' convolutions): both get the count set before and
    run one BLAS thread; the count comes back when the last one ends, not when the first does."""
    before = library.get()
    library.set(3)
    try:
        with one_blas_thread() as first:
            assert (first, library.get()) == (3, 1)
            with one_blas_thread() as second:
                assert (second, library.get()) == (3, 1)
            first_only = library.get()
        assert (first_only, library.get()) == (1, 3)
        library.set(1)
        with one_blas_thread() as only:
            assert (only, library.get()) == (1, 1)
        assert library.get() == 1
    finally:
        library.set(before)


def test_a_users_count_fills_the_variables_they_left_unset(monkeypatch):
    """`OPENBLAS_NUM_THREADS=2 gspmdc run --backend local` on a busy machine: `gspmdc run` fills
    the other variables before numpy loads, and the run then sets the count they give."""
    user = {"OPENBLAS_NUM_THREADS": "2", "PATH": "/bin"}
    environment = with_blas_threads(user, 1 << 20)   # a share of the free cores would be 1
    assert environment == {**{name: "2" for name in BLAS_THREAD_VARIABLES}, **user}
    for name in BLAS_THREAD_VARIABLES:
        monkeypatch.setenv(name, environment[name])
    assert chosen_blas_threads(1 << 20) == 2


def test_the_count_chosen_is_the_one_openblas_read_at_load(library):
    """With two variables that disagree, the count the runtime sets is the one the library took
    from the environment when numpy loaded it (its own variable before `OMP_NUM_THREADS`)."""
    environment = {name: value for name, value in os.environ.items()
                   if name not in BLAS_THREAD_VARIABLES}
    environment.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="2")
    probe = ("import numpy\n"
             "from gspmdc.runtime.blas import loaded_blas\n"
             "from gspmdc.runtime.cores import chosen_blas_threads\n"
             "print(loaded_blas().get(), chosen_blas_threads(1))\n")
    proc = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.split() == ["1", "1"]


@pytest.mark.parametrize("kernels", ["Sandybridge", "Haswell"])
def test_the_kernels_named_are_the_ones_openblas_runs(library, kernels):
    """`blas_kernels` names the kernels OpenBLAS chose at load: the ones `OPENBLAS_CORETYPE`
    forces (these two run on any x86-64 CPU with AVX2)."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx2 " not in flags.replace("\n", " "):
        pytest.skip("Haswell's kernels need an x86-64 CPU with AVX2")
    probe = ("import numpy\n"
             "from gspmdc.runtime.blas import blas_kernels\n"
             "print(blas_kernels())\n")
    proc = subprocess.run([sys.executable, "-c", probe],
                          env={**os.environ, "OPENBLAS_CORETYPE": kernels},
                          capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == kernels
