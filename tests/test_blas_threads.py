"""The local backend sets the thread count of the OpenBLAS numpy loaded for the length of a run
(runtime/blas.py): a process that imported numpy before it ran partitions (the API, the
scorers) must not leave each partition thread driving a pool of spinning BLAS threads. Checked
with the library's own getter, from inside the run."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.blas import blas_threads_set_to, loaded_blas
from gspmdc.runtime.cores import BLAS_THREAD_VARIABLES, chosen_blas_threads

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
