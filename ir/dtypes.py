"""HLO primitive element types and their numpy counterparts.

Element types are kept as their HLO spelling (`"f32"`, `"pred"`, `"token"`); this module maps them to
numpy dtypes (bf16 via `ml_dtypes.bfloat16`) and answers the questions kernels and shape inference ask.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

_NUMPY = {
    "pred": np.dtype(np.bool_),
    "s8": np.dtype(np.int8), "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32), "s64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8), "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32), "u64": np.dtype(np.uint64),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16), "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
    "c64": np.dtype(np.complex64), "c128": np.dtype(np.complex128),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}

#: every element type name the text format accepts (`token` has no numpy counterpart)
ELEMENT_TYPES = frozenset(_NUMPY) | {"token"}
#: recognised by the lexer but rejected with a clear error
EXOTIC_TYPES = frozenset({"s1", "s2", "s4", "u1", "u2", "u4", "f8e4m3fn", "f8e5m2", "f8e4m3",
                          "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz", "f8e3m4", "f4e2m1fn",
                          "f8e8m0fnu", "tf32", "opaque"})

FLOAT_TYPES = frozenset({"bf16", "f16", "f32", "f64"})
COMPLEX_TYPES = frozenset({"c64", "c128"})
SIGNED_TYPES = frozenset({"s8", "s16", "s32", "s64"})
UNSIGNED_TYPES = frozenset({"u8", "u16", "u32", "u64"})
INTEGER_TYPES = SIGNED_TYPES | UNSIGNED_TYPES


def numpy_dtype(element_type: str) -> np.dtype:
    """The numpy dtype that stores `element_type` (KeyError for `token`)."""
    return _NUMPY[element_type]


def element_type_of(dtype: np.dtype) -> str:
    """The HLO element type of a numpy dtype."""
    return _FROM_NUMPY[np.dtype(dtype)]


def is_float(t: str) -> bool:
    return t in FLOAT_TYPES


def is_complex(t: str) -> bool:
    return t in COMPLEX_TYPES


def is_integer(t: str) -> bool:
    return t in INTEGER_TYPES


def is_signed(t: str) -> bool:
    return t in SIGNED_TYPES


def is_unsigned(t: str) -> bool:
    return t in UNSIGNED_TYPES


def byte_width(t: str) -> int:
    """Bytes per element (pred is stored as one byte, token has none)."""
    return 0 if t == "token" else _NUMPY[t].itemsize


def bit_width(t: str) -> int:
    return 1 if t == "pred" else 8 * byte_width(t)
