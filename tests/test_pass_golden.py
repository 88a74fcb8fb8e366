"""Golden tests of one pass at a time, in the FileCheck manner: each `tests/passes/<pass>/*.hlo`
is an input module at a stage the pass accepts, with `// CHECK...:` directives
(`tests/filecheck.py`) matched against the module the pass writes. `// RUN: <pipeline>` gives
the pipeline with options (default: the folder's pass alone); the partition count is the
module's `num_partitions`, else the devices its shardings name. The verifier runs after the
pass, and the output must compute what the input computes: a global program evaluated on one
device, a partitioned one run on its partitions from the same global inputs (from the same
per-partition inputs when the input is partitioned already)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gspmdc import api
from gspmdc.ir.stage import Stage, module_stage
from gspmdc.passes.pass_manager import run_pipeline
from gspmdc.passes.pass_table import PASSES, parse_pipeline
from gspmdc.prepare import devices_named_by_shardings
from gspmdc.runtime.backends.local import run_local

from filecheck import check, directives
from spmd_partition_helpers import assert_close, inputs_for, run_global

ROOT = Path(__file__).parent / "passes"
CASES = sorted(ROOT.glob("*/*.hlo"))


def test_every_pass_has_golden_cases():
    assert sorted({path.parent.name for path in CASES}) == sorted(PASSES)
    for name in PASSES:
        assert len([p for p in CASES if p.parent.name == name]) >= 2, name


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_pass_golden(path, pass_context):
    text = path.read_text()
    run = re.search(r"^// RUN: (.*)$", text, re.M)
    passes = parse_pipeline(run.group(1) if run else path.parent.name)
    assert passes[0].name == path.parent.name
    module = api.parse(text, str(path))
    n = module.num_partitions or devices_named_by_shardings(module)
    before = module_stage(module)
    output = api.to_text(run_pipeline(pass_context(n), module, passes))
    check(output, directives(text))
    result = api.parse(output, f"{path.name} after {passes[0].name}")
    assert module_stage(result) is (passes[-1].produces or before)
    inputs = inputs_for(text)
    if before is Stage.PARTITIONED:      # per-partition inputs, per-partition results
        per_partition = [inputs] * n
        assert_close(tuple(run_local(result, per_partition, n, timeout=60)),
                     tuple(run_local(api.parse(text), per_partition, n, timeout=60)))
        return
    want = api.evaluate(api.parse(text), inputs)
    got = run_global(result, inputs, n) if module_stage(result) is Stage.PARTITIONED else \
        api.evaluate(result, inputs)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
