"""HLO shapes: arrays (element type, dims, optional layout) and tuples (possibly nested).

Shapes are immutable values. The layout is kept verbatim (the text between the braces, e.g. `"1,0"` or
`"1,0:T(8,128)"`) so the printer reproduces it; it never affects semantics, so `compatible()` ignores
it while `==` (IR identity) does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Iterator, Union

from . import dtypes


@dataclass(frozen=True, slots=True)
class ArrayShape:
    """An array `f32[8,16]{1,0}`; `token[]` is an ArrayShape with element type `token`."""

    element_type: str
    dims: tuple[int, ...]
    layout: str | None = None
    #: the hash of the compared fields, computed once (a shape keys the memo tables of
    #: planning and every common-subexpression key)
    _hash: int = field(init=False, repr=False, compare=False)
    #: the number of dims (read by every rule: a field, not a property to call)
    rank: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.element_type, self.dims, self.layout)))
        object.__setattr__(self, "rank", len(self.dims))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # rebuilt through the constructor: the cached hash is only valid in the process that
        # computed it
        return (ArrayShape, (self.element_type, self.dims, self.layout))

    @property
    def num_elements(self) -> int:
        return prod(self.dims)

    @property
    def byte_size(self) -> int:
        return self.num_elements * dtypes.byte_width(self.element_type)

    @property
    def is_tuple(self) -> bool:
        return False

    @property
    def is_token(self) -> bool:
        return self.element_type == "token"

    @property
    def tuple_depth(self) -> int:
        return 0

    def with_dims(self, dims) -> "ArrayShape":
        """Same element type, new dims, layout dropped (a derived shape has no layout of its own)."""
        return ArrayShape(self.element_type, tuple(int(d) for d in dims))

    def with_element_type(self, element_type: str) -> "ArrayShape":
        return ArrayShape(element_type, self.dims)

    def without_layout(self) -> "ArrayShape":
        return ArrayShape(self.element_type, self.dims) if self.layout is not None else self

    def leaves(self) -> Iterator["ArrayShape"]:
        yield self

    def __str__(self) -> str:
        text = f"{self.element_type}[{','.join(map(str, self.dims))}]"
        if self.layout is not None:
            text += "{" + self.layout + "}"
        return text


@dataclass(frozen=True, slots=True)
class TupleShape:
    """A tuple `(f32[2], (s32[], pred[]))`; `()` is the empty tuple. `tuple_depth` is how many
    tuple levels it nests (`((f32[2]))`: 2), known from construction."""

    elements: tuple["Shape", ...]
    tuple_depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "tuple_depth",
                           1 + max((e.tuple_depth for e in self.elements), default=0))

    @property
    def is_tuple(self) -> bool:
        return True

    @property
    def is_token(self) -> bool:
        return False

    @property
    def byte_size(self) -> int:
        return sum(e.byte_size for e in self.elements)

    def leaves(self) -> Iterator[ArrayShape]:
        """Array leaves in pre-order (the order tuple shardings list them in)."""
        for e in self.elements:
            yield from e.leaves()

    def without_layout(self) -> "TupleShape":
        elements = tuple(e.without_layout() for e in self.elements)
        return self if all(a is b for a, b in zip(elements, self.elements)) else \
            TupleShape(elements)

    def __str__(self) -> str:
        return "(" + ", ".join(str(e) for e in self.elements) + ")"


Shape = Union[ArrayShape, TupleShape]


def compatible(a: Shape, b: Shape) -> bool:
    """Equal up to layouts (the semantic shape equality the verifier uses)."""
    return a.without_layout() == b.without_layout()


def num_leaves(shape: Shape) -> int:
    return sum(1 for _ in shape.leaves())


def subshape(shape: Shape, index: tuple[int, ...]) -> Shape:
    """The element at a tuple index path (`()` is the shape itself)."""
    for i in index:
        if not isinstance(shape, TupleShape) or not 0 <= i < len(shape.elements):
            raise IndexError(f"tuple index {index} out of range for shape {shape}")
        shape = shape.elements[i]
    return shape
