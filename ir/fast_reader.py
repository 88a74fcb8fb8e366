"""The fast reader: HLO text in its common forms -> parse records, without lark.

`read_records(text)` returns the same records (`parse_records.py`) lark's pass over
`grammar.lark` with `grammar_callbacks.Records` returns, or None when the text is outside the
subset it reads; the parser then reads the text with lark, which also reports every syntax error.
Contract: the fast reader never accepts text the grammar refuses, and where it accepts, its
records equal lark's (tokens included: type, text, line and column), so the module builder and
its error messages are the same whichever reader ran. `tests/test_fast_reader.py` checks both
readers against each other on every HLO text of the test corpora.

The subset: text without comments; an optional `HloModule` header; computations with optional
signatures; instructions with array or tuple shapes, operands with optional shape prefixes,
`parameter(N)` and constants written as one literal token; attributes that are generic values of
one piece (a word, a string or a balanced group), key=value lists (`metadata=`,
`frontend_attributes=`), `sharding=` in every form but the named mesh's, `slice=`,
`replica_groups=` (explicit and iota), `window=`, `padding=`, `dim_labels=` and
`control-predecessors=`. Anything else (a named mesh, stack frame tables, structured literals,
multi-piece values, any error) makes it return None. It is an optimisation only: the grammar
stays the definition of the language (docs/design/hlo-text.md).
"""
from __future__ import annotations

import re
from bisect import bisect_left

from lark import Token

from gspmdc.errors import ShardingError

from . import limits
from .attribute_text import unquote, word
from .grammar_callbacks import Records
from .parse_errors import ParseProblem
from .parse_records import (
    Attr, ComputationText, InstructionText, Lit, ModuleText, Span, Value,
)
from .shape_text import ShapeTextError, array_shape
from .shapes import ArrayShape
from .sharding_text import explicit_tiles, iota_tiles, single_sharding

__all__ = ["read_array_shape", "read_records"]

_CALLBACKS = Records()

# The terminals of grammar.lark this reader matches (same patterns; see the grammar's comments).
_NAME = r"%?[A-Za-z_][\w.\-]*"
_ARRAY_SHAPE = re.compile(
    r"(pred|s1|s2|s4|s8|s16|s32|s64|u1|u2|u4|u8|u16|u32|u64|f16|bf16|f32|f64|c64|c128|tf32|token|"
    r"opaque|f4e2m1fn|f8e3m4|f8e4m3|f8e4m3fn|f8e4m3fnuz|f8e4m3b11fnuz|f8e5m2|f8e5m2fnuz|f8e8m0fnu)"
    r"\[[^\]]*\](\s*\{[^{}=]*\})?")
_STRING = re.compile(r'"(\\.|[^"\\])*"')
_WORD = re.compile(r"(?:[^\s{}\[\](),\"\/]|\/(?![*\/]))+")
_KV_FLAT = re.compile(
    r'\{\s*(?:[A-Za-z_][\w.\-]*=(?:"(?:[^"\\]|\\.)*"|[^\s,{}"=]+)'
    r'(?:(?:\s*,\s*|\s+)[A-Za-z_][\w.\-]*=(?:"(?:[^"\\]|\\.)*"|[^\s,{}"=]+))*)?\s*\}')
_ELIDED = re.compile(r"\{\s*\.\.\.\s*\}")
_ARRAY_LITERAL = re.compile(r"\{[^()\"\/]*\}")
_LIT_SCALAR = re.compile(
    r"[-+]?(inf|nan(\(0x[0-9a-fA-F]+\))?|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)|true|false")

# Forms between tokens (white space, line breaks included, is free between tokens as in lark).
_SPACE = re.compile(r"\s*")
_HEADER = re.compile(rf"\s*HloModule\s+({_NAME})\s*")
_COMPUTATION = re.compile(rf"(?:(ENTRY)\s+)?({_NAME})\s*")
_BODY_OPEN = re.compile(r"\{\s*")
_EXECUTION_THREAD = re.compile(r'\s*,\s*execution_thread=\s*("(?:\\.|[^"\\])*")\s*')
# (`name=` with no space between would be an attribute name to lark after a group: left to it)
_INSTRUCTION = re.compile(rf"(?:(ROOT)\s+)?({_NAME})\s+=\s*")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\s*\(\s*")
_PARAMETER_NUMBER = re.compile(r"(-?\d+)\s*\)\s*")
_OPERAND = re.compile(rf"({_NAME})\s*([,)])\s*")
_ATTR_NAME = re.compile(r",\s*([A-Za-z_][\w.\-]*=)\s*")
_PARAM = re.compile(rf"({_NAME})\s*:\s*")
_ARROW = re.compile(r"\s*->\s*")
_CLOSE_PAREN = re.compile(r"\s*\)\s*")
_COMMA = re.compile(r"\s*,\s*")
_SIMPLE_WORD = re.compile(r"-?\d+|%?[A-Za-z_][\w.\-]*")
_PAD = re.compile(r"-?\d+_-?\d+(_\d+)?(x-?\d+_-?\d+(_\d+)?)*")
_DXD = re.compile(r"\d+(x\d+)*")
_DIM_LABELS = re.compile(r"[0-9bf?]+_[0-9io?]+->[0-9bf?]+")
_WINDOW_FIELD = re.compile(r"\s*(size=|stride=|lhs_dilate=|rhs_dilate=|rhs_reversal=|pad=)\s*")
_WINDOW_KEYS = {"size=": ("SIZE_EQ", _DXD, "DXD"), "stride=": ("STRIDE_EQ", _DXD, "DXD"),
                "lhs_dilate=": ("LHS_DILATE_EQ", _DXD, "DXD"),
                "rhs_dilate=": ("RHS_DILATE_EQ", _DXD, "DXD"),
                "rhs_reversal=": ("RHS_REVERSAL_EQ", _DXD, "DXD"), "pad=": ("PAD_EQ", _PAD, "PAD")}
_SLICE_DIM = re.compile(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]\s*")
_INT_LIST = re.compile(r"\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*")
_IOTA = re.compile(r"\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]\s*<=\s*\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]"
                   r"(?:\s*T\s*\(\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\))?")

#: words the grammar reads as keywords where this reader expects a name
_KEYWORDS = frozenset({"ENTRY", "ROOT", "HloModule"})
#: attributes with a rule of their own in the grammar, read here by `_attribute`
_KV_ATTRIBUTES = {"metadata=": "METADATA_EQ", "frontend_attributes=": "FRONTEND_ATTRIBUTES_EQ"}
_OPCODE_TYPES = {"parameter": "PARAMETER", "constant": "CONSTANT"}
_BRACKETS = {"{": ("}", "LBRACE"), "[": ("]", "LSQB"), "(": (")", "LPAR")}
_CLOSERS = {"}": "RBRACE", "]": "RSQB", ")": "RPAR"}


class _Outside(Exception):
    """The text is outside the fast reader's subset (or wrong): lark reads it instead."""


def read_records(text: str) -> ModuleText | None:
    """The parse records of `text`, or None when lark must read it (see the module docstring)."""
    if "/*" in text or "//" in text:
        return None
    try:
        return _Reader(text).module()
    except (_Outside, ParseProblem, ShapeTextError, ShardingError, ValueError):
        return None


def read_array_shape(text: str) -> ArrayShape | None:
    """The shape of `text` when it is one array shape (the grammar's ARRAY_SHAPE terminal,
    nothing around it) within the limits, else None (the grammar reads it)."""
    if not _ARRAY_SHAPE.fullmatch(text):
        return None
    try:
        return array_shape(text)
    except ShapeTextError:
        return None


class _Breaks:
    """The line breaks of a text: the line and column of an offset."""

    __slots__ = ("offsets",)

    def __init__(self, text: str):
        self.offsets = [m.start() for m in re.finditer("\n", text)]

    def line_and_column(self, offset: int) -> tuple[int, int]:
        index = bisect_left(self.offsets, offset)
        return index + 1, offset - (self.offsets[index - 1] + 1 if index else 0) + 1


class _Token(Token):
    """lark's Token whose line and column are found from its offset when read: only error
    messages read them, and the reader makes a token for every name, opcode and attribute. The
    end is given on the first line (`end_column` = column + length)."""

    __slots__ = ("breaks",)

    @property
    def line(self) -> int:
        return self.breaks.line_and_column(self.start_pos)[0]

    @property
    def column(self) -> int:
        return self.breaks.line_and_column(self.start_pos)[1]

    @property
    def end_line(self) -> int:
        return self.line

    @property
    def end_column(self) -> int:
        return self.column + self.end_pos - self.start_pos


class _Reader:
    """One read of one text: a cursor that matches forms at positions and makes tokens that find
    their line and column in the table of line breaks."""

    def __init__(self, text: str):
        self.text = text
        self.breaks = _Breaks(text)
        self.shardings: dict[str, object] = {}

    # ---- positions and tokens -----------------------------------------------------------------

    def token(self, kind: str, start: int, end: int) -> Token:
        # a lark Token with the fields `Token(kind, value, start, ...)` sets (without its
        # argument checks: this runs for every token), line and column read lazily
        value = self.text[start:end]
        token = str.__new__(_Token, value)
        token.type, token.value, token.start_pos, token.end_pos = kind, value, start, end
        token.breaks = self.breaks
        return token

    def match(self, pattern: re.Pattern, pos: int) -> re.Match:
        found = pattern.match(self.text, pos)
        if found is None:
            raise _Outside
        return found

    def name_token(self, found: re.Match, group: int) -> Token:
        if found.group(group) in _KEYWORDS:
            raise _Outside
        return self.token("NAME", found.start(group), found.end(group))

    # ---- module structure ---------------------------------------------------------------------

    def module(self) -> ModuleText:
        records = ModuleText()
        pos = _SPACE.match(self.text).end()
        header = _HEADER.match(self.text, pos)
        if header is not None:
            records.name = self.name_token(header, 1)
            records.header, pos = self.header_attrs(header.end())
        while True:
            computation, pos = self.computation(pos)
            records.computations.append(computation)
            if pos == len(self.text):
                return records

    def header_attrs(self, pos: int) -> tuple[list, int]:
        attrs = []
        while self.text.startswith(",", pos):
            found = self.match(_ATTR_NAME, pos)
            if found.group(1) == "mesh=":
                raise _Outside
            if found.group(1) == "frontend_attributes=":
                token = self.token("FRONTEND_ATTRIBUTES_EQ", found.start(1), found.end(1))
                value, pos = self.kv_list(found.end())
                attrs.append((token, "frontend_attributes", value))
                continue
            token = self.token("ATTR_NAME", found.start(1), found.end(1))
            value, pos = self.value(found.end())
            attrs.append((token, token.value[:-1], value))
        return attrs, pos

    def computation(self, pos: int) -> tuple[ComputationText, int]:
        found = self.match(_COMPUTATION, pos)
        entry = self.token("ENTRY", found.start(1), found.end(1)) if found.group(1) else None
        name = self.name_token(found, 2)
        pos, signature = found.end(), None
        if self.text.startswith("(", pos):
            signature, pos = self.signature(pos)
        pos = self.match(_BODY_OPEN, pos).end()
        instructions = []
        while not self.text.startswith("}", pos):
            instruction, pos = self.instruction(pos)
            instructions.append(instruction)
        if not instructions:
            raise _Outside
        pos, thread = _SPACE.match(self.text, pos + 1).end(), None
        found = _EXECUTION_THREAD.match(self.text, pos)
        if found is not None:
            pos, thread = found.end(), unquote(found.group(1))
        return ComputationText(entry, name, signature, instructions, thread), pos

    def signature(self, pos: int) -> tuple:
        lpar = self.token("LPAR", pos, pos + 1)
        pos = _SPACE.match(self.text, pos + 1).end()
        params = []
        if not self.text.startswith(")", pos):
            while True:
                found = self.match(_PARAM, pos)
                shape, pos = self.shape(found.end())
                params.append((self.name_token(found, 1), shape))
                if not self.text.startswith(",", pos):
                    break
                pos = self.match(_COMMA, pos).end()
        pos = self.match(_CLOSE_PAREN, pos).end()
        pos = self.match(_ARROW, pos).end()
        result, pos = self.shape(pos)
        return (lpar, params, result), pos

    # ---- instructions -------------------------------------------------------------------------

    def instruction(self, pos: int) -> tuple[InstructionText, int]:
        text = self.text
        found = self.match(_INSTRUCTION, pos)
        root = self.token("ROOT", found.start(1), found.end(1)) if found.group(1) else None
        name = self.name_token(found, 2)
        pos, shape = found.end(), None
        if text.startswith("(", pos) or _ARRAY_SHAPE.match(text, pos):
            shape, pos = self.shape(pos)
        found = self.match(_OPCODE, pos)
        opcode = self.token(_OPCODE_TYPES.get(found.group(1), "OPCODE"), found.start(1),
                            found.end(1))
        inst = InstructionText(root, name, shape, opcode, [], [])
        pos = found.end()
        if opcode.type == "PARAMETER":
            found = self.match(_PARAMETER_NUMBER, pos)
            inst.parameter_number, pos = int(found.group(1)), found.end()
        elif opcode.type == "CONSTANT":
            inst.literal, pos = self.literal(pos)
        else:
            inst.operands, pos = self.operands(pos)
        inst.attrs, pos = self.attributes(pos)
        return inst, pos

    def operands(self, pos: int) -> tuple[list, int]:
        text, operands = self.text, []
        if text.startswith(")", pos):
            return operands, _SPACE.match(text, pos + 1).end()
        while True:
            prefix = None
            if text.startswith("(", pos) or _OPERAND.match(text, pos) is None:
                prefix, pos = self.shape(pos)
            found = self.match(_OPERAND, pos)
            operands.append((prefix, self.name_token(found, 1)))
            pos = found.end()
            if found.group(2) == ")":
                return operands, pos

    def literal(self, pos: int) -> tuple[Lit, int]:
        for pattern, kind in ((_ELIDED, "ELIDED"), (_ARRAY_LITERAL, "ARRAY_LITERAL"),
                              (_LIT_SCALAR, "LIT_SCALAR")):
            found = pattern.match(self.text, pos)
            if found is not None:
                break
        else:
            raise _Outside
        token = self.token(kind, found.start(), found.end())
        pos = self.match(_CLOSE_PAREN, found.end()).end()
        return _CALLBACKS.constant_literal([token]), pos

    def attributes(self, pos: int) -> tuple[list, int]:
        attrs = []
        while self.text.startswith(",", pos):
            found = self.match(_ATTR_NAME, pos)
            key = found.group(1)
            reader = _ATTRIBUTE_READERS.get(key)
            if reader is None:
                value, pos = self.value(found.end())
                attrs.append(Attr(key[:-1], value, value.token))
            else:
                kind, read = reader
                attr, pos = read(self, self.token(kind, found.start(1), found.end(1)), found.end())
                attrs.append(attr)
        return attrs, pos

    # ---- shapes -------------------------------------------------------------------------------

    def shape(self, pos: int, depth: int = 0) -> tuple:
        """(shape, position after it and white space) of the array or tuple shape at `pos`
        (tuples nested within the limit)."""
        text = self.text
        if text.startswith("(", pos):
            if depth >= limits.MAX_TUPLE_DEPTH:
                raise _Outside
            lpar = self.token("LPAR", pos, pos + 1)
            pos = _SPACE.match(text, pos + 1).end()
            elements = []
            if not text.startswith(")", pos):
                while True:
                    element, pos = self.shape(pos, depth + 1)
                    elements.append(element)
                    if not text.startswith(",", pos):
                        break
                    pos = _SPACE.match(text, pos + 1).end()
            if not text.startswith(")", pos):
                raise _Outside
            return _CALLBACKS.tuple_shape([lpar] + elements), _SPACE.match(text, pos + 1).end()
        found = self.match(_ARRAY_SHAPE, pos)
        return array_shape(found.group()), _SPACE.match(text, found.end()).end()

    # ---- attribute values ---------------------------------------------------------------------

    def value(self, pos: int) -> tuple[Value, int]:
        """A generic value of one piece (a word, a string or a group)."""
        text = self.text
        first = text[pos:pos + 1]
        if first in _BRACKETS:
            value, end = self.group(pos)
        else:
            found = self.match(_STRING if first == '"' else _WORD, pos)
            end = found.end()
            value = _CALLBACKS.value([self.token("STRING" if first == '"' else "WORD", pos, end)])
        return value, _SPACE.match(text, end).end()

    def group(self, pos: int) -> tuple[Value, int]:
        """A balanced `{...}`, `[...]` or `(...)` group at `pos`: its Value (typed when it is a
        brace list of words and such lists, as `grammar_callbacks.Records.group` types it)."""
        text = self.text
        opening = text[pos]
        closer, kind = _BRACKETS[opening]
        token = self.token(kind, pos, pos + 1)
        typed, depth, end = self.brace_list(pos) if opening == "{" else (None, 0, pos)
        if typed is None:
            depth, end = _balanced(text, pos)
        return Value(typed if depth <= limits.MAX_TUPLE_DEPTH else None, Span(pos, end), token,
                     depth), end

    def brace_list(self, pos: int, level: int = 1) -> tuple:
        """(typed tuple, depth, end) of the `{a, b, {c}}` list at `pos`, or (None, 0, pos) when it
        is not a list of words (ints, bools, names) and such lists nested within the limit."""
        text = self.text
        if level > limits.MAX_TUPLE_DEPTH:
            return None, 0, pos
        i = _SPACE.match(text, pos + 1).end()
        values, depth = [], 1
        if text.startswith("}", i):
            return (), 1, i + 1
        while True:
            if text.startswith("{", i):
                typed, inner, i = self.brace_list(i, level + 1)
                if typed is None:
                    return None, 0, pos
                values.append(typed)
                depth = max(depth, inner + 1)
            else:
                found = _SIMPLE_WORD.match(text, i)
                if found is None:
                    return None, 0, pos
                value = word(found.group())
                if value is None:
                    return None, 0, pos
                values.append(value)
                i = found.end()
            i = _SPACE.match(text, i).end()
            if text.startswith("}", i):
                return tuple(values), depth, i + 1
            if not text.startswith(",", i):
                return None, 0, pos
            i = _SPACE.match(text, i + 1).end()

    def kv_list(self, pos: int) -> tuple:
        """A `{key=value ...}` list as `grammar_callbacks.Records.kv_list` returns it."""
        found = _KV_FLAT.match(self.text, pos)
        if found is not None:
            value = _CALLBACKS.kv_flat([self.token("KV_FLAT", pos, found.end())])
            return value, _SPACE.match(self.text, found.end()).end()
        text = self.text
        if not text.startswith("{", pos):
            raise _Outside
        children = [self.token("LBRACE", pos, pos + 1)]
        pos = _SPACE.match(text, pos + 1).end()
        while not text.startswith("}", pos):
            if text.startswith(",", pos):
                if len(children) == 1:
                    raise _Outside
                children.append(self.token("COMMA", pos, pos + 1))
                pos = _SPACE.match(text, pos + 1).end()
            found = self.match(_KV_KEY, pos)
            key = self.token("ATTR_NAME", pos, found.end())
            value, pos = self.value(found.end())
            piece = value.token if value.token.type in ("STRING", "WORD") else value
            children.append(_CALLBACKS.kv([key, piece]))
        return _CALLBACKS.kv_list(children), _SPACE.match(text, pos + 1).end()

    # ---- attributes with a rule of their own ----------------------------------------------------

    def sharding_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        """`sharding=`, decoded once per distinct text (named-mesh forms are left to lark). A
        text up to the first `}` that is one already decoded is that sharding: decoded texts
        are whole balanced groups, and such a group's end is where the scan ends on the same
        characters (a tuple's first `}` closes an element, never a decoded text)."""
        end = self.text.find("}", pos) + 1
        if end:
            sharding = self.shardings.get(self.text[pos:end])
            if sharding is not None:
                return Attr("sharding", sharding, token), _SPACE.match(self.text, end).end()
        depth, end = _balanced(self.text, pos) if self.text.startswith("{", pos) else (0, pos)
        if not depth:
            raise _Outside
        body = self.text[pos:end]
        sharding = self.shardings.get(body)
        if sharding is None:
            sharding = self.shardings[body] = _sharding(body)
        return Attr("sharding", sharding, token), _SPACE.match(self.text, end).end()

    def kv_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        value, pos = self.kv_list(pos)
        return _CALLBACKS.attr_kv([token, value]), pos

    def slice_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        text = self.text
        pos = self.match(_BODY_OPEN, pos).end()
        dims = []
        while not text.startswith("}", pos):
            if dims:
                pos = self.match(_COMMA, pos).end()
            found = self.match(_SLICE_DIM, pos)
            dims.append(_CALLBACKS.slice_dim([int(g) for g in found.groups() if g is not None]))
            pos = found.end()
        return _CALLBACKS.attr_slice([token] + dims), _SPACE.match(text, pos + 1).end()

    def replica_groups_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        text = self.text
        if text.startswith("[", pos):
            found = self.match(_IOTA, pos)
            spec = _CALLBACKS.groups_iota([_CALLBACKS.iota_list(
                [_ints(g) for g in found.groups() if g is not None])])
            end = found.end()
        else:
            pos = self.match(_BODY_OPEN, pos).end()
            groups = []
            while not text.startswith("}", pos):
                if groups:
                    pos = self.match(_COMMA, pos).end()
                pos = self.match(_BODY_OPEN, pos).end()
                found = _INT_LIST.match(text, pos)
                groups.append(_ints(found.group(1)) if found else ())
                pos = found.end() if found else pos
                if not text.startswith("}", pos):
                    raise _Outside
                pos = _SPACE.match(text, pos + 1).end()
            spec, end = _CALLBACKS.groups_explicit(groups), pos + 1
        return _CALLBACKS.attr_replica_groups([token, spec]), _SPACE.match(text, end).end()

    def window_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        text = self.text
        pos = self.match(_BODY_OPEN, pos).end()
        fields = [token]
        while not text.startswith("}", pos):
            found = self.match(_WINDOW_FIELD, pos)
            kind, pattern, value_kind = _WINDOW_KEYS[found.group(1)]
            value = self.match(pattern, found.end())
            fields.append((self.token(kind, found.start(1), found.end(1)),
                           self.token(value_kind, value.start(), value.end())))
            pos = _SPACE.match(text, value.end()).end()
        return _CALLBACKS.attr_window(fields), _SPACE.match(text, pos + 1).end()

    def padding_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        found = self.match(_PAD, pos)
        pad = self.token("PAD", pos, found.end())
        return _CALLBACKS.attr_padding([token, pad]), _SPACE.match(self.text, found.end()).end()

    def dim_labels_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        found = self.match(_DIM_LABELS, pos)
        labels = self.token("DIM_LABELS", pos, found.end())
        return _CALLBACKS.attr_dim_labels([token, labels]), \
            _SPACE.match(self.text, found.end()).end()

    def control_attr(self, token: Token, pos: int) -> tuple[Attr, int]:
        text = self.text
        pos = self.match(_BODY_OPEN, pos).end()
        names = []
        while not text.startswith("}", pos):
            if names:
                pos = self.match(_COMMA, pos).end()
            found = self.match(_CONTROL_NAME, pos)
            names.append(self.name_token(found, 1))
            pos = found.end()
        return _CALLBACKS.attr_control([token] + names), _SPACE.match(text, pos + 1).end()


_KV_KEY = re.compile(r"[A-Za-z_][\w.\-]*=\s*")
_CONTROL_NAME = re.compile(rf"({_NAME})\s*")
#: the attributes with a rule of their own: their keyword's token type and their reader
_ATTRIBUTE_READERS = {
    "sharding=": ("SHARDING_EQ", _Reader.sharding_attr),
    "metadata=": ("METADATA_EQ", _Reader.kv_attr),
    "frontend_attributes=": ("FRONTEND_ATTRIBUTES_EQ", _Reader.kv_attr),
    "slice=": ("SLICE_EQ", _Reader.slice_attr),
    "replica_groups=": ("REPLICA_GROUPS_EQ", _Reader.replica_groups_attr),
    "window=": ("WINDOW_EQ", _Reader.window_attr),
    "padding=": ("PADDING_EQ", _Reader.padding_attr),
    "dim_labels=": ("DIM_LABELS_EQ", _Reader.dim_labels_attr),
    "control-predecessors=": ("CONTROL_PREDECESSORS_EQ", _Reader.control_attr),
}


def _balanced(text: str, pos: int) -> tuple[int, int]:
    """(depth, end) of the balanced group opening at `pos` (strings skipped, brackets matched)."""
    stack, depth, i, size = [_BRACKETS[text[pos]][0]], 1, pos + 1, len(text)
    while stack:
        if i >= size:
            raise _Outside
        c = text[i]
        if c == '"':
            found = _STRING.match(text, i)
            if found is None:
                raise _Outside
            i = found.end()
            continue
        if c in _BRACKETS:
            stack.append(_BRACKETS[c][0])
            depth = max(depth, len(stack))
        elif c in _CLOSERS and c != stack.pop():
            raise _Outside
        elif c == "/":
            raise _Outside
        i += 1
    return depth, i


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(p) for p in text.split(","))


# ---- shardings -----------------------------------------------------------------------------------
# Decoding needs no positions: any problem sends the text to lark, which reports it where it is.
# (The key=value token of `metadata=` starts at 0: its spans, kept only for values that are not
# strings, integers or bools, are refused by the sharding's metadata rule anyway.)

_SHARDING_ITEM = re.compile(
    r"\s*(?:(replicated|manual|maximal|unknown|unreduced|last_tile_dim_replicate)(?![\w.\-=])"
    r"|device=\s*(-?\d+)"
    r"|devices=\s*(?:\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]\s*(-?\d+(?:\s*,\s*-?\d+)*)"
    r"|\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]\s*<=\s*\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]"
    r"(?:\s*T\s*\(\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\))?)"
    r"|last_tile_dims=\s*\{\s*((?:manual|replicated|unreduced)"
    r"(?:\s*,\s*(?:manual|replicated|unreduced))*)\s*\}"
    r"|(shard_as|shard_like)\s+(-?\d+)"
    r"|metadata=\s*(" + _KV_FLAT.pattern + r"))\s*")


def _sharding(body: str):
    """The HloSharding written `body` (`{...}`): a single sharding or a tuple of them."""
    inner = _SPACE.match(body, 1).end()
    if body.startswith("}", inner):
        return _CALLBACKS.sharding_empty([])
    if not body.startswith("{", inner):
        return _single(body)
    elements, pos = [], inner
    while True:
        _, end = _balanced(body, pos)
        elements.append(_single(body[pos:end]))
        pos = _SPACE.match(body, end).end()
        if body.startswith("}", pos) and pos == len(body) - 1:
            return _CALLBACKS.sharding_tuple([Token("LBRACE", "{")] + elements)
        if not body.startswith(",", pos):
            raise _Outside
        pos = _SPACE.match(body, pos + 1).end()
        if not body.startswith("{", pos):
            raise _Outside


def _single(body: str):
    """The single (not tuple) sharding written `body` (`{...}`)."""
    items, pos, end = [], 1, len(body) - 1
    while pos < end:
        found = _SHARDING_ITEM.match(body, pos, end)
        if found is None or found.end() == pos:
            raise _Outside
        keyword, device, dims, ids, iota, reshape, perm, subgroups, group, number, metadata = \
            found.group(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
        if keyword:
            items.append(Token(keyword.upper(), keyword))
        elif device is not None:
            items.append(("device", int(device), Token("DEVICE_EQ", "device=")))
        elif dims is not None:
            items.append(("tiles", explicit_tiles(_ints(dims), _ints(ids)),
                          Token("DEVICES_EQ", "devices=")))
        elif iota is not None:
            items.append(("tiles", iota_tiles(_ints(iota), _ints(reshape), _ints(perm)),
                          Token("DEVICES_EQ", "devices=")))
        elif subgroups is not None:
            kinds = tuple(k.strip() for k in subgroups.split(","))
            items.append(("subgroups", kinds, Token("LAST_TILE_DIMS_EQ", "last_tile_dims=")))
        elif group is not None:
            items.append(_CALLBACKS.sharding_group([Token(group.upper(), group),
                                                    Token("INT", number)]))
        else:
            entries = _CALLBACKS.kv_flat([Token("KV_FLAT", metadata, 0)])
            items.append(_CALLBACKS.sharding_metadata([Token("METADATA_EQ", "metadata="), entries]))
        pos = found.end()
    if not items:
        raise _Outside
    return single_sharding(Token("LBRACE", "{"), items)
