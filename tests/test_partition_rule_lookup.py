"""`rule_for` (passes/spmd/partition_rules.py): the order of its module docstring for every
opcode of the rule table, manual leaves first; the default action's check of callees."""
from __future__ import annotations

import pytest

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import ComputationRef
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.parser import parse_shape, parse_sharding
from gspmdc.passes.spmd.op_rules import DEFAULT_RULE
from gspmdc.passes.spmd.op_rules_manual import ManualRule
from gspmdc.passes.spmd.partition_rules import rule_for

#: the opcodes whose rules pass leaf shardings through, manual ones included
STRUCTURAL = {"parameter", "tuple", "get-tuple-element", "while", "conditional", "call"}
SHARDINGS = [None, "{replicated}", "{devices=[2,2]<=[4]}", "{maximal device=1}",
             "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"]


def _inst(opcode: str, sharding: str | None, attrs=None) -> Instruction:
    return Instruction("i", opcode, parse_shape("f32[4,4]"), [], attrs,
                       sharding=None if sharding is None else parse_sharding(sharding))


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize("opcode", sorted(PARTITION_RULES.rules))
def test_opcode_rule_without_manual_leaves(opcode, sharding):
    assert rule_for(_inst(opcode, sharding), {}) is PARTITION_RULES.rules[opcode]


@pytest.mark.parametrize("sharding", ["{manual}", "{devices=[2,1,2]<=[4] last_tile_dims={manual}}"])
@pytest.mark.parametrize("opcode", sorted(PARTITION_RULES.rules))
def test_manual_leaf_takes_the_manual_rule_first(opcode, sharding):
    rule = rule_for(_inst(opcode, sharding), {})
    if opcode in STRUCTURAL:
        assert rule is PARTITION_RULES.rules[opcode]
    else:
        assert isinstance(rule, ManualRule)


def test_custom_call_target_rule_and_unknown_target():
    sharding = _inst("custom-call", "{replicated}", {"custom_call_target": "Sharding"})
    assert rule_for(sharding, {}) is PARTITION_RULES.targets["Sharding"]
    other = _inst("custom-call", "{replicated}", {"custom_call_target": "my_kernel"})
    assert rule_for(other, {}) is DEFAULT_RULE


def test_default_action_refuses_a_partition_dependent_callee():
    pid = Instruction("pid", "partition-id", parse_shape("u32[]"))
    callee = Computation("holds_pid", [pid], pid)
    user = _inst("custom-call", None, {"custom_call_target": "my_kernel"})
    user.attrs["called_computations"] = (ComputationRef(callee.name),)
    with pytest.raises(UnsupportedError, match="partition-id"):
        rule_for(user, {callee.name: callee})
