"""Structural checks behind the performance goals (the timings themselves are in
bench/bench_propagation.py): the driver's work is linear in the module size, and iota shardings
are never expanded into per-device arrays, so the device count does not matter."""
import sys
from pathlib import Path

import pytest

from gspmdc.ir import tile_assignment
from gspmdc.ir.parser import parse_module
from gspmdc.passes.propagation import driver, propagate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_propagation  # noqa: E402


def visits(layers: int, monkeypatch) -> int:
    count = [0]
    original = driver.Driver._visit

    def counting(self, *args):
        count[0] += 1
        return original(self, *args)

    monkeypatch.setattr(driver.Driver, "_visit", counting)
    propagate(parse_module(bench_propagation.transformer(layers, 2, 4), "t"),
              record_origins=False)
    monkeypatch.setattr(driver.Driver, "_visit", original)
    return count[0]


def test_work_grows_linearly_with_the_module(monkeypatch):
    small, large = visits(2, monkeypatch), visits(8, monkeypatch)
    assert large <= 4.2 * small


@pytest.mark.parametrize("mesh", [(2, 4), (64, 64)])
def test_iota_shardings_are_never_materialised(monkeypatch, mesh):
    module = parse_module(bench_propagation.transformer(2, *mesh), "t")

    def forbidden(*args):
        raise AssertionError("a tile assignment was expanded into a device array")

    monkeypatch.setattr(tile_assignment, "_iota_array", forbidden)
    propagate(module, record_origins=False)
    assert module.entry.root.operands[0].sharding.is_tiled
