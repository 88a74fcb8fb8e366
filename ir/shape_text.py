"""Shape text: the `ArrayShape` of one array-shape token, and the limits a shape must keep.

An array shape is `type[d0,d1,...]` with an optional layout `{minor_to_major...}`; the element
types are those of `dtypes.py` (the exotic float types are refused by name), every dimension is a
static size no larger than 2^63-1 (XLA's dynamic `<=N` and `?` dimensions are refused) and the
total size keeps within `limits.py`. Tuple shapes nest at most `limits.MAX_TUPLE_DEPTH` levels.
Problems inside a token are `ShapeTextError`s carrying the offset of the offending character.
"""
from __future__ import annotations

import re

from . import dtypes, limits
from .shapes import ArrayShape, Shape
from .sharding_algebra import cached

_ARRAY_SHAPE = re.compile(r"(\w+)\[([^\]]*)\]\s*(?:\{([^{}]*)\})?", re.S)


class ShapeTextError(Exception):
    """A problem inside an ARRAY_SHAPE token, `offset` characters into it."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.message, self.offset = message, offset


@cached
def array_shape(text: str) -> ArrayShape:
    """The ArrayShape of an ARRAY_SHAPE token (`f32[8,16]{1,0}`); cached, shapes repeat a lot."""
    element_type, dims_text, layout = _ARRAY_SHAPE.fullmatch(text).groups()
    if element_type in dtypes.EXOTIC_TYPES:
        raise ShapeTextError(f"element type {element_type} is not supported", 0)
    dims = []
    if dims_text.strip():
        offset = len(element_type) + 1
        for part in dims_text.split(","):
            word = part.strip()
            if word.isascii() and word.isdigit():
                dims.append(int(word))
                if dims[-1] > limits.MAX_SIZE:
                    raise ShapeTextError(f"dimension size {word} is more than the largest "
                                          f"size, 2^63-1", offset + part.index(word))
            else:
                at = offset + part.index(word) if word else offset
                if word.startswith("<=") or word == "?":
                    raise ShapeTextError(f"dynamic dimension '{word}' is not supported", at)
                raise ShapeTextError(f"expected a dimension size, found '{word}'", at)
            offset += len(part) + 1
    problem = limits.size_problem(tuple(dims), dtypes.byte_width(element_type))
    if problem is not None:
        raise ShapeTextError(f"{text.split('{')[0]}: {problem}", 0)
    return ArrayShape(element_type, tuple(dims), layout)


def nesting_problem(shape: Shape) -> str | None:
    depth = shape.tuple_depth
    if depth <= limits.MAX_TUPLE_DEPTH:
        return None
    return (f"tuple shapes nest {depth} levels deep here; gspmdc accepts at most "
            f"{limits.MAX_TUPLE_DEPTH}")


def shape_problem(shape: Shape) -> str | None:
    """Why an inferred shape is beyond the limits of `limits.py`, or None."""
    problems = (limits.size_problem(leaf.dims, dtypes.byte_width(leaf.element_type))
                for leaf in shape.leaves())
    return nesting_problem(shape) or next((p for p in problems if p is not None), None)
