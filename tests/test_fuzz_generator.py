"""The fuzz generator itself (tests/fuzz): deterministic, valid, small, and covering every
operation the partitioner supports (read from the product's tables, so a new opcode without a
generator fails here)."""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import Case, case, cases
from fuzz.coverage import NOT_GENERATED, operations_in, required_operations, supported_operations
from fuzz.program import MAX_DIM, MAX_ELEMENTS
from fuzz.values import Arr, Tup

from gspmdc import api

#: seeds whose modules together must use every supported operation
COVERAGE_SEEDS = range(600)


def test_the_same_seed_gives_the_same_case_and_seeds_differ():
    assert case(7) == case(7)
    assert len({case(seed).text for seed in range(20)}) == 20


@pytest.mark.parametrize("seed", range(0, 300, 3))
def test_generated_modules_verify_and_stay_small(seed):
    c = case(seed)
    module = api.parse(c.text)                       # parses and verifies
    assert module.num_partitions == c.num_partitions
    assert re.match(rf"HloModule \S+, num_partitions={c.num_partitions}\n", c.text)
    if c.reference_text is not None:
        reference = api.parse(c.reference_text)
        assert [p.shape for p in reference.entry.parameters] == \
            [p.shape for p in module.entry.parameters]
        assert reference.entry.root.shape == module.entry.root.shape
    # the budget counts the instructions the generator chose (25), not the reducers and
    # comparators it calls nor the gets and copies that extract and return values
    chosen = [i for comp in module.computations.values() for i in comp.instructions
              if i.opcode not in ("get-tuple-element", "parameter", "constant")
              and not re.match(r"(add|maximum|minimum|multiply|or|and|xor|compare|arg|select|"
                               r"map|scatter2)_", comp.name)]
    assert len(chosen) <= 40
    for _, inst in module.all_instructions():
        for leaf in inst.shape.leaves():
            assert leaf.num_elements <= MAX_ELEMENTS, (inst.name, leaf)
            assert all(d <= MAX_DIM for d in leaf.dims), (inst.name, leaf)


def test_every_supported_operation_is_generated():
    seen = set()
    for seed in COVERAGE_SEEDS:
        seen |= operations_in(case(seed).text)
    missing = sorted(required_operations() - seen)
    assert not missing, f"operations the partitioner supports that no case uses: {missing}"


def test_the_supported_operations_come_from_the_product_tables():
    supported = supported_operations()
    # a few that must be there: ruled ops, default-action ops, custom-call targets
    for name in ("dot", "convolution", "gather", "while", "custom-call:Sharding",
                 "custom-call:SPMDFullToShardShape", "opt-barrier", "bitcast",
                 "custom-call:LayoutConstraint", "reduce-precision"):
        assert name in supported
    # partition-dependent ops and the partitioner's own per-partition forms are not
    for name in ("partition-id", "all-gather", "custom-call:gspmdc.RngShard", "send"):
        assert name not in supported
    assert set(NOT_GENERATED) <= supported


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_the_hypothesis_strategy_gives_valid_cases(c):
    assert isinstance(c, Case) and c.seed is None
    api.parse(c.text)
    if c.reference_text is not None:
        api.parse(c.reference_text)


def test_shapes_print_as_hlo():
    assert Arr("f32", (2, 3)).text() == "f32[2,3]"
    assert Tup((Arr("s32", ()), Tup(()))).text() == "(s32[], ())"
