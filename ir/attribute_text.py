"""Attribute values in HLO text: typing words, strings and brace lists, and the structured
attributes whose text has its own small syntax (`window={size=3x3 pad=0_0x1_1}`).

Typing rules (shared by every reader of the text): a bare word is an int (`-?digits`), a bool
(`true`/`false`) or a name (`Word`), anything else stays verbatim; a double-quoted string is
C-unescaped; a `{...}` list is typed when it is `a, b, ...` of such scalars or such lists, and
kept verbatim otherwise. In `metadata={...}` and `frontend_attributes={...}` lists, strings,
integers and bools are typed and any other value is a span of the source.
"""
from __future__ import annotations

import re

from lark import Token

from .attributes import Window, WindowDim
from .parse_errors import problem_at
from .parse_records import Span, Value, Word
from .sdy import PREFIX as SDY_PREFIX

#: the separator printed between the items of a key=value list when its text shows none
KV_DEFAULT_SEPARATOR = {"metadata": " ", "frontend_attributes": ", "}
#: the token types of a plain word inside a `{...}` attribute value (the grammar's group_word)
GROUP_WORDS = frozenset({"WORD", "NAME", "INT", "ROOT", "ENTRY", "FRAME_SECTION"})

KV_ITEM = re.compile(r'([A-Za-z_][\w.\-]*)=("(?:[^"\\]|\\.)*"|[^\s,{}"=]+)')
_INT = re.compile(r"-?\d+")
_NAME = re.compile(r"%?[A-Za-z_][\w.\-]*")
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def unquote(token: str) -> str:
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


def ints(text: str, separator: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(separator))


def scalar(token: Token):
    return unquote(token.value) if token.type == "STRING" else word(token.value)


def word(text: str):
    """The typed value of a bare word: int, bool, a name (`Word`), or None (kept verbatim)."""
    if _INT.fullmatch(text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return Word(text) if _NAME.fullmatch(text) else None


def kv_item(key: str, text: str, start: int) -> tuple:
    """One `key=value` of a metadata / frontend-attributes list: strings, integers and bools are
    typed, anything else is kept verbatim (a span of the source); Shardy's `xla.sdy.*` values stay
    spans until the module builder reads them (`sdy_text.py`)."""
    if key.startswith(SDY_PREFIX):
        return key, Span(start, start + len(text))
    if text[0] == '"':
        return key, unquote(text)
    value = word(text)
    if value is None or isinstance(value, Word):
        return key, Span(start, start + len(text))
    return key, value


def brace_list(items: list):
    """The typed tuple for the inside of `{...}` when it is `a, b, ...` of ints, bools and names or
    nested such lists; None when it is anything else."""
    values = []
    expect_item = True
    for item in items:
        if expect_item:
            value = item.typed if isinstance(item, Value) else \
                word(item.value) if item.type in GROUP_WORDS else None
            if value is None:
                return None
            values.append(value)
        elif isinstance(item, Value) or item.type != "COMMA":
            return None
        expect_item = not expect_item
    if values and expect_item:   # trailing comma
        return None
    return tuple(values)


def window(token: Token, fields: dict) -> Window:
    if "size=" not in fields:
        if fields:
            raise problem_at(token, "window needs a size= field")
        return Window(())
    sizes = ints(fields["size="][1].value, "x")
    columns = {}
    for key, (key_token, value) in fields.items():
        if key == "pad=":
            numbers = [ints(p, "_") for p in value.value.split("x")]
            if any(len(n) != 2 for n in numbers):
                raise problem_at(value, f"window padding must be low_high per dimension, found {value}")
        else:
            numbers = ints(value.value, "x")
        if len(numbers) != len(sizes):
            raise problem_at(key_token, f"window field {key} has {len(numbers)} dimensions, "
                             f"size= has {len(sizes)}")
        columns[key] = numbers
    reversal = columns.get("rhs_reversal=", (0,) * len(sizes))
    if any(r not in (0, 1) for r in reversal):
        raise problem_at(fields["rhs_reversal="][0], "rhs_reversal values must be 0 or 1")
    dims = []
    for i, size in enumerate(sizes):
        low, high = columns["pad="][i] if "pad=" in columns else (0, 0)
        dims.append(WindowDim(size, columns.get("stride=", (1,) * len(sizes))[i], low, high,
                              columns.get("lhs_dilate=", (1,) * len(sizes))[i],
                              columns.get("rhs_dilate=", (1,) * len(sizes))[i], bool(reversal[i])))
    return Window(tuple(dims))
