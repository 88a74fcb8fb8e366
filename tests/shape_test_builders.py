"""Small builders of IR objects for tests that must not depend on the parser.

`S("f32[4,8]")`, `S("(f32[2], (s32[], pred[]))")` build shapes; `param`, `op` build instructions;
`scalar_computation` builds reducers/comparators; `module_of` wraps computations into a module.
"""
from __future__ import annotations

import re

from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

_ARRAY = re.compile(r"\s*([a-z0-9]+)\[([0-9,]*)\](?:\{[^}]*\})?")


def S(text: str) -> Shape:
    shape, rest = _shape(text)
    assert not rest.strip(), f"trailing text {rest!r}"
    return shape


def _shape(text: str) -> tuple[Shape, str]:
    text = text.lstrip()
    if text.startswith("("):
        elements, text = [], text[1:].lstrip()
        while not text.startswith(")"):
            element, text = _shape(text)
            elements.append(element)
            text = text.lstrip().removeprefix(",").lstrip()
        return TupleShape(tuple(elements)), text[1:]
    m = _ARRAY.match(text)
    assert m, f"bad shape text {text!r}"
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    return ArrayShape(m.group(1), dims), text[m.end():]


_counter = iter(range(10 ** 9))


def param(shape: str, number: int = 0, name: str | None = None) -> Instruction:
    return Instruction(name or f"p{number}", "parameter", S(shape), parameter_number=number)


def op(opcode: str, *operands: Instruction, shape: str | None = None, name: str | None = None,
       **attrs) -> Instruction:
    """An instruction; `shape=None` leaves the result shape omitted. Attribute names are HLO's."""
    return Instruction(name or f"{opcode}.{next(_counter)}", opcode,
                       S(shape) if shape is not None else None, operands, attrs)


def computation(name: str, params: list[Instruction], body: list[Instruction],
                root: Instruction | None = None) -> Computation:
    instructions = params + body
    return Computation(name, instructions, root or instructions[-1])


def scalar_computation(name: str, opcode: str, types: list[str], **attrs) -> Computation:
    """`ROOT = opcode(p0, p1, ...)` over scalars of the given types (shape inferred by hand:
    compare gives pred, everything else the first parameter's type)."""
    params = [param(f"{t}[]", i, f"{name}.p{i}") for i, t in enumerate(types)]
    result = "pred[]" if opcode == "compare" else f"{types[0]}[]"
    root = op(opcode, *params, shape=result, name=f"{name}.root", **attrs)
    return computation(name, params, [root])


def module_of(*computations: Computation, entry: str | None = None,
              **attrs) -> Module:
    comps = list(computations)
    entry_name = entry or comps[-1].name
    for c in comps:
        c.is_entry = c.name == entry_name
    return Module("test", comps, entry_name, attrs)
