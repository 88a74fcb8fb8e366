"""The opcode catalogue against the layers that attach rules to it: every opcode the verifier
accepts is supported by every later layer, or refused with the catalogue's own message; every
elementwise opcode works end to end (shape, propagation, partitioning, kernel) from its catalogue
entry and its kernel alone."""
from __future__ import annotations

import subprocess
import sys

import pytest

import gspmdc.ir.shape_inference  # noqa: F401  (shape rules)
import gspmdc.passes.propagation  # noqa: F401  (propagation rules)
import gspmdc.passes.spmd  # noqa: F401  (partitioning rules)
import gspmdc.runtime.kernels  # noqa: F401  (kernels)
from gspmdc import api
from gspmdc.errors import UnsupportedError
from gspmdc.ir import ops
from gspmdc.ir.ops import Layer, TypeClass
from gspmdc.passes.propagation import propagate
from gspmdc.passes.propagation.opclass import is_elementwise
from gspmdc.passes.shardy import factor_rules
from gspmdc.passes.spmd.op_rules_elementwise import ElementwiseRule
from hlo_text import hlo_module
from spmd_partition_helpers import check_equivalent


def test_every_layer_supports_every_catalogued_opcode_unless_the_catalogue_says_why():
    unexplained = [(name, layer.value) for name in ops.CATALOGUE
                   for layer, table in ops.TABLES.items()
                   if table.support(name) == "refused" and ops.refusal(name, layer) is None]
    assert unexplained == []


def test_a_refusal_the_catalogue_states_is_the_layers_message():
    refused = [(name, layer) for name in ops.CATALOGUE for layer in Layer
               if ops.TABLES[layer].support(name) == "refused"]
    assert refused, "the partitioner refuses partition-dependent opcodes"
    for name, layer in refused:
        with pytest.raises(UnsupportedError) as caught:
            ops.TABLES[layer].lookup(name)
        assert str(caught.value) == ops.refusal(name, layer)


def test_the_partitioner_refuses_a_partition_dependent_op_with_the_catalogues_message():
    text = hlo_module("  ROOT id = u32[] replica-id(), sharding={replicated}")
    with pytest.raises(UnsupportedError) as caught:
        check_equivalent(text, 2)
    assert ops.refusal("replica-id", Layer.PARTITION) in str(caught.value)


def test_the_verifier_refuses_an_opcode_outside_the_catalogue_with_its_message():
    text = hlo_module("  p = f32[4] parameter(0)\n  ROOT r = f32[4] frobnicate(p)")
    with pytest.raises(UnsupportedError) as caught:
        api.parse(text)
    assert ops.refusal("frobnicate", Layer.SHAPE) in str(caught.value)


def test_rules_register_only_against_the_catalogue_and_once():
    table = ops.RuleTable(Layer.KERNEL)
    with pytest.raises(ValueError, match="not in the opcode catalogue"):
        table.add(print, "frobnicate")
    with pytest.raises(ValueError, match="does not name"):
        table.add(print, targets=("NoSuchTarget",))
    table.add(print, "add")
    with pytest.raises(ValueError, match="two kernel rules"):
        table.add(print, "add")


def test_opcode_lists_are_checked_against_the_catalogue():
    assert ops.opcodes("add", "opt-barrier") == {"add", "opt-barrier"}
    with pytest.raises(ValueError, match="clz"):
        ops.opcodes("add", "clz")


def test_the_groups_follow_the_traits():
    assert ops.ELEMENTWISE_UNARY | ops.ELEMENTWISE_BINARY | ops.ELEMENTWISE_TERNARY == \
        ops.ELEMENTWISE_PURE
    assert ops.ELEMENTWISE - ops.ELEMENTWISE_PURE == {"map", "rng"}
    assert ops.HOST_IO == {"infeed", "outfeed", "send", "send-done", "recv", "recv-done"}
    assert "partition-id" in ops.SPMD_ONLY and "replica-id" not in ops.SPMD_ONLY
    assert ops.CALLED_COMPUTATION_ATTRIBUTES >= {"to_apply", "body", "condition", "calls"}


def test_gspmdc_ops_lists_every_opcode_and_no_unexplained_refusal():
    report = subprocess.run([sys.executable, "-m", "gspmdc", "ops"], capture_output=True,
                            text=True, check=True).stdout
    rows = {line.split()[0]: line.split()[1:7] for line in report.splitlines()[1:]
            if line and not line.startswith(" ") and line.split()[0] in ops.CATALOGUE}
    assert set(rows) == set(ops.CATALOGUE)
    assert rows["add"] == ["yes", "rule", "default", "default", "rule", "rule"]
    assert rows["partition-id"][4] == "refused" and rows["parameter"][5] == "elsewhere"
    assert "NOT STATED" not in report


def test_gspmdc_ops_of_an_unknown_opcode_says_so():
    done = subprocess.run([sys.executable, "-m", "gspmdc", "ops", "add", "clz"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert ops.refusal("clz", Layer.SHAPE) in done.stderr


# ---- elementwise opcodes: the catalogue entry and the kernel are all it takes -------------------

@pytest.mark.parametrize("opcode", sorted(ops.ELEMENTWISE))
def test_every_elementwise_opcode_has_a_rule_in_every_layer(opcode):
    assert opcode in ops.SHAPE_RULES
    assert opcode in ops.KERNELS
    assert ops.PARTITION_RULES.support(opcode) == "rule"
    assert ops.FORWARD_RULES.support(opcode) in ("rule", "default")
    assert ops.BACKWARD_RULES.support(opcode) in ("rule", "default")


#: an element type each class accepts, for the end-to-end check
_TYPE = {
    TypeClass.NUMERIC: "f32", TypeClass.FLOAT: "f32", TypeClass.FLOAT_OR_COMPLEX: "f32",
    TypeClass.SIGNED_FLOAT_OR_COMPLEX: "s32", TypeClass.INTEGRAL: "u32",
    TypeClass.INTEGRAL_OR_PRED: "pred",
}


def _program(opcode: str, sharded: bool) -> str:
    """`opcode` on [6,4] operands (the second tiled the other way, so partitioning reshards),
    its result used by a tuple root."""
    op = ops.CATALOGUE[opcode]
    t = _TYPE[op.types.operands]
    tiles = ["{devices=[2,1]<=[2]}", "{devices=[1,2]<=[2]}"]
    params = [f"  p{i} = {t}[6,4] parameter({i})"
              + (f", sharding={tiles[i]}" if sharded or i == 0 else "")
              for i in range(op.arity)]
    result = f"  r = {opcode}({', '.join(f'p{i}' for i in range(op.arity))})" + \
        (f", sharding={tiles[0]}" if sharded else "")
    return hlo_module("\n".join(params + [result, "  ROOT t = tuple(r)"
                                          + (", sharding={{replicated}}" if sharded else "")]))


@pytest.mark.parametrize("opcode", sorted(ops.TYPED_ELEMENTWISE))
def test_a_typed_elementwise_opcode_is_pointwise_for_shardy(opcode):
    """Shardy's factor rule maps each dim of every operand and of the result to one factor of
    the dim's size (written out here, not built by the rule's own helpers)."""
    module = api.parse(_program(opcode, sharded=False))
    rule = factor_rules.rule_of(module.entry.instruction("r"), module)
    arity = ops.CATALOGUE[opcode].arity
    assert rule is not None
    assert rule.factor_sizes == (6, 4)
    assert rule.operands == (((0,), (1,)),) * arity and rule.results == (((0,), (1,)),)
    assert rule.reduction == rule.need_replication == rule.blocked_propagation == ()


@pytest.mark.parametrize("opcode", sorted(ops.TYPED_ELEMENTWISE))
def test_a_typed_elementwise_opcode_propagates_partitions_and_runs(opcode):
    module = propagate(api.parse(_program(opcode, sharded=False)))
    result = module.entry.instruction("r")
    assert is_elementwise(result)
    assert result.sharding.to_text(False) == "{devices=[2,1]<=[2]}"
    assert isinstance(ops.PARTITION_RULES[opcode], ElementwiseRule)
    check_equivalent(_program(opcode, sharded=True), 2)
