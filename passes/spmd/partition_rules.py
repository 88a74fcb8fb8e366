"""Which rule partitions an instruction: the lookup insert-reshards and lower-spmd share.

The rule modules below fill the catalogue's `PARTITION_RULES`; `rule_for` then picks, in order:

1. `ManualRule` for an instruction with a manual leaf inside a manual region (not for the region
   boundaries, nor for parameters, tuples and control flow, whose rules pass manual leaves
   through);
2. for a custom-call: UnsupportedError when it has side effects and no rule of its own (JAX
   prints a `Sharding` annotation of an unreduced value as side-effecting), else the rule of its
   target;
3. the opcode's rule; else UnsupportedError with the catalogue's message for a
   partition-dependent opcode (`ops.refusal`); else the default action, which runs called
   computations unchanged on every partition, so they must not hold partition-dependent ops.
"""
from __future__ import annotations

from gspmdc.errors import UnsupportedError
from gspmdc.ir.custom_call_targets import MANUAL_BOUNDARIES, target_of
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.ops import PARTITION_DEPENDENT, PARTITION_RULES, opcodes

from . import (  # noqa: F401  (each module registers its rules)
    op_rules_control, op_rules_conv, op_rules_data, op_rules_dot, op_rules_elementwise,
    op_rules_fusion, op_rules_gather, op_rules_indexed, op_rules_io, op_rules_passthrough, op_rules_ragged, op_rules_random,
    op_rules_reduce, op_rules_window,
)
from .op_rules import DEFAULT_RULE, PartitionRule, has_manual_leaf
from .op_rules_manual import ManualRule

#: opcodes whose rules pass leaf shardings through, manual ones included
_STRUCTURAL = opcodes("parameter", "tuple", "get-tuple-element", "while", "conditional", "call")
_MANUAL_RULE = ManualRule()


def rule_for(inst: Instruction, computations: dict[str, Computation]) -> PartitionRule:
    """The rule partitioning `inst` (see the module docstring); UnsupportedError for
    partition-dependent ops outside manual regions."""
    opcode, sharding = inst.opcode, inst.sharding
    if opcode != "custom-call" and (sharding is None or not sharding.has_manual_leaf):
        # most instructions (asked for every plan and every lowering): no target, no manual leaf
        rule = PARTITION_RULES.rules.get(opcode)
        if rule is not None and rule is not DEFAULT_RULE:
            return rule
    target = target_of(inst)
    if target not in MANUAL_BOUNDARIES and opcode not in _STRUCTURAL and \
            has_manual_leaf(sharding):
        return _MANUAL_RULE
    if target is not None and inst.attr("custom_call_has_side_effect", False) and \
            target not in PARTITION_RULES.targets:      # a Sharding annotation may be one
        raise UnsupportedError(f"{inst.name}: side-effecting custom-call {target!r} cannot be "
                               "partitioned")
    try:
        rule = PARTITION_RULES.lookup(inst.opcode, target)
    except UnsupportedError as e:
        raise UnsupportedError(f"{inst.name}: {e}") from None
    if rule is DEFAULT_RULE:
        for name in inst.called_computation_names():
            _check_callee(inst, computations, name, set())
    return rule


def _check_callee(inst: Instruction, computations: dict[str, Computation], name: str,
                  seen: set[str]) -> None:
    """Callees of a default-action op run unchanged on every partition: they must not contain
    partition-dependent ops (a cross-replica all-reduce, without `channel_id`, combines replicas,
    not partitions, so it runs unchanged too)."""
    if name in seen:
        return
    seen.add(name)
    for callee_inst in computations[name].instructions:
        if callee_inst.opcode in PARTITION_DEPENDENT and not (
                callee_inst.opcode == "all-reduce" and callee_inst.attr("channel_id") is None):
            raise UnsupportedError(f"{inst.name}: called computation {name} contains "
                                   f"{callee_inst.opcode}, which cannot be partitioned")
        for inner in callee_inst.called_computation_names():
            _check_callee(inst, computations, inner, seen)


__all__ = ["rule_for"]
