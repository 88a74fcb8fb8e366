"""What an instruction's `sharding=` annotation describes.

For every opcode but one, the annotation is the sharding of the instruction's result. An
`outfeed`'s annotation (as in XLA) describes what it sends: its data operand, optionally followed
by one more element for the token it returns; the token's sharding is that last element (or
the whole annotation when it is not a tuple).
"""
from __future__ import annotations

from .module import Instruction
from .shapes import ArrayShape, Shape, TupleShape, num_leaves
from .sharding import HloSharding


def annotated_shape(inst: Instruction) -> Shape:
    """The shape `inst.sharding` describes: the result's, or for an outfeed its data operand's
    (a tuple of it and the token when the annotation has one element more)."""
    if (inst.opcode != "outfeed" or inst.sharding is None or not inst.operands
            or inst.operands[0].shape is None):
        return inst.shape
    data = inst.operands[0].shape
    if inst.sharding.kind == "tuple" and len(inst.sharding.elements) == num_leaves(data) + 1:
        return TupleShape((data, ArrayShape("token", ())))
    return data


def result_sharding(inst: Instruction) -> HloSharding | None:
    """The sharding of `inst`'s result as its users read it: the annotation, or for an outfeed
    the token's part of it (XLA's GetOutputSharding)."""
    s = inst.sharding
    if inst.opcode != "outfeed" or s is None or not s.is_tuple:
        return s
    return s.elements[-1]
