"""The oracle's bytes measure (`tests/conformance`): a program's bytes are every device's total
over the run, then the largest (the busiest device) and the mean; the verdict against XLA is by
the busiest device, then the mean, and separately by the mean alone; a module whose XLA program
computes wrong values is kept out of it. Hand-computed answers, no XLA needed; the two modules
of seed 11100 that motivated the classification run against XLA itself with the `[xla]` extra."""
from __future__ import annotations

import io

import pytest

from gspmdc import api
from gspmdc.passes.spmd.traffic import collective_traffic, sent_per_device

from conformance.differential import ProgramBytes, program_bytes, xla_values_wrong
from conformance.oracle import xla_available
from conformance.report import Figures, bytes_verdict, divergence_classes
from conformance.summary import CaseSummary, read_summaries

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

# 4 devices: a permute sends 8 B from devices 0 and 1, another 8 B from device 2, and an
# all-gather of 4 B pieces 12 B from each device: totals 20, 20, 20, 12
SPMD = """HloModule spmd, num_partitions=4

ENTRY main {
  x = f32[2] parameter(0)
  a = f32[2] collective-permute(x), channel_id=1, source_target_pairs={{0,1},{1,0}}
  b = f32[2] collective-permute(a), channel_id=2, source_target_pairs={{2,3}}
  s = f32[1] slice(b), slice={[0:1]}
  ROOT g = f32[4] all-gather(s), channel_id=3, dimensions={0}, replica_groups={{0,1,2,3}}, use_global_device_ids=true
}
"""


def test_a_device_total_sums_its_bytes_over_the_collectives():
    sent = sent_per_device(api.parse(SPMD, verify=False), 4)
    assert sent.tolist() == [20, 20, 20, 12]


def test_the_busiest_device_is_the_largest_total_not_the_sum_of_each_collectives_busiest():
    measured = program_bytes(SPMD, 4)
    assert measured == ProgramBytes(20, 18.0)
    each = sum(t.traffic.max_sent for t in collective_traffic(api.parse(SPMD, verify=False), 4))
    assert each == 28 and measured.busiest < each


def test_a_loop_multiplies_every_devices_bytes_by_its_trips():
    text = """HloModule spmd, num_partitions=4

body {
  p = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  v = f32[2] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  w = f32[2] collective-permute(v), channel_id=1, source_target_pairs={{0,1},{1,0}}
  ROOT t = (s32[], f32[2]) tuple(j, w)
}

cond {
  p = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}

ENTRY main {
  x = f32[2] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[2]) tuple(zero, x)
  loop = (s32[], f32[2]) while(init), condition=cond, body=body
  ROOT r = f32[2] get-tuple-element(loop), index=1
}
"""
    assert program_bytes(text, 4) == ProgramBytes(24, 12.0)


def test_programs_compare_by_the_busiest_device_then_the_mean():
    assert ProgramBytes(20, 5.0) > ProgramBytes(16, 16.0)
    assert ProgramBytes(16, 17.0) > ProgramBytes(16, 16.0)
    assert ProgramBytes(16, 16.0) == ProgramBytes(16, 16.0)


def _record(name: str, ours: tuple, theirs: tuple, mismatch=None, branches=()) -> CaseSummary:
    """A compared case: `ours` / `theirs` are (busiest or None, mean)."""
    return CaseSummary(name, 4, name.endswith("[on]"), name.endswith("[on]"), 0, "compared",
                       our_bytes=ours[1], xla_bytes=theirs[1], our_busiest=ours[0],
                       xla_busiest=theirs[0], spmd_made=True, values="compared",
                       value_mismatch=dict(mismatch or {}), branches=list(branches))


@pytest.mark.parametrize("ours,theirs,by_busiest,by_mean", [
    ((4, 4.0), (5, 3.5), "fewer", "more"),        # a permute on XLA's side: dearer busiest
    ((4, 3.0), (4, 2.0), "more", "more"),         # a tie on the busiest device: the mean decides
    ((8, 2.0), (6, 3.0), "more", "fewer"),
    ((6, 3.0), (6, 3.0), "equal", "equal"),
    ((None, 3.0), (None, 2.0), "unrecorded", "more"),   # a record written before the busiest
])
def test_the_verdict_by_each_measure(ours, theirs, by_busiest, by_mean):
    r = _record("fuzz/1 [off]", ours, theirs)
    assert (bytes_verdict(r), bytes_verdict(r, "mean")) == (by_busiest, by_mean)


def test_xla_values_wrong_only_where_gspmdc_agrees_with_the_reference():
    assert xla_values_wrong({"XLA": "out0 differs"}, [])
    assert xla_values_wrong({}, [{}, {"XLA": "out0 differs"}])          # a forced branch
    assert not xla_values_wrong({"XLA": "out0", "gspmdc": "out0"}, [])  # the reference in doubt
    assert not xla_values_wrong({"gspmdc": "out0 differs"}, [])
    assert not xla_values_wrong({}, [])


def test_a_module_whose_xla_values_are_wrong_is_kept_out_of_both_verdicts():
    wrong = _record("fuzz/11100002675 [on]", (196, 196.0), (64, 64.0),
                    mismatch={"XLA": "out0: MISMATCH"})
    branch = _record("fuzz/5 [off]", (9, 9.0), (1, 1.0),
                     branches=[["branch 1 of c", "compared", {"XLA": "out0: MISMATCH"}]])
    assert bytes_verdict(wrong) == bytes_verdict(wrong, "mean") == "xla-values-wrong"
    assert bytes_verdict(branch) == "xla-values-wrong"
    both = _record("fuzz/6 [off]", (9, 9.0), (1, 1.0),
                   mismatch={"XLA": "out0", "gspmdc": "out0"})
    assert bytes_verdict(both) == "more"


def test_the_figures_count_and_list_each_measure_apart():
    records = [
        _record("fuzz/3 [on]", (4, 3.0), (4, 2.0)),               # above by both
        _record("fuzz/1 [on]", (4, 4.0), (5, 3.5)),               # above by the mean alone
        _record("fuzz/2 [on]", (8, 2.0), (6, 3.0)),               # above by the busiest alone
        _record("fuzz/4 [on]", (2, 2.0), (2, 2.0)),
        _record("fuzz/9 [on]", (99, 99.0), (1, 1.0), mismatch={"XLA": "out0"}),
    ]
    figures = Figures()
    for r in records:
        figures.add(r)
    assert (figures.bytes_compared, figures.bytes_equal, figures.bytes_fewer,
            figures.bytes_more) == (4, 1, 1, 2)
    assert sorted(figures.above["busiest"]) == ["fuzz/2 [on]", "fuzz/3 [on]"]
    assert sorted(figures.above["mean"]) == ["fuzz/1 [on]", "fuzz/3 [on]"]
    assert figures.xla_values_wrong == ["fuzz/9 [on]"]
    text = "\n".join(figures.lines())
    assert "more on 2 (2 on, 3 on)" in text                    # the project's measure, run order
    assert "gspmdc <= XLA on 2 (equal 1, fewer 1), more on 2 (1 on, 3 on)" in text
    assert "XLA's values wrong" in text and "1 (9 on)" in text


def test_a_record_keeps_both_measures_and_an_older_record_still_reads(tmp_path):
    r = _record("fuzz/7 [on]", (5, 3.5), (4, 4.0))
    old = r.to_json().replace('"our_busiest": 5, ', "").replace('"xla_busiest": 4, ', "")
    assert "busiest" not in old
    path = tmp_path / "r.jsonl"
    path.write_text(r.to_json() + "\n")
    assert read_summaries([path]) == [r]
    path.write_text(old + "\n")
    back, = read_summaries([path])
    assert back.our_busiest is None and bytes_verdict(back) == "unrecorded"
    assert bytes_verdict(back, "mean") == "fewer"


def _run_one(module: int, setting: str):
    from conformance.differential import run_case
    from conformance.oracle import XlaOracle
    from conformance.sources import fuzz_cases
    seed, index = divmod(module, 1000000)
    case, = [c for c in fuzz_cases(index + 1, seed, (index, index + 1))
             if c.propagate_to_output == (setting == "on")]
    with XlaOracle() as xla:
        return run_case(case, xla, seed)


@needs_xla
def test_xlas_wrong_topk_indices_keep_the_module_out_of_the_bytes_verdict():
    # fuzz/11100002675: a TopK (k=1) over a dim tiled 4 ways; XLA's partitioned program returns
    # indices that differ from the reference interpreter's, gspmdc's agree
    result = _run_one(11100002675, "off")
    assert "XLA" in result.value_mismatch and "gspmdc" not in result.value_mismatch
    assert bytes_verdict(result) == "xla-values-wrong"
    assert not any(kind == "bytes" for kind, _ in divergence_classes(result))


@needs_xla
def test_a_one_element_reshape_stays_on_its_tiles_as_xlas_does():
    # fuzz/11100000266 on: a bf16[1] in 2 tiles reshaped to bf16[1,1]: gspmdc gathered it to
    # reshape replicated (3 B per device on average, XLA 2); now local, as XLA's; the reshard
    # after it sends its one real element alone (an exchange of pieces): 2 B, XLA 4
    result = _run_one(11100000266, "on")
    assert (result.our_busiest, result.xla_busiest) == (2, 4)
    assert bytes_verdict(result) == "fewer" and not result.value_mismatch


@needs_xla
def test_a_size_one_dim_cut_beside_a_kept_dim_reshapes_locally_as_xlas_does():
    # fuzz/11200001242 on: s32[4,6,1] cut [1,2,2] (replicated twice) reshaped to s32[1,4,6,1]
    # cut [1,1,2,2]: gspmdc gathered dims 2 and 1 to reshape replicated (124 B from the busiest
    # device, XLA 28); XLA's pair now reshapes locally, as XLA does
    result = _run_one(11200001242, "on")
    assert result.our_busiest <= result.xla_busiest == 28
    assert bytes_verdict(result) in ("equal", "fewer") and not result.value_mismatch
