"""HloSharding: the immutable, validated sharding value attached to instruction results.

Follows XLA's `HloSharding` (docs/design/sharding-algebra.md). A sharding is one of

| kind         | text                                                 |
|--------------|------------------------------------------------------|
| `replicated` | `{replicated}`                                       |
| `manual`     | `{manual}`                                           |
| `unknown`    | `{unknown}`                                          |
| `unreduced`  | `{unreduced}`                                        |
| `maximal`    | `{maximal device=3}`                                 |
| `tiled`      | `{devices=[2,1,2]<=[4] last_tile_dim_replicate}`      |
| `tuple`      | `{{replicated}, {maximal device=0}}` (one leaf per array leaf, pre-order) |

A tiled sharding has a `TileAssignment` `T` whose leading `data_rank` dims cut the array's dims and
whose trailing dims are typed subgroups (`subgroup_types`, a tuple of "manual" / "unreduced" /
"replicated"; `("replicated",)` is `last_tile_dim_replicate`). Shardings are canonicalised on
construction (docs/design/sharding-algebra.md#canonical-forms), so `==` is semantic: it compares
kind, tile assignment, subgroup types,
maximal device, tuple elements and shard group, never metadata.

Shard-shape arithmetic (docs/design/sharding-algebra.md#shard-arithmetic): `shard = cdiv(S, t)`,
padded offset `ordinal * shard`, valid range
`[min(ordinal*shard, S), min((ordinal+1)*shard, S))`; tables over all devices are numpy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Iterator, Sequence

import numpy as np

from gspmdc.errors import ShardingError

from .attributes import KeyValueList
from .shapes import ArrayShape, Shape, TupleShape
from .tile_assignment import TileAssignment

#: subgroup types in canonical order (replicated always last)
SUBGROUP_TYPES = ("manual", "unreduced", "replicated")
_SINGLE_KINDS = ("replicated", "manual", "unknown", "unreduced", "maximal", "tiled")
#: every valid `subgroup_types`: distinct types in the order of SUBGROUP_TYPES
_ORDERED_TYPES = frozenset(tuple(t for k, t in enumerate(SUBGROUP_TYPES) if mask >> k & 1)
                           for mask in range(1 << len(SUBGROUP_TYPES)))


@dataclass(frozen=True, slots=True)
class ShardGroup:
    """A `shard_as N` / `shard_like N` annotation: values in group N get the same sharding
    ("as") or a sharding like it ("like"). Part of sharding equality."""

    kind: str
    group_id: int

    def __post_init__(self):
        if self.kind not in ("as", "like"):
            raise ShardingError(f"shard group kind must be 'as' or 'like', got {self.kind!r}")
        if not isinstance(self.group_id, int) or self.group_id < 0:
            raise ShardingError(
                f"shard group id must be a non-negative integer, got {self.group_id!r}")

    def to_text(self) -> str:
        return f"shard_{self.kind} {self.group_id}"


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quote(value: str) -> str:
    """A C-escaped double-quoted string (other control characters as 3-digit octal escapes)."""
    return '"' + "".join(_ESCAPES.get(c) or (f"\\{ord(c):03o}" if c < " " else c)
                         for c in value) + '"'


def _metadata_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return _quote(value) if isinstance(value, str) else str(value)


def _metadata_text(entry: KeyValueList) -> str:
    return entry.separator.join(f"{k}={_metadata_value(v)}" for k, v in entry.items)


def _cdiv(a, b):
    return -(-a // b)


#: entries kept in `_TILED` before it is emptied
_TILED_LIMIT = 1 << 14
#: `HloSharding.tiled` results without metadata or shard group, by (tile assignment, subgroup
#: types), and each such value by itself: equal values made from different tile assignments
#: (or subgroup types) are one object, so comparing them is an identity test. Registered with
#: (and emptied by) `sharding_algebra.clear_caches`, the project's one cache.
_TILED: dict = {}
#: `HloSharding.shard_shape` of tiled shardings, by (sharding, array shape): lowering asks for
#: the shard shape of every instruction more than once. Registered like `_TILED`.
_SHARD_SHAPES: dict = {}
#: (sharding, shape, number of devices) triples `HloSharding.validate` accepted: the
#: partitioner validates every instruction's sharding. Registered like `_TILED`.
_VALID: dict = {}

#: the metadata-free `{replicated}`, `{manual}`, `{unknown}` and `{unreduced}` values, one each
#: (`HloSharding._plain`; immutable, so sharing them is safe)
_PLAIN: dict = {}


@dataclass(frozen=True, slots=True, eq=False)
class HloSharding:
    """An immutable sharding value; build it with the class methods (`replicate`, `tiled`, ...),
    which validate and canonicalise. Invalid values raise `ShardingError` naming them."""

    kind: str
    tile_assignment: TileAssignment | None = None
    subgroup_types: tuple[str, ...] = ()
    device: int | None = None
    elements: tuple["HloSharding", ...] = ()
    metadata: tuple[KeyValueList, ...] = ()
    shard_group: ShardGroup | None = None
    #: hash of the semantic key, computed once (shardings are hashed over and over as memo keys)
    _hash: int = field(init=False, repr=False, compare=False, default=0)
    #: the key under which the algebra's cache stores results for this value: the value itself
    #: when no leaf carries metadata, else the value with its leaves' metadata (a cached result
    #: must carry the metadata of the arguments it was computed from)
    memo_key: object = field(init=False, repr=False, compare=False, default=None)
    #: the tile counts of the data dims (tiled shardings; computed once, read constantly)
    _counts: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self):
        self._validate()
        object.__setattr__(self, "_hash", hash(self._key()))
        if self.kind == "tuple":
            metadata = tuple(leaf.metadata for leaf in self.elements)
            object.__setattr__(self, "memo_key",
                               self if not any(metadata) else (self, metadata))
        else:
            object.__setattr__(self, "memo_key",
                               self if not self.metadata else (self, (self.metadata,)))
        if self.kind == "tiled":
            dims = self.tile_assignment.dims
            object.__setattr__(self, "_counts", dims[:len(dims) - len(self.subgroup_types)])

    def _validate(self):
        kind = self.kind
        if kind not in _SINGLE_KINDS and kind != "tuple":
            raise ShardingError(f"unknown sharding kind {kind!r}")
        if (self.tile_assignment is not None) != (kind == "tiled"):
            raise ShardingError(f"a {kind} sharding {'needs' if kind == 'tiled' else 'takes no'} "
                                f"tile assignment")
        if self.subgroup_types and kind != "tiled":
            raise ShardingError(
                f"a {kind} sharding takes no subgroup types, got {self.subgroup_types}")
        if (self.device is not None) != (kind == "maximal"):
            raise ShardingError(f"a {kind} sharding {'needs' if kind == 'maximal' else 'takes no'} "
                                f"device, got {self.device!r}")
        if kind == "maximal" and \
                (not isinstance(self.device, (int, np.integer)) or self.device < 0):
            raise ShardingError(
                f"maximal device must be a non-negative integer, got {self.device!r}")
        if self.elements and kind != "tuple":
            raise ShardingError(f"a {kind} sharding has no tuple elements")
        for e in self.elements:
            if not isinstance(e, HloSharding) or e.kind == "tuple":
                raise ShardingError(f"tuple sharding elements must be leaf shardings, got {e!r}")
        if kind == "tuple" and self.shard_group is not None:
            raise ShardingError("a tuple sharding carries shard groups on its elements")
        if self.metadata != () and (not isinstance(self.metadata, tuple) or
                                    not all(isinstance(m, KeyValueList) for m in self.metadata)):
            raise ShardingError(
                f"sharding metadata must be a tuple of KeyValueList, got {self.metadata!r}")
        if kind == "tiled":
            self._check_tiled()

    def _check_tiled(self):
        ta, types = self.tile_assignment, self.subgroup_types
        if ta.num_devices == 1:
            raise ShardingError(f"a tiled sharding needs more than one device, got {ta.to_text()}")
        if types not in _ORDERED_TYPES:
            raise ShardingError(f"subgroup types must be distinct, in the order {SUBGROUP_TYPES}; "
                                f"got {list(types)}")
        if len(types) > ta.ndim:
            raise ShardingError(f"{len(types)} subgroup types {list(types)} for tile assignment "
                                f"{ta.to_text()} of rank {ta.ndim}")
        if len(types) and 1 in ta.dims[ta.ndim - len(types):]:
            raise ShardingError(f"size-1 subgroup dim in {ta.to_text()} {list(types)}")

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def replicate(cls, metadata=(), shard_group: ShardGroup | None = None) -> "HloSharding":
        return cls._plain("replicated", metadata, shard_group)

    @classmethod
    def manual(cls, metadata=(), shard_group: ShardGroup | None = None) -> "HloSharding":
        return cls._plain("manual", metadata, shard_group)

    @classmethod
    def unknown(cls, metadata=(), shard_group: ShardGroup | None = None) -> "HloSharding":
        return cls._plain("unknown", metadata, shard_group)

    @classmethod
    def unreduced(cls, metadata=(), shard_group: ShardGroup | None = None) -> "HloSharding":
        return cls._plain("unreduced", metadata, shard_group)

    @classmethod
    def _plain(cls, kind: str, metadata, shard_group: ShardGroup | None) -> "HloSharding":
        """A sharding of `kind` without tiles or device; without metadata or shard group the
        one shared value of that kind (`_PLAIN`: `{replicated}` is asked for constantly)."""
        if not metadata and shard_group is None:
            found = _PLAIN.get(kind)
            if found is None:
                found = _PLAIN[kind] = cls(kind)
            return found
        return cls(kind, metadata=tuple(metadata), shard_group=shard_group)

    @classmethod
    def maximal(cls, device: int, metadata=(),
                shard_group: ShardGroup | None = None) -> "HloSharding":
        return cls("maximal", device=device, metadata=tuple(metadata), shard_group=shard_group)

    @classmethod
    def tiled(cls, tile_assignment: TileAssignment, subgroup_types: Sequence[str] = (),
              metadata=(), shard_group: ShardGroup | None = None) -> "HloSharding":
        """A tiled sharding in canonical form (docs/design/sharding-algebra.md#canonical-forms):
        size-1 subgroup dims dropped, same-typed
        subgroup dims merged, types ordered manual < unreduced < replicated, replication groups
        sorted; degenerates to `{replicated}`/`{manual}`/`{unreduced}` when no data dim is cut
        and one subgroup type remains, and to `{replicated}` on a single device.

        Without metadata or shard group the value is made once per (tile assignment, subgroup
        types) and shared (`_TILED`), one object per value: compilation builds the same few
        shardings thousands of times, and compares them more often still."""
        metadata = tuple(metadata)
        if metadata or shard_group is not None or not isinstance(tile_assignment, TileAssignment):
            return cls._canonical_tiled(tile_assignment, tuple(subgroup_types), metadata,
                                        shard_group)
        try:
            key = (tile_assignment, tuple(subgroup_types))
            found = _TILED.get(key)
        except TypeError:               # unhashable subgroup types: the checks name them
            return cls._canonical_tiled(tile_assignment, tuple(subgroup_types), (), None)
        if found is None:
            if len(_TILED) >= _TILED_LIMIT:
                _TILED.clear()
            made = cls._canonical_tiled(*key, (), None)
            found = _TILED[key] = _TILED.setdefault(made, made)
        return found

    @classmethod
    def _canonical_tiled(cls, ta, types: tuple, metadata: tuple,
                         shard_group: ShardGroup | None) -> "HloSharding":
        if not isinstance(ta, TileAssignment):
            raise ShardingError(f"tile assignment must be a TileAssignment, got {ta!r}")
        bad = [t for t in types if t not in SUBGROUP_TYPES]
        if bad:
            raise ShardingError(f"unknown subgroup types {bad} (expected {list(SUBGROUP_TYPES)})")
        if len(types) > ta.ndim:
            raise ShardingError(f"{len(types)} subgroup types {list(types)} for tile assignment "
                                f"{ta.to_text()} of rank {ta.ndim}")
        data_rank = ta.ndim - len(types)
        data_dims = ta.dims[:data_rank]
        if types and prod(data_dims) == 1 and len(set(types)) == 1:
            return cls._plain(types[0], metadata, shard_group)
        perm, new_dims, new_types = list(range(data_rank)), list(data_dims), []
        for t in SUBGROUP_TYPES:
            axes = [data_rank + i for i, u in enumerate(types)
                    if u == t and ta.dims[data_rank + i] > 1]
            if axes:
                perm += axes
                new_dims.append(prod(ta.dims[a] for a in axes))
                new_types.append(t)
        perm += [a for a in range(data_rank, ta.ndim) if a not in perm]
        if tuple(new_dims) != ta.dims or perm != sorted(perm):
            if not new_dims:
                return cls._plain("replicated", metadata, shard_group)
            ta = ta.transpose(perm).reshape(new_dims)
        if len(new_types) == 1 and prod(data_dims) == 1:
            return cls._plain(new_types[0], metadata, shard_group)
        if ta.num_devices == 1:
            return cls._plain("replicated", metadata, shard_group)
        if new_types and new_types[-1] == "replicated":
            ta = ta.sort_last_dim()
        return cls("tiled", tile_assignment=ta, subgroup_types=tuple(new_types),
                   metadata=metadata, shard_group=shard_group)

    @classmethod
    def iota_tiled(cls, dims: Sequence[int], reshape_dims: Sequence[int] | None = None,
                   transpose_perm: Sequence[int] | None = None, subgroup_types: Sequence[str] = (),
                   metadata=()) -> "HloSharding":
        """Shorthand for `tiled(TileAssignment.iota(dims, reshape_dims, transpose_perm), ...)`."""
        return cls.tiled(TileAssignment.iota(dims, reshape_dims, transpose_perm),
                         subgroup_types, metadata)

    @classmethod
    def tuple(cls, elements: Sequence["HloSharding"], metadata=()) -> "HloSharding":
        """One leaf sharding per array leaf of the tuple shape (pre-order). `metadata`, when given,
        is appended to every element's metadata (XLA keeps metadata on the leaves)."""
        elements = tuple(elements)
        if metadata:
            elements = tuple(e.with_metadata(e.metadata + tuple(metadata)) for e in elements)
        return cls("tuple", elements=elements)

    # ---- value semantics ----------------------------------------------------------------------

    def _key(self):
        return (self.kind, self.tile_assignment, self.subgroup_types, self.device, self.elements,
                self.shard_group)

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if type(other) is not HloSharding:
            return NotImplemented
        # field by field rather than through `_key()`: equal values that are not the same object
        # are compared constantly (a plan's sharding against an operand's)
        # (the tile assignments are usually one interned object: no call to compare them)
        return self._hash == other._hash and self.kind == other.kind and \
            (self.tile_assignment is other.tile_assignment or
             self.tile_assignment == other.tile_assignment) and \
            self.subgroup_types == other.subgroup_types and self.device == other.device and \
            self.elements == other.elements and self.shard_group == other.shard_group

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # rebuilt through the constructor: the cached hash is only valid in the process that
        # computed it
        return (HloSharding, (self.kind, self.tile_assignment, self.subgroup_types, self.device,
                              self.elements, self.metadata, self.shard_group))

    def with_metadata(self, metadata) -> "HloSharding":
        """The same sharding with `metadata` replacing its own (on every leaf for tuples)."""
        metadata = tuple(metadata)
        if self.kind == "tuple":
            elements = tuple(e.with_metadata(metadata) for e in self.elements)
            if all(new is old for new, old in zip(elements, self.elements)):
                return self
            return HloSharding("tuple", elements=elements)
        if metadata == self.metadata:
            return self
        return HloSharding(self.kind, self.tile_assignment, self.subgroup_types, self.device, (),
                           metadata, self.shard_group)

    def with_shard_group(self, shard_group: ShardGroup | None) -> "HloSharding":
        if self.kind == "tuple":
            elements = tuple(e.with_shard_group(shard_group) for e in self.elements)
            if all(new is old for new, old in zip(elements, self.elements)):
                return self
            return HloSharding("tuple", elements=elements)
        if shard_group == self.shard_group:
            return self
        return HloSharding(self.kind, self.tile_assignment, self.subgroup_types, self.device, (),
                           self.metadata, shard_group)

    # ---- text ---------------------------------------------------------------------------------

    def to_text(self, include_metadata: bool = True) -> str:
        """XLA's text form, e.g. `{devices=[2,1,2]<=[4] last_tile_dim_replicate}`."""
        if self.kind == "tuple":
            return "{" + ", ".join(e.to_text(include_metadata) for e in self.elements) + "}"
        suffix = ""
        if self.shard_group is not None:
            suffix += " " + self.shard_group.to_text()
        if include_metadata and self.metadata:
            if len(self.metadata) == 1:
                suffix += " metadata={" + _metadata_text(self.metadata[0]) + "}"
            else:
                suffix += " metadata={" + ", ".join(
                    "{" + _metadata_text(m) + "}" for m in self.metadata) + "}"
        if self.kind == "maximal":
            return f"{{maximal device={self.device}{suffix}}}"
        if self.kind != "tiled":
            return f"{{{self.kind}{suffix}}}"
        text = "{devices=" + self.tile_assignment.to_text()
        if self.subgroup_types == ("replicated",):
            text += " last_tile_dim_replicate"
        elif self.subgroup_types:
            text += " last_tile_dims={" + ", ".join(self.subgroup_types) + "}"
        return text + suffix + "}"

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"HloSharding({self.to_text()})"

    # ---- kind predicates ----------------------------------------------------------------------

    def _all_leaves(self, kinds: tuple[str, ...]) -> bool:
        """Whether every leaf's kind is one of `kinds` (asked constantly: arrays answer first)."""
        if self.kind != "tuple":
            return self.kind in kinds
        return all(e.kind in kinds for e in self.elements)

    @property
    def is_tuple(self) -> bool:
        return self.kind == "tuple"

    @property
    def is_replicated(self) -> bool:
        """Every (leaf) sharding is `{replicated}` (true for the empty tuple)."""
        if self.kind != "tuple":            # arrays answer first: asked constantly
            return self.kind == "replicated"
        return self._all_leaves(("replicated",))

    @property
    def is_manual(self) -> bool:
        if self.kind != "tuple":
            return self.kind == "manual"
        return self._all_leaves(("manual",))

    @property
    def is_unknown(self) -> bool:
        return self._all_leaves(("unknown",))

    @property
    def is_unreduced(self) -> bool:
        return self._all_leaves(("unreduced",))

    @property
    def is_maximal(self) -> bool:
        """Single-device (`{maximal device=k}`) on every leaf."""
        return self._all_leaves(("maximal",))

    @property
    def is_tile_maximal(self) -> bool:
        """Replicated or single-device on every leaf (XLA's IsTileMaximal; manual is not)."""
        if self.kind != "tuple":
            return self.kind == "replicated" or self.kind == "maximal"
        return self._all_leaves(("replicated", "maximal"))

    @property
    def is_tiled(self) -> bool:
        """A leaf `devices=` sharding (possibly partially replicated or with subgroups)."""
        return self.kind == "tiled"

    @property
    def replicate_on_last_tile_dim(self) -> bool:
        return self.subgroup_types == ("replicated",)

    @property
    def has_manual_subgroup(self) -> bool:
        return "manual" in self.subgroup_types

    @property
    def has_unreduced(self) -> bool:
        """A leaf holding partial values: `{unreduced}`, or tiled with an unreduced subgroup."""
        return self.kind == "unreduced" or "unreduced" in self.subgroup_types

    @property
    def has_manual_leaf(self) -> bool:
        """Some leaf is `{manual}` or has a manual subgroup (per-device data)."""
        if self.kind != "tuple":
            return self.kind == "manual" or "manual" in self.subgroup_types
        return any(leaf.kind == "manual" or leaf.has_manual_subgroup for leaf in self.leaves())

    @property
    def has_partial_replication(self) -> bool:
        """Tiled with a replicated subgroup dim (each tile on a group of devices)."""
        return "replicated" in self.subgroup_types

    @property
    def unique_device(self) -> int | None:
        """The device of a maximal sharding (tuples: all leaves maximal on one device), or None."""
        if self.kind == "tuple":
            devices = {e.device if e.kind == "maximal" else None for e in self.elements}
            return devices.pop() if len(devices) == 1 else None
        return self.device

    def leaves(self) -> Iterator["HloSharding"]:
        if self.kind == "tuple":
            yield from self.elements
        else:
            yield self

    # ---- tile counts --------------------------------------------------------------------------

    def _require_tiled(self, what: str):
        if self.kind != "tiled":
            raise ShardingError(f"{what} needs a tiled sharding, got {self.to_text()}")

    @property
    def data_rank(self) -> int:
        """Number of data dims of `T` (its rank minus the subgroup dims); tiled shardings only."""
        self._require_tiled("data_rank")
        return len(self._counts)

    @property
    def tile_counts(self) -> tuple[int, ...]:
        """How many pieces each array dim is cut into (the data dims of `T`); tiled only."""
        self._require_tiled("tile_counts")
        return self._counts

    def tile_counts_for_rank(self, rank: int) -> tuple[int, ...]:
        """`tile_counts` for tiled shardings (checked against `rank`), all ones otherwise."""
        if self.kind != "tiled":
            return (1,) * rank
        if len(self._counts) != rank:
            raise ShardingError(f"sharding {self.to_text()} has data rank {self.data_rank}, "
                                f"array rank is {rank}")
        return self._counts

    @property
    def num_tiles(self) -> int:
        """Product of the data tile counts (replication excluded); 1 unless tiled."""
        return prod(self._counts) if self.kind == "tiled" else 1

    @property
    def total_num_tiles(self) -> int:
        """Number of elements of `T`; 1 unless tiled."""
        return self.tile_assignment.num_devices if self.kind == "tiled" else 1

    def subgroup_dim(self, subgroup_type: str) -> int:
        """Index in `T` of the subgroup dim of that type, or -1."""
        if subgroup_type not in self.subgroup_types:
            return -1
        return self.tile_assignment.ndim - len(self.subgroup_types) + \
            self.subgroup_types.index(subgroup_type)

    def subgroup_size(self, subgroup_type: str) -> int:
        """Size of the subgroup dim of that type (1 when absent)."""
        dim = self.subgroup_dim(subgroup_type)
        return 1 if dim < 0 else self.tile_assignment.dims[dim]

    # ---- devices and tiles --------------------------------------------------------------------

    def tile_indices(self) -> np.ndarray:
        """`[max_device + 1, data_rank]` int table: row d = tile index of device d (-1 rows for
        ids absent from `T`). Read-only."""
        self._require_tiled("tile_indices")
        return self.tile_assignment.coordinates()[:, :self.data_rank]

    def _has_device(self, device: int) -> bool:
        full = self.tile_assignment.coordinates()
        return 0 <= device < full.shape[0] and full[device, 0] >= 0

    def tile_index_for_device(self, device: int) -> tuple[int, ...]:
        """The data tile index of `device` (its coordinates in the data dims of `T`)."""
        table = self.tile_indices()
        if not self._has_device(device):
            raise ShardingError(f"device {device} is not in sharding {self.to_text()}")
        return tuple(int(i) for i in table[device])

    def devices_for_tile(self, index: Sequence[int]) -> np.ndarray:
        """Device ids holding the tile at data index `index` (all subgroup members, `T` order)."""
        self._require_tiled("devices_for_tile")
        index = tuple(int(i) for i in index)
        if len(index) != self.data_rank or \
                any(not 0 <= i < t for i, t in zip(index, self.tile_counts)):
            raise ShardingError(f"tile index {list(index)} out of range for tile counts "
                                f"{list(self.tile_counts)} of {self.to_text()}")
        return self.tile_assignment.array[index].ravel()

    def replication_groups(self, num_devices: int | None = None) -> np.ndarray:
        """`[G, S]` array of devices holding identical data: the replicated subgroup rows of `T`
        (`S = 1` without partial replication); `{replicated}` gives one group of `num_devices`."""
        if self.kind == "replicated":
            if num_devices is None:
                raise ShardingError("replication_groups of {replicated} needs num_devices")
            return np.arange(num_devices, dtype=np.int64)[None, :]
        self._require_tiled("replication_groups")
        size = self.subgroup_size("replicated")
        return self.tile_assignment.array.reshape(-1, size)

    def partition_groups_for_replication(self, dims: Sequence[int]) -> np.ndarray:
        """`[G, S]` groups of devices that must exchange data to undo the tiling on `T` dims
        `dims` (docs/design/sharding-algebra.md#grouping): devices sharing every other coordinate
        of `T`, groups ordered by those
        coordinates, members row-major by their coordinates on `dims`."""
        self._require_tiled("partition_groups_for_replication")
        ta = self.tile_assignment
        dims = [int(d) for d in dims]
        if len(set(dims)) != len(dims) or any(not 0 <= d < ta.ndim for d in dims):
            raise ShardingError(f"bad replication dims {dims} for tile assignment {ta.to_text()}")
        dims = sorted(dims)
        others = [d for d in range(ta.ndim) if d not in dims]
        size = prod(ta.dims[d] for d in dims)
        return ta.transpose(others + dims).array.reshape(-1, size)

    # ---- shapes and offsets -------------------------------------------------------------------

    def _leaf_for_array(self, shape: ArrayShape) -> tuple[int, ...]:
        """Tile counts for `shape`, checking the rank."""
        if not isinstance(shape, ArrayShape):
            raise ShardingError(f"sharding {self.to_text()} applied to non-array shape {shape}")
        return self.tile_counts_for_rank(shape.rank)

    def leaf_shardings(self, shape: Shape) -> list["HloSharding"]:
        """One leaf sharding per array leaf of `shape` (a non-tuple sharding applies to all)."""
        leaves = list(shape.leaves())
        if self.kind != "tuple":
            return [self] * len(leaves)
        if len(self.elements) != len(leaves):
            raise ShardingError(f"tuple sharding with {len(self.elements)} elements for shape "
                                f"{shape} with {len(leaves)} leaves")
        return list(self.elements)

    def subsharding(self, shape: Shape, index: Sequence[int]) -> "HloSharding":
        """The sharding of the sub-shape at tuple index path `index` (a tuple sharding for tuple
        sub-shapes)."""
        if self.kind != "tuple":
            return self
        leaves = self.leaf_shardings(shape)
        start = 0
        for i in index:
            if not isinstance(shape, TupleShape) or not 0 <= i < len(shape.elements):
                raise ShardingError(f"tuple index {list(index)} out of range for shape {shape}")
            start += sum(sum(1 for _ in e.leaves()) for e in shape.elements[:i])
            shape = shape.elements[i]
        if not isinstance(shape, TupleShape):
            return leaves[start]
        count = sum(1 for _ in shape.leaves())
        return HloSharding.tuple(leaves[start:start + count])

    def shard_shape(self, shape: Shape) -> Shape:
        """The per-partition shape: `cdiv(S[d], t_d)` on tiled dims; base shape otherwise."""
        if isinstance(shape, TupleShape):
            leaves = iter(self.leaf_shardings(shape))

            def rebuild(s: Shape) -> Shape:
                if isinstance(s, TupleShape):
                    return TupleShape(tuple(rebuild(e) for e in s.elements))
                return next(leaves).shard_shape(s)
            return rebuild(shape)
        if self.kind != "tiled":
            self._leaf_for_array(shape)
            return shape
        key = (self, shape)
        found = _SHARD_SHAPES.get(key)
        if found is None:
            counts = self._leaf_for_array(shape)
            dims = tuple(_cdiv(s, t) for s, t in zip(shape.dims, counts))
            if len(_SHARD_SHAPES) >= _TILED_LIMIT:
                _SHARD_SHAPES.clear()
            found = _SHARD_SHAPES[key] = ArrayShape(shape.element_type, dims, shape.layout)
        return found

    def _table_rows(self, num_devices: int | None) -> int:
        if self.kind == "tiled":
            rows = self.tile_assignment.max_device + 1
            if num_devices is not None and num_devices < rows:
                raise ShardingError(f"sharding {self.to_text()} uses device {rows - 1} but there "
                                    f"are only {num_devices} devices")
            return rows if num_devices is None else num_devices
        if num_devices is None:
            raise ShardingError(f"per-device tables for {self.to_text()} need num_devices")
        return num_devices

    def _indices_table(self, shape: ArrayShape, num_devices: int | None):
        """(tile index table [D, rank] with -1 for absent devices, shard sizes, base dims)."""
        counts = self._leaf_for_array(shape)
        rows = self._table_rows(num_devices)
        dims = np.asarray(shape.dims, dtype=np.int64)
        shard = np.asarray([_cdiv(s, t) for s, t in zip(shape.dims, counts)], dtype=np.int64)
        if self.kind != "tiled":
            return np.zeros((rows, shape.rank), dtype=np.int64), shard, dims
        table = self.tile_indices()
        if rows > table.shape[0]:
            table = np.vstack([table, np.full((rows - table.shape[0], shape.rank), -1, np.int64)])
        return table, shard, dims

    def offset_table(self, shape: ArrayShape, num_devices: int | None = None) -> np.ndarray:
        """`[D, rank]` padded offsets `ordinal * shard_size` of each device's shard (0 for devices
        outside `T`); `D = num_devices` or `max device + 1`."""
        table, shard, _ = self._indices_table(shape, num_devices)
        return np.maximum(table, 0) * shard

    def valid_range_table(self, shape: ArrayShape, num_devices: int | None = None):
        """`(start, limit)`, two `[D, rank]` tables of each device's real (unpadded) data range:
        `min(ordinal*shard, S)`, `min((ordinal+1)*shard, S)`; empty for devices outside `T`."""
        table, shard, dims = self._indices_table(shape, num_devices)
        if self.kind != "tiled":
            start = np.zeros_like(table)
            limit = np.broadcast_to(dims, table.shape).copy()
            if self.kind == "maximal" and num_devices is not None and self.device >= num_devices:
                raise ShardingError(f"maximal device {self.device} >= {num_devices} devices")
            return start, limit
        absent = table < 0
        start = np.minimum(table * shard, dims)
        limit = np.minimum((table + 1) * shard, dims)
        start[absent] = 0
        limit[absent] = 0
        return start, limit

    def valid_extent_table(self, shape: ArrayShape, num_devices: int | None = None) -> np.ndarray:
        """`[D, rank]` number of real elements each device holds per dim (`limit - start`)."""
        start, limit = self.valid_range_table(shape, num_devices)
        return limit - start

    def non_padded_shape(self, shape: ArrayShape, device: int) -> tuple[int, ...]:
        """The valid (unpadded) extent of `device`'s shard
        (docs/design/sharding-algebra.md#shard-arithmetic); zeros for devices not in `T`."""
        if self.kind != "tiled":
            self._leaf_for_array(shape)
            return tuple(shape.dims)
        self._leaf_for_array(shape)
        if not self._has_device(device):
            return (0,) * shape.rank
        index = self.tile_indices()[device]
        shard = [_cdiv(s, t) for s, t in zip(shape.dims, self.tile_counts)]
        return tuple(int(min((i + 1) * z, s) - min(i * z, s))
                     for i, z, s in zip(index, shard, shape.dims))

    # ---- validation ---------------------------------------------------------------------------

    def validate(self, shape: Shape, num_devices: int | None = None) -> None:
        """Check the sharding fits `shape` (and `num_devices` partitions): tuple leaf count, data
        rank == array rank, device ids `< N` and, for tiled shardings, all N devices present."""
        key = (self, shape, num_devices)
        if key in _VALID:
            return
        self._check_fits(shape, num_devices)
        if len(_VALID) >= _TILED_LIMIT:
            _VALID.clear()
        _VALID[key] = True

    def _check_fits(self, shape: Shape, num_devices: int | None) -> None:
        if self.kind == "tuple":
            if not isinstance(shape, TupleShape):
                raise ShardingError(f"tuple sharding {self.to_text()} for non-tuple shape {shape}")
            for leaf, leaf_shape in zip(self.leaf_shardings(shape), shape.leaves()):
                leaf.validate(leaf_shape, num_devices)
            return
        if isinstance(shape, TupleShape):
            for leaf_shape in shape.leaves():
                self.validate(leaf_shape, num_devices)
            return
        if self.kind == "maximal":
            if num_devices is not None and self.device >= num_devices:
                raise ShardingError(f"sharding {self.to_text()} names device {self.device} but "
                                    f"there are {num_devices} devices")
            return
        if self.kind != "tiled":
            return
        if shape.is_token:
            raise ShardingError(f"tiled sharding {self.to_text()} on token shape {shape}")
        if self.data_rank != shape.rank:
            raise ShardingError(f"sharding {self.to_text()} has data rank {self.data_rank} but "
                                f"shape {shape} has rank {shape.rank}")
        if num_devices is not None:
            ta = self.tile_assignment
            if ta.max_device >= num_devices:
                raise ShardingError(f"sharding {self.to_text()} names device {ta.max_device} but "
                                    f"there are {num_devices} devices")
            if ta.num_devices != num_devices:
                raise ShardingError(f"sharding {self.to_text()} covers {ta.num_devices} devices, "
                                    f"expected all {num_devices}")


__all__ = ["HloSharding", "ShardGroup", "SUBGROUP_TYPES", "TileAssignment"]
