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


def _corpus_texts():
    texts = [pytest.param(bench_propagation.transformer(3, 2, 4), id="transformer")]
    corpus = Path(__file__).resolve().parents[2] / "shared" / "conformance" / \
        "xla-propagation.json"
    if corpus.is_file():
        import json
        texts += [pytest.param(case["hlo"], id=f"{case['name']}:{case['line']}")
                  for case in json.loads(corpus.read_text())["cases"]]
    return texts


@pytest.mark.parametrize("text", _corpus_texts())
def test_levels_resume_from_the_previous_fixpoint(monkeypatch, text):
    """Levels 2 and 3 start from what the previous level left dirty plus what the level enables
    (the broadcasts); restarting every level with every instruction dirty, as XLA's repeated
    sweeps do, gives the same shardings and the same origins."""
    from gspmdc.errors import GspmdcError
    from gspmdc.ir.printer import print_module

    def outcome():
        module = parse_module(text, "t")
        try:
            propagate(module, propagate_to_output=True)
        except GspmdcError as error:
            return f"{type(error).__name__}: {error}"
        return print_module(module)

    resumed = outcome()
    fixpoint = driver.Driver._fixpoint

    def restarting(self, level, groups, restart=True):
        return fixpoint(self, level, groups, restart=True)

    monkeypatch.setattr(driver.Driver, "_fixpoint", restarting)
    assert outcome() == resumed
