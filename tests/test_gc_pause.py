"""The collector pause of parsing, compiling and printing (`gspmdc.ir.gc_pause`): the collector is
off inside, turning it back on scans nothing, and the reference cycles made inside stay bounded."""
from __future__ import annotations

import gc

import pytest

from gspmdc.ir import gc_pause
from gspmdc.ir.gc_pause import paused_collection


@pytest.fixture
def collections():
    """The generations of the collections that run while the test does."""
    seen: list[int] = []

    def record(phase, info):
        if phase == "start":
            seen.append(info["generation"])
    was_enabled = gc.isenabled()
    gc.enable()
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        if not was_enabled:
            gc.disable()


def _cycles(count: int) -> None:
    """Make `count` two-list reference cycles and drop them (only a collection frees them)."""
    for _ in range(count):
        a, b = [], []
        a.append(b)
        b.append(a)


def test_the_collector_is_off_inside_and_back_on_after(collections):
    with paused_collection():
        assert not gc.isenabled()
        with paused_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()          # an inner pause leaves it to the outer one
        kept = [[i] for i in range(20_000)]
    assert gc.isenabled()
    assert collections == []
    assert len(kept) == 20_000


def test_resuming_does_not_scan_what_the_pause_made(collections):
    gc.collect()
    collections.clear()
    with paused_collection():
        kept = [[i] for i in range(50_000)]
    # with the 50,000 lists still counted as young, the next allocations would scan them all
    assert gc.get_count()[0] < 700
    more = [[i] for i in range(100)]
    assert collections == []
    assert len(kept) + len(more) == 50_100


def test_cycles_made_in_pauses_stay_bounded(monkeypatch, collections):
    floor = 60_000
    monkeypatch.setattr(gc_pause, "FULL_COLLECTION_FLOOR", floor)
    gc.collect()
    base = len(gc.get_objects())
    peak = base
    for _ in range(40):
        with paused_collection():
            _cycles(10_000)                # 20,000 tracked objects of garbage each time
        peak = max(peak, len(gc.get_objects()))
    # without the bound the 800,000 lists would all still be there
    assert 2 in collections
    assert peak < base + max(gc_pause.FULL_COLLECTION_GROWTH * base, floor) + 30_000


def test_freezing_at_the_end_keeps_every_object_out_of_collections():
    before = gc.get_freeze_count()
    try:
        with paused_collection(freeze=True):
            kept = [[i] for i in range(1_000)]
        assert gc.get_freeze_count() >= before + 1_000
        assert gc.isenabled()
    finally:
        gc.unfreeze()
    assert len(kept) == 1_000
