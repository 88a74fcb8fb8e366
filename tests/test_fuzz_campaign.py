"""The campaign driver behind `make fuzz` (tests/fuzz/campaign.py, `python -m fuzz`): counts
per outcome class, a time budget that stops between batches, the exit status."""
from __future__ import annotations

from fuzz import campaign
from fuzz.__main__ import main


def test_a_small_campaign_reports_counts_per_outcome_class(tmp_path, capsys):
    code = main(["--programs", "2", "--texts", "30", "--jobs", "1", "--mpi-every", "0",
                 "--no-deep", "--shared", str(tmp_path / "absent"), "--out", str(tmp_path)])
    report = capsys.readouterr().out
    assert code == 0, report
    programs, texts = report.splitlines()[:2]
    assert programs.startswith("programs (2 local backend, 0 MPI): 2 inputs in ")
    assert programs.endswith(": ok 2, rejected 0, mismatch 0, internal 0, hang 0")
    counts = dict(cell.rsplit(" ", 1) for cell in texts.split(": ")[-1].split(", "))
    assert list(counts) == ["ok", "error", "unlocated", "internal", "hang"]
    assert int(counts["ok"]) + int(counts["error"]) == 30, texts
    assert "no failures" in report


def test_the_time_budget_stops_between_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "BATCH", 4)
    tally = campaign.texts(10, 0, tmp_path, jobs=1, timeout=10.0, shared=None, deep=False,
                           minutes=1e-9)
    assert sum(tally.counts.values()) == 4 and tally.planned == 10
    assert "4 inputs (of 10: the time budget ran out)" in tally.report(("ok", "error"))
