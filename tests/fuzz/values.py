"""Shapes and values of the program under construction.

A `Value` is an instruction result the generator can use as an operand, with what the generator
knows about its numbers: `exact` (every element is computed the same way however the program is
partitioned: no sum whose order a partitioning can change, no transcendental function whose last
bit may depend on the array layout), and `bound` (an upper bound of |element| for floats). Ops
that are discontinuous or ill-conditioned (compare, floor, sort keys, convert to an integer,
bitcast-convert, cbrt, ...) take exact operands only, so the partitioned and unpartitioned
programs agree up to the reduction-order tolerance of `run --check`; ops that could overflow take
bounded operands only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Iterator, Union

FLOATS = ("f32", "bf16", "f16", "f64")
INTS = ("s32", "u32", "s8", "u8", "s16", "u16", "s64", "u64")
COMPLEX = ("c64", "c128")
#: bits of each element type (bitcast-convert pairs types of equal width)
BITS = {"pred": 8, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32,
        "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128}
#: the largest bound a float value may reach (ops that would exceed it are not generated)
MAX_BOUND = 1e4


@dataclass(frozen=True)
class Arr:
    """An array shape: element type and dims."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def size(self) -> int:
        return prod(self.dims)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    @property
    def is_int(self) -> bool:
        return self.dtype in INTS

    @property
    def is_complex(self) -> bool:
        return self.dtype in COMPLEX

    def with_dims(self, dims) -> "Arr":
        return Arr(self.dtype, tuple(dims))

    def with_dtype(self, dtype: str) -> "Arr":
        return Arr(dtype, self.dims)

    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"

    def leaves(self) -> Iterator["Arr"]:
        yield self


@dataclass(frozen=True)
class Tup:
    """A tuple shape."""

    elements: tuple["Shape", ...]

    def text(self) -> str:
        return "(" + ", ".join(e.text() for e in self.elements) + ")"

    def leaves(self) -> Iterator[Arr]:
        for e in self.elements:
            yield from e.leaves()


Shape = Union[Arr, Tup]


@dataclass(frozen=True)
class Value:
    """An instruction result: its name and shape and what is known of its numbers (see the
    module docstring). `full` is the global shape of a value inside a manual region (whose
    `shape` is then one device's shard). A tuple value lists its elements' facts in `parts`
    (values without a name, used when extracting them)."""

    name: str
    shape: Shape
    exact: bool = True
    bound: float = 1.0
    full: Arr | None = None
    parts: tuple["Value", ...] = field(default=())

    @property
    def arr(self) -> Arr:
        assert isinstance(self.shape, Arr)
        return self.shape

    @property
    def is_tuple(self) -> bool:
        return isinstance(self.shape, Tup)

    @property
    def manual(self) -> bool:
        return self.full is not None


def fact(shape: Shape, exact: bool = True, bound: float = 1.0) -> Value:
    """An unnamed value: the facts of one element of a tuple."""
    return Value("", shape, exact, bound)

