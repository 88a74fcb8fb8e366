"""Shared fixtures of the test suite.

- `hlo_module(body, computations="", header="")`: the text of a module `m` whose entry `e`
  holds `body` (`hlo_text.py`);
- `reducer(name, opcode=None, element_type="f32")`: the text of a scalar reducer computation;
- `check_equivalent(text, n, ...)`: partition `text` for `n` partitions (verifying after every
  pass), run it on `n` local threads and assert it reproduces the unpartitioned program run on
  one device (`spmd_partition_helpers.py`); returns the SPMD module;
- `pass_context(n)`: a `PassContext` for `n` partitions that runs the verifier after every pass,
  for tests that run pipelines of their own.

Helper modules beside this file (`hlo_text`, `spmd_partition_helpers`, `filecheck`, ...) are
importable by name from the tests: the tests folder is on the path.
"""
from __future__ import annotations

from typing import Callable

import pytest

from gspmdc.passes.pass_manager import PassContext

import hlo_text
import spmd_partition_helpers


@pytest.fixture
def hlo_module() -> Callable[..., str]:
    return hlo_text.hlo_module


@pytest.fixture
def reducer() -> Callable[..., str]:
    return hlo_text.reducer


@pytest.fixture
def check_equivalent() -> Callable:
    return spmd_partition_helpers.check_equivalent


@pytest.fixture
def pass_context() -> Callable[[int], PassContext]:
    def make(num_partitions: int = 1) -> PassContext:
        return PassContext(num_partitions, verify_each=True)
    return make
