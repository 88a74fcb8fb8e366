"""`gspmdc cost --json` (modelled, before running) against `gspmdc run --profile-json`
(measured on MPI ranks), on the JAX programs and on XLA's partitioner test cases:

- every collective's bytes sent and received by every partition over the run, and its calls,
  equal to the byte;
- operations per partition equal;
- the peak of live arrays each rank measures within 10% of the liveness analysis's peak;
- for the JAX programs, parameter and output bytes per device equal XLA's memory analysis
  (`memory_per_device` in `reference.json`).

A conditional runs one branch where the model counts the costlier, so where the program has one
the model is an upper bound (equal when the branches cost the same). The conformance corpora are
XLA's partitioner cases and XLA's propagation cases (annotated global modules, partitioned here
for the devices their shardings name); the normal suite runs a sample of the quick ones (every
`SAMPLE_STEP`-th case with values up to 1 MiB and dots up to 10^6 multiply-adds), and
`pytest -m slow tests/test_cost_agreement.py` runs all the others small enough for MPI ranks (the
cases of `conformance.score_cost.agreement_cases` and `propagation_agreement_cases`). The cases
over those limits run on the local backend under the machine's limits, as the partition scorer
runs its large cases, only in `make cost-agreement` (`python -m conformance.score cost`: an hour
or more, with values of up to 38 GiB in files), which prints the figures of docs/cost.md; here a
small program checks that that path measures what MPI ranks measure.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.score_cost import (RUN_TIMEOUT_SECONDS, agreement_cases,
                                    propagation_agreement_cases)

SHARED = Path(__file__).resolve().parents[2] / "shared"
PROGRAMS = SHARED / "jax-programs"
PROGRAM_NAMES = ["attention_long_seq", "conv_spatial", "embedding_gather", "mlp_megatron",
                 "moe_layer", "pipeline_shift", "uneven_shapes"]
#: conformance cases in the sample of the quick run: every SAMPLE_STEP-th runnable case
SAMPLE_STEP = 30
MEMORY_TOLERANCE = 0.10


def _gspmdc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gspmdc", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


def _figures(program: Path, n: int, tmp_path: Path, *run_args: str) -> tuple[dict, dict]:
    cost = _gspmdc("cost", program, "-n", n, "--json")
    assert cost.returncode == 0, cost.stderr
    measured_path = tmp_path / "measured.json"
    run = _gspmdc("run", program, "-n", n, "-q", "--profile-json", measured_path, *run_args)
    assert run.returncode == 0, run.stderr
    return json.loads(cost.stdout), json.loads(measured_path.read_text())


def _check_agreement(model: dict, measured: dict, exact: bool) -> None:
    """`exact`: no conditional, so every figure must match; else the model bounds them."""
    assert model["kind"] == "modelled" and measured["kind"] == "measured"
    n = model["num_partitions"]
    assert measured["num_partitions"] == n
    modelled = {c["name"]: c for c in model["collectives"]}
    ran = {c["name"]: c for c in measured["collectives"]}
    assert set(ran) <= set(modelled)
    for name, c in modelled.items():
        if name not in ran:                      # in a branch that did not run
            assert not exact, f"{name} never ran"
            continue
        for key in ("bytes_sent_per_device", "bytes_received_per_device"):
            if exact:
                assert ran[name][key] == c[key], (name, key)
            else:
                assert all(m >= r for m, r in zip(c[key], ran[name][key])), (name, key)
        assert ran[name]["calls"] == c["calls"] or not exact, name
        assert ran[name]["group_size"] == c["group_size"], name
    for key in ("total_bytes_sent_per_device", "total_bytes_received_per_device",
                "flops_per_device"):
        assert len(measured[key]) == len(model[key]) == n
        if exact:
            assert measured[key] == model[key], key
        else:
            assert all(m >= r for m, r in zip(model[key], measured[key])), key
    for modelled_peak, measured_peak in zip(model["peak_memory_bytes_per_device"],
                                            measured["peak_memory_bytes_per_device"]):
        if exact:
            assert abs(modelled_peak - measured_peak) <= MEMORY_TOLERANCE * measured_peak
        else:
            assert modelled_peak >= measured_peak * (1 - MEMORY_TOLERANCE)
    for key in ("parameter_bytes_per_device", "output_bytes_per_device"):
        assert measured[key] == model[key], key
    for key in ("collectives", "total_bytes_sent_per_device", "flops_per_device",
                "peak_memory_bytes_per_device", "modelled_step_seconds"):
        assert key in model and key in measured


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_jax_program_cost_equals_measurement_and_xla_memory(name, tmp_path):
    folder = PROGRAMS / name
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    reference = json.loads((folder / "reference.json").read_text())
    n = reference["num_partitions"]
    model, measured = _figures(folder / "program.hlo", n, tmp_path, "--inputs",
                               folder / "inputs.npz")
    _check_agreement(model, measured, exact=True)
    memory = reference["memory_per_device"]
    assert model["parameter_bytes_per_device"] == [memory["parameter_bytes"]] * n
    assert model["output_bytes_per_device"] == [memory["output_bytes"]] * n


def _sample_and_rest(cases: list[dict], quick: list[dict]) -> tuple[list[dict], list[dict]]:
    """Every SAMPLE_STEP-th quick case, and all the other cases."""
    sample = quick[::SAMPLE_STEP]
    names = {c["name"] for c in sample}
    return sample, [c for c in cases if c["name"] not in names]


SAMPLE, REST = _sample_and_rest(agreement_cases(SHARED), agreement_cases(SHARED, quick=True))
PROPAGATION_SAMPLE, PROPAGATION_REST = _sample_and_rest(
    propagation_agreement_cases(SHARED), propagation_agreement_cases(SHARED, quick=True))


def _check_case(case: dict, tmp_path: Path) -> None:
    program = tmp_path / "case.hlo"
    program.write_text(case["hlo"])
    n = case["num_devices"]
    cost = _gspmdc("cost", program, "-n", n, "--json")
    if cost.returncode == 2:
        pytest.skip(f"gspmdc does not partition it: {cost.stderr.strip()[:200]}")
    assert cost.returncode == 0, cost.stderr
    measured_path = tmp_path / "measured.json"
    run = _gspmdc("run", program, "-n", n, "-q", "--profile-json", measured_path,
                  "--timeout", RUN_TIMEOUT_SECONDS)
    if run.returncode == 2:
        pytest.skip(f"gspmdc does not run it: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    exact = "conditional" not in case["opcodes"]
    _check_agreement(json.loads(cost.stdout), json.loads(measured_path.read_text()), exact)


def _params(corpus: str, sample: list[dict], rest: list[dict]) -> list:
    """The sample of a corpus in the quick run, the rest under `-m slow`."""
    return [pytest.param(c, id=f"{corpus}/{c['name']}") for c in sample] + \
        [pytest.param(c, id=f"{corpus}/{c['name']}", marks=pytest.mark.slow) for c in rest]


@pytest.mark.parametrize("case", _params("partitioner", SAMPLE, REST)
                         + _params("propagation", PROPAGATION_SAMPLE, PROPAGATION_REST))
def test_conformance_cost_equals_measurement(case, tmp_path):
    _check_case(case, tmp_path)


def test_the_agreement_score_counts_what_differs():
    from conformance.score_cost import compare
    collective = {"name": "ag", "bytes_sent_per_device": [12, 12],
                  "bytes_received_per_device": [12, 12], "calls": 1}
    model = {"collectives": [collective, dict(collective, name="ar")],
             "flops_per_device": [10, 10], "peak_memory_bytes_per_device": [100, 200]}
    measured = {"collectives": [collective, dict(collective, name="ar", calls=2)],
                "flops_per_device": [10, 11], "peak_memory_bytes_per_device": [100, 150]}
    agreement = compare(model, measured)
    assert (agreement.collectives, agreement.collectives_equal) == (2, 1)
    assert not agreement.flops_equal and not agreement.within_bounds   # 11 > 10 operations
    assert agreement.peak_deviations == [0.0, -0.25]


def test_corpus_cases_are_compared_or_listed_with_the_reason(tmp_path):
    from conformance.score import MachineLimits
    from conformance.score_cost import large_cases, unmeasured_cases
    small = """HloModule small
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  ROOT c = f32[8] copy(p)
}"""
    large = """HloModule large
ENTRY e {
  p = f32[65536,1024] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT c = f32[65536,1024] copy(p)
}"""
    io = """HloModule io
ENTRY e {
  t = token[] after-all()
  ROOT f = ((f32[8]), token[]) infeed(t)
}"""
    cases = [{"name": name, "line": line, "hlo": hlo, "opcodes": opcodes}
             for name, line, hlo, opcodes in [("Small", 1, small, ["copy", "parameter"]),
                                              ("Large", 2, large, ["copy", "parameter"]),
                                              ("Io", 3, io, ["after-all", "infeed"])]]
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "xla-propagation.json").write_text(json.dumps({"cases": cases}))
    compared = propagation_agreement_cases(tmp_path)
    assert [(c["name"], c["num_devices"]) for c in compared] == [("Small:1", 4)]
    # the 256 MiB value fits a machine of 1 GiB of memory and disk (half of it), not one of 256
    roomy, cramped = MachineLimits(1 << 29, 1 << 30), MachineLimits(1 << 27, 1 << 28)
    assert [c["name"] for c in large_cases(tmp_path, roomy)["xla-propagation.json"]] == \
        ["Large:2"]
    assert unmeasured_cases(tmp_path, roomy)["xla-propagation.json"] == \
        [("Io:3", "host I/O (infeed)")]
    assert large_cases(tmp_path, cramped)["xla-propagation.json"] == []
    assert unmeasured_cases(tmp_path, cramped)["xla-propagation.json"] == [
        ("Large:2", "too large for this machine: a value of 0.2 GiB (limit 0.1 GiB)"),
        ("Io:3", "host I/O (infeed)")]
    assert unmeasured_cases(tmp_path, roomy)["xla-partitioner.json"] == []


def test_the_local_backend_measures_what_mpi_ranks_measure(tmp_path):
    """The path of the cases over the MPI limits (`gspmdc run --backend local` in a child
    process under the machine's limits) measures the figures MPI ranks measure, on a program
    with a loop, a reshard and a reduction."""
    from conformance.score import MachineLimits
    from conformance.score_cost import _measure_on_mpi, compare, measure_on_local_backend
    program = tmp_path / "loop.hlo"
    program.write_text("""HloModule loop
body {
  s = (s32[], f32[16,8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[16,8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[16,8] copy(x), sharding={devices=[1,2]<=[2]}
  z = f32[16,8] multiply(y, y), sharding={devices=[2,1]<=[2]}
  ROOT t = (s32[], f32[16,8]) tuple(j, z)
}
cond {
  s = (s32[], f32[16,8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}
ENTRY e {
  p = f32[16,8] parameter(0), sharding={devices=[2,1]<=[2]}
  zero = s32[] constant(0)
  init = (s32[], f32[16,8]) tuple(zero, p)
  w = (s32[], f32[16,8]) while(init), condition=cond, body=body
  r = f32[16,8] get-tuple-element(w), index=1
  c = f32[] constant(0)
  ROOT s = f32[8] reduce(r, c), dimensions={0}, to_apply=add, sharding={replicated}
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}""")
    from conformance.score import run_isolated
    local = run_isolated(MachineLimits(8 << 30, 16 << 30, timeout_seconds=120),
                         measure_on_local_backend, str(program), 2, 120)
    mpi = _measure_on_mpi(program, 2, tmp_path, None)
    assert local["collectives"] and local["kind"] == mpi["kind"] == "measured"
    for key in ("total_bytes_sent_per_device", "total_bytes_received_per_device",
                "flops_per_device", "peak_memory_bytes_per_device",
                "parameter_bytes_per_device", "output_bytes_per_device"):
        assert local[key] == mpi[key], key
    assert [(c["name"], c["calls"], c["bytes_sent_per_device"]) for c in local["collectives"]] \
        == [(c["name"], c["calls"], c["bytes_sent_per_device"]) for c in mpi["collectives"]]
    agreement = compare(mpi, local)
    assert agreement.collectives_equal == agreement.collectives and agreement.flops_equal


#: a two-partition program with one all-gather, for the scorer's own tests
GATHERED_COPY = """HloModule m
ENTRY e {
  p = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT c = f32[8,4] copy(p), sharding={replicated}
}"""


def test_the_score_resumes_from_its_journal(tmp_path, capsys):
    """Outcomes in the journal are taken, not run again; new ones are appended."""
    from conformance.score_cost import score
    program = GATHERED_COPY
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "xla-partitioner.json").write_text(json.dumps({"cases": [
        {"name": name, "num_devices": 2, "hlo": program, "opcodes": ["copy", "parameter"]}
        for name in ("Earlier", "Later")]}))
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"corpus": "XLA partitioner cases", "name": "Earlier",
                                   "refused": "run: recorded before"}) + "\n")
    assert score(tmp_path, verbose=False, journal=journal) == 0
    out = capsys.readouterr().out
    assert "refused: XLA partitioner cases Earlier: run: recorded before" in out
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(e["name"], sorted(e)) for e in lines] == [
        ("Earlier", ["corpus", "name", "refused"]),
        ("Later", ["agreement", "corpus", "name", "seconds"])]
    assert lines[1]["agreement"]["collectives_equal"] == 1


def test_the_score_compares_both_conformance_corpora(tmp_path, capsys):
    from conformance.score_cost import score
    program = GATHERED_COPY
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "xla-propagation.json").write_text(json.dumps({"cases": [
        {"name": "Gathered", "line": 7, "hlo": program, "opcodes": ["copy", "parameter"]}]}))
    (tmp_path / "conformance" / "xla-partitioner.json").write_text(json.dumps({"cases": [
        {"name": "Gathered", "num_devices": 2, "hlo": program, "opcodes": ["copy", "parameter"]},
        {"name": "Io", "num_devices": 2, "hlo": "", "opcodes": ["infeed"]}]}))
    assert score(tmp_path, verbose=False) == 0
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:5]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| XLA")}
    # compared, refused, not measured, collectives equal (the all-gather of the result)
    assert rows == {"XLA partitioner cases": ["1", "0", "1", "1 / 1"],
                    "XLA partitioner cases over 64 MiB (local backend)": ["0", "0", "0", "0 / 0"],
                    "XLA propagation cases": ["1", "0", "0", "1 / 1"],
                    "XLA propagation cases over 64 MiB (local backend)": ["0", "0", "0", "0 / 0"]}


#: the case over the MPI limits the normal suite compares on the local backend (a quick one with
#: a collective: some 30 s)
LARGE_SAMPLE = "CollectivePermuteSimplifyZero"


def test_a_case_over_the_mpi_limits_agrees_on_the_local_backend(tmp_path):
    """A 111 MiB case of XLA's partitioner tests (a collective-permute on 2 partitions), on the
    path `make cost-agreement` takes for every case too large for MPI ranks."""
    from conformance.score import MachineLimits, largest_value_bytes
    from conformance.score_cost import MPI_VALUE_BYTES, compare_program, large_cases
    from gspmdc import api
    limits = MachineLimits.of_this_machine()
    case = next((c for c in large_cases(SHARED, limits)["xla-partitioner.json"]
                 if c["name"] == LARGE_SAMPLE), None)
    if case is None:
        pytest.skip(f"{LARGE_SAMPLE} is not in {SHARED} or does not fit this machine")
    program = tmp_path / "case.hlo"
    program.write_text(case["hlo"])
    assert largest_value_bytes(api.parse(case["hlo"])) > MPI_VALUE_BYTES
    agreement = compare_program(program, case["num_devices"], tmp_path, limits=limits)
    assert not isinstance(agreement, str), agreement
    assert agreement.collectives == agreement.collectives_equal == 1 and agreement.flops_equal
    assert len(agreement.peak_deviations) == 2
    assert all(abs(d) <= MEMORY_TOLERANCE for d in agreement.peak_deviations)
