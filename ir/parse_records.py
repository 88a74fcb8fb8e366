"""The records a parse produces: plain values between the text and the IR.

The grammar callbacks (`grammar_callbacks.py`) and the fast reader (`fast_reader.py`) both turn
HLO text into these records; `module_builder.py` builds the IR from them. Records keep the
tokens that errors point at (names, opcodes, attribute names), so a problem found while
building is still reported at its file:line:col. Typed attribute values are final except
`Word` (a bare word, typed by the attribute it belongs to) and `Value` (a generic value whose
verbatim text is its `Span` of the source).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lark import Token

from .attributes import KeyValueList
from .shapes import Shape
from .sharding import ShardGroup

class Word(str):
    """A bare word value (`GT`, `%add`), typed later by the attribute it belongs to."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Span:
    """A piece of the source kept verbatim (a RawAttr once the text is at hand)."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Value:
    """A generic attribute value: `typed` is the Python value when the text is a plain scalar or a
    brace list of them nested at most `limits.MAX_TUPLE_DEPTH` levels (None otherwise: the value
    stays verbatim); `span` covers the value's text; `depth` is its brace nesting."""

    typed: Any
    span: Span
    token: Token
    depth: int = 0


@dataclass(frozen=True, slots=True)
class Attr:
    """One `name=value` attribute of an instruction."""

    name: str
    value: Any          # typed value, Value (generic), or Span
    token: Token        # where errors about the attribute point


@dataclass(frozen=True, slots=True)
class MeshSplit:
    """`{mesh_split=[...]}`: per tensor dim, the mesh axes splitting it (lowered with the mesh)."""

    dims: tuple[tuple[str, ...], ...]
    metadata: tuple[KeyValueList, ...]
    shard_group: ShardGroup | None
    token: Token


@dataclass(frozen=True, slots=True)
class MeshTuple:
    """A tuple sharding with at least one `MeshSplit` element."""

    elements: tuple
    token: Token


@dataclass(frozen=True, slots=True)
class Lit:
    """A constant literal before it meets its shape: kind `text` (array/scalar token),
    `elided`, `list` (brace group) or `tuple` (paren group)."""

    kind: str
    token: Token
    items: tuple = ()


@dataclass(slots=True)
class InstructionText:
    """One instruction as written: operands are still names, the shape may be omitted."""

    root: Token | None
    name: Token
    shape: Shape | None
    opcode: Token
    operands: list       # [(shape prefix | None, name token)]
    attrs: list          # [Attr]
    parameter_number: int | None = None
    literal: Lit | None = None


@dataclass(slots=True)
class ComputationText:
    """One computation as written: its ENTRY mark, name, optional signature and instructions."""

    entry: Token | None
    name: Token
    signature: tuple | None     # (LPAR token, [(name token, shape)], result shape)
    instructions: list
    execution_thread: str | None


@dataclass(slots=True)
class ModuleText:
    """A whole module as written: header name and attributes, stack-frame tables, computations."""

    name: Token | None = None
    header: list = field(default_factory=list)      # [(name token, name, value)]
    frame_index: Span | None = None
    computations: list = field(default_factory=list)


def name_of(token: Token) -> str:
    """An instruction/computation name as kept in the IR (without the optional `%`)."""
    value = token.value
    return value[1:] if value.startswith("%") else value


def literal_node(child) -> Lit:
    """A literal record for a child of a literal rule (a token or an already built record)."""
    if isinstance(child, Lit):
        return child
    return Lit("elided" if child.type == "ELIDED" else "text", child)
