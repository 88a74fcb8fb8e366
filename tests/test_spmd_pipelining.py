"""GSPMD pipelining (docs/partitioning.md#pipelining-gspmdcexamplespipelinehlo): the bundled
example `gspmdc/examples/pipeline.hlo` runs a
4-stage pipeline as a while loop over a stage-sharded activation buffer. Partitioned on 4
devices, each loop iteration must be the local stage computation plus exactly one
collective-permute shifting one microbatch activation from stage s to stage s + 1."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gspmdc import api
from gspmdc.cli import main
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.traffic import collective_traffic

from spmd_partition_helpers import COLLECTIVES, run_global

EXAMPLE = Path(__file__).resolve().parents[1] / "gspmdc" / "examples" / "pipeline.hlo"
STAGES, MICROBATCHES, BATCH, HIDDEN = 4, 6, 2, 8


def _compiled():
    """The example partitioned as `gspmdc run` does (propagation on), printed and re-parsed."""
    spmd = compile_spmd(api.load(EXAMPLE), STAGES)
    return api.parse(api.to_text(spmd))


def _loop(spmd):
    loop = next(i for i in spmd.entry.instructions if i.opcode == "while")
    return spmd.computations[loop.attr("body").name], spmd.computations[loop.attr("condition").name]


def _collectives(comp):
    return [i for i in comp.instructions if i.opcode in COLLECTIVES]


def test_each_iteration_is_the_local_stage_plus_one_shift():
    body, cond = _loop(_compiled())
    assert _collectives(cond) == []
    (shift,) = _collectives(body)
    assert shift.opcode == "collective-permute"
    assert sorted(tuple(p) for p in shift.attr("source_target_pairs")) == [(0, 1), (1, 2), (2, 3)]
    # it carries one microbatch activation: this device's stage
    assert shift.shape.dims == (1, BATCH, HIDDEN)
    # the stage computation is local: a dot on this stage's weights only
    (dot,) = [i for i in body.instructions if i.opcode == "dot"]
    assert dot.operands[1].shape.dims == (1, HIDDEN, HIDDEN)


def test_the_shift_runs_once_per_iteration():
    spmd = _compiled()
    traffic = collective_traffic(spmd, STAGES)
    in_loop = [t for t in traffic if t.computation != spmd.entry.name]
    assert [(t.opcode, t.executions) for t in in_loop] == \
        [("collective-permute", MICROBATCHES + STAGES - 1)]
    assert in_loop[0].result_bytes == BATCH * HIDDEN * 4


def test_pipeline_applies_every_stage_to_every_microbatch():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((STAGES, HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
    b = rng.standard_normal((STAGES, HIDDEN)).astype(np.float32)
    x = rng.standard_normal((MICROBATCHES, BATCH, HIDDEN)).astype(np.float32)
    want = x.astype(np.float64)
    for s in range(STAGES):                     # the stages applied in sequence, all at once
        want = np.tanh(want @ w[s] + b[s])
    got = run_global(_compiled(), [w, b, x], STAGES)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bundled_example_runs_with_check():
    assert main(["run", str(EXAMPLE), "-n", "4", "--seed", "0", "--check", "-q"]) == 0


def test_global_dumps_of_the_pipeline_still_evaluate_to_the_reference(tmp_path):
    # up to halo-exchange the partitioned loop body is global code with reshard nodes
    from gspmdc.runtime import io
    reference = api.load(EXAMPLE)
    inputs = io.random_inputs(reference, seed=1)
    want = api.evaluate(reference, inputs)
    compile_spmd(api.load(EXAMPLE), STAGES, dump_dir=tmp_path)
    dumps = sorted(tmp_path.glob("*.hlo"))
    global_dumps = [d for d in dumps if any(p in d.name for p in
                                            ("insert-reshards", "pad-uneven", "halo-exchange"))]
    assert len(global_dumps) == 3
    for dump in global_dumps:
        np.testing.assert_allclose(api.evaluate(api.load(dump), inputs), want, rtol=1e-6,
                                   err_msg=dump.name)
