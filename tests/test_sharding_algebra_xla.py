"""The sharding algebra against XLA's own answers: a recorded table of random cases (no jax
needed), and fresh random cases asked of XLA when jax and ../shared/xla-oracle are present.
The cases and the way XLA is asked are in xla_algebra_cases.py."""
import json
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


def test_fresh_random_cases_against_xla():
    """New random cases (another seed than the table's), asked of XLA now."""
    oracle = cases.load_oracle()
    if oracle is None:
        pytest.skip("jax 0.10.2 or ../shared/xla-oracle not available")
    recorded = json.loads(cases.TABLE.read_text())["seed"]
    table = cases.ask_xla(oracle, cases.random_cases(200, recorded + 1))
    wrong = _mismatches(table)
    assert not wrong, f"{len(wrong)} of {len(table)} differ from XLA:\n" + "\n".join(wrong[:20])
