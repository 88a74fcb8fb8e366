"""One collective, one number: the reshard planner's estimate of a step's collectives (one per
round of pieces for an exchange, each emitted once), `gspmdc explain`'s bytes, `gspmdc cost`'s
modelled bytes and the bytes the profiler of `run --profile` counts on every partition (sent and
received) agree to the byte, on the JAX programs and on the XLA partitioner cases (partitioned by
gspmdc, run on the local backend, all in this process). The cost model's
own formulas are checked in test_cost.py; `gspmdc cost --json` against `run --profile-json` on MPI
ranks in test_cost_agreement.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from conformance.score import largest_value_bytes, multiply_adds
from gspmdc.errors import GspmdcError
from gspmdc.ir import dtypes
from gspmdc.ir.cost import Traffic, instruction_traffic
from gspmdc.ir.parser import parse_sharding
from gspmdc.passes.analysis.cost import program_cost
from gspmdc.passes.analysis.machine import PRESETS
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.pipeline import partitioner_pipeline
from gspmdc.passes.spmd.explain import describe_instruction
from gspmdc.passes.spmd.reshard_nodes import is_inserted_reshard
from gspmdc.passes.spmd.reshard_plan import plan_reshard
from gspmdc.runtime import io
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.profile import ProfileRecorder
from gspmdc.runtime.sharded_io import spmd_signature, split_inputs

SHARED = Path(__file__).resolve().parents[2] / "shared"
PROGRAMS = SHARED / "jax-programs"
CASES = SHARED / "conformance" / "xla-partitioner.json"
#: conformance cases checked (the first this many small ones with collectives)
CASE_COUNT = 40

_KEYS = ("op_name", "spmd_value", "spmd_role", "spmd_from", "spmd_to")


def _reshard_key(metadata) -> tuple:
    return tuple(metadata.get(k) for k in _KEYS)


def compile_with_reshards(module, n: int, propagate: bool):
    """The SPMD program, and for every reshard node insert-reshards made: its global shape by
    the metadata its collectives carry."""
    shapes = {}

    def after(index, pass_, result, seconds):
        if pass_.name == "insert-reshards":
            for _, inst in result.all_instructions():
                if is_inserted_reshard(inst):
                    shapes[_reshard_key(inst.attr("metadata"))] = inst.shape

    spmd = run_pipeline(PassContext(n), module, partitioner_pipeline(propagate=propagate), after)
    return api.parse(api.to_text(spmd)), shapes


def planned_traffics(inst, shapes: dict, n: int) -> tuple[tuple, list[Traffic]] | None:
    """The plan step that emitted `inst` (its reshard node and step index) and the traffic
    of each collective the planner says that step emits (None when `inst` comes from no
    reshard node)."""
    metadata = inst.attr("metadata")
    step = None if metadata is None else metadata.get("spmd_step")
    key = _reshard_key(metadata) if metadata is not None else None
    shape = None if step is None else shapes.get(key)
    if shape is None:
        return None
    index = int(step.split("/")[0]) - 1
    plan = plan_reshard(shape, parse_sharding(metadata.get("spmd_from")),
                        parse_sharding(metadata.get("spmd_to")), n)
    width = max(dtypes.byte_width(shape.element_type), 1)
    return (key, index), plan.steps[index].collective_traffics(shape.dims, width)


def profiled_bytes(spmd, inputs, n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per collective instruction: the bytes each partition's profile counts as sent and as
    received per execution."""
    recorders = [ProfileRecorder(p, n) for p in range(n)]
    signature = spmd_signature(spmd, n)
    run_local(spmd, split_inputs(signature, inputs, padding="garbage"), n, recorders=recorders,
              timeout=300)
    found = {}
    for p, recorder in enumerate(recorders):
        for name, stats in recorder.profile().collectives.items():
            sent, received = found.setdefault(name, (np.zeros(n, dtype=np.int64),
                                                     np.zeros(n, dtype=np.int64)))
            assert stats.bytes_sent % stats.calls == 0 and stats.bytes_received % stats.calls == 0
            sent[p] = stats.bytes_sent // stats.calls
            received[p] = stats.bytes_received // stats.calls
    return found


def check_agreement(spmd, shapes: dict, inputs, n: int) -> int:
    """Assert the four agree on every collective of `spmd` (the planner's estimate of a step
    against the sum over the collectives it emitted: an exchange of pieces emits one permute
    per round); the number of planner steps compared."""
    profiled = profiled_bytes(spmd, inputs, n)
    modelled = {c.name: c for c in program_cost(spmd, n, PRESETS["tpu-v4"]).figures.collectives}
    planned = 0
    steps: dict[tuple, tuple[list[Traffic], list[Traffic]]] = {}    # planned, emitted
    for comp, inst in spmd.all_instructions():
        traffic = instruction_traffic(inst, n, spmd.computations)
        if traffic is None:
            continue
        line = describe_instruction(spmd, inst)
        figures = modelled[inst.name]
        if figures.calls is not None:
            assert list(figures.bytes_sent_per_device) == (traffic.sent * figures.calls).tolist()
            assert list(figures.bytes_received_per_device) == \
                (traffic.received * figures.calls).tolist()
        if inst.name in profiled:       # executed (not in a branch that never ran)
            measured, received = profiled[inst.name]
            assert np.array_equal(measured, traffic.sent), (inst.name, measured, traffic.sent)
            assert np.array_equal(received, traffic.received), inst.name
            expected = Traffic(traffic.kind, traffic.num_groups, traffic.group_size,
                               traffic.operand_bytes, measured.copy(), traffic.received.copy())
            assert line.endswith(expected.describe()), (line, expected.describe())
        plan = planned_traffics(inst, shapes, n)
        if plan is not None:
            step, expected = plan
            steps.setdefault((comp.name, step), (expected, []))[1].append(traffic)
    for (_, step), (expected, emitted) in steps.items():
        # a step emits the planned collectives, each once (an exchange one per round)
        assert sorted(map(_figures, emitted)) == sorted(map(_figures, expected)), step
        planned += len(emitted)
    return planned


def _figures(traffic: Traffic) -> tuple:
    return traffic.kind, tuple(traffic.sent.tolist()), tuple(traffic.received.tolist())


def _programs():
    if not PROGRAMS.is_dir():
        return []
    return sorted(p.name for p in PROGRAMS.iterdir() if (p / "program.hlo").is_file())


@pytest.mark.parametrize("name", _programs())
def test_jax_program_costs_agree(name):
    folder = PROGRAMS / name
    n = json.loads((folder / "reference.json").read_text())["num_partitions"]
    spmd, shapes = compile_with_reshards(api.load(folder / "program.hlo"), n, propagate=True)
    inputs = io.read_inputs(folder / "inputs.npz", api.load(folder / "program.hlo"))
    check_agreement(spmd, shapes, inputs, n)


def _cases():
    if not CASES.is_file():
        return []
    chosen = []
    for case in json.loads(CASES.read_text())["cases"]:
        if {"infeed", "outfeed"} & set(case["opcodes"]):
            continue
        module = api.parse(case["hlo"])
        if largest_value_bytes(module) > 1 << 20 or multiply_adds(module) > 1e6:
            continue
        chosen.append(case)
        if len(chosen) == CASE_COUNT:
            break
    return chosen


def test_partitioned_conformance_modules_costs_agree():
    cases = _cases()
    if not cases:
        pytest.skip(f"{CASES} not found")
    planned = 0
    for case in cases:
        n = case["num_devices"]
        try:
            spmd, shapes = compile_with_reshards(api.parse(case["hlo"]), n, propagate=False)
            inputs = io.random_inputs(api.parse(case["hlo"]), seed=0)
            planned += check_agreement(spmd, shapes, inputs, n)
        except GspmdcError:
            continue            # cleanly rejected cases are scored elsewhere
    assert planned > 0
