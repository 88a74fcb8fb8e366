"""Typed values of instruction attributes (`name=value` after the operand list).

The parser turns each attribute into one of these values; the printer turns it back into XLA's text.
Plain Python types cover the simple forms:

| text                         | value                                  |
|------------------------------|----------------------------------------|
| `index=0`                    | `int`                                  |
| `is_stable=true`             | `bool`                                 |
| `custom_call_target="x"`     | `str` (a quoted string)                |
| `direction=GT`               | `Ident("GT")` (a bare word)            |
| `dimensions={1,0}`           | `tuple[int, ...]`                      |
| `operand_precision={HIGH,HIGH}` | `tuple[Ident, ...]`                 |
| `parameter_replication={true}` | `tuple[bool, ...]`                   |
| `to_apply=%add`              | `ComputationRef("add")`                |
| `branch_computations={%a,%b}`| `tuple[ComputationRef, ...]`           |
| `control-predecessors={%a}`  | `tuple[InstructionRef, ...]`           |

and the classes below cover the structured ones. Anything gspmdc does not model is a `RawAttr`
holding the value's text verbatim, so it survives a round trip.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .ops import CALLED_COMPUTATION_ATTRIBUTES

#: Module.attrs key under which XLA's stack-frame tables (FileNames, FunctionNames, FileLocations,
#: StackFrames; printed between the header and the computations) are kept verbatim as a RawAttr.
STACK_FRAME_INDEX = "stack_frame_index"


class Ident(str):
    """A bare identifier value (`GT`, `TOTALORDER`, `rng_uniform`, `kLoop`); printed unquoted."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Ident({str.__repr__(self)})"


@dataclass(frozen=True, slots=True)
class ComputationRef:
    """A reference to a computation of the module by name (`to_apply=%sum`)."""

    name: str


@dataclass(frozen=True, slots=True)
class InstructionRef:
    """A reference to an instruction of the same computation by name (`control-predecessors`)."""

    name: str


@dataclass(frozen=True, slots=True)
class RawAttr:
    """An attribute value kept verbatim (`output_to_operand_aliasing={...}`, `backend_config={...}`)."""

    text: str


@dataclass(frozen=True, slots=True)
class WindowDim:
    """One dimension of a `window={...}` attribute (XLA's defaults: stride 1, no pad, dilation 1)."""

    size: int
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    base_dilation: int = 1      # lhs_dilate
    window_dilation: int = 1    # rhs_dilate
    window_reversal: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    """`window={size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=1x1 rhs_dilate=2x2 rhs_reversal=0x1}`."""

    dims: tuple[WindowDim, ...]


@dataclass(frozen=True, slots=True)
class ConvDimLabels:
    """`dim_labels=b01f_01io->b01f`: the three label strings of a convolution.

    lhs/out: `b` batch, `f` feature, digit k = spatial dimension k; rhs: `i` input feature,
    `o` output feature, digits spatial. `?` marks an ignored size-1 dimension.
    """

    lhs: str
    rhs: str
    out: str

    @staticmethod
    def _spatial(labels: str) -> tuple[int, ...]:
        digits = sorted((c, i) for i, c in enumerate(labels) if c.isdigit())
        return tuple(i for _, i in digits)

    @property
    def lhs_batch(self) -> int:
        return self.lhs.index("b")

    @property
    def lhs_feature(self) -> int:
        return self.lhs.index("f")

    @property
    def lhs_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.lhs)

    @property
    def rhs_input_feature(self) -> int:
        return self.rhs.index("i")

    @property
    def rhs_output_feature(self) -> int:
        return self.rhs.index("o")

    @property
    def rhs_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.rhs)

    @property
    def out_batch(self) -> int:
        return self.out.index("b")

    @property
    def out_feature(self) -> int:
        return self.out.index("f")

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.out)

    def __str__(self) -> str:
        return f"{self.lhs}_{self.rhs}->{self.out}"


@dataclass(frozen=True, slots=True)
class SliceDim:
    """One `[start:limit:stride]` entry of `slice={...}`."""

    start: int
    limit: int
    stride: int = 1


@dataclass(frozen=True, slots=True)
class PadDim:
    """One `low_high[_interior]` entry of `padding=...` (low/high may be negative: cropping)."""

    low: int
    high: int
    interior: int = 0


#: a `ReplicaGroups` hash reads about this many of the groups, evenly spaced, and as many of
#: the members of each (all of them when there are no more ids than that squared)
HASH_SAMPLE = 8


class ReplicaGroups:
    """`replica_groups=...` in any of XLA's forms, materialised as explicit groups.

    `groups` is a tuple of groups (tuples of ids, order significant); the empty tuple is `{}`, meaning
    one group with every participant. Equality ignores the text form; the printer chooses the iota
    form `[G,S]<=[...]T(...)` whenever it matches. Immutable. Built from a `[G, S]` array
    (`from_array`, what the partitioner emits), the value keeps the array and makes the tuples
    only when they are read, so building, hashing and comparing the groups of a collective over
    thousands of devices costs array operations, not one Python object per device. The hash
    reads the array's shape and an evenly spaced sample of its ids (`HASH_SAMPLE`: equal groups
    have equal samples, a collision costs one vectorised comparison), so it costs the same at
    any device count (CSE keys every collective by its groups).
    """

    __slots__ = ("_groups", "_array", "_hash")

    def __init__(self, groups: tuple[tuple[int, ...], ...] = ()):
        object.__setattr__(self, "_groups", tuple(tuple(g) for g in groups))
        object.__setattr__(self, "_array", None)
        object.__setattr__(self, "_hash", None)

    @classmethod
    def from_array(cls, array: np.ndarray) -> "ReplicaGroups":
        """From a `[num_groups, group_size]` integer array. A read-only int64 array (the device
        arrays of tile assignments, which the partitioner's group arrays are) is shared, not
        copied: the collectives of one reshard plan then hold one array, whatever their number
        and the device count; any other array is copied."""
        array = np.asarray(array)
        if array.dtype != np.int64 or array.flags.writeable:
            array = np.array(array, dtype=np.int64)
            array.setflags(write=False)
        value = object.__new__(cls)
        object.__setattr__(value, "_groups", None)
        object.__setattr__(value, "_array", array)
        object.__setattr__(value, "_hash", None)
        return value

    def __setattr__(self, name, value):
        raise AttributeError("ReplicaGroups is immutable")

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        if self._groups is None:
            object.__setattr__(self, "_groups", tuple(map(tuple, self._array.tolist())))
        return self._groups

    @property
    def is_all(self) -> bool:
        return not (len(self._array) if self._groups is None else self._groups)

    def as_array(self) -> np.ndarray | None:
        """The groups as a `[G, S]` array (read-only), or None when they are empty or ragged."""
        if self._array is None:
            if not self._groups or len({len(g) for g in self._groups}) != 1:
                return None
            array = np.asarray(self._groups, dtype=np.int64)
            array.setflags(write=False)
            object.__setattr__(self, "_array", array)
        return self._array

    def __eq__(self, other) -> bool:
        if not isinstance(other, ReplicaGroups):
            return NotImplemented
        if self is other:
            return True
        a, b = self.as_array(), other.as_array()
        if a is not None and b is not None:
            return a is b or (a.shape == b.shape and bool(np.array_equal(a, b)))
        return self.groups == other.groups

    def __hash__(self) -> int:
        if self._hash is None:
            array = self.as_array()
            if array is None:
                key = self.groups
            elif array.size <= HASH_SAMPLE * HASH_SAMPLE:
                key = (array.shape, array.tobytes())
            else:
                groups, size = array.shape
                sample = array[::max(1, groups // HASH_SAMPLE), ::max(1, size // HASH_SAMPLE)]
                key = (array.shape, sample.tobytes())
            object.__setattr__(self, "_hash", hash(key))
        return self._hash

    def __repr__(self) -> str:
        return f"ReplicaGroups(groups={self.groups!r})"

    def __reduce__(self):
        if self._groups is None:
            return (ReplicaGroups.from_array, (np.array(self._array),))
        return (ReplicaGroups, (self._groups,))


@dataclass(frozen=True, slots=True)
class KeyValueList:
    """An ordered list of `key=value` pairs: `metadata={op_name="x" source_line=3}` (space-separated)
    and `frontend_attributes={a="1", b="2"}` (comma-separated). Values are `str` (quoted in text) or
    `int`; `separator` remembers which of the two spellings the attribute uses."""

    items: tuple[tuple[str, Any], ...]
    separator: str = " "

    def get(self, key: str, default=None):
        for k, v in self.items:
            if k == key:
                return v
        return default


@dataclass(eq=False, slots=True)
class Literal:
    """The value of a `constant(...)`: a numpy array of the instruction's shape, a tuple of literals
    for tuple constants, or elided (`constant({...})`, values unknown: printable, not executable)."""

    value: np.ndarray | None = None
    elements: tuple["Literal", ...] | None = None
    elided: bool = False

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Literal):
            return NotImplemented
        if self.elided or other.elided:
            return self.elided == other.elided
        if self.elements is not None or other.elements is not None:
            return self.elements == other.elements
        a, b = self.value, other.value
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    __hash__ = None  # mutable container semantics


#: attribute names whose values are computation references (the catalogue's `calls`)
COMPUTATION_ATTRIBUTES = CALLED_COMPUTATION_ATTRIBUTES


def called_computation_names(value: Any) -> list[str]:
    """The computation names an attribute value refers to (empty for non-references)."""
    if isinstance(value, ComputationRef):
        return [value.name]
    if isinstance(value, tuple):
        return [v.name for v in value if isinstance(v, ComputationRef)]
    return []


__all__ = [
    "Ident", "ComputationRef", "InstructionRef", "RawAttr", "WindowDim", "Window", "ConvDimLabels",
    "SliceDim", "PadDim", "ReplicaGroups", "KeyValueList", "Literal", "COMPUTATION_ATTRIBUTES",
    "called_computation_names",
]
