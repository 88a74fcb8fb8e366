"""IR -> HLO text in XLA's canonical style: `print_module`, `print_instruction`, `print_shape`.

Layout of the output:

    HloModule name, attr=value, ...

    <stack-frame tables, when the module kept them>

    %callee (p: f32[]) -> f32[] {
      %p = f32[] parameter(0)
      ROOT %neg = f32[] negate(%p)
    }

    ENTRY %main (x: f32[2]) -> f32[2] {
      ...
    }

Computations in module order (the parser keeps the text order, callees first in XLA dumps), a
derived signature line (parameter names and shapes, result shape, without layouts), one instruction
per line with its result shape always printed (with layout when the IR has one) and operands without
shape prefixes. Attributes come in the order: the opcode's own (IR order), `sharding=`, then
`frontend_attributes`, `control-predecessors`, `metadata`, `backend_config`, then any other
verbatim (RawAttr) ones. Floats are printed with the shortest digits that round-trip per element
type; replica groups in iota form `[G,S]<=[...]T(...)` whenever they are one. The output re-parses
to an identical module (`Module.difference() is None`).
"""
from __future__ import annotations

import re
from typing import Any

from .attributes import (
    STACK_FRAME_INDEX, ComputationRef, ConvDimLabels, Ident, InstructionRef, KeyValueList, Literal,
    PadDim, RawAttr, ReplicaGroups, SliceDim, Window,
)
from .gc_pause import paused_collection
from .literal_text import format_array
from .mesh import Mesh
from .module import Computation, Instruction, Module
from .sdy import SdyAttribute
from .shapes import Shape, TupleShape
from .sharding_algebra import cached
from .tile_assignment import iota_replica_groups

__all__ = ["print_module", "print_computation", "print_instruction", "print_shape",
           "format_attribute"]

#: attributes printed after `sharding=`, in this order (XLA's)
_TRAILING = ("frontend_attributes", "control-predecessors", "metadata", "backend_config")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
#: a character `_quote` escapes: a backslash, a double quote or a control character
_NEEDS_ESCAPE = re.compile(r'[\\"\x00-\x1f]')


def print_module(module: Module) -> str:
    """The whole module as HLO text (ends with a newline; the cyclic garbage collector paused
    meanwhile, `gc_pause`)."""
    with paused_collection():
        return _print_module(module)


def _print_module(module: Module) -> str:
    header = "HloModule " + module.name
    # XLA's order: frontend attributes last
    for name, value in sorted(module.attrs.items(), key=lambda kv: kv[0] == "frontend_attributes"):
        if name != STACK_FRAME_INDEX:
            header += f", {name}={_header_value(value)}"
    parts = [header]
    frames = module.attrs.get(STACK_FRAME_INDEX)
    if frames is not None:
        parts.append(frames.text)
    parts.extend(print_computation(c) for c in module.computations.values())
    return "\n\n".join(parts) + "\n"


def print_computation(comp: Computation) -> str:
    params = ", ".join(f"{p.name}: {print_shape(p.shape.without_layout())}"
                       for p in comp.parameters)
    lines = [f"{'ENTRY ' if comp.is_entry else ''}%{comp.name} ({params}) -> "
             f"{print_shape(comp.root.shape.without_layout())} {{"]
    for inst in comp.instructions:
        lines.append(("  ROOT " if inst is comp.root else "  ") + print_instruction(inst))
    closing = "}"
    if comp.execution_thread is not None:
        closing += f", execution_thread={_quote(comp.execution_thread)}"
    lines.append(closing)
    return "\n".join(lines)


def print_instruction(inst: Instruction) -> str:
    """One instruction line without indentation or `ROOT `: `%name = shape opcode(...), attrs`."""
    if inst.opcode == "parameter":
        args = str(inst.parameter_number)
    elif inst.opcode == "constant":
        args = format_literal(inst.literal, inst.shape)
    else:
        args = ", ".join("%" + o.name for o in inst.operands)
    text = f"%{inst.name} = {print_shape(inst.shape)} {inst.opcode}({args})"
    attrs = inst.attrs
    pieces = [text]
    raw = []
    for n, v in attrs.items():
        if n in _TRAILING:
            continue
        if isinstance(v, RawAttr):
            raw.append(f"{n}={v.text}")
        else:
            pieces.append(f"{n}={format_attribute(n, v)}")
    if inst.sharding is not None:
        pieces.append("sharding=" + _sharding_text(inst.sharding))
    pieces += [f"{n}={format_attribute(n, attrs[n])}" for n in _TRAILING if n in attrs]
    pieces += raw
    return ", ".join(pieces) if len(pieces) > 1 else text


@cached
def _sharding_text(sharding) -> str:
    """A sharding's text, metadata included (made once per distinct value: a model's layers
    repeat a few shardings)."""
    return sharding.to_text()


def print_shape(shape: Shape) -> str:
    """`f32[8,16]{1,0}`, `(f32[2], s32[])`, `token[]`."""
    return str(shape)


# ---------------------------------------------------------------------------------- values

def format_attribute(name: str, value: Any) -> str:
    """The text of one attribute value (`name` decides the spelling of empty `padding`)."""
    kind = type(value)
    if kind is tuple and value and name != "padding" and all(type(v) is int for v in value):
        return "{" + ",".join(map(str, value)) + "}"        # dims lists: the common case
    if kind is int:
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Ident)):
        return str(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, (ComputationRef, InstructionRef)):
        return "%" + value.name
    if isinstance(value, RawAttr):
        return value.text
    if isinstance(value, Window):
        return _window(value)
    if isinstance(value, ConvDimLabels):
        return str(value)
    if isinstance(value, ReplicaGroups):
        return _replica_groups(value)
    if isinstance(value, KeyValueList):
        return _key_values(value)
    if isinstance(value, tuple):
        if name == "padding" or (value and isinstance(value[0], PadDim)):
            return _padding(value)
        if value and isinstance(value[0], SliceDim):
            return "{" + ", ".join(_slice_dim(d) for d in value) + "}"
        separator = ", " if value and isinstance(value[0], (ComputationRef, InstructionRef)) else ","
        return "{" + separator.join(format_attribute(name, v) for v in value) + "}"
    raise TypeError(f"attribute {name}: no text form for {type(value).__name__} {value!r}")


def format_literal(literal: Literal, shape: Shape) -> str:
    """The text inside `constant(...)`."""
    if literal.elided:
        return "{...}"
    if isinstance(shape, TupleShape):
        return "(" + ", ".join(format_literal(lit, s)
                               for lit, s in zip(literal.elements, shape.elements)) + ")"
    return format_array(literal.value, shape.element_type)


def _quote(value: str) -> str:
    """A C-escaped double-quoted string (control characters as 3-digit octal escapes)."""
    if _NEEDS_ESCAPE.search(value) is None:
        return f'"{value}"'
    return '"' + "".join(_ESCAPES.get(c) or (f"\\{ord(c):03o}" if c < " " else c)
                         for c in value) + '"'


def _header_value(value: Any) -> str:
    return value.to_text() if isinstance(value, Mesh) else format_attribute("", value)


def _window(window: Window) -> str:
    dims = window.dims
    if not dims:
        return "{}"

    def column(values, default) -> str | None:
        return None if all(v == default for v in values) else "x".join(map(str, values))

    fields = [("size", "x".join(str(d.size) for d in dims)),
              ("stride", column([d.stride for d in dims], 1)),
              ("pad", None if all(d.padding_low == d.padding_high == 0 for d in dims)
               else "x".join(f"{d.padding_low}_{d.padding_high}" for d in dims)),
              ("lhs_dilate", column([d.base_dilation for d in dims], 1)),
              ("rhs_dilate", column([d.window_dilation for d in dims], 1)),
              ("rhs_reversal", column([int(d.window_reversal) for d in dims], 0))]
    return "{" + " ".join(f"{k}={v}" for k, v in fields if v is not None) + "}"


def _padding(dims: tuple[PadDim, ...]) -> str:
    interior = any(d.interior for d in dims)
    return "x".join(f"{d.low}_{d.high}" + (f"_{d.interior}" if interior else "") for d in dims)


def _slice_dim(d: SliceDim) -> str:
    return f"[{d.start}:{d.limit}" + (f":{d.stride}]" if d.stride != 1 else "]")


@cached
def _replica_groups(groups: ReplicaGroups) -> str:
    """The text of replica groups: the iota form when one matches (found once per distinct
    groups: every layer's collectives repeat the same few)."""
    array = groups.as_array()
    if array is not None:
        iota = iota_replica_groups(array)
        if iota is not None:
            reshape_dims, perm = iota
            text = f"[{array.shape[0]},{array.shape[1]}]<=[{','.join(map(str, reshape_dims))}]"
            if len(reshape_dims) > 1:
                text += f"T({','.join(map(str, perm))})"
            return text
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups.groups) + "}"


def _key_values(kv: KeyValueList) -> str:
    return "{" + kv.separator.join(f"{k}={_kv_value(v)}" for k, v in kv.items) + "}"


def _kv_value(value: Any) -> str:
    if isinstance(value, SdyAttribute):
        return value.kv_text()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, RawAttr):
        return value.text
    if isinstance(value, Ident):
        return str(value)
    if isinstance(value, str):
        return _quote(value)
    return str(value)

