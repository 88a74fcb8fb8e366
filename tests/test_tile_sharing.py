"""Tiles shared among a kernel's threads (`runtime/kernels/tile_sharing.py`): every tile runs
once, on the caller and as many threads in all as the BLAS ran, each with one BLAS thread; one
tile or a count of one runs on the caller alone; a failure is raised once no helper runs. An
OpenBLAS is needed to set the count."""
from __future__ import annotations

import threading
import time

import pytest

from gspmdc.runtime.blas import blas_threads_set_to, loaded_blas
from gspmdc.runtime.kernels.tile_sharing import share_tiles


@pytest.fixture
def library():
    found = loaded_blas()
    if found is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS whose thread count can be set")
    return found


def _recording(done: list, library):
    def work(queue):
        while (tile := queue.take()) is not None:
            done.append((tile, threading.current_thread().name, library.get()))
            time.sleep(0.001)
    return work


@pytest.mark.parametrize("threads", [3, 1])
def test_every_tile_runs_once_on_the_threads_the_blas_ran_each_with_one_blas_thread(
        library, threads):
    done: list = []
    with blas_threads_set_to(threads):
        share_tiles(list(range(30)), _recording(done, library))
        assert library.get() == threads                       # restored
    assert sorted(tile for tile, _, _ in done) == list(range(30))
    assert {count for _, _, count in done} == {1}
    names = {name for _, name, _ in done}
    caller = threading.current_thread().name
    assert len(names) <= threads and (threads > 1 or names == {caller})
    assert all(name == caller or name.startswith("gspmdc-tiles") for name in names)


def test_one_tile_runs_on_the_caller_with_the_blas_threads(library):
    done: list = []
    with blas_threads_set_to(3):
        share_tiles(["only"], _recording(done, library))
    assert done == [("only", threading.current_thread().name, 3)]


def test_a_helpers_failure_is_raised(library):
    def work(queue):
        while (tile := queue.take()) is not None:
            time.sleep(0.001)
            if tile == 7 and threading.current_thread().name.startswith("gspmdc-tiles"):
                raise ValueError("tile 7")
    with blas_threads_set_to(2), pytest.raises(ValueError, match="tile 7"):
        # tile 7 goes to whichever thread takes it: run until a helper took it
        for _ in range(50):
            share_tiles(list(range(20)), work)


def test_the_callers_failure_is_raised_after_the_helpers_stopped(library):
    running = []

    def work(queue):
        caller = threading.current_thread() is threading.main_thread()
        while (tile := queue.take()) is not None:
            running.append(1)
            time.sleep(0.002)
            running.pop()
            if caller and tile >= 2:
                raise ValueError("caller")
    with blas_threads_set_to(2), pytest.raises(ValueError, match="caller"):
        share_tiles(list(range(40)), work)
    assert running == []
