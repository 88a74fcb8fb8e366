"""The partitioner on the team's corpora (`../shared`, skipped when absent):

- every JAX program compiles (with sharding propagation), reproduces JAX's `outputs.npz` and
  moves no more collective bytes per device and run than XLA's own partitioning
  (`reference.json`);
- every XLA partitioner test small enough for a local run is equivalent to its unpartitioned
  program or cleanly rejected; those using only ops with rules need no default action.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from conformance.score import largest_value_bytes, multiply_adds
from conformance.score_partition import run_case
from gspmdc.errors import GspmdcError
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.traffic import collective_traffic
from gspmdc.runtime import io

from spmd_partition_helpers import run_global

SHARED = Path(__file__).resolve().parents[2] / "shared"
PROGRAMS = SHARED / "jax-programs"
#: the exported programs (each must also move no more collective bytes per run than XLA)
PROGRAM_NAMES = ["attention_long_seq", "conv_spatial", "embedding_gather", "mlp_megatron", "moe_layer",
           "pipeline_shift", "uneven_shapes"]
#: opcodes with partitioning rules of their own
RULED = frozenset("""parameter constant iota add subtract multiply divide maximum minimum negate
    exponential log tanh abs sqrt rsqrt copy convert select compare clamp tuple
    get-tuple-element broadcast reshape transpose reduce dot and or not xor power sign floor
    ceil""".split())


def _has_rules(module) -> bool:
    """Every op of the module has a rule (custom-calls: only `Sharding` annotations)."""
    return all(i.opcode in RULED or (i.opcode == "custom-call" and
                                     i.attr("custom_call_target") == "Sharding")
               for i in module.entry.instructions)


def _program(name: str):
    folder = PROGRAMS / name
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    return folder


def _compile(folder: Path):
    reference = json.loads((folder / "reference.json").read_text())
    n = reference["num_partitions"]
    spmd = compile_spmd(api.load(folder / "program.hlo"), n)
    return api.parse(api.to_text(spmd)), n, reference


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_jax_program_reproduces_jax_outputs(name):
    folder = _program(name)
    spmd, n, _ = _compile(folder)
    inputs = io.read_inputs(folder / "inputs.npz", api.load(folder / "program.hlo"))
    got = io.output_arrays(spmd, run_global(spmd, inputs, n))
    want = np.load(folder / "outputs.npz")
    assert sorted(got) == sorted(want.files)
    for key in want.files:
        np.testing.assert_allclose(np.asarray(got[key], np.float64),
                                   np.asarray(want[key], np.float64), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name} {key}")


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_jax_program_moves_no_more_bytes_than_xla(name):
    """Per run (collectives in loops times their trip count), as XLA's report counts result
    bytes, and sent bytes by the cost model on both programs (XLA's reported estimate counts a
    collective-permute's operand on devices that send nothing)."""
    folder = _program(name)
    spmd, n, reference = _compile(folder)
    traffic = collective_traffic(spmd, n)
    assert all(t.executions is not None for t in traffic)
    xla = reference["collectives"]["xla_spmd"]
    assert sum(t.total_result_bytes for t in traffic) <= xla["total_dynamic_bytes"]
    xla_traffic = collective_traffic(api.load(folder / "xla_spmd.hlo"), n)
    assert sum(t.total_sent_bytes for t in traffic) <= \
        sum(t.total_sent_bytes for t in xla_traffic)


def test_traffic_of_xla_programs_matches_xla_report():
    """The traffic measure itself, on XLA's partitioned programs (loops included): result bytes
    as XLA reports them; sent bytes of the ring collectives as XLA estimates them; those of a
    collective-permute counted on the devices that send (XLA counts its operand on every
    device), here by hand from its pairs."""
    if not PROGRAMS.is_dir():
        pytest.skip(f"{PROGRAMS} not found")
    for folder in sorted(p for p in PROGRAMS.iterdir() if p.is_dir()):
        reference = json.loads((folder / "reference.json").read_text())
        xla = reference["collectives"]["xla_spmd"]
        n = reference["num_partitions"]
        module = api.load(folder / "xla_spmd.hlo")
        traffic = collective_traffic(module, n)
        assert sum(t.total_result_bytes for t in traffic) == xla["total_dynamic_bytes"], folder
        for kind, report in xla["by_kind"].items():
            found = [t for t in traffic if t.opcode == kind]
            if kind == "collective-permute":
                insts = {i.name: i for _, i in module.all_instructions()}
                expected = sum(
                    sum(1 for s, d in insts[t.name].attr("source_target_pairs") if s != d) *
                    insts[t.name].operands[0].shape.byte_size * t.executions for t in found) / n
            else:
                expected = report["est_sent_bytes"]
            assert sum(t.total_sent_bytes for t in found) == pytest.approx(expected, abs=1.0), \
                (folder, kind)


def _cases():
    path = SHARED / "conformance" / "xla-partitioner.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text())["cases"]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_xla_partitioner_case(case):
    if {"infeed", "outfeed"} & set(case["opcodes"]):
        pytest.skip("I/O ops: no single-device reference")
    module = api.parse(case["hlo"])
    if largest_value_bytes(module) > 1 << 22 or multiply_adds(module) > 1e7:
        pytest.skip("too large for a quick local run")
    ruled = _has_rules(module)
    try:
        problems, used_default = run_case(case["hlo"], case["num_devices"], case["name"])
    except GspmdcError as e:
        assert not ruled or "manual" in str(e) or "unreduced" in str(e), \
            f"{case['name']} rejected: {e}"
        return
    assert problems == []
    if ruled:
        assert not used_default
