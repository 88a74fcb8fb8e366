"""A conformance-xla run split into shards (`python -m conformance.xla --shard i/k --results
FILE`, then `merge`): the shards hold every module of the run exactly once, a case's record
survives the round trip through its file, and (with the `[xla]` extra) the union of the shards'
records gives the same figures and divergence classes as the unsplit run of the same seed."""
from __future__ import annotations

import io

import pytest

from conformance.oracle import xla_available
from conformance.sources import in_shard
from conformance.summary import CaseSummary, read_summaries

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_shards_hold_every_module_exactly_once(k):
    owners = [[i for i in range(k) if in_shard(index, (i, k))] for index in range(50)]
    assert all(len(o) == 1 for o in owners)
    assert sorted({o[0] for o in owners}) == list(range(k))


def test_fuzz_shards_are_the_run_split():
    from conformance.sources import fuzz_cases
    whole = [c.name for c in fuzz_cases(5, 3)]
    parts = [c.name for i in range(2) for c in fuzz_cases(5, 3, (i, 2))]
    assert sorted(parts) == sorted(whole) and len(whole) == 10
    assert [c.name for c in fuzz_cases(5, 3, (1, 2))][:2] == \
        ["fuzz/3000001 [off]", "fuzz/3000001 [on]"]


SUMMARY = CaseSummary(
    "fuzz/7 [on]", 4, True, True, 0, "compared", instructions=5, agreeing=4, absent=1,
    propagated=True, differing=[("add", "main/a (add): gspmdc {replicated}  XLA (none)")],
    our_bytes=48.0, xla_bytes=16.0, spmd_made=True, values="compared",
    value_mismatch={"XLA": "out0 differs"}, classes=[("sharding", "add"), ("bytes", "dot")],
    seconds={"XLA compile": 0.25}, text="HloModule m", before="HloModule b")


def test_a_record_reads_back_as_written(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(SUMMARY.to_json() + "\n")
    assert read_summaries([path]) == [SUMMARY]
    assert SUMMARY.case().text == "HloModule m" and SUMMARY.setting == "on"


def test_a_case_recorded_twice_counts_once_and_a_torn_line_not_at_all(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    other = CaseSummary("fuzz/8 [off]", 2, False, False, 0, "skipped")
    a.write_text(SUMMARY.to_json() + "\n" + other.to_json() + "\n")
    b.write_text(SUMMARY.to_json() + "\n" + other.to_json()[:25])
    assert sorted(r.name for r in read_summaries([a, b])) == ["fuzz/7 [on]", "fuzz/8 [off]"]


def _figures_text(results) -> str:
    """The report's text without the line of timings (which differ run to run)."""
    from conformance.xla import report
    out = io.StringIO()
    report(results, None, 0, 0, out)
    return "\n".join(line for line in out.getvalue().splitlines()
                     if "seconds per case" not in line)


@needs_xla
def test_the_union_of_shards_reports_as_the_unsplit_run(tmp_path):
    from conformance.oracle import XlaOracle
    from conformance.sources import fuzz_cases
    from conformance.xla import main, run_all
    modules, seed = 6, 11
    with XlaOracle() as xla:
        whole = run_all(fuzz_cases(modules, seed), xla, seed)
    files = [tmp_path / f"r{i}.jsonl" for i in range(3)]
    for i, path in enumerate(files):
        assert main(["--cases", str(modules), "--seed", str(seed), "--shard", f"{i}/3",
                     "--results", str(path), "--show", "0", "--quiet"]) == 0
    union = read_summaries(files)
    assert sorted(r.name for r in union) == sorted(r.name for r in whole)
    assert _figures_text(union) == _figures_text(whole)
    assert "cases: 6" in _figures_text(union)
    # a shard cut off mid-line and started again with its file runs only the cases it lost
    lines = files[0].read_text().splitlines(keepends=True)
    files[0].write_text("".join(lines[:-1]) + lines[-1][:20])
    assert main(["--cases", str(modules), "--seed", str(seed), "--shard", "0/3",
                 "--results", str(files[0]), "--show", "0", "--quiet"]) == 0
    assert len(files[0].read_text().splitlines()) == len(lines) + 1      # + the torn line
    assert _figures_text(read_summaries(files)) == _figures_text(whole)
