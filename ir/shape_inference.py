"""Shape inference: the shape layer of the opcode catalogue and its two entry points.

The catalogue's `SHAPE_RULES` (`ir/ops.py`) maps each opcode to its rule; the `shape_rules_*`
modules fill it, one family each (elementwise, data movement, contractions, reductions,
gather/scatter, control flow, collectives, side effects). The operand count an opcode accepts is
the catalogue's; typed elementwise ops take their rule from their catalogue entry.

- `infer_shape(inst, module)`: the result shape from the operands' shapes and the typed attributes
  (HLO semantics as in XLA's shape inference). For ops whose result is not determined by them
  (reshape, iota, convert, custom-call, rng, collectives with an unknown group size, ...) the
  instruction's given shape is validated and returned; it is an error for it to be missing.
  `dot`/`convolution` take a given result element type as XLA's `preferred_element_type`.
- `check_shape(inst, module)`: raises when the given shape is incompatible (layouts ignored) with
  what the op allows.

Called computations are looked up by name in `module.computations`, so the parser may call these
while it builds the module. Errors are `VerificationError`s naming the instruction; an opcode the
catalogue does not know raises `UnsupportedError`.
"""
from __future__ import annotations

from gspmdc.errors import UnsupportedError, VerificationError

from . import (  # noqa: F401  (each module registers its rules)
    shape_rules_collective, shape_rules_contraction, shape_rules_control, shape_rules_data,
    shape_rules_effects, shape_rules_elementwise, shape_rules_indexing, shape_rules_reduction,
)
from .module import Instruction, Module
from .ops import CATALOGUE, SHAPE_RULES
from .shape_rules_common import ShapeRuleError
from .shapes import Shape, compatible

__all__ = ["infer_shape", "check_shape"]


def infer_shape(inst: Instruction, module: Module) -> Shape:
    """The result shape of `inst` (without layout); raises VerificationError on invalid operands or
    attributes and UnsupportedError for an opcode the catalogue does not know."""
    try:
        rule = SHAPE_RULES.lookup(inst.opcode)
    except UnsupportedError as e:
        raise UnsupportedError(f"instruction {inst.name}: {e}") from None
    op = CATALOGUE[inst.opcode]
    count = len(inst.operands)
    if count < op.min_operands or (op.max_operands is not None and count > op.max_operands):
        raise VerificationError(f"instruction {inst.name}: {inst.opcode} takes "
                                f"{op.describe_operands()} operands, found {count}")
    try:
        return rule(inst, module)
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
