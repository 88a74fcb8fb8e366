"""Shape inference: the per-opcode table of shape rules and the two entry points.

`SHAPE_RULES` maps each opcode to an `OpRule` (accepted operand counts + rule function); the
`shape_rules_*` modules fill it, one family each (elementwise, data movement, contractions,
reductions, gather/scatter, control flow, collectives, side effects). Adding an op means adding
one `@shape_rule` function.

- `infer_shape(inst, module)`: the result shape from the operands' shapes and the typed attributes
  (HLO semantics as in XLA's shape inference). For ops whose result is not determined by them
  (reshape, iota, convert, custom-call, rng, collectives with an unknown group size, ...) the
  instruction's given shape is validated and returned; it is an error for it to be missing.
  `dot`/`convolution` take a given result element type as XLA's `preferred_element_type`.
- `check_shape(inst, module)`: raises when the given shape is incompatible (layouts ignored) with
  what the op allows.

Called computations are looked up by name in `module.computations`, so the parser may call these
while it builds the module. Errors are `VerificationError`s naming the instruction; opcodes without
a rule raise `UnsupportedError`.
"""
from __future__ import annotations

from gspmdc.errors import UnsupportedError, VerificationError

from . import (  # noqa: F401  (each module registers its rules)
    shape_rules_collective, shape_rules_contraction, shape_rules_control, shape_rules_data,
    shape_rules_effects, shape_rules_elementwise, shape_rules_indexing, shape_rules_reduction,
)
from .module import Instruction, Module
from .shape_rules_common import SHAPE_RULES, OpRule, ShapeRuleError
from .shapes import Shape, compatible

__all__ = ["SHAPE_RULES", "OpRule", "infer_shape", "check_shape"]


def _operand_count(rule: OpRule) -> str:
    if rule.max_operands is None:
        return f"at least {rule.min_operands}"
    if rule.max_operands == rule.min_operands:
        return str(rule.min_operands)
    return f"{rule.min_operands} to {rule.max_operands}"


def infer_shape(inst: Instruction, module: Module) -> Shape:
    """The result shape of `inst` (without layout); raises VerificationError on invalid operands or
    attributes and UnsupportedError for an opcode without a shape rule."""
    rule = SHAPE_RULES.get(inst.opcode)
    if rule is None:
        raise UnsupportedError(f"instruction {inst.name}: no shape rule for opcode {inst.opcode}")
    count = len(inst.operands)
    if count < rule.min_operands or (rule.max_operands is not None and count > rule.max_operands):
        raise VerificationError(f"instruction {inst.name}: {inst.opcode} takes "
                                f"{_operand_count(rule)} operands, found {count}")
    try:
        return rule.infer(inst, module)
    except ShapeRuleError as e:
        raise VerificationError(f"instruction {inst.name}: {e}") from None


def check_shape(inst: Instruction, module: Module) -> None:
    """Raise VerificationError unless `inst.shape` is compatible with what the op allows."""
    expected = infer_shape(inst, module)
    if inst.shape is None:
        raise VerificationError(f"instruction {inst.name}: missing result shape "
                                f"(inferred {expected})")
    if not compatible(inst.shape, expected):
        raise VerificationError(f"instruction {inst.name}: result shape "
                                f"{inst.shape.without_layout()} is incompatible with inferred "
                                f"{expected}")
