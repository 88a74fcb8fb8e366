"""The sharding algebra against XLA's own answers: a recorded table of random cases (no jax
needed), and fresh random cases asked of XLA when jax and ../shared/xla-oracle are present.
The cases and the way XLA is asked are in xla_algebra_cases.py."""
import json
import subprocess
import sys
from collections import Counter

import pytest

import xla_algebra_cases as cases
from gspmdc import api
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.parser import parse_sharding
from gspmdc.passes.propagation import propagate


def algebra_answer(case: dict) -> str | None:
    """gspmdc's answer to a case: the algebra function itself for reshapes and transposes, and
    for merges (which XLA decides inside propagation) our propagation of the same program."""
    kind = case["kind"]
    if kind == "merge":
        module = propagate(api.parse(cases.module_text([case], case["n"])), record_origins=False)
        found = module.entry.instruction("q0").sharding
        return None if found is None else found.to_text(include_metadata=False)
    s = parse_sharding(case["sharding"])
    if kind == "reshape":
        got = algebra.propagate_through_reshape(s, case["source"], case["target"])
    elif kind == "reshape_backward":
        got = algebra.propagate_through_reshape(s, case["target"], case["source"])
    else:
        got = algebra.transpose(s, case["perm"])
    return got.to_text(include_metadata=False)


def _mismatches(table: list[dict]) -> list[str]:
    wrong = []
    for case in table:
        got = algebra_answer(case)
        want = case["xla"]
        same = got == want or (got is not None and want is not None and
                               parse_sharding(got) == parse_sharding(want))
        if not same:
            wrong.append(f"{json.dumps({k: v for k, v in case.items() if k != 'xla'})}: "
                         f"XLA {want}, gspmdc {got}")
    return wrong


def test_recorded_xla_answers():
    table = json.loads(cases.TABLE.read_text())["cases"]
    assert Counter(c["kind"] for c in table).keys() == set(cases.KINDS)
    assert len(table) >= 100
    wrong = _mismatches(table)
    assert not wrong, f"{len(wrong)} of {len(table)} differ from XLA:\n" + "\n".join(wrong[:20])


def test_fresh_random_cases_against_xla(tmp_path):
    """New random cases (another seed than the table's), asked of XLA now, in a child process:
    jax starts threads, and tests that fork must not inherit them."""
    if not cases.oracle_available():
        pytest.skip("jax 0.10.2 or ../shared/xla-oracle not available")
    recorded = json.loads(cases.TABLE.read_text())["seed"]
    out = tmp_path / "fresh.json"
    subprocess.run([sys.executable, cases.__file__, "--count", "200", "--seed", str(recorded + 1),
                    "--out", str(out)], check=True, capture_output=True, timeout=1800)
    table = json.loads(out.read_text())["cases"]
    wrong = _mismatches(table)
    assert not wrong, f"{len(wrong)} of {len(table)} differ from XLA:\n" + "\n".join(wrong[:20])
