"""Helpers for the interpreter and kernel tests: evaluate one instruction on given arrays, or a
module written as HLO text. Both go through `evaluate`, so results are checked against the
instruction's shape and dtype."""
from __future__ import annotations

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, Shape
from gspmdc.runtime.interpreter import evaluate


def array_shape(value: np.ndarray) -> ArrayShape:
    return ArrayShape(dtypes.element_type_of(value.dtype), tuple(value.shape))


def single_op(opcode: str, shape: Shape | tuple[str, tuple[int, ...]], args, *, literal=None,
              **attrs):
    """Evaluate `opcode(p0, p1, ...)` with result `shape` (a Shape or (element type, dims)) on
    the arrays `args`, with the given attributes."""
    if not isinstance(shape, Shape.__args__):
        shape = ArrayShape(shape[0], tuple(shape[1]))
    params = [Instruction(f"p{i}", "parameter", array_shape(a), parameter_number=i)
              for i, a in enumerate(args)]
    inst = Instruction("result", opcode, shape, params, attrs, literal=literal)
    module = Module("test", [Computation("main", params + [inst], inst, is_entry=True)], "main")
    return evaluate(module, list(args))


def run_hlo(text: str, *args, **kwargs):
    """Parse an HLO module and evaluate its entry computation on `args`."""
    from gspmdc.ir.parser import parse_module
    return evaluate(parse_module(text), list(args), **kwargs)
