"""Tile assignments: the device-id arrays of tiled shardings (XLA's `TileAssignment`).

A tile assignment is an integer array `T` of distinct device ids. It is stored in one of two forms:

* iota: `T = arange(n).reshape(reshape_dims).transpose(perm).reshape(dims)`, text
  `[dims]<=[reshape_dims]T(perm)` (the `T(...)` omitted when `reshape_dims` has one entry);
* explicit: the row-major device list, text `[dims]d0,d1,...`.

Invariant: a tile assignment is stored in iota form whenever its array is representable as one, and
the iota parameters are canonical (no size-1 reshape dims, no two reshape dims that stay adjacent
and in order after the transpose). The canonical parameters of an array are unique, so equality and
hashing of iota assignments compare `(dims, reshape_dims, perm)` without materialising the array;
`transpose`, `reshape` and sorting the last dim stay in iota form where XLA's IotaTileAssignment
does (and a little further), so their cost does not grow with the device count.

Internally an iota assignment is handled as a list of *digits* `(radix, stride)`, most significant
output position first: the flat output index written in mixed radix with these radices maps to the
device id `sum(digit_value * stride)`. Splitting a digit `(a*b, s)` into `(a, s*b), (b, s)` does not
change the array, which is how tile dims that cut across digits are aligned.
"""
from __future__ import annotations

from math import prod
from typing import Iterable, Sequence

import numpy as np

from gspmdc.errors import ShardingError

Digits = list[tuple[int, int]]

#: entries kept in `_INTERNED` before it is emptied
_INTERN_LIMIT = 1 << 16
#: interned iota assignments and the results of their transformations, by `("iota", dims,
#: iota parameters)` or `(operation, dims, iota parameters, argument)`: equal iota values are
#: one object, so the array and coordinate table they materialise are built once per value, and
#: transforming an iota the same way twice costs one lookup. Registered with (and emptied by)
#: `sharding_algebra.clear_caches`, the project's one cache.
_INTERNED: dict = {}


def _ints(values: Iterable, what: str) -> tuple[int, ...]:
    try:
        out = tuple(map(int, values))
    except (TypeError, ValueError):
        raise ShardingError(f"{what} must be a sequence of integers, got {values!r}") from None
    return out


def _remember(key, make):
    """`_INTERNED[key]`, made by `make()` when missing."""
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= _INTERN_LIMIT:
            _INTERNED.clear()
        found = _INTERNED[key] = make()
    return found


def _iota_value(dims: tuple[int, ...], iota: tuple) -> "TileAssignment":
    """The one iota assignment with these dims and canonical parameters."""
    return _remember(("iota", dims, iota), lambda: TileAssignment(dims, iota, None))


def _brief(array: np.ndarray) -> str:
    """A short rendering of a possibly large id array for error messages."""
    return np.array2string(np.asarray(array).ravel(), separator=",", threshold=32, edgeitems=8)


def _digits(reshape_dims: Sequence[int], perm: Sequence[int]) -> Digits:
    """The output digits of `arange(n).reshape(reshape_dims).transpose(perm)`."""
    strides = [1] * len(reshape_dims)
    for i in range(len(reshape_dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * reshape_dims[i + 1]
    return [(reshape_dims[p], strides[p]) for p in perm]


def _canonical(digits: Digits) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Canonical `(reshape_dims, perm)` of a digit list: size-1 digits dropped, digits that are
    adjacent and in order in both output and input merged."""
    merged: Digits = []
    for radix, stride in digits:
        if radix == 1:
            continue
        if merged and merged[-1][1] == stride * radix:
            merged[-1] = (merged[-1][0] * radix, stride)
        else:
            merged.append((radix, stride))
    if not merged:
        return (1,), (0,)
    order = sorted(range(len(merged)), key=lambda i: -merged[i][1])
    rank = {digit: k for k, digit in enumerate(order)}
    return tuple(merged[i][0] for i in order), tuple(rank[i] for i in range(len(merged)))


def _align(digits: Digits, dims: Sequence[int]) -> list[Digits] | None:
    """Split `digits` into consecutive groups whose radix products are `dims` (splitting digits
    where a dim boundary falls inside one); None when a boundary cannot be placed."""
    pending = [d for d in digits if d[0] != 1]
    groups: list[Digits] = []
    for size in reversed(dims):
        group: Digits = []
        while size > 1:
            radix, stride = pending[-1]
            if radix <= size:
                if size % radix:
                    return None
                group.append(pending.pop())
                size //= radix
            else:
                if radix % size:
                    return None
                group.append((size, stride))
                pending[-1] = (radix // size, stride * size)
                size = 1
        groups.append(group[::-1])
    return groups[::-1]


def _detect(flat: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Canonical iota parameters reproducing the permutation `flat` of `range(n)`, or None.

    The least significant output digit is found from `flat[1]` (its stride) and the length of the
    run `flat[k] == k * stride`; a canonical form ends that run exactly at the digit's radix, so the
    digits are recovered one by one in O(n) total, then checked against the materialised iota."""
    n = flat.size
    found: Digits = []
    out_stride = 1
    while out_stride < n:
        stride = int(flat[out_stride])
        column = flat[::out_stride]
        mismatch = np.flatnonzero(column != np.arange(column.size) * stride)
        radix = int(mismatch[0]) if mismatch.size else column.size
        if stride == 0 or radix < 2 or (n // out_stride) % radix:
            return None
        found.append((radix, stride))
        out_stride *= radix
    digits = found[::-1]
    expected = 1
    for radix, stride in sorted(digits, key=lambda d: d[1]):
        if stride != expected:
            return None
        expected *= radix
    reshape_dims, perm = _canonical(digits)
    if not np.array_equal(_iota_array(reshape_dims, perm, (n,)), flat):
        return None
    return reshape_dims, perm


def _iota_array(reshape_dims, perm, dims) -> np.ndarray:
    return np.arange(prod(reshape_dims), dtype=np.int64).reshape(reshape_dims) \
        .transpose(perm).reshape(dims)


def _is_permutation_of_range(flat: np.ndarray) -> bool:
    n = flat.size
    if n == 0 or flat.min() < 0 or flat.max() != n - 1:
        return False
    return bool(np.bincount(flat, minlength=n).max() == 1)


def iota_replica_groups(groups: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Iota parameters `(reshape_dims, perm)` such that `groups` (a `[G, S]` array) equals
    `arange(G*S).reshape(reshape_dims).transpose(perm).reshape(G, S)`, or None. Used to print
    `replica_groups=[G,S]<=[reshape_dims]T(perm)`."""
    flat = np.asarray(groups, dtype=np.int64).ravel()
    if not _is_permutation_of_range(flat):
        return None
    return _detect(flat)


def atomic_axes(*assignments: "TileAssignment") -> list[list[Digits]] | None:
    """For iota assignments of the same devices: per assignment, per axis, the digits
    `(radix, stride)` of the device id whose values make up the axis index (major first), all
    cut at the same places, so that two axes read the same part of the device id exactly when
    they list the same digits, and axes list no digit in common exactly when they read
    independent parts of it. None when an assignment is explicit, or the digits of the
    assignments do not cut into one mixed radix."""
    groups = []
    for ta in assignments:
        if ta._iota is None:
            return None
        axes = _align(_digits(*ta._iota), ta.dims)
        if axes is None:
            return None
        groups.append(axes)
    cuts = sorted({c for axes in groups for axis in axes for radix, stride in axis
                   for c in (stride, radix * stride)})
    if any(b % a for a, b in zip(cuts, cuts[1:])):
        return None
    place = {c: k for k, c in enumerate(cuts)}

    def cut(radix: int, stride: int) -> Digits:
        low, high = place[stride], place[radix * stride]
        return [(cuts[k + 1] // cuts[k], cuts[k]) for k in range(high - 1, low - 1, -1)]
    return [[[atom for digit in axis for atom in cut(*digit)] for axis in axes]
            for axes in groups]


def from_axes(dims: Sequence[int], axes: Sequence[Digits]) -> "TileAssignment":
    """The iota assignment of `dims` whose axis k has its index made of the digits `axes[k]`
    (major first; together a mixed radix of the device ids, as `atomic_axes` gives them)."""
    return _iota_value(tuple(int(d) for d in dims),
                       _canonical([digit for axis in axes for digit in axis]))


class TileAssignment:
    """An immutable array of distinct device ids (see the module docstring for the two forms).

    Build with `TileAssignment.iota(...)` or `TileAssignment.explicit(...)`; both validate and raise
    `ShardingError` naming the offending values."""

    __slots__ = ("dims", "_iota", "_array", "_coordinates", "_hash")

    def __init__(self, dims: tuple[int, ...], iota: tuple | None, array: np.ndarray | None):
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "_iota", iota)
        object.__setattr__(self, "_array", array)
        object.__setattr__(self, "_coordinates", None)
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name, value):
        raise AttributeError("TileAssignment is immutable")

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def iota(cls, dims: Sequence[int], reshape_dims: Sequence[int] | None = None,
             transpose_perm: Sequence[int] | None = None) -> "TileAssignment":
        """`arange(prod(reshape_dims)).reshape(reshape_dims).transpose(perm).reshape(dims)`."""
        dims = _ints(dims, "tile assignment dims")
        if not dims or min(dims) < 1:
            raise ShardingError(
                f"tile assignment dims must be non-empty and positive, got {list(dims)}")
        n = prod(dims)
        reshape_dims = (n,) if reshape_dims is None else _ints(reshape_dims, "iota reshape dims")
        if not reshape_dims or min(reshape_dims) < 1:
            raise ShardingError(
                f"iota reshape dims must be non-empty and positive, got {list(reshape_dims)}")
        if prod(reshape_dims) != n:
            raise ShardingError(
                f"iota tile assignment {list(dims)} has {n} devices but reshape dims "
                f"{list(reshape_dims)} have {prod(reshape_dims)}")
        perm = tuple(range(len(reshape_dims))) if transpose_perm is None \
            else _ints(transpose_perm, "iota transpose perm")
        if sorted(perm) != list(range(len(reshape_dims))):
            raise ShardingError(
                f"iota transpose perm {list(perm)} is not a permutation of "
                f"range({len(reshape_dims)}) (reshape dims {list(reshape_dims)})")
        return _iota_value(dims, _canonical(_digits(reshape_dims, perm)))

    @classmethod
    def explicit(cls, dims: Sequence[int], device_ids: Iterable[int]) -> "TileAssignment":
        """From a row-major device list (the text form `[dims]d0,d1,...`): needs more than one
        device, `prod(dims)` distinct non-negative ids. Stored in iota form when it is one."""
        dims = _ints(dims, "tile assignment dims")
        ids = np.asarray(list(device_ids) if not isinstance(device_ids, np.ndarray) else device_ids)
        if ids.size <= 1:
            raise ShardingError(f"an explicit tile assignment needs more than one device, "
                                f"got {ids.ravel().tolist()}")
        return cls.from_array(ids.reshape(-1), dims)

    @classmethod
    def from_array(cls, array, dims: Sequence[int] | None = None) -> "TileAssignment":
        """From an integer array (reshaped to `dims` when given): any size, distinct ids >= 0."""
        array = np.asarray(array)
        if array.dtype.kind not in "iu":
            raise ShardingError(f"device ids must be integers, got {_brief(array)}")
        dims = array.shape if dims is None else _ints(dims, "tile assignment dims")
        if not dims or min(dims) < 1:
            raise ShardingError(
                f"tile assignment dims must be non-empty and positive, got {list(dims)}")
        if array.size != prod(dims):
            raise ShardingError(
                f"tile assignment dims {list(dims)} need {prod(dims)} devices, got {array.size}: "
                f"{_brief(array)}")
        flat = array.astype(np.int64, copy=False).ravel()
        if flat.min() < 0:
            raise ShardingError(
                f"negative device id {int(flat.min())} in tile assignment {_brief(flat)}")
        top = int(flat.max())
        if top < 2 * flat.size:                  # dense ids: count them in one linear pass
            counts = np.bincount(flat, minlength=top + 1)
            dups = np.flatnonzero(counts > 1)
        else:                                    # sparse ids: sort, no array of size max(id)
            ids, counts = np.unique(flat, return_counts=True)
            dups = ids[counts > 1]
        if dups.size:
            raise ShardingError(
                f"duplicate device ids {dups[:8].tolist()} in tile assignment {_brief(flat)}")
        if top == flat.size - 1:
            iota = _detect(flat)
            if iota is not None:
                return _iota_value(tuple(dims), iota)
        frozen = flat.reshape(dims).copy()
        frozen.setflags(write=False)
        return cls(tuple(dims), None, frozen)

    # ---- queries ------------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def num_devices(self) -> int:
        """Number of elements (devices) of the assignment."""
        return prod(self.dims)

    @property
    def max_device(self) -> int:
        return self.num_devices - 1 if self._iota is not None else int(self._array.max())

    @property
    def array(self) -> np.ndarray:
        """The device-id array (int64, read-only; materialised once and cached)."""
        if self._array is None:
            array = _iota_array(*self._iota, self.dims)
            array.setflags(write=False)
            object.__setattr__(self, "_array", array)
        return self._array

    def iota_form(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Canonical `(reshape_dims, perm)` when the assignment is an iota, else None."""
        return self._iota

    def device(self, index: Sequence[int]) -> int:
        """The device at a full index of `T`."""
        return int(self.array[tuple(index)])

    def coordinates(self) -> np.ndarray:
        """`[max_device + 1, ndim]` table: the index of each device id in `T` (-1 rows for ids
        absent from `T`). Cached; read-only."""
        if self._coordinates is None:
            flat = self.array.ravel()
            table = np.full((int(flat.max()) + 1, self.ndim), -1, dtype=np.int64)
            table[flat] = np.indices(self.dims, dtype=np.int64).reshape(self.ndim, -1).T
            table.setflags(write=False)
            object.__setattr__(self, "_coordinates", table)
        return self._coordinates

    # ---- transformations ----------------------------------------------------------------------

    def reshape(self, dims: Sequence[int]) -> "TileAssignment":
        """Same row-major device order, new dims."""
        dims = _ints(dims, "tile assignment dims")
        if self._iota is not None:
            # an interned value with these dims and parameters: the reshape is valid
            found = _INTERNED.get(("iota", dims, self._iota))
            if found is not None:
                return found
        if prod(dims) != self.num_devices or not dims or min(dims) < 1:
            raise ShardingError(
                f"cannot reshape tile assignment {list(self.dims)} to {list(dims)}")
        if self._iota is not None:
            return _iota_value(dims, self._iota)
        return TileAssignment(dims, None, _frozen(self._array.reshape(dims)))

    def transpose(self, perm: Sequence[int]) -> "TileAssignment":
        """`T.transpose(perm)`: output dim i is input dim `perm[i]`."""
        perm = _ints(perm, "transpose perm")
        if self._iota is not None:
            # transposed this way before: the perm is valid
            found = _INTERNED.get(("transpose", self.dims, self._iota, perm))
            if found is not None:
                return found
        if sorted(perm) != list(range(self.ndim)):
            raise ShardingError(
                f"transpose perm {list(perm)} is not a permutation of range({self.ndim}) "
                f"(tile assignment dims {list(self.dims)})")
        if perm == tuple(range(self.ndim)):
            return self
        if self._iota is not None:
            return _remember(("transpose", self.dims, self._iota, perm),
                             lambda: self._transposed(perm))
        return TileAssignment.from_array(self.array.transpose(perm))

    def _transposed(self, perm: tuple[int, ...]) -> "TileAssignment":
        groups = _align(_digits(*self._iota), self.dims)
        if groups is None:
            return TileAssignment.from_array(self.array.transpose(perm))
        digits = [d for p in perm for d in groups[p]]
        return _iota_value(tuple(self.dims[p] for p in perm), _canonical(digits))

    def sort_last_dim(self) -> "TileAssignment":
        """Sort the ids along the last dim (each replication group ascending,
        docs/design/sharding-algebra.md#canonical-forms)."""
        if self._iota is not None:
            return _remember(("sort_last_dim", self.dims, self._iota),
                             self._sorted_last_dim)
        return self._sorted_last_dim()

    def _sorted_last_dim(self) -> "TileAssignment":
        if self._iota is not None:
            groups = _align(_digits(*self._iota), self.dims)
            if groups is not None:
                groups[-1] = sorted(groups[-1], key=lambda d: -d[1])
                digits = [d for g in groups for d in g]
                return _iota_value(self.dims, _canonical(digits))
        last = self.dims[-1]
        return TileAssignment.from_array(np.sort(self.array.reshape(-1, last), axis=1), self.dims)

    # ---- value semantics ----------------------------------------------------------------------

    def __eq__(self, other) -> bool:
        if not isinstance(other, TileAssignment):
            return NotImplemented
        if self is other:
            return True
        if self.dims != other.dims:
            return False
        if self._iota is not None or other._iota is not None:
            return self._iota == other._iota
        return bool(np.array_equal(self._array, other._array))

    def __hash__(self) -> int:
        if self._hash is None:
            key = self._iota if self._iota is not None else self._array.tobytes()
            object.__setattr__(self, "_hash", hash((self.dims, key)))
        return self._hash

    def to_text(self) -> str:
        """XLA's text: `[2,2]<=[4]`, `[2,2]<=[2,2]T(1,0)` or `[2,2]3,1,2,0`."""
        head = "[" + ",".join(map(str, self.dims)) + "]"
        if self._iota is None:
            return head + ",".join(map(str, self._array.ravel().tolist()))
        reshape_dims, perm = self._iota
        text = head + "<=[" + ",".join(map(str, reshape_dims)) + "]"
        if len(reshape_dims) > 1:
            text += "T(" + ",".join(map(str, perm)) + ")"
        return text

    def __repr__(self) -> str:
        return f"TileAssignment({self.to_text()})"

    def __reduce__(self):
        if self._iota is not None:
            return (TileAssignment.iota, (self.dims, *self._iota))
        return (TileAssignment.from_array, (np.array(self._array),))


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array)
    array.setflags(write=False)
    return array


__all__ = ["TileAssignment", "iota_replica_groups", "atomic_axes", "from_axes"]
