"""The text of array literals (`constant(...)` values): parse and format, vectorized with numpy.

Syntax (XLA's): a scalar is one token; an array nests one brace level per dimension, major to minor,
elements separated by commas (`{{1, 2}, {3, 4}}` for a `[2,2]` array; `{}` for an empty dimension).
An array of at least one element may also be written as one bare element token, as XLA's parser
reads it: that token is the array's first element (in row-major order) and every other element is
zero (`f32[2,2] constant(7)` is `{{7, 0}, {0, 0}}`, not a broadcast of 7).
Element tokens by type:

* `pred`: `true` / `false` (`1` / `0` accepted);
* integers: decimal, range-checked against the element type;
* floats: decimal or exponent notation, `inf`, `-inf`, `nan`, `-nan`, and `nan(0x<payload>)` /
  `-nan(0x<payload>)` for a NaN whose mantissa bits are not the canonical quiet NaN's;
* complex numbers are written `(re, im)`; the parser hands their parts to `parse_values` separately.

Formatting produces the shortest text that parses back to the identical bits (per element type:
bf16 and f16 get their own shortest digits, NaN sign and payload are kept).
"""
from __future__ import annotations

import re
from math import prod

import numpy as np

from . import dtypes

_ELEMENT = re.compile(r"[^\s{},]+")
_SPACE = re.compile(r"\s+")
_BOOL_TOKENS = np.array(["true", "false", "1", "0"])
_UINT_FOR_WIDTH = {2: np.uint16, 4: np.uint32, 8: np.uint64}
#: enough significant digits to round-trip any value of each float type
_MAX_DIGITS = {"bf16": 4, "f16": 5, "f32": 9, "f64": 17}


class LiteralTextError(ValueError):
    """The literal text does not fit the instruction's shape or element type."""


# ---------------------------------------------------------------------------------- parsing

def parse_array(text: str, element_type: str, dims: tuple[int, ...]) -> np.ndarray:
    """The array of shape `dims` written by `text` (a scalar token for rank 0, else nested braces,
    or one bare token for the first element of an otherwise zero array)."""
    tokens = _ELEMENT.findall(text)
    count = prod(dims)
    if dims and len(tokens) == 1 and "{" not in text:
        return _first_element_only(tokens, element_type, dims)
    if len(tokens) != count:    # checked first: the expected skeleton is as long as the shape
        raise LiteralTextError(
            f"literal has {len(tokens)} element{'s' * (len(tokens) != 1)}, "
            f"shape {element_type}[{','.join(map(str, dims))}] has {count}")
    skeleton = _SPACE.sub("", _ELEMENT.sub("x", text))
    if skeleton != _skeleton(dims, "x", ","):
        raise LiteralTextError(
            f"literal nesting does not match shape {element_type}[{','.join(map(str, dims))}] "
            f"(one brace level per dimension, each listing exactly that dimension's size)")
    return parse_values(np.array(tokens, dtype=str), element_type).reshape(dims)


def _first_element_only(tokens: list[str], element_type: str, dims: tuple[int, ...]) -> np.ndarray:
    """The array of shape `dims` whose first element the one token gives, all others zero."""
    shape_text = f"{element_type}[{','.join(map(str, dims))}]"
    if prod(dims) == 0:
        raise LiteralTextError(f"literal has 1 element, shape {shape_text} has none")
    first = parse_values(np.array(tokens, dtype=str), element_type)
    value = np.zeros(dims, dtype=first.dtype)
    value.reshape(-1)[0] = first[0]
    return value


def parse_values(tokens: np.ndarray, element_type: str) -> np.ndarray:
    """A flat array of `element_type` from an array of element tokens."""
    if dtypes.is_float(element_type):
        return _parse_floats(tokens, element_type)
    if element_type == "pred":
        bad = ~np.isin(tokens, _BOOL_TOKENS)
        if bad.any():
            raise LiteralTextError(f"expected true or false, found {tokens[bad][0]!r}")
        return (tokens == "true") | (tokens == "1")
    if dtypes.is_integer(element_type):
        return _parse_integers(tokens, element_type)
    raise LiteralTextError(f"no literal syntax for element type {element_type}")


def _parse_integers(tokens: np.ndarray, element_type: str) -> np.ndarray:
    target = dtypes.numpy_dtype(element_type)
    try:
        values = tokens.astype(np.uint64 if element_type == "u64" else np.int64)
    except (ValueError, OverflowError):
        raise LiteralTextError(_integer_problem(tokens.tolist(), element_type)) from None
    if element_type != "u64":
        info = np.iinfo(target)
        bad = (values < info.min) | (values > info.max)
        if bad.any():
            raise LiteralTextError(_integer_problem([str(values[bad][0])], element_type))
    return values.astype(target)


def _integer_problem(tokens: list[str], element_type: str) -> str:
    """What is wrong with the first bad integer token (only called once numpy refused one)."""
    info = np.iinfo(dtypes.numpy_dtype(element_type))
    for token in tokens:
        try:
            value = int(token)
        except ValueError:
            return f"expected an integer, found {token!r}"
        if not info.min <= value <= info.max:
            return f"{value} is out of range for {element_type} [{info.min}, {info.max}]"
    return f"invalid {element_type} literal"


def _parse_floats(tokens: np.ndarray, element_type: str) -> np.ndarray:
    target = dtypes.numpy_dtype(element_type)
    has_payload = np.char.find(tokens, "(") >= 0
    plain = np.where(has_payload, "nan", tokens) if has_payload.any() else tokens
    try:
        wide = plain.astype(np.float64)
    except ValueError:
        bad = next(t for t in plain.tolist() if not _is_float(t))
        raise LiteralTextError(f"expected a number, found {bad!r}") from None
    with np.errstate(over="ignore", invalid="ignore"):
        values = wide.astype(target)
    nan = np.isnan(wide)
    if nan.any():
        _set_nan_bits(values, nan, tokens, has_payload, element_type)
    return values


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _float_layout(element_type: str) -> tuple[type, int, int]:
    """(unsigned view type, total bits, mantissa bits) of a float type."""
    width = dtypes.byte_width(element_type)
    mantissa = {"bf16": 7, "f16": 10, "f32": 23, "f64": 52}[element_type]
    return _UINT_FOR_WIDTH[width], 8 * width, mantissa


def _set_nan_bits(values, nan, tokens, has_payload, element_type) -> None:
    """Write NaNs with the sign and payload the tokens spell (`-nan`, `nan(0x7ff)`)."""
    uint, bits, mbits = _float_layout(element_type)
    exponent = ((1 << (bits - 1)) - 1) & ~((1 << mbits) - 1)
    mantissa = np.full(int(nan.sum()), 1 << (mbits - 1), dtype=np.uint64)
    payload_tokens = tokens[nan & has_payload]
    if payload_tokens.size:
        payloads = [_payload(t, mbits) for t in payload_tokens.tolist()]
        mantissa[has_payload[nan]] = np.array(payloads, dtype=np.uint64)
    sign = np.char.startswith(tokens[nan], "-").astype(np.uint64) << np.uint64(bits - 1)
    values.view(uint)[nan] = (sign | np.uint64(exponent) | mantissa).astype(uint)


def _payload(token: str, mbits: int) -> int:
    match = re.fullmatch(r"[-+]?nan\(0x([0-9a-fA-F]+)\)", token)
    value = int(match.group(1), 16) if match else 0
    if not 0 < value < (1 << mbits):
        raise LiteralTextError(f"NaN payload in {token!r} must be in [1, 2^{mbits})")
    return value


def _skeleton(dims: tuple[int, ...], element: str, separator: str) -> str:
    """The brace structure of an array of shape `dims` with every element written `element`."""
    text = element
    for d in reversed(dims):
        text = "{" + separator.join([text] * d) + "}"
    return text


# ---------------------------------------------------------------------------------- formatting

def format_array(value: np.ndarray, element_type: str) -> str:
    """The literal text of an array (`1.5`, `{1, 2}`, `{{1, 2}, {3, 4}}`)."""
    dims = value.shape
    if value.size == 0:
        return _skeleton(dims, "", ", ")
    flat = format_values(value.reshape(-1), element_type)
    if not dims:
        return str(flat[0])
    # between elements i-1 and i, one brace closes and reopens per dimension whose block ends there
    sizes = np.cumprod(dims[::-1])[::-1]
    boundaries = (np.arange(1, flat.size)[:, None] % sizes == 0).sum(axis=1)
    separators = np.array(["}" * c + ", " + "{" * c for c in range(len(dims) + 1)], dtype=object)
    pieces = np.empty(2 * flat.size - 1, dtype=object)
    pieces[0::2] = flat
    pieces[1::2] = separators[boundaries]
    return "{" * len(dims) + "".join(pieces.tolist()) + "}" * len(dims)


def format_values(flat: np.ndarray, element_type: str) -> np.ndarray:
    """Element tokens (a string array) for a flat array of `element_type`."""
    if element_type == "pred":
        return np.where(flat, "true", "false")
    if dtypes.is_integer(element_type):
        return flat.astype(str)
    if dtypes.is_complex(element_type):
        part = "f32" if element_type == "c64" else "f64"
        re_text = format_values(np.ascontiguousarray(flat.real), part)
        im_text = format_values(np.ascontiguousarray(flat.imag), part)
        return np.char.add(np.char.add(np.char.add("(", re_text), np.char.add(", ", im_text)), ")")
    if dtypes.is_float(element_type):
        return _format_floats(flat, element_type)
    raise LiteralTextError(f"no literal syntax for element type {element_type}")


def _format_floats(flat: np.ndarray, element_type: str) -> np.ndarray:
    """Shortest round-tripping tokens: numpy's per-dtype shortest repr for f16/f32/f64 (`3.0`
    shortened to `3`), a digit search for bf16 (numpy has no bf16 repr)."""
    bits = flat.view(_float_layout(element_type)[0])
    nan = _is_nan(bits, element_type)
    if element_type == "bf16":
        text = _shortest_digits(flat, bits, element_type)
    else:
        text = flat.astype(str)
        integral = np.char.endswith(text, ".0")
        text[integral] = np.char.rstrip(np.char.rstrip(text[integral], "0"), ".")
    if nan.any():
        text = text.astype(f"<U{max(text.itemsize // 4, 24)}")
        text[nan] = _format_nans(bits[nan], element_type)
    return text


def _is_nan(bits: np.ndarray, element_type: str) -> np.ndarray:
    """NaN test on the bit patterns (numpy's isnan warns on bf16 signalling NaNs)."""
    _, width, mbits = _float_layout(element_type)
    magnitude = bits.astype(np.uint64) & np.uint64((1 << (width - 1)) - 1)
    return magnitude > np.uint64(((1 << (width - 1 - mbits)) - 1) << mbits)


def _shortest_digits(flat: np.ndarray, bits: np.ndarray, element_type: str) -> np.ndarray:
    """`%.<d>g` with the fewest digits d that parse back to the same bits, per element."""
    todo = ~_is_nan(bits, element_type)
    with np.errstate(invalid="ignore"):
        wide = flat.astype(np.float64)
    text = np.empty(flat.size, dtype="<U24")
    for digits in range(1, _MAX_DIGITS[element_type] + 1):
        if not todo.any():
            break
        candidate = np.char.mod(f"%.{digits}g", wide[todo])
        ok = _parse_floats(candidate, element_type).view(bits.dtype) == bits[todo]
        where = np.flatnonzero(todo)[ok]
        text[where] = candidate[ok]
        todo[where] = False
    return text


def _format_nans(bits: np.ndarray, element_type: str) -> np.ndarray:
    _, width, mbits = _float_layout(element_type)
    wide = bits.astype(np.uint64)
    sign = np.where((wide >> np.uint64(width - 1)) & np.uint64(1), "-nan", "nan")
    mantissa = wide & np.uint64((1 << mbits) - 1)
    canonical = mantissa == np.uint64(1 << (mbits - 1))
    if canonical.all():
        return sign
    hex_text = np.char.add(np.char.add("(0x", np.char.mod("%x", mantissa)), ")")
    return np.where(canonical, sign, np.char.add(sign, hex_text))
