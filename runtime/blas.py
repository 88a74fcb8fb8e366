"""The thread count of the BLAS library numpy has loaded, set while the process runs.

The BLAS thread variables (`cores.BLAS_THREAD_VARIABLES`) are read once, when numpy loads its
BLAS; a process that had numpy loaded before it knew how many partitions it would run (the local
backend called from Python: the API, the conformance scorers, the tests) must set the count
through the library itself. OpenBLAS, numpy's own (wheels bundle it with a `scipy_` prefix and
64-bit-integer suffixes) or the system's, is found among the process's mapped libraries and
asked through its `openblas_set_num_threads` / `openblas_get_num_threads` entry points; with
any other BLAS, or where the process's mappings cannot be read, nothing is changed. Its
`openblas_get_corename` names the kernels it runs (the CPU it detected at load, or the one
`OPENBLAS_CORETYPE` forced): what a matrix product costs depends on them (the benchmarks print
it).
"""
from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator, NamedTuple

#: the names OpenBLAS builds give their entry points, as (set threads, get threads, core name)
_ENTRY_POINTS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_",
                  "scipy_openblas_get_corename64_"),
                 ("openblas_set_num_threads64_", "openblas_get_num_threads64_",
                  "openblas_get_corename64_"),
                 ("openblas_set_num_threads", "openblas_get_num_threads",
                  "openblas_get_corename"))


class BlasThreads(NamedTuple):
    """A loaded BLAS library's thread-count setter and getter, and its kernels' name getter."""

    set: ctypes._CFuncPtr
    get: ctypes._CFuncPtr
    core: ctypes._CFuncPtr


@lru_cache(maxsize=1)
def loaded_blas() -> BlasThreads | None:
    """The thread-count entry points of the OpenBLAS this process has loaded, or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if "openblas" in line.rsplit("/", 1)[-1]})
    for path in paths:
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for setter, getter, core in _ENTRY_POINTS:
            if all(hasattr(library, name) for name in (setter, getter, core)):
                set_threads, get_threads = getattr(library, setter), getattr(library, getter)
                core_name = getattr(library, core)
                set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
                get_threads.argtypes, get_threads.restype = [], ctypes.c_int
                core_name.argtypes, core_name.restype = [], ctypes.c_char_p
                return BlasThreads(set_threads, get_threads, core_name)
    return None


def blas_kernels() -> str | None:
    """The name of the kernels the loaded OpenBLAS runs (e.g. `Haswell`, `SkylakeX`), or None."""
    library = loaded_blas()
    return None if library is None else library.core().decode(errors="replace")


def blas_in_use() -> tuple[str, int] | None:
    """(the name of the kernels, the threads) the loaded OpenBLAS runs now, or None."""
    library = loaded_blas()
    return None if library is None else (library.core().decode(errors="replace"),
                                         library.get())


@contextmanager
def blas_threads_set_to(threads: int) -> Iterator[None]:
    """Within the block, the loaded BLAS runs `threads` threads; its count before is restored
    after (nothing changes when no OpenBLAS is loaded)."""
    library = loaded_blas()
    if library is None:
        yield
        return
    before = library.get()
    library.set(threads)
    try:
        yield
    finally:
        library.set(before)


#: guards `_one_thread_blocks`: [the `one_blas_thread` blocks running now, the count the first
#: of them found]
_one_thread_lock = threading.Lock()
_one_thread_blocks = [0, 1]


@contextmanager
def one_blas_thread() -> Iterator[int]:
    """Within the block the loaded BLAS runs one thread, and the block gets the count it ran
    before: the threads its caller may run itself, each with its own products. Blocks running in
    several threads at once (the local backend's partitions) share the setting: the first saves
    the count, the last restores it. Without an OpenBLAS the count is 1 and nothing changes."""
    library = loaded_blas()
    if library is None:
        yield 1
        return
    with _one_thread_lock:
        if _one_thread_blocks[0] == 0:
            _one_thread_blocks[1] = library.get()
            if _one_thread_blocks[1] > 1:
                library.set(1)
        _one_thread_blocks[0] += 1
        threads = _one_thread_blocks[1]
    try:
        yield threads
    finally:
        with _one_thread_lock:
            _one_thread_blocks[0] -= 1
            if _one_thread_blocks[0] == 0 and _one_thread_blocks[1] > 1:
                library.set(_one_thread_blocks[1])
