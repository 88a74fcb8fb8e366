"""Which instructions are elementwise (XLA's `IsElementwise`), fusions included.

An op is elementwise when each result element is computed from the operand elements at the
same position: the catalogue's `ELEMENTWISE` opcodes (unary, binary and ternary arithmetic,
`map`, `rng`), `bitcast-convert` only between element types of one bit width (between widths
it adds or drops a dim).

A `fusion` is elementwise when its fused computation is: every instruction the fused root
depends on, apart from parameters, is an elementwise op (a `clamp` only with bounds of the
result's shape), a constant, or a *no-op*, an instruction that returns its operand 0
unchanged (a transpose by the identity permutation; a reshape, bitcast or broadcast to the same
dims in the same order; a slice of the whole array; a reverse of no dims; a pad by nothing).
This is XLA's rule as XLA applies it to a module it reads from text: its fused computations
hold no dead instructions (its verifier refuses them; gspmdc ignores them), its HLO import
folds no-ops away, and it gives a clamp's scalar bounds the result's shape with broadcasts,
which are not elementwise. Such a fusion is elementwise whatever its fusion kind, and a
parameter may be read any number of times.
"""
from __future__ import annotations

from typing import Mapping

from . import dtypes
from .module import Computation, Instruction
from .ops import ELEMENTWISE
from .shapes import ArrayShape


def is_elementwise_op(inst: Instruction) -> bool:
    """XLA's `IsElementwise` for an instruction that is not a fusion (see the module
    docstring)."""
    if inst.opcode == "bitcast-convert":
        operand = inst.operands[0].shape
        return isinstance(operand, ArrayShape) and isinstance(inst.shape, ArrayShape) and \
            dtypes.bit_width(operand.element_type) == dtypes.bit_width(inst.shape.element_type)
    return inst.opcode in ELEMENTWISE


def is_elementwise_fusion(fusion: Instruction, computations: Mapping[str, Computation]) -> bool:
    """Whether the `fusion` instruction is elementwise (see the module docstring)."""
    fused = computations[fusion.attr("calls").name]
    return all(inst.opcode in ("parameter", "constant") or _elementwise_fused(inst)
               for inst in live_fused_instructions(fused))


def live_fused_instructions(fused: Computation) -> list[Instruction]:
    """The instructions of `fused` its root depends on, in computation order, no-ops
    (`is_no_op`) left out: a no-op's users read its operand 0 (`skip_no_ops`)."""
    live: set[Instruction] = set()
    stack = [skip_no_ops(fused.root)]
    while stack:
        inst = stack.pop()
        if inst in live:
            continue
        live.add(inst)
        stack.extend(skip_no_ops(op) for op in inst.operands)
    return [inst for inst in fused.instructions if inst in live]


def skip_no_ops(inst: Instruction) -> Instruction:
    """`inst`, or the value a chain of no-ops starting at `inst` returns unchanged."""
    while is_no_op(inst):
        inst = inst.operands[0]
    return inst


def is_no_op(inst: Instruction) -> bool:
    """Whether `inst` returns its operand 0 unchanged: same shape, and an identity transpose,
    a reshape, bitcast or in-order broadcast to the same dims, a whole slice, a reverse of no
    dims or a pad by nothing."""
    if not inst.operands or not isinstance(inst.shape, ArrayShape):
        return False
    operand = inst.operands[0].shape
    if not isinstance(operand, ArrayShape) or operand.dims != inst.shape.dims or \
            operand.element_type != inst.shape.element_type:
        return False
    opcode, rank = inst.opcode, inst.shape.rank
    if opcode in ("reshape", "bitcast"):
        return True
    if opcode in ("transpose", "broadcast"):
        return tuple(inst.attr("dimensions")) == tuple(range(rank))
    if opcode == "reverse":
        return not inst.attr("dimensions")
    if opcode == "slice":
        return all(d.start == 0 and d.limit == size and d.stride == 1
                   for d, size in zip(inst.attr("slice"), inst.shape.dims))
    if opcode == "pad":
        return all(p.low == 0 and p.high == 0 and p.interior == 0 for p in inst.attr("padding"))
    return False


def _elementwise_fused(inst: Instruction) -> bool:
    if inst.opcode == "clamp":
        return all(op.shape.dims == inst.shape.dims for op in inst.operands)
    return is_elementwise_op(inst)


__all__ = ["is_elementwise_op", "is_elementwise_fusion", "live_fused_instructions",
           "skip_no_ops", "is_no_op"]
