"""HLO text -> IR: `parse_module`, `parse_file`, `parse_shape`, `parse_sharding`.

The syntax is XLA's HLO text as specified in gspmd-algorithms.md §1 (grammar in `grammar.lark`),
plus gspmdc's named-mesh notation:

* header attribute `mesh={x=2, y=4}` (axis name = size, major to minor), optionally ending with
  `devices=[0,2,4,6,1,3,5,7]` (explicit device order, row-major over the mesh);
* instruction sharding `sharding={mesh_split=[x, _, (y,z)]}`: one entry per tensor dim, an axis
  name, `_` for an unsplit dim, or `(a,b)` for several axes major-to-minor; mesh axes not named are
  replicated. It is lowered at parse time to the standard tiled sharding via `Mesh.sharding`.

Parsing is one LALR pass whose callbacks (`_Records`) turn the text into plain records with typed
attribute values, then `_ModuleBuilder` builds the IR in three steps: computations and
instructions (operands resolved in SSA order), computation references, then omitted result shapes
inferred callee-first (`shape_inference.infer_shape`) with operand shape prefixes checked and
literals materialised from the (possibly inferred) result shapes. Every error, syntactic or
semantic, is an `HloSyntaxError` located at `file:line:col` with the source line and a caret.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.parsers.lalr_analysis import Shift

from gspmdc.errors import GspmdcError, HloSyntaxError, ShardingError

from . import dtypes, limits
from .attributes import (
    COMPUTATION_ATTRIBUTES, ComputationRef, ConvDimLabels, Ident, InstructionRef, KeyValueList,
    Literal, PadDim, RawAttr, ReplicaGroups, SliceDim, Window, WindowDim,
)
from .literal_text import LiteralTextError, parse_array, parse_values
from .mesh import Mesh
from .module import Computation, Instruction, Module
from .sdy import PREFIX as SDY_PREFIX
from .sdy_read import SdyPositionError, SdyReader
from .shapes import ArrayShape, Shape, TupleShape, compatible
from .sharding import HloSharding, ShardGroup
from .sharding_algebra import cached
from .tile_assignment import TileAssignment

__all__ = ["parse_module", "parse_file", "parse_shape", "parse_sharding", "STACK_FRAME_INDEX"]

#: Module.attrs key under which XLA's stack-frame tables (FileNames, FunctionNames, FileLocations,
#: StackFrames; printed between the header and the computations) are kept verbatim as a RawAttr.
STACK_FRAME_INDEX = "stack_frame_index"

_HEADER_INTS = frozenset({"num_partitions", "replica_count"})
_HEADER_BOOLS = frozenset({"is_scheduled"})
_HEADER_BOOL_LISTS = frozenset({"allow_spmd_sharding_propagation_to_parameters",
                                "allow_spmd_sharding_propagation_to_output"})
_KV_DEFAULT_SEPARATOR = {"metadata": " ", "frontend_attributes": ", "}
_SINGLE_KINDS = {"REPLICATED": "replicated", "MANUAL": "manual", "UNKNOWN": "unknown",
                 "UNREDUCED": "unreduced", "MAXIMAL": "maximal"}
_ARRAY_SHAPE = re.compile(r"(\w+)\[([^\]]*)\]\s*(?:\{([^{}]*)\})?", re.S)
_KV_ITEM = re.compile(r'([A-Za-z_][\w.\-]*)=("(?:[^"\\]|\\.)*"|[^\s,{}"=]+)')
_INT = re.compile(r"-?\d+")
_NAME = re.compile(r"%?[A-Za-z_][\w.\-]*")
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


# ==================================================================================== errors

class _Problem(Exception):
    """An error at a known position, raised while parsing; `parse_module` adds file and line."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def _at(token: Token, message: str) -> _Problem:
    return _Problem(message, token.line, token.column)


def _error(problem: _Problem, text: str, filename: str) -> HloSyntaxError:
    lines = text.splitlines()
    source = lines[problem.line - 1] if 0 < problem.line <= len(lines) else None
    return HloSyntaxError(problem.message, filename=filename, line=problem.line,
                          column=problem.column, source_line=source)


#: readable descriptions of the regex terminals of grammar.lark (string terminals print as quoted)
_TERMINAL_TEXT = {
    "NAME": "a name", "OPCODE": "an opcode", "PARAMETER": "'parameter'", "CONSTANT": "'constant'",
    "ATTR_NAME": "an attribute (name=value)", "ARRAY_SHAPE": "a shape such as f32[8]",
    "INT": "an integer", "STRING": "a quoted string",
    "QUOTED": "a quoted axis name such as 'x'", "WORD": "a value",
    "PAD": "padding such as 0_0x1_1",
    "DXD": "sizes such as 3x3", "DIM_LABELS": "dimension labels such as b01f_01io->b01f",
    "COMMA_DEVICE_IDS": "', device_ids='", "KV_FLAT": "{key=value ...}", "ELIDED": "'{...}'", "ARRAY_LITERAL": "an array literal",
    "LIT_SCALAR": "a literal value", "FRAME_SECTION": "a stack frame table",
    "$END": "end of input",
}


def _expected_text(names, lark: Lark) -> str:
    names = set(names or ())
    if "ATTR_NAME" in names:   # the `name=` keywords are attribute names too
        names = {n for n in names if not _terminal_pattern(lark, n).endswith("=")} | {"ATTR_NAME"}
    if "OPCODE" in names:
        names -= {"PARAMETER", "CONSTANT"}
    texts = sorted({_TERMINAL_TEXT.get(n) or f"'{_terminal_pattern(lark, n)}'" for n in names})
    if not texts:
        return "nothing"
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " or " + texts[-1]


def _terminal_pattern(lark: Lark, name: str) -> str:
    try:
        return lark.get_terminal(name).pattern.value
    except KeyError:
        return name


def _syntax_problem(e: UnexpectedInput, text: str, lark: Lark) -> _Problem:
    """The located `expected X, found Y` problem for one of lark's exceptions."""
    candidates = e.allowed if isinstance(e, UnexpectedCharacters) else e.expected
    expected = _expected_text(_viable(e.state, candidates), lark)
    position = e.pos_in_stream
    if position is not None and text.startswith("/*", position):
        return _Problem("unterminated /* comment", e.line, e.column)
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        found = e.token.value if len(e.token.value) <= 40 else e.token.value[:37] + "..."
        return _Problem(f"expected {expected}, found '{found}'", e.token.line, e.token.column)
    if isinstance(e, UnexpectedCharacters):
        found = text[position]
        found = "end of line" if found == "\n" else f"'{found}'"
        return _Problem(f"expected {expected}, found {found}", e.line, e.column)
    return _Problem(f"expected {expected}, found end of input", *_end_position(text))


def _viable(parser_state, candidates) -> set[str]:
    """The candidate terminals the parser would really shift from `parser_state` (LALR's merged
    states announce lookaheads of other contexts too; this replays the reductions on a copy of
    the state stack, without callbacks, to keep only the real ones)."""
    candidates = set(candidates or ())
    stack = getattr(parser_state, "state_stack", None)
    if stack is None:
        return candidates
    states = parser_state.parse_conf.states
    viable = set()
    for terminal in candidates:
        trial = list(stack)
        while True:
            step = states[trial[-1]].get(terminal)
            if step is None:
                break
            action, arg = step
            if action is Shift:
                viable.add(terminal)
                break
            if arg.expansion:
                del trial[-len(arg.expansion):]
            trial.append(states[trial[-1]][arg.origin.name][1])
    return viable or candidates


def _end_position(text: str) -> tuple[int, int]:
    end = len(text.rstrip())
    return text.count("\n", 0, end) + 1, end - text.rfind("\n", 0, end)


# ==================================================================================== records

class _Word(str):
    """A bare word value (`GT`, `%add`), typed later by the attribute it belongs to."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class _Span:
    """A piece of the source kept verbatim (a RawAttr once the text is at hand)."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Value:
    """A generic attribute value: `typed` is the Python value when the text is a plain scalar or a
    brace list of them nested at most `limits.MAX_TUPLE_DEPTH` levels (None otherwise: the value
    stays verbatim); `span` covers the value's text; `depth` is its brace nesting."""

    typed: Any
    span: _Span
    token: Token
    depth: int = 0


@dataclass(frozen=True, slots=True)
class _Attr:
    name: str
    value: Any          # typed value, _Value (generic), or _Span
    token: Token        # where errors about the attribute point


@dataclass(frozen=True, slots=True)
class _MeshSplit:
    """`{mesh_split=[...]}`: per tensor dim, the mesh axes splitting it (lowered with the mesh)."""

    dims: tuple[tuple[str, ...], ...]
    metadata: tuple[KeyValueList, ...]
    shard_group: ShardGroup | None
    token: Token


@dataclass(frozen=True, slots=True)
class _MeshTuple:
    """A tuple sharding with at least one `_MeshSplit` element."""

    elements: tuple
    token: Token


@dataclass(frozen=True, slots=True)
class _Lit:
    """A constant literal before it meets its shape: kind `text` (array/scalar token),
    `elided`, `list` (brace group) or `tuple` (paren group)."""

    kind: str
    token: Token
    items: tuple = ()


@dataclass(slots=True)
class _InstructionText:
    root: Token | None
    name: Token
    shape: Shape | None
    opcode: Token
    operands: list       # [(shape prefix | None, name token)]
    attrs: list          # [_Attr]
    parameter_number: int | None = None
    literal: _Lit | None = None


@dataclass(slots=True)
class _ComputationText:
    entry: Token | None
    name: Token
    signature: tuple | None     # (LPAR token, [(name token, shape)], result shape)
    instructions: list
    execution_thread: str | None


@dataclass(slots=True)
class _ModuleText:
    name: Token | None = None
    header: list = field(default_factory=list)      # [(name token, name, value)]
    frame_index: _Span | None = None
    computations: list = field(default_factory=list)


def _name(token: Token) -> str:
    """An instruction/computation name as kept in the IR (without the optional `%`)."""
    value = token.value
    return value[1:] if value.startswith("%") else value


def _unquote(token: str) -> str:
    """The value of a C-escaped double-quoted string token."""
    body = token[1:-1]
    if "\\" not in body:
        return body
    return _ESCAPE.sub(_unescape_one, body)


def _unescape_one(match: re.Match) -> str:
    code = match.group(1)
    if code[0] == "x":
        return chr(int(code[1:], 16))
    if code[0] in "01234567":
        return chr(int(code, 8))
    return _SIMPLE_ESCAPES.get(code, code)


def _ints(text: str, separator: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(separator))


# ==================================================================================== callbacks

class _Records(Transformer):
    """LALR callbacks: one method per grammar rule/alias, building records and typed values.
    Stateless (one shared instance serves every parse); positions come from the tokens."""

    # ---- module structure ---------------------------------------------------------------------

    def start(self, children):
        module = _ModuleText()
        for child in children:
            if isinstance(child, _ComputationText):
                module.computations.append(child)
            elif isinstance(child, _Span):
                module.frame_index = child
            else:
                module.name, module.header = child
        return module

    def shape_text(self, children):
        return children[0]

    def sharding_text(self, children):
        return children[0]

    def header(self, children):
        return children[0], children[1:]

    def header_mesh(self, children):
        return children[0], "mesh", children[1]

    def header_kv(self, children):
        token, value = children
        return token, "frontend_attributes", value

    def header_generic(self, children):
        token, value = children
        return token, token.value[:-1], value

    def mesh_spec(self, children):
        brace, axes, device_ids = children[0], children[1:], None
        if len(axes) >= 2 and isinstance(axes[-2], Token):     # `devices=` [ids]
            device_ids, axes = axes[-1], axes[:-2]
        try:
            return Mesh(tuple(a for a, _ in axes), tuple(s for _, s in axes), device_ids)
        except (ShardingError, ValueError) as e:
            raise _at(brace, f"invalid mesh: {e}") from None

    def mesh_axis(self, children):
        return children[0].value[:-1], int(children[1])

    def frame_index(self, children):
        return _Span(children[0].start, children[-1].end)

    def frame_section(self, children):
        end = children[-1] if len(children) > 1 else children[0].end_pos
        return _Span(children[0].start_pos, end)

    def frame_entry(self, children):
        last = children[-1]
        return last.span.end if isinstance(last, _Value) else last.end_pos

    def computation(self, children):
        entry = children[0] if children[0].type == "ENTRY" else None
        rest = children[1:] if entry is not None else children
        name, signature, instructions = rest[0], None, []
        thread = None
        for child in rest[1:]:
            if isinstance(child, _InstructionText):
                instructions.append(child)
            elif isinstance(child, tuple):
                signature = child
            elif child.type == "ATTR_NAME":
                if child.value != "execution_thread=":
                    raise _at(child, f"expected 'execution_thread=' after a computation, "
                                     f"found '{child.value}'")
            else:
                thread = _unquote(child.value)
        return _ComputationText(entry, name, signature, instructions, thread)

    def signature(self, children):
        return children[0], children[1:-1], children[-1]

    def param(self, children):
        return children[0], children[1]

    def instruction(self, children):
        root = children[0] if children[0].__class__ is Token and children[0].type == "ROOT" else None
        i = 1 if root is not None else 0
        name = children[i]
        shape = children[i + 1] if isinstance(children[i + 1], (ArrayShape, TupleShape)) else None
        op_index = i + 2 if shape is not None else i + 1
        kind, opcode, payload = children[op_index]
        inst = _InstructionText(root, name, shape, opcode, [], children[op_index + 1:])
        if kind == "parameter":
            inst.parameter_number = payload
        elif kind == "constant":
            inst.literal = payload
        else:
            inst.operands = payload
        return inst

    def op_parameter(self, children):
        return "parameter", children[0], int(children[1])

    def op_constant(self, children):
        return "constant", children[0], children[1]

    def op_generic(self, children):
        return "op", children[0], children[1:]

    def operand(self, children):
        return (children[0], children[1]) if len(children) == 2 else (None, children[0])

    # ---- shapes -------------------------------------------------------------------------------

    def array_shape(self, children):
        token = children[0]
        try:
            return _array_shape(token.value)
        except _ShapeTextError as e:
            raise _Problem(e.message, *_position(token, e.offset)) from None

    def tuple_shape(self, children):
        shape = TupleShape(tuple(children[1:]))
        problem = _nesting_problem(shape)
        if problem is not None:
            raise _at(children[0], problem)
        return shape

    # ---- literals -----------------------------------------------------------------------------

    def constant_literal(self, children):
        return _literal_node(children[0])

    def literal_list(self, children):
        return _Lit("list", children[0], tuple(_literal_node(c) for c in children[1:]))

    def literal_tuple(self, children):
        return _Lit("tuple", children[0], tuple(_literal_node(c) for c in children[1:]))

    # ---- generic values -----------------------------------------------------------------------

    def value(self, children):
        head = children[0]
        last = children[-1]
        end = last.span.end if isinstance(last, _Value) else last.end_pos
        if isinstance(head, _Value):
            span = _Span(head.span.start, end)
            return _Value(head.typed if len(children) == 1 else None, span, head.token,
                          head.depth)
        typed = _scalar(head) if len(children) == 1 else None
        return _Value(typed, _Span(head.start_pos, end), head)

    def group(self, children):
        opening, closing = children[0], children[-1]
        depth = 1 + max((c.depth for c in children if isinstance(c, _Value)), default=0)
        typed = _brace_list(children[1:-1]) \
            if opening.value == "{" and depth <= limits.MAX_TUPLE_DEPTH else None
        return _Value(typed, _Span(opening.start_pos, closing.end_pos), opening, depth)

    def int_list(self, children):
        return tuple(int(t) for t in children)

    def kv_list(self, children):
        items, comma = [], False
        for child in children[1:]:
            if isinstance(child, tuple):
                items.append(child)
            else:
                comma = True
        separator = ", " if comma else (" " if len(items) > 1 else None)
        return tuple(items), separator

    def kv_flat(self, children):
        token = children[0]
        items = tuple(_kv_item(m.group(1), m.group(2), token.start_pos + m.start(2))
                      for m in _KV_ITEM.finditer(token.value))
        comma = "," in _KV_ITEM.sub("", token.value)
        return items, ", " if comma else (" " if len(items) > 1 else None)

    def kv(self, children):
        key, value = children
        if isinstance(value, _Value):
            return key.value[:-1], value.span
        return _kv_item(key.value[:-1], value.value, value.start_pos)

    # ---- attributes ---------------------------------------------------------------------------

    def attr_generic(self, children):
        token, value = children
        return _Attr(token.value[:-1], value, value.token)

    def attr_sharding(self, children):
        return _Attr("sharding", children[1], children[0])

    def attr_kv(self, children):
        token, (items, separator) = children
        name = token.value[:-1]
        return _Attr(name, (items, separator or _KV_DEFAULT_SEPARATOR[name]), token)

    def attr_control(self, children):
        refs = tuple(InstructionRef(_name(t)) for t in children[1:])
        return _Attr("control-predecessors", refs, children[0])

    def attr_padding(self, children):
        if len(children) == 1:
            return _Attr("padding", (), children[0])
        dims = []
        for part in children[1].value.split("x"):
            numbers = _ints(part, "_")
            if len(numbers) == 3 and numbers[2] < 0:
                raise _at(children[1], f"interior padding must be non-negative, found {part}")
            dims.append(PadDim(*numbers))
        return _Attr("padding", tuple(dims), children[0])

    def attr_dim_labels(self, children):
        token = children[1]
        operands, out = token.value.split("->")
        lhs, rhs = operands.split("_")
        return _Attr("dim_labels", ConvDimLabels(lhs, rhs, out), children[0])

    def attr_window(self, children):
        token, fields = children[0], {}
        for key, value in children[1:]:
            if key.value in fields:
                raise _at(key, f"window field '{key.value}' given twice")
            fields[key.value] = (key, value)
        return _Attr("window", _window(token, fields), token)

    def window_field(self, children):
        return children[0], children[1]

    def attr_slice(self, children):
        return _Attr("slice", tuple(children[1:]), children[0])

    def slice_dim(self, children):
        return SliceDim(*(int(t) for t in children))

    def attr_replica_groups(self, children):
        token, spec = children
        try:
            return _Attr("replica_groups", _replica_groups(spec), token)
        except (ValueError, ShardingError) as e:
            raise _at(token, f"invalid replica groups: {e}") from None

    def groups_explicit(self, children):
        return "explicit", tuple(children)

    def replica_group(self, children):
        return children[0] if children else ()

    def groups_iota(self, children):
        return ("iota",) + children[0]

    def iota_list(self, children):
        return children[0], children[1], (children[2] if len(children) > 2 else None)

    def groups_mesh(self, children):
        axes = [c for c in children if isinstance(c, tuple) and c[0] == "axis"]
        refs = [c for c in children if isinstance(c, tuple) and c[0] == "ref"]
        ids = next((c for c in children if isinstance(c, tuple) and c[0] == "ids"), None)
        return "mesh", [(a[1], a[2]) for a in axes], ids, [r[1:] for r in refs]

    def mesh_axis_size(self, children):
        return "axis", children[0].value[1:-1], int(children[1])

    def device_ids_iota(self, children):
        return "ids", "iota", children[0], (children[1] if len(children) > 1 else None)

    def device_ids_explicit(self, children):
        return "ids", "explicit", children[0], None

    def axis_ref(self, children):
        name = children[0].value[1:-1]
        if len(children) == 1:
            return "ref", name, None, None
        return "ref", name, int(children[1]), int(children[2])

    # ---- shardings ----------------------------------------------------------------------------

    def sharding_single(self, children):
        brace = children[0]
        try:
            return _single_sharding(brace, children[1:])
        except ShardingError as e:
            raise _at(brace, f"invalid sharding: {e}") from None

    def sharding_tuple(self, children):
        brace, elements = children[0], tuple(children[1:])
        if any(isinstance(e, _MeshTuple) or (isinstance(e, HloSharding) and e.is_tuple)
               for e in elements):
            raise _at(brace, "tuple shardings cannot nest")
        if any(isinstance(e, _MeshSplit) for e in elements):
            return _MeshTuple(elements, brace)
        try:
            return HloSharding.tuple(elements)
        except ShardingError as e:
            raise _at(brace, f"invalid sharding: {e}") from None

    def sharding_empty(self, children):
        return HloSharding.tuple(())

    def sharding_device(self, children):
        return "device", int(children[1]), children[0]

    def sharding_explicit(self, children):
        token, dims, ids = children
        try:
            return "tiles", _explicit_tiles(dims, ids), token
        except ShardingError as e:
            raise _at(token, f"invalid sharding: {e}") from None

    def sharding_iota(self, children):
        token, (dims, reshape_dims, perm) = children
        try:
            return "tiles", _iota_tiles(dims, reshape_dims, perm), token
        except ShardingError as e:
            raise _at(token, f"invalid sharding: {e}") from None

    def sharding_subgroups(self, children):
        return "subgroups", tuple(t.value for t in children[1:]), children[0]

    def sharding_group(self, children):
        kind = "as" if children[0].type == "SHARD_AS" else "like"
        return "group", ShardGroup(kind, int(children[1])), children[0]

    def sharding_metadata(self, children):
        token = children[0]
        for items, _ in children[1:]:
            if any(isinstance(v, _Span) for _, v in items):
                raise _at(token, "sharding metadata values must be strings, integers or bools")
        entries = tuple(KeyValueList(items, separator or " ") for items, separator in children[1:])
        return "metadata", entries, token

    def sharding_mesh_split(self, children):
        return "mesh_split", tuple(children[1:]), children[0]

    def mesh_split_dim(self, children):
        names = tuple(_name(t) for t in children)
        return () if names == ("_",) else names


def _scalar(token: Token):
    return _unquote(token.value) if token.type == "STRING" else _word(token.value)


def _word(text: str):
    """The typed value of a bare word: int, bool, a name (`_Word`), or None (kept verbatim)."""
    if _INT.fullmatch(text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return _Word(text) if _NAME.fullmatch(text) else None


def _kv_item(key: str, text: str, start: int) -> tuple:
    """One `key=value` of a metadata / frontend-attributes list: strings, integers and bools are
    typed, anything else is kept verbatim (a span of the source); Shardy's `xla.sdy.*` values stay
    spans until the module builder reads them (`sdy_text.py`)."""
    if key.startswith(SDY_PREFIX):
        return key, _Span(start, start + len(text))
    if text[0] == '"':
        return key, _unquote(text)
    value = _word(text)
    if value is None or isinstance(value, _Word):
        return key, _Span(start, start + len(text))
    return key, value


#: the token types of a plain word inside a `{...}` attribute value (the grammar's group_word)
_GROUP_WORDS = frozenset({"WORD", "NAME", "INT", "ROOT", "ENTRY", "FRAME_SECTION"})


def _brace_list(items: list):
    """The typed tuple for the inside of `{...}` when it is `a, b, ...` of ints, bools and names or
    nested such lists; None when it is anything else."""
    values = []
    expect_item = True
    for item in items:
        if expect_item:
            value = item.typed if isinstance(item, _Value) else \
                _word(item.value) if item.type in _GROUP_WORDS else None
            if value is None:
                return None
            values.append(value)
        elif isinstance(item, _Value) or item.type != "COMMA":
            return None
        expect_item = not expect_item
    if values and expect_item:   # trailing comma
        return None
    return tuple(values)


class _ShapeTextError(Exception):
    """A problem inside an ARRAY_SHAPE token, `offset` characters into it."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.message, self.offset = message, offset


@cached
def _array_shape(text: str) -> ArrayShape:
    """The ArrayShape of an ARRAY_SHAPE token (`f32[8,16]{1,0}`); cached, shapes repeat a lot."""
    element_type, dims_text, layout = _ARRAY_SHAPE.fullmatch(text).groups()
    if element_type in dtypes.EXOTIC_TYPES:
        raise _ShapeTextError(f"element type {element_type} is not supported", 0)
    dims = []
    if dims_text.strip():
        offset = len(element_type) + 1
        for part in dims_text.split(","):
            word = part.strip()
            if word.isascii() and word.isdigit():
                dims.append(int(word))
                if dims[-1] > limits.MAX_SIZE:
                    raise _ShapeTextError(f"dimension size {word} is more than the largest "
                                          f"size, 2^63-1", offset + part.index(word))
            else:
                at = offset + part.index(word) if word else offset
                if word.startswith("<=") or word == "?":
                    raise _ShapeTextError(f"dynamic dimension '{word}' is not supported", at)
                raise _ShapeTextError(f"expected a dimension size, found '{word}'", at)
            offset += len(part) + 1
    problem = limits.size_problem(tuple(dims), dtypes.byte_width(element_type))
    if problem is not None:
        raise _ShapeTextError(f"{text.split('{')[0]}: {problem}", 0)
    return ArrayShape(element_type, tuple(dims), layout)


def _nesting_problem(shape: Shape) -> str | None:
    depth = shape.tuple_depth
    if depth <= limits.MAX_TUPLE_DEPTH:
        return None
    return (f"tuple shapes nest {depth} levels deep here; gspmdc accepts at most "
            f"{limits.MAX_TUPLE_DEPTH}")


def _shape_problem(shape: Shape) -> str | None:
    """Why an inferred shape is beyond the limits of `limits.py`, or None."""
    problems = (limits.size_problem(leaf.dims, dtypes.byte_width(leaf.element_type))
                for leaf in shape.leaves())
    return _nesting_problem(shape) or next((p for p in problems if p is not None), None)


def _position(token: Token, offset: int) -> tuple[int, int]:
    """Line and column of the character `offset` characters into `token`."""
    before = token.value[:offset]
    newlines = before.count("\n")
    if not newlines:
        return token.line, token.column + offset
    return token.line + newlines, offset - before.rfind("\n")


def _literal_node(child) -> _Lit:
    if isinstance(child, _Lit):
        return child
    return _Lit("elided" if child.type == "ELIDED" else "text", child)


def _window(token: Token, fields: dict) -> Window:
    if "size=" not in fields:
        if fields:
            raise _at(token, "window needs a size= field")
        return Window(())
    sizes = _ints(fields["size="][1].value, "x")
    columns = {}
    for key, (key_token, value) in fields.items():
        if key == "pad=":
            numbers = [_ints(p, "_") for p in value.value.split("x")]
            if any(len(n) != 2 for n in numbers):
                raise _at(value, f"window padding must be low_high per dimension, found {value}")
        else:
            numbers = _ints(value.value, "x")
        if len(numbers) != len(sizes):
            raise _at(key_token, f"window field {key} has {len(numbers)} dimensions, "
                                 f"size= has {len(sizes)}")
        columns[key] = numbers
    reversal = columns.get("rhs_reversal=", (0,) * len(sizes))
    if any(r not in (0, 1) for r in reversal):
        raise _at(fields["rhs_reversal="][0], "rhs_reversal values must be 0 or 1")
    dims = []
    for i, size in enumerate(sizes):
        low, high = columns["pad="][i] if "pad=" in columns else (0, 0)
        dims.append(WindowDim(size, columns.get("stride=", (1,) * len(sizes))[i], low, high,
                              columns.get("lhs_dilate=", (1,) * len(sizes))[i],
                              columns.get("rhs_dilate=", (1,) * len(sizes))[i], bool(reversal[i])))
    return Window(tuple(dims))


def _replica_groups(spec) -> ReplicaGroups:
    """Materialise explicit / iota / mesh-axes replica groups (§1.9) as explicit groups."""
    kind = spec[0]
    if kind == "explicit":
        if any(not 0 <= i <= limits.MAX_SIZE for group in spec[1] for i in group):
            raise ValueError("ids must be integers in [0, 2^63-1]")
        return ReplicaGroups(spec[1])
    if kind == "iota":
        _, dims, reshape_dims, perm = spec
        if len(dims) != 2:
            raise ValueError(f"iota replica groups need [num_groups,group_size], got {list(dims)}")
        ta = TileAssignment.iota(dims, reshape_dims, perm)
        return ReplicaGroups.from_array(ta.array)
    _, axes, ids, refs = spec
    return ReplicaGroups.from_array(_mesh_axes_groups(axes, ids, refs))


def _mesh_axes_groups(axes, ids, refs) -> np.ndarray:
    """XLA's mesh-axes replica groups `mesh['a'=4,'b'=2], device_ids=(...) {'a'}`: the devices of
    the mesh (iota or the given device order), grouped along the listed axes (in the listed order;
    `'a':(k)m` is the size-m sub-axis of `a` with k above it); groups ordered by the other axes."""
    names = [n for n, _ in axes]
    sizes = [s for _, s in axes]
    if len(set(names)) != len(names) or min(sizes, default=1) < 1:
        raise ValueError(f"mesh axes must be distinct with positive sizes, got {axes}")
    count = prod(sizes)
    if ids is None:
        devices = np.arange(count)
    elif ids[1] == "iota":
        devices = TileAssignment.iota((count,), ids[2], ids[3]).array
    else:
        devices = TileAssignment.from_array(np.asarray(ids[2], dtype=np.int64), (count,)).array
    expanded, grouped = [], []
    for name, size in axes:
        parts = [(pre, sub) for n, pre, sub in refs if n == name and pre is not None]
        whole = any(n == name and pre is None for n, pre, _ in refs)
        if not parts:
            expanded.append((name, None, size))
            continue
        if whole or len(parts) > 1:
            raise ValueError(f"axis '{name}' is named more than once in {refs}")
        pre, sub = parts[0]
        if size % (pre * sub):
            raise ValueError(f"sub-axis '{name}':({pre}){sub} does not divide axis size {size}")
        expanded += [(name, "major", pre), (name, (pre, sub), sub), (name, "minor", size // (pre * sub))]
    for name, pre, sub in refs:
        if name not in names:
            raise ValueError(f"axis '{name}' is not an axis of the mesh {names}")
        key = None if pre is None else (pre, sub)
        grouped.append(next(i for i, (n, k, _) in enumerate(expanded) if n == name and k == key))
    shape = [s for _, _, s in expanded]
    others = [i for i in range(len(expanded)) if i not in grouped]
    group_size = prod(shape[i] for i in grouped)
    return devices.reshape(shape).transpose(others + grouped).reshape(count // group_size, group_size)


def _single_sharding(brace: Token, items: list):
    kinds, tiles, device, subgroups = [], None, None, ()
    metadata, shard_group, mesh_split = (), None, None
    seen = set()
    for item in items:
        if isinstance(item, Token):
            key, token = item.type, item
        else:
            key, token = item[0], item[-1]
        if key in seen:
            raise _at(token, f"'{token.value}' given twice in one sharding")
        seen.add(key)
        if isinstance(item, Token):
            if key == "LAST_TILE_DIM_REPLICATE":
                subgroups = ("replicated",)
            else:
                kinds.append(_SINGLE_KINDS[key])
        elif key == "device":
            device = item[1]
        elif key == "tiles":
            tiles = item[1]
        elif key == "subgroups":
            subgroups = item[1]
        elif key == "group":
            shard_group = item[1]
        elif key == "metadata":
            metadata = item[1]
        else:
            mesh_split = item
    if "LAST_TILE_DIM_REPLICATE" in seen and "subgroups" in seen:
        raise _at(brace, "last_tile_dim_replicate and last_tile_dims= exclude each other")
    if mesh_split is not None:
        if kinds or tiles is not None or device is not None or subgroups:
            raise _at(mesh_split[2], "mesh_split= cannot be combined with other sharding forms")
        return _MeshSplit(mesh_split[1], metadata, shard_group, brace)
    if len(kinds) > 1:
        raise _at(brace, f"conflicting sharding kinds {' and '.join(kinds)}")
    kind = kinds[0] if kinds else None
    if kind == "maximal":
        if device is None or tiles is not None or subgroups:
            raise _at(brace, "a maximal sharding takes exactly 'device=N'")
        return HloSharding.maximal(device, metadata, shard_group)
    if device is not None:
        raise _at(brace, "'device=' belongs to a maximal sharding")
    if kind is not None:
        if tiles is not None or subgroups:
            raise _at(brace, f"a {kind} sharding takes no devices or subgroups")
        return getattr(HloSharding, "replicate" if kind == "replicated" else kind)(metadata, shard_group)
    if tiles is None:
        raise _at(brace, "expected a sharding: replicated, manual, maximal, unknown, unreduced, "
                         "devices=[...] or mesh_split=[...]")
    return _tiled_sharding(tiles, subgroups, metadata, shard_group)


# Shardings repeat across a module: with the algebra's cache each distinct one costs a single
# construction.
_explicit_tiles = cached(TileAssignment.explicit)
_iota_tiles = cached(TileAssignment.iota)
_tiled_sharding = cached(HloSharding.tiled)


# ==================================================================================== the parser

_GRAMMAR: list[Lark] = []


def _lark() -> Lark:
    """The compiled grammar, built on first use in a process. lark keeps the LALR tables in a
    file of the temporary directory keyed by the grammar's hash (`cache=True`): loading them
    takes a quarter of building them, which every MPI rank's start-up saves; an unreadable
    cache file is rebuilt."""
    if not _GRAMMAR:
        grammar = resources.files(__package__).joinpath("grammar.lark").read_text()
        _GRAMMAR.append(Lark(grammar, parser="lalr", lexer="contextual", transformer=_Records(),
                             start=["start", "shape_text", "sharding_text"],
                             maybe_placeholders=False, cache=True))
    return _GRAMMAR[0]


def _parse(text: str, filename: str, start: str):
    lark = _lark()
    try:
        try:
            return lark.parse(text, start=start)
        except UnexpectedInput as e:
            raise _syntax_problem(e, text, lark) from None
    except _Problem as problem:
        raise _error(problem, text, filename) from None


def parse_module(text: str, filename: str = "<string>", *, verify: bool = False) -> Module:
    """Parse HLO module text. Raises HloSyntaxError (file:line:col, the line and a caret) for
    malformed text and for semantic errors found while building (undefined names, shape
    mismatches, invalid shardings, uninferable shapes, ...). `verify`: also run the verifier
    (`verifier.verify_module`); its error about an instruction then starts with the
    instruction's file:line:col and shows the line."""
    records = _parse(text, filename, "start")
    builder = _ModuleBuilder(text)
    try:
        module = builder.build(records)
    except _Problem as problem:
        raise _error(problem, text, filename) from None
    except SdyPositionError as e:
        line = text.count("\n", 0, e.offset) + 1
        raise _error(_Problem(e.message, line, e.offset - text.rfind("\n", 0, e.offset)), text,
                     filename) from None
    if verify:
        from .verifier import verify_module
        try:
            verify_module(module)
        except GspmdcError as e:
            record = builder.texts.get(id(e.instruction))
            if record is None:
                raise
            raise _located(e, record.name, text, filename) from None
    return module


def _located(error: GspmdcError, token: Token, text: str, filename: str) -> GspmdcError:
    """`error` (same class) with `file:line:col:` of `token`, the line and a caret."""
    lines = text.splitlines()
    message = f"{filename}:{token.line}:{token.column}: {error}"
    if 0 < token.line <= len(lines):
        message += "\n" + lines[token.line - 1].rstrip("\n") + "\n" + \
            " " * max(token.column - 1, 0) + "^"
    located = type(error)(message)
    located.instruction = error.instruction
    return located


def parse_file(path) -> Module:
    """Parse an HLO text file (errors name the file)."""
    return parse_module(read_source(path), str(path))


def read_source(path) -> str:
    """The text of an HLO file (`-`: standard input), which must be UTF-8: a byte that is not
    is an HloSyntaxError at its line and column; an unreadable file a GspmdcError."""
    import sys
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except OSError as e:
        raise GspmdcError(f"{name}: cannot read: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1:].decode("utf-8", "replace")) + 1
        text = data.decode("utf-8", "replace")
        source = text.splitlines()[line - 1] if text.splitlines() else None
        raise HloSyntaxError(f"not UTF-8 text: byte 0x{data[e.start]:02x}", filename=name,
                             line=line, column=column, source_line=source) from None


def parse_shape(text: str) -> Shape:
    """A shape such as `f32[8,16]{1,0}` or `(f32[2], s32[])`."""
    return _parse(text, "<shape>", "shape_text")


def parse_sharding(text: str) -> HloSharding:
    """A sharding such as `{devices=[2,1]0,1}` (the named-mesh form needs a module's mesh)."""
    sharding = _parse(text, "<sharding>", "sharding_text")
    if isinstance(sharding, (_MeshSplit, _MeshTuple)):
        raise _error(_at(sharding.token, "mesh_split= needs a module with a mesh= header"),
                     text, "<sharding>")
    return sharding


# ==================================================================================== IR building

class _ModuleBuilder:
    """Builds the Module from the parse records (see the module docstring for the steps)."""

    def __init__(self, text: str):
        self.text = text
        self.mesh = None
        self.texts: dict[int, _InstructionText] = {}     # id(Instruction) -> its record
        self.sdy = SdyReader(text)

    def raw(self, span: _Span) -> RawAttr:
        return RawAttr(self.text[span.start:span.end])

    # ---- step 1: header, computations, instructions --------------------------------------------

    def build(self, records: _ModuleText) -> Module:
        attrs = self.header_attrs(records.header)
        if records.frame_index is not None:
            attrs[STACK_FRAME_INDEX] = self.raw(records.frame_index)
        computations, entry = [], None
        names: set[str] = set()
        for comp_text in records.computations:
            name = _name(comp_text.name)
            if name in names:
                raise _at(comp_text.name, f"duplicate computation name '{name}'")
            names.add(name)
            if comp_text.entry is not None:
                if entry is not None:
                    raise _at(comp_text.entry, f"second ENTRY computation '{name}' "
                                               f"(the entry is '{entry}')")
                entry = name
            computations.append(self.computation(comp_text))
        entry = entry or computations[-1].name
        module_name = _name(records.name) if records.name is not None else entry
        module = Module(module_name, computations, entry, attrs)
        module.computations[entry].is_entry = True
        self.check_references(module)
        self.complete_shapes(module, records)
        self.sdy.check(module)
        return module

    def header_attrs(self, header: list) -> dict:
        attrs = {}
        for token, name, value in header:
            if name in attrs:
                raise _at(token, f"header attribute '{name}' given twice")
            if name == "mesh":
                self.mesh = attrs[name] = value
                continue
            if name == "frontend_attributes":
                items, separator = value
                attrs[name] = KeyValueList(tuple(
                    (k, self.sdy.header_value(k, v.start, v.end) if k.startswith(SDY_PREFIX) else
                     self.raw(v) if isinstance(v, _Span) else v) for k, v in items),
                    separator or ", ")
                continue
            typed = value.typed
            if name in _HEADER_INTS:
                if type(typed) is not int or not 1 <= typed <= limits.MAX_SIZE:
                    raise _at(value.token, f"{name} must be a positive integer (at most "
                                           f"2^63-1)")
            elif name in _HEADER_BOOLS:
                if type(typed) is not bool:
                    raise _at(value.token, f"{name} must be true or false")
            elif name in _HEADER_BOOL_LISTS:
                if not (type(typed) is bool or (isinstance(typed, tuple)
                                                and all(type(v) is bool for v in typed))):
                    raise _at(value.token, f"{name} must be a bool or a list of bools")
            else:
                typed = self.raw(value.span)
            attrs[name] = typed
        mesh, partitions = attrs.get("mesh"), attrs.get("num_partitions")
        if mesh is not None and partitions is not None and mesh.num_devices != partitions:
            token = next(t for t, n, _ in header if n == "mesh")
            raise _at(token, f"the mesh has {mesh.num_devices} devices but num_partitions="
                             f"{partitions}")
        return attrs

    def computation(self, comp_text: _ComputationText) -> Computation:
        all_names = {_name(t.name) for t in comp_text.instructions}
        defined: dict[str, Instruction] = {}
        instructions, root = [], None
        for text in comp_text.instructions:
            name = _name(text.name)
            if name in defined:
                raise _at(text.name, f"duplicate instruction name '{name}' in computation "
                                     f"'{_name(comp_text.name)}'")
            operands = []
            for _, token in text.operands:
                operand = defined.get(_name(token))
                if operand is None:
                    where = "is defined after its use" if _name(token) in all_names else \
                        f"is not defined in computation '{_name(comp_text.name)}'"
                    raise _at(token, f"operand '{_name(token)}' {where}")
                operands.append(operand)
            attrs, sharding = self.instruction_attrs(text)
            inst = Instruction(name, text.opcode.value, text.shape, operands, attrs,
                               sharding=sharding, parameter_number=text.parameter_number)
            self.texts[id(inst)] = text
            defined[name] = inst
            instructions.append(inst)
            if text.root is not None:
                if root is not None:
                    raise _at(text.root, f"second ROOT in computation '{_name(comp_text.name)}' "
                                         f"(the root is '{root.name}')")
                root = inst
        for inst in instructions:
            for ref in inst.attrs.get("control-predecessors", ()):
                if ref.name not in defined:
                    raise _at(self.attr_token(inst, "control-predecessors"),
                              f"control predecessor '{ref.name}' is not defined in computation "
                              f"'{_name(comp_text.name)}'")
        return Computation(_name(comp_text.name), instructions, root or instructions[-1],
                           execution_thread=comp_text.execution_thread)

    def instruction_attrs(self, text: _InstructionText) -> tuple[dict, Any]:
        attrs, sharding = {}, None
        for attr in text.attrs:
            if attr.name in attrs or (attr.name == "sharding" and sharding is not None):
                raise _at(attr.token, f"attribute '{attr.name}' given twice")
            if attr.name == "sharding":
                sharding = self.lower_sharding(attr.value)
            else:
                attrs[attr.name] = self.attribute_value(attr)
        return attrs, sharding

    def attribute_value(self, attr: _Attr):
        value, name = attr.value, attr.name
        if name in _KV_DEFAULT_SEPARATOR:
            items, separator = value
            return KeyValueList(tuple(
                (k, self.sdy.value(k, v.start, v.end) if k.startswith(SDY_PREFIX) else
                 self.raw(v) if isinstance(v, _Span) else v) for k, v in items), separator)
        if not isinstance(value, _Value):
            return value
        typed = value.typed
        if name in COMPUTATION_ATTRIBUTES:
            return _computation_refs(typed, attr.token)
        if name == "backend_config":
            return typed if isinstance(typed, str) else self.raw(value.span)
        typed = _plain(typed)
        return self.raw(value.span) if typed is None else typed

    def lower_sharding(self, sharding):
        if isinstance(sharding, _MeshTuple):
            return HloSharding.tuple(tuple(self.lower_sharding(e) for e in sharding.elements))
        if not isinstance(sharding, _MeshSplit):
            return sharding
        if self.mesh is None:
            raise _at(sharding.token, "mesh_split= needs a mesh={...} header attribute")
        unknown = sorted({a for axes in sharding.dims for a in axes} - set(self.mesh.axis_names))
        if unknown:
            raise _at(sharding.token, f"unknown mesh axes {unknown} (the mesh has "
                                      f"{list(self.mesh.axis_names)})")
        try:
            lowered = self.mesh.sharding(sharding.dims, len(sharding.dims))
        except ShardingError as e:
            raise _at(sharding.token, f"invalid sharding: {e}") from None
        lowered = lowered.with_metadata(sharding.metadata) if sharding.metadata else lowered
        if sharding.shard_group is not None:
            lowered = lowered.with_shard_group(sharding.shard_group)
        return lowered

    def attr_token(self, inst: Instruction, name: str) -> Token:
        text = self.texts[id(inst)]
        return next((a.token for a in text.attrs if a.name == name), text.name)

    # ---- step 2: computation references ------------------------------------------------------

    def check_references(self, module: Module) -> None:
        for _, inst in module.all_instructions():
            for name, value in inst.attrs.items():
                if name not in COMPUTATION_ATTRIBUTES:
                    continue
                for ref in (value if isinstance(value, tuple) else (value,)):
                    if ref.name not in module.computations:
                        raise _at(self.attr_token(inst, name),
                                  f"computation '{ref.name}' is not defined")

    # ---- step 3: shapes and literals -------------------------------------------------------------

    def complete_shapes(self, module: Module, records: _ModuleText) -> None:
        signatures = {_name(c.name): c.signature for c in records.computations}
        for comp in self.callee_first(module):
            for inst in comp.instructions:
                text = self.texts[id(inst)]
                if inst.shape is None:
                    inst.shape = self.inferred_shape(inst, module, text)
                for (prefix, token), operand in zip(text.operands, inst.operands):
                    if prefix is not None and not compatible(prefix, operand.shape):
                        raise _at(token, f"operand '{operand.name}' has shape {operand.shape}, "
                                         f"not {prefix}")
                if text.literal is not None:
                    inst.literal = _literal(text.literal, inst.shape)
            if signatures[comp.name] is not None:
                _check_signature(comp, signatures[comp.name])

    def inferred_shape(self, inst: Instruction, module: Module, text: _InstructionText) -> Shape:
        # imported here: shape inference pulls in every shape rule, needed only for omitted shapes
        from .shape_inference import infer_shape
        try:
            shape = infer_shape(inst, module)
        except GspmdcError as e:
            raise _at(text.opcode, f"cannot infer the shape of '{inst.name}' (give it "
                                   f"explicitly): {e}") from None
        problem = _shape_problem(shape)
        if problem is not None:
            raise _at(text.opcode, f"cannot use the shape inferred for '{inst.name}': {problem}")
        return shape

    def callee_first(self, module: Module) -> list[Computation]:
        """The computations, each after those it calls (a depth-first walk with an explicit
        stack). Raises at the call site for a computation that calls itself, and where
        computations nest deeper than `limits.MAX_COMPUTATION_DEPTH` levels."""
        order: list[Computation] = []
        height: dict[str, int] = {}          # levels nested in a computation, itself included
        active: set[str] = set()
        for start in module.computations.values():
            if start.name in height:
                continue
            active.add(start.name)
            stack = [(start, iter(self.calls(start)))]
            while stack:
                comp, pending = stack[-1]
                step = next(pending, None)
                if step is None:
                    stack.pop()
                    active.discard(comp.name)
                    height[comp.name] = 1 + max((height[callee] for _, callee in
                                                 self.calls(comp)), default=0)
                    order.append(comp)
                    continue
                via, callee = step
                if callee in active:
                    raise _at(via, f"computation '{callee}' calls itself")
                below = height.get(callee, 1)
                if len(stack) + below > limits.MAX_COMPUTATION_DEPTH:
                    raise _at(via, f"calling '{callee}' here nests computations more than "
                                   f"{limits.MAX_COMPUTATION_DEPTH} levels deep (counting "
                                   f"'{start.name}' and every computation down to the "
                                   f"deepest); gspmdc accepts at most "
                                   f"{limits.MAX_COMPUTATION_DEPTH}")
                if callee not in height:
                    active.add(callee)
                    stack.append((module.computations[callee],
                                  iter(self.calls(module.computations[callee]))))
        return order

    def calls(self, comp: Computation) -> list[tuple[Token, str]]:
        """(attribute token, callee name) of every computation `comp` calls."""
        return [(self.attr_token(inst, name), ref.name)
                for inst in comp.instructions for name, value in inst.attrs.items()
                if name in COMPUTATION_ATTRIBUTES
                for ref in (value if isinstance(value, tuple) else (value,))]


def _computation_refs(typed, token: Token):
    if isinstance(typed, _Word):
        return ComputationRef(typed.lstrip("%"))
    if isinstance(typed, tuple) and all(isinstance(v, _Word) for v in typed):
        return tuple(ComputationRef(v.lstrip("%")) for v in typed)
    raise _at(token, "expected a computation name or a {list} of them")


def _plain(typed):
    """The attribute value for a generic typed value: words become Idents; None when the value
    must stay verbatim (floats, `%names`, anything unstructured)."""
    if isinstance(typed, _Word):
        return None if typed.startswith("%") else Ident(typed)
    if isinstance(typed, tuple):
        items = tuple(_plain(v) for v in typed)
        return None if any(v is None for v in items) else items
    return typed


def _check_signature(comp: Computation, signature: tuple) -> None:
    """The signature's result must match the root. Its parameter list is informational (as in
    XLA: real dumps do not always keep it exact)."""
    token, _, result = signature
    if not compatible(result, comp.root.shape):
        raise _at(token, f"computation '{comp.name}' returns {comp.root.shape}, its signature "
                         f"says {result}")


# ---- literals ---------------------------------------------------------------------------------

def _literal(node: _Lit, shape: Shape) -> Literal:
    """The Literal written by `node` for an instruction of `shape`."""
    if node.kind == "elided":
        return Literal(elided=True)
    if isinstance(shape, TupleShape):
        if node.kind != "tuple" or len(node.items) != len(shape.elements):
            raise _at(node.token, f"expected a tuple literal of {len(shape.elements)} elements "
                                  f"for shape {shape}")
        return Literal(elements=tuple(_literal(n, s) for n, s in zip(node.items, shape.elements)))
    element_type = shape.element_type
    if element_type == "token":
        raise _at(node.token, "a constant cannot have type token[]")
    try:
        if dtypes.is_complex(element_type):
            return Literal(_complex_array(node, shape))
        if node.kind == "text":
            return Literal(parse_array(node.token.value, element_type, shape.dims))
        leaves = _leaves(node, shape.dims)
        if any(leaf.kind != "text" for leaf in leaves):
            raise _at(node.token, f"expected a literal of {element_type} values")
        tokens = np.array([leaf.token.value for leaf in leaves], dtype=str)
        return Literal(parse_values(tokens, element_type).reshape(shape.dims))
    except LiteralTextError as e:
        raise _at(node.token, f"{e}") from None


def _leaves(node: _Lit, dims: tuple[int, ...]) -> list[_Lit]:
    """The element nodes of a structured array literal, checked against `dims` level by level."""
    if not dims:
        if node.kind not in ("text", "tuple"):
            raise _at(node.token, "expected a literal element")
        return [node]
    if node.kind != "list" or len(node.items) != dims[0]:
        found = f"{len(node.items)} elements" if node.kind == "list" else "a single value"
        raise _at(node.token, f"expected {{...}} with {dims[0]} elements, found {found}")
    leaves = []
    for item in node.items:
        leaves.extend(_leaves(item, dims[1:]))
    return leaves


def _complex_array(node: _Lit, shape: ArrayShape) -> np.ndarray:
    part = "f32" if shape.element_type == "c64" else "f64"
    pairs = _leaves(node, shape.dims)
    for pair in pairs:
        if pair.kind != "tuple" or len(pair.items) != 2 or \
                any(p.kind != "text" for p in pair.items):
            raise _at(pair.token, "expected a complex number (real, imaginary)")
    real = parse_values(np.array([p.items[0].token.value for p in pairs], dtype=str), part)
    imag = parse_values(np.array([p.items[1].token.value for p in pairs], dtype=str), part)
    value = real.astype(dtypes.numpy_dtype(shape.element_type))
    value.imag = imag
    return value.reshape(shape.dims)
