"""The fast reader: HLO text in its common one-instruction-a-line form -> parse records, without lark.

`read_records(text)` returns the same records (`parse_records.py`) lark's pass over
`grammar.lark` with `grammar_callbacks.Records` returns, or None when the text is outside the
subset it reads; the parser then reads the text with lark, which also reports every syntax error.
Contract: the fast reader never accepts text the grammar refuses, and where it accepts, its
records equal lark's (tokens included: type, text, line and column), so the module builder and
its error messages are the same whichever reader ran. `tests/test_fast_reader.py` checks both
readers against each other on every HLO text of the test corpora.

The subset: an optional `HloModule` header line; computations `[ENTRY] name [signature] {` ...
`}` with one instruction per line; no comments; attributes that are generic values of one piece
(a word, a string or a balanced group), `sharding=` in the kind/explicit/iota/tuple forms,
`metadata=` and `frontend_attributes=` as flat key=value lists. Anything else (a named mesh, stack
frame tables, windows, replica groups, structured literals, a value split over lines, any error)
makes it return None. It is an optimisation only: the grammar stays the definition of the
language (docs/design/hlo-text.md).
"""
from __future__ import annotations

import re

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
from .sharding_text import explicit_tiles, iota_tiles, single_sharding

__all__ = ["read_records"]

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
    r'\{\s*(?:[A-Za-z_][\w.\-]*=(?:"(?:[^"\\]|\\.)*"|[^\s,{}"=]+)(?:(?:\s*,\s*|\s+)[A-Za-z_][\w.\-]*='
    r'(?:"(?:[^"\\]|\\.)*"|[^\s,{}"=]+))*)?\s*\}')
_ELIDED = re.compile(r"\{\s*\.\.\.\s*\}")
_ARRAY_LITERAL = re.compile(r"\{[^()\"\/]*\}")
_LIT_SCALAR = re.compile(
    r"[-+]?(inf|nan(\(0x[0-9a-fA-F]+\))?|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)|true|false")

# Line-level forms (matched between a line's start and its end: `\s` never crosses a line).
_SPACE = re.compile(r"[ \t\r]*")
_HEADER = re.compile(rf"[ \t]*HloModule[ \t]+({_NAME})[ \t]*")
_COMPUTATION = re.compile(rf"[ \t]*(?:(ENTRY)[ \t]+)?({_NAME})[ \t]*")
_BODY_OPEN = re.compile(r"[ \t]*\{[ \t\r]*$")
_BODY_CLOSE = re.compile(r'[ \t]*\}[ \t]*(?:,[ \t]*(execution_thread=)[ \t]*("(?:\\.|[^"\\])*")[ \t]*)?\r?$')
_INSTRUCTION = re.compile(rf"[ \t]*(?:(ROOT)[ \t]+)?({_NAME})[ \t]*=[ \t]*")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)[ \t]*\([ \t]*")
_PARAMETER_NUMBER = re.compile(r"(-?\d+)[ \t]*\)")
_OPERAND = re.compile(rf"({_NAME})[ \t]*([,)])[ \t]*")
_SEPARATOR = re.compile(r"[ \t]*([,)])[ \t]*")
_ATTR_NAME = re.compile(r"[ \t]*,[ \t]*([A-Za-z_][\w.\-]*=)[ \t]*")
_PARAM = re.compile(rf"({_NAME})[ \t]*:[ \t]*")
_ARROW = re.compile(r"[ \t]*->[ \t]*")
_CLOSE_PAREN = re.compile(r"[ \t]*\)[ \t]*")
_COMMA = re.compile(r"[ \t]*,[ \t]*")
_SIMPLE_WORD = re.compile(r"-?\d+|%?[A-Za-z_][\w.\-]*")

#: words the grammar reads as keywords where this reader expects a name
_KEYWORDS = frozenset({"ENTRY", "ROOT", "HloModule"})
#: attributes with a rule of their own in the grammar, read here by `_attribute`
_KV_ATTRIBUTES = {"metadata=": "METADATA_EQ", "frontend_attributes=": "FRONTEND_ATTRIBUTES_EQ"}
#: attributes with a rule of their own that this reader leaves to lark
_LARK_ATTRIBUTES = frozenset({"control-predecessors=", "padding=", "dim_labels=", "window=",
                              "slice=", "replica_groups="})
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


class _Reader:
    """One read of one text: a cursor over its lines (`line`, `start` of the line, `end`)."""

    def __init__(self, text: str):
        self.text = text
        self.line = 0
        self.start = 0
        self.end = -1
        self.shardings: dict[str, object] = {}

    # ---- lines and tokens ---------------------------------------------------------------------

    def next_line(self) -> bool:
        """Move to the next line that is not blank; False at the end of the text."""
        text = self.text
        while self.end < len(text):
            self.start = self.end + 1
            self.line += 1
            end = text.find("\n", self.start)
            self.end = len(text) if end < 0 else end
            if text[self.start:self.end].strip():
                return True
        return False

    def token(self, kind: str, start: int, end: int) -> Token:
        column = start - self.start + 1
        return Token(kind, self.text[start:end], start, self.line, column, self.line,
                     column + end - start, end)

    def match(self, pattern: re.Pattern, pos: int) -> re.Match:
        found = pattern.match(self.text, pos, self.end)
        if found is None:
            raise _Outside
        return found

    # ---- module structure ---------------------------------------------------------------------

    def module(self) -> ModuleText:
        records = ModuleText()
        if not self.next_line():
            raise _Outside
        header = _HEADER.match(self.text, self.start, self.end)
        if header is not None:
            records.name = self.name_token(header, 1)
            records.header = self.header_attrs(header.end())
            if not self.next_line():
                raise _Outside
        while True:
            records.computations.append(self.computation())
            if not self.next_line():
                return records

    def header_attrs(self, pos: int) -> list:
        attrs = []
        while pos < self.end and not self.text[pos:self.end].isspace():
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
        return attrs

    def name_token(self, found: re.Match, group: int) -> Token:
        if found.group(group) in _KEYWORDS:
            raise _Outside
        return self.token("NAME", found.start(group), found.end(group))

    def computation(self) -> ComputationText:
        found = self.match(_COMPUTATION, self.start)
        entry = self.token("ENTRY", found.start(1), found.end(1)) if found.group(1) else None
        name = self.name_token(found, 2)
        pos, signature = found.end(), None
        if self.text.startswith("(", pos):
            signature, pos = self.signature(pos)
        self.match(_BODY_OPEN, pos)
        instructions = []
        while True:
            if not self.next_line():
                raise _Outside
            close = _BODY_CLOSE.match(self.text, self.start, self.end)
            if close is not None:
                break
            instructions.append(self.instruction())
        if not instructions:
            raise _Outside
        thread = unquote(close.group(2)) if close.group(1) else None
        return ComputationText(entry, name, signature, instructions, thread)

    def signature(self, pos: int) -> tuple:
        lpar = self.token("LPAR", pos, pos + 1)
        pos = self.match(_SPACE, pos + 1).end()
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

    def instruction(self) -> InstructionText:
        found = self.match(_INSTRUCTION, self.start)
        root = self.token("ROOT", found.start(1), found.end(1)) if found.group(1) else None
        name = self.name_token(found, 2)
        pos, shape = found.end(), None
        if self.text.startswith("(", pos) or _ARRAY_SHAPE.match(self.text, pos, self.end):
            shape, pos = self.shape(pos)
            pos = self.match(_SPACE, pos).end()
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
        inst.attrs = self.attributes(pos)
        return inst

    def operands(self, pos: int) -> tuple[list, int]:
        text, operands = self.text, []
        if text.startswith(")", pos):
            return operands, pos + 1
        while True:
            prefix = None
            if text.startswith("(", pos) or _OPERAND.match(text, pos, self.end) is None:
                prefix, pos = self.shape(pos)
                pos = self.match(_SPACE, pos).end()
            found = self.match(_OPERAND, pos)
            operands.append((prefix, self.name_token(found, 1)))
            pos = found.end()
            if found.group(2) == ")":
                return operands, pos

    def literal(self, pos: int) -> tuple[Lit, int]:
        for pattern, kind in ((_ELIDED, "ELIDED"), (_ARRAY_LITERAL, "ARRAY_LITERAL"),
                              (_LIT_SCALAR, "LIT_SCALAR")):
            found = pattern.match(self.text, pos, self.end)
            if found is not None:
                break
        else:
            raise _Outside
        token = self.token(kind, found.start(), found.end())
        pos = self.match(_CLOSE_PAREN, found.end()).end()
        return _CALLBACKS.constant_literal([token]), pos

    def attributes(self, pos: int) -> list:
        attrs = []
        while pos < self.end and not self.text[pos:self.end].isspace():
            found = self.match(_ATTR_NAME, pos)
            key = found.group(1)
            if key == "sharding=":
                token = self.token("SHARDING_EQ", found.start(1), found.end(1))
                sharding, pos = self.sharding(found.end())
                attrs.append(Attr("sharding", sharding, token))
            elif key in _KV_ATTRIBUTES:
                token = self.token(_KV_ATTRIBUTES[key], found.start(1), found.end(1))
                value, pos = self.kv_list(found.end())
                attrs.append(_CALLBACKS.attr_kv([token, value]))
            elif key in _LARK_ATTRIBUTES:
                raise _Outside
            else:
                value, pos = self.value(found.end())
                attrs.append(Attr(key[:-1], value, value.token))
        return attrs

    # ---- shapes -------------------------------------------------------------------------------

    def shape(self, pos: int, depth: int = 0) -> tuple:
        """(shape, end) of the array or tuple shape at `pos` (tuples nested within the limit)."""
        text = self.text
        if text.startswith("(", pos):
            if depth >= limits.MAX_TUPLE_DEPTH:
                raise _Outside
            lpar = self.token("LPAR", pos, pos + 1)
            pos = self.match(_SPACE, pos + 1).end()
            elements = []
            if not text.startswith(")", pos):
                while True:
                    element, pos = self.shape(pos, depth + 1)
                    elements.append(element)
                    pos = self.match(_SPACE, pos).end()
                    if not text.startswith(",", pos):
                        break
                    pos = self.match(_SPACE, pos + 1).end()
            if not text.startswith(")", pos):
                raise _Outside
            return _CALLBACKS.tuple_shape([lpar] + elements), pos + 1
        found = self.match(_ARRAY_SHAPE, pos)
        return array_shape(found.group()), found.end()

    # ---- attribute values ---------------------------------------------------------------------

    def value(self, pos: int) -> tuple[Value, int]:
        """A generic value of one piece, followed by the end of the line or a comma."""
        text = self.text
        first = text[pos:pos + 1]
        if first in _BRACKETS:
            value, end = self.group(pos)
        else:
            found = self.match(_STRING if first == '"' else _WORD, pos)
            end = found.end()
            value = _CALLBACKS.value([self.token("STRING" if first == '"' else "WORD", pos, end)])
        after = self.match(_SPACE, end).end()
        if after < self.end and text[after] != ",":
            raise _Outside
        return value, after

    def group(self, pos: int) -> tuple[Value, int]:
        """A balanced `{...}`, `[...]` or `(...)` group at `pos`: its Value (typed when it is a
        brace list of words and such lists, as `grammar_callbacks.Records.group` types it)."""
        text, end = self.text, self.end
        opening = text[pos]
        closer, kind = _BRACKETS[opening]
        token = self.token(kind, pos, pos + 1)
        typed, depth, i = self.brace_list(pos) if opening == "{" else (None, 0, pos)
        if typed is None:
            stack, depth, i = [closer], 1, pos + 1
            while stack:
                if i >= end:
                    raise _Outside
                c = text[i]
                if c == '"':
                    i = self.match(_STRING, i).end()
                    continue
                if c in _BRACKETS:
                    stack.append(_BRACKETS[c][0])
                    depth = max(depth, len(stack))
                elif c in _CLOSERS:
                    if c != stack.pop():
                        raise _Outside
                elif c == "/":
                    raise _Outside
                i += 1
            typed = None
        return Value(typed if depth <= limits.MAX_TUPLE_DEPTH else None, Span(pos, i), token,
                     depth), i

    def brace_list(self, pos: int, level: int = 1) -> tuple:
        """(typed tuple, depth, end) of the `{a, b, {c}}` list at `pos`, or (None, 0, pos) when it
        is not a list of words (ints, bools, names) and such lists nested within the limit."""
        text, end = self.text, self.end
        if level > limits.MAX_TUPLE_DEPTH:
            return None, 0, pos
        i = _SPACE.match(text, pos + 1, end).end()
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
                found = _SIMPLE_WORD.match(text, i, end)
                if found is None:
                    return None, 0, pos
                value = word(found.group())
                if value is None:
                    return None, 0, pos
                values.append(value)
                i = found.end()
            i = _SPACE.match(text, i, end).end()
            if text.startswith("}", i):
                return tuple(values), depth, i + 1
            if not text.startswith(",", i):
                return None, 0, pos
            i = _SPACE.match(text, i + 1, end).end()

    def kv_list(self, pos: int) -> tuple:
        found = self.match(_KV_FLAT, pos)
        value = _CALLBACKS.kv_flat([self.token("KV_FLAT", pos, found.end())])
        after = self.match(_SPACE, found.end()).end()
        if after < self.end and self.text[after] != ",":
            raise _Outside
        return value, after

    # ---- shardings ----------------------------------------------------------------------------

    def sharding(self, pos: int) -> tuple:
        """A sharding in the kind, explicit-tiles, iota or tuple form (decoded once per text)."""
        text = self.text
        found = self.match(_SHARDING_TEXT, pos)
        body = found.group()
        sharding = self.shardings.get(body)
        if sharding is None:
            sharding = self.shardings[body] = _sharding(body)
        after = self.match(_SPACE, found.end()).end()
        if after < self.end and text[after] != ",":
            raise _Outside
        return sharding, after


# ---- shardings -----------------------------------------------------------------------------------
# Decoding needs no positions: any problem sends the text to lark, which reports it where it is.

_SINGLE_BODY = r"\{[^{}\"]*(?:\{[^{}\"]*\}[^{}\"]*)?\}"
_SHARDING_TEXT = re.compile(rf"{_SINGLE_BODY}|\{{\s*(?:{_SINGLE_BODY}\s*(?:,\s*{_SINGLE_BODY}\s*)*)?\}}")
_INTS = r"\s*-?\d+(?:\s*,\s*-?\d+)*\s*"
_SHARDING_ITEM = re.compile(
    r"\s*(?:(replicated|manual|maximal|unknown|unreduced|last_tile_dim_replicate)(?![\w.\-=])"
    rf"|device=\s*(-?\d+)"
    rf"|devices=\s*\[({_INTS})\]\s*(?:<=\s*\[({_INTS})\]\s*(?:T\s*\(({_INTS})\))?|(-?\d+(?:\s*,\s*-?\d+)*))"
    r"|last_tile_dims=\s*\{\s*((?:manual|replicated|unreduced)(?:\s*,\s*(?:manual|replicated|unreduced))*)\s*\})"
    r"\s*")
_SINGLE_INNER = re.compile(r"\{([^{}\"]*(?:\{[^{}\"]*\}[^{}\"]*)?)\}")


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(p) for p in text.split(","))


def _sharding(body: str):
    """The HloSharding written `body` (`{...}`): a single sharding or a tuple of them."""
    inner = body[1:-1].strip()
    if not inner:
        return _CALLBACKS.sharding_empty([])
    if inner.startswith("{"):
        elements = [_single(m.group(1)) for m in _SINGLE_INNER.finditer(inner)]
        return _CALLBACKS.sharding_tuple([Token("LBRACE", "{")] + elements)
    return _single(inner)


def _single(inner: str):
    items, pos = [], 0
    while pos < len(inner):
        found = _SHARDING_ITEM.match(inner, pos)
        if found is None or found.end() == pos:
            raise _Outside
        keyword, device, dims, reshape, perm, ids, subgroups = found.groups()
        if keyword:
            items.append(Token(keyword.upper(), keyword))
        elif device is not None:
            items.append(("device", int(device), Token("DEVICE_EQ", "device=")))
        elif dims is not None:
            tiles = explicit_tiles(_ints(dims), _ints(ids)) if ids is not None else \
                iota_tiles(_ints(dims), _ints(reshape), _ints(perm))
            items.append(("tiles", tiles, Token("DEVICES_EQ", "devices=")))
        else:
            kinds = tuple(k.strip() for k in subgroups.split(","))
            items.append(("subgroups", kinds, Token("LAST_TILE_DIMS_EQ", "last_tile_dims=")))
        pos = found.end()
    if not items:
        raise _Outside
    return single_sharding(Token("LBRACE", "{"), items)
