"""Where bf16 results are rounded: the two semantics of the interpreter.

HLO gives every instruction an element type, and the literal reading rounds every bf16 result to
bf16. XLA's CPU backend computes bf16 arithmetic in f32 and, with its default
`--xla_allow_excess_precision=true`, hands some consumers the f32 value before it is rounded.
`evaluate(..., rounding=...)` (and `gspmdc eval/run --rounding`) chooses between

- `"xla"` (the default): XLA:CPU with its default flags. A `convert` to f32 reads the f32 value of
  the bf16 instruction producing its operand when XLA:CPU computes that instruction in f32 as it
  is written (`computed_in_f32`); so does a bf16 `all-reduce` or `reduce-scatter`, which XLA:CPU
  performs in f32. Every other consumer, the root included, reads the rounded bf16 value.
- `"per-op"`: every result is rounded to its type; XLA:CPU under
  `--xla_allow_excess_precision=false`.

Common to both: bf16/f16 dots and convolutions accumulate in f32 and round once; bf16
all-reduces and reduce-scatters sum in f32 and round once (`kernels/collective_ops.py`);
bf16/f16 `reduce` and `reduce-window` round after every step of their reducer, in XLA:CPU's order
(`kernels/narrow_reduction.py`). `docs/design/bf16-rounding.md` explains where these rules come
from in XLA.

A computation's plan (`interpreter._Plan`) asks `unrounded_readers` which instructions to evaluate
in f32 (`unrounded`, an f32 copy of the instruction run by the same kernel) and which of their
users read that value; the other users get it rounded (`round_to_bf16`).
"""
from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir import ops
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.shapes import ArrayShape

from .options import ROUNDINGS

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)

#: bf16 elementwise ops whose f32 result can differ from its rounding (the catalogue's `ROUNDED`
#: trait; the others, e.g. maximum, negate, floor, select, give bf16 values in f32 too)
_ARITHMETIC = ops.with_trait(ops.Trait.ROUNDED)

#: consumers XLA:CPU gives an f32 operand (a convert to f32 also qualifies)
_F32_COLLECTIVES = ops.opcodes("all-reduce", "reduce-scatter")


def check_rounding(rounding: str) -> str:
    """`rounding` if it names a semantics, else a GspmdcError listing them."""
    if rounding not in ROUNDINGS:
        raise GspmdcError(f"unknown rounding {rounding!r}; expected one of {', '.join(ROUNDINGS)}")
    return rounding


def computed_in_f32(inst: Instruction) -> bool:
    """Whether XLA:CPU computes the bf16 array result of `inst` in f32 and rounds it afterwards,
    with nothing in between: arithmetic elementwise ops, convolutions, and dots it keeps as
    written. It rewrites a dot with more than one contracting dimension, more than one free
    dimension in an operand, batch dimensions not leading, or a batch dimension of size 1 into
    reshapes around another dot before it changes types, and a reshape of a bf16 value rounds."""
    shape = inst.shape
    if not isinstance(shape, ArrayShape) or shape.element_type != "bf16":
        return False
    if inst.opcode in _ARITHMETIC or inst.opcode == "convolution":
        return True
    return inst.opcode == "dot" and _dot_kept_as_written(inst)


def _dot_kept_as_written(inst: Instruction) -> bool:
    if len(inst.operands) != 2:
        return False
    lhs_batch = tuple(inst.attr("lhs_batch_dims", ()))
    rhs_batch = tuple(inst.attr("rhs_batch_dims", ()))
    lhs_rank, rhs_rank = (len(op.shape.dims) for op in inst.operands)
    if any(inst.operands[0].shape.dims[d] == 1 for d in lhs_batch):
        return False
    return (_canonical_operand(lhs_rank, inst.attr("lhs_contracting_dims", ()), lhs_batch)
            and _canonical_operand(rhs_rank, inst.attr("rhs_contracting_dims", ()), rhs_batch))


def _canonical_operand(rank: int, contracting, batch: tuple) -> bool:
    return len(contracting) == 1 and rank <= len(batch) + 2 and batch == tuple(range(len(batch)))


def reads_f32(user: Instruction) -> bool:
    """Whether XLA:CPU gives `user` its bf16 operands in f32: a convert to f32, a bf16
    all-reduce or reduce-scatter."""
    if user.opcode == "convert":
        return isinstance(user.shape, ArrayShape) and user.shape.element_type == "f32"
    return user.opcode in _F32_COLLECTIVES


def unrounded_readers(comp: Computation) -> dict[Instruction, frozenset[Instruction]]:
    """Under `"xla"` rounding: `{producer: users reading its f32 value}` for the instructions of
    `comp` computed in f32 that have such users."""
    readers: dict[Instruction, set[Instruction]] = {}
    for user in comp.instructions:
        if reads_f32(user):
            for op in user.operands:
                if computed_in_f32(op):
                    readers.setdefault(op, set()).add(user)
    return {producer: frozenset(users) for producer, users in readers.items()}


Kernel = Callable[[Instruction, list, Any], Any]


def unrounded(kernel: Kernel, inst: Instruction) -> Kernel:
    """A kernel computing `inst` (computed in f32) without the final rounding: `kernel` run on an
    f32 copy of `inst` with its bf16 operands in f32, which is how the bf16 kernels compute."""
    wide = Instruction(inst.name, inst.opcode, inst.shape.with_element_type("f32"),
                       inst.operands, inst.attrs)

    def run(_inst, args, ctx):
        return kernel(wide, [a.astype(_F32) if a.dtype == _BF16 else a for a in args], ctx)
    return run


def round_to_bf16(_inst, args, _ctx) -> np.ndarray:
    """The kernel of the rounding that follows an unrounded instruction for its other users."""
    return args[0].astype(_BF16)
