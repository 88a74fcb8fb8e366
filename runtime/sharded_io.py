"""Global values <-> per-partition values, by the shardings of an SPMD module's entry.

A partitioned module's entry parameters and root have *per-partition* shapes. Running it on global
inputs needs, for every entry parameter and for the result, the global shape and the sharding:

- shardings: the entry parameters' `sharding=` (XLA keeps them; a parameter without one is
  replicated) and the root's `sharding=` (XLA drops it: callers then pass `output_sharding`);
- global shapes, from the first source that exists:
  1. the header attribute `spmd_global_signature={(p0, p1, ...)->result}` that gspmdc's partitioner
     writes (the same syntax as `entry_computation_layout`; layouts optional). It must agree with
     the shardings (`shard_shape(global) == local`); a one-element tuple result for an array root
     is accepted as that array;
  2. `entry_computation_layout`, used per value when it agrees with the sharding, and ignored when
     it lists exactly the per-partition shapes (what XLA's partitioned modules print there: a
     size-1 dimension split in two would otherwise pass for a global size of 1);
  3. the local shape times the tile counts. For a dimension that was split unevenly this
     over-estimates the global size (the padding becomes part of the value): modules with uneven
     shardings need source 1 or 2.

Splitting (`split_value`, all partitions at once; `shard_value`, one partition, reading only its
slice, e.g. of a memory-mapped file) follows the shard arithmetic of
docs/design/sharding-algebra.md#shard-arithmetic: the
shard of a tiled dimension is `ceil(S/t)` long, partition ordinal `i` holds
`[min(i*shard, S), min((i+1)*shard, S))` followed by padding up to the shard size. Padding is zeros by
default; `padding="garbage"` fills it with values that reveal a program reading it (NaN for floats
and complex, the type's maximum for integers, `true` for predicates). Partially replicated leaves
give every member of a replication group the same tile; replicated leaves give everybody the whole
value; a maximal leaf gives its device the whole value and everybody else padding.

Assembling (`assemble_value`) reads, per tile, the piece of the first device of its replication
group (`source_partitions`), stacks the tiles and drops the padding; a replicated leaf is partition
0's value, a maximal one its device's. A result with `unreduced` devices (a `{unreduced}` leaf, or
an `unreduced` subgroup) holds partial values whose sum is the global value (the meaning of
unreduced in Shardy and in the partitioner's partial dots): every unreduced member of a tile is
read and the pieces are added. `manual` and `unknown` values (and tiled shardings with manual
subgroups), and unreduced inputs, are per-device data with no global array: they raise
UnsupportedError. Everything is sliced or reshaped numpy, no per-element loops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from gspmdc.errors import GspmdcError, ShardingError, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.attributes import RawAttr
from gspmdc.ir.module import Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.stage import GLOBAL_SIGNATURE_KEY
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from . import spill
from .allocation import aligned_empty

PADDINGS = ("zeros", "garbage")


@dataclass(frozen=True)
class ShardedLeaf:
    """One array of an entry parameter or of the result: its global and per-partition shapes and
    its (leaf) sharding."""

    global_shape: ArrayShape
    local_shape: ArrayShape
    sharding: HloSharding

    def check_global_io(self, what: str, output: bool = False) -> None:
        """Raise UnsupportedError unless a global array can be split into (`output=False`) or
        assembled from (`output=True`: unreduced parts are summed) this leaf's per-partition
        values."""
        s = self.sharding
        allowed = {"replicated", "unreduced"} if output else {"replicated"}
        if s.kind in ("manual", "unknown") or (s.kind == "unreduced" and not output) or \
                (s.kind == "tiled" and set(s.subgroup_types) - allowed):
            raise UnsupportedError(
                f"{what} has sharding {s.to_text(include_metadata=False)}: its per-partition "
                "values are per-device data, not pieces of one global array, so it cannot be "
                "split from or assembled into a global array")


@dataclass(frozen=True)
class ShardedValue:
    """An entry parameter or the result: global and local shapes, the leaves in pre-order."""

    global_shape: Shape
    local_shape: Shape
    leaves: tuple[ShardedLeaf, ...]


@dataclass(frozen=True)
class SpmdSignature:
    """The global view of an SPMD module's entry: one `ShardedValue` per parameter (by parameter
    number) and one for the result."""

    num_partitions: int
    parameters: tuple[ShardedValue, ...]
    output: ShardedValue

    def check_global_io(self) -> None:
        """Raise UnsupportedError if some parameter or output leaf cannot be split/assembled."""
        for i, param in enumerate(self.parameters):
            for leaf in param.leaves:
                leaf.check_global_io(f"entry parameter {i}")
        for leaf in self.output.leaves:
            leaf.check_global_io("the result", output=True)


def spmd_signature(module: Module, num_partitions: int | None = None, *,
                   output_sharding: HloSharding | None = None) -> SpmdSignature:
    """The global signature of the SPMD `module` (see the module docstring for the sources).

    `output_sharding` overrides the root's sharding (needed for XLA's partitioned modules, whose
    root carries none). Raises GspmdcError for an inconsistent `spmd_global_signature`, a root
    without sharding and no override, or shardings that do not fit the shapes.
    """
    n = num_partitions or module.num_partitions or 1
    entry = module.entry
    params = entry.parameters
    recorded = _signature_attr(module, GLOBAL_SIGNATURE_KEY, len(params))
    layout = _signature_attr(module, "entry_computation_layout", len(params))
    if layout is not None and _same_dims(layout[0], [p.shape for p in params]) and \
            _same_dims([layout[1]], [entry.root.shape]):
        layout = None
    values = []
    for i, param in enumerate(params):
        sharding = param.sharding or HloSharding.replicate()
        what = f"entry parameter {param.parameter_number} ({param.name})"
        values.append(_sharded_value(
            param.shape, sharding, n, what,
            recorded[0][i] if recorded else None, layout[0][i] if layout else None))
    root = entry.root
    sharding = output_sharding or root.sharding
    if sharding is None:
        raise GspmdcError(f"the root {root.name} of the partitioned module {module.name} has no "
                          "sharding, so how the partitions' results form the global result is "
                          "unknown (XLA's partitioned modules drop it): annotate the root, e.g. "
                          "sharding={replicated} when every partition computes the whole result")
    recorded_out = _array_if_singleton(recorded[1], root.shape) if recorded else None
    output = _sharded_value(root.shape, sharding, n, f"the result ({root.name})", recorded_out,
                            layout[1] if layout else None)
    return SpmdSignature(n, tuple(values), output)


def _signature_attr(module: Module, name: str, num_params: int):
    """`(parameter shapes, result shape)` of a `{(p0, ...)->result}` header attribute, or None.
    The shapes are parsed here, where the job is prepared: MPI ranks receive the signature built
    (`job.Job`) and never import the parser."""
    attr = module.attrs.get(name)
    if attr is None:
        return None
    from gspmdc.ir.parser import parse_shape
    text = attr.text if isinstance(attr, RawAttr) else str(attr)
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    arrow = _top_level_arrow(body)
    if arrow < 0:
        raise GspmdcError(f"header attribute {name}: expected {{(parameter shapes)->result "
                          f"shape}}, got {text}")
    listed = body[:arrow].strip()
    if not (listed.startswith("(") and listed.endswith(")")):
        raise GspmdcError(f"header attribute {name}: expected a (parenthesised) list of "
                          f"parameter shapes, got {listed}")
    # each parameter on its own: the list is no tuple value, and must not count as one more
    # level of tuple nesting
    params = [parse_shape(part) for part in _top_level_parts(listed[1:-1])]
    if len(params) != num_params:
        raise GspmdcError(f"header attribute {name} lists {len(params)} parameters, the entry "
                          f"computation has {num_params}")
    return params, parse_shape(body[arrow + 2:].strip())


def _same_dims(shapes: Sequence[Shape], others: Sequence[Shape]) -> bool:
    return [[leaf.dims for leaf in s.leaves()] for s in shapes] == \
        [[leaf.dims for leaf in s.leaves()] for s in others]


def _top_level_arrow(text: str) -> int:
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "-" and depth == 0 and text.startswith("->", i):
            return i
    return -1


def _top_level_parts(text: str) -> list[str]:
    """`text` split at the commas outside brackets (no parts for blank text)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [] if len(parts) == 1 and not parts[0].strip() else [p.strip() for p in parts]


def _array_if_singleton(shape: Shape, local: Shape) -> Shape:
    if isinstance(local, ArrayShape) and isinstance(shape, TupleShape) and \
            len(shape.elements) == 1:
        return shape.elements[0]
    return shape


def _sharded_value(local: Shape, sharding: HloSharding, n: int, what: str,
                   recorded: Shape | None, layout: Shape | None) -> ShardedValue:
    try:
        leaf_shardings = sharding.leaf_shardings(local)
    except ShardingError as e:
        raise GspmdcError(f"{what}: {e}") from None
    if recorded is not None:
        if not _agrees(recorded, local, sharding):
            raise GspmdcError(f"{what}: {GLOBAL_SIGNATURE_KEY} gives the global shape "
                              f"{recorded}, which sharding {sharding.to_text(False)} does not "
                              f"split into the partitioned shape {local}")
        global_shape = recorded
    elif layout is not None and _agrees(layout, local, sharding):
        global_shape = layout
    else:
        global_shape = _unsharded(local, leaf_shardings)
    global_shape = global_shape.without_layout()
    leaves = tuple(ShardedLeaf(g, l.without_layout(), s) for g, l, s in
                   zip(global_shape.leaves(), local.leaves(), leaf_shardings))
    for leaf in leaves:
        try:
            leaf.sharding.validate(leaf.global_shape, n)
        except ShardingError as e:
            raise GspmdcError(f"{what}: {e}") from None
    return ShardedValue(global_shape, local.without_layout(), leaves)


def _agrees(global_shape: Shape, local: Shape, sharding: HloSharding) -> bool:
    """`global_shape` has the structure and element types of `local` and shards into it."""
    if isinstance(global_shape, TupleShape) != isinstance(local, TupleShape):
        return False
    globals_, locals_ = list(global_shape.leaves()), list(local.leaves())
    if len(globals_) != len(locals_) or \
            any(g.element_type != l.element_type or g.rank != l.rank
                for g, l in zip(globals_, locals_)):
        return False
    try:
        shards = sharding.shard_shape(global_shape)
    except ShardingError:
        return False
    return all(s.dims == l.dims for s, l in zip(shards.leaves(), locals_))


def _unsharded(local: Shape, leaf_shardings: list[HloSharding]) -> Shape:
    """Local shape times tile counts (exact for even shardings)."""
    leaves = iter(leaf_shardings)

    def rebuild(shape: Shape) -> Shape:
        if isinstance(shape, TupleShape):
            return TupleShape(tuple(rebuild(e) for e in shape.elements))
        counts = next(leaves).tile_counts_for_rank(shape.rank)
        return shape.with_dims(tuple(d * t for d, t in zip(shape.dims, counts)))
    return rebuild(local)


# ============================================================================ splitting

def pad_value(dtype: np.dtype, padding: str):
    """The fill value of shard padding: 0, or with `padding="garbage"` a value that shows."""
    if padding not in PADDINGS:
        raise GspmdcError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if padding == "zeros":
        return 0
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.nan


def shard_leaf(array: np.ndarray, leaf: ShardedLeaf, partition: int, num_partitions: int, *,
               padding: str = "zeros") -> np.ndarray:
    """Partition `partition`'s shard of the global `array`, reading only that slice (suits
    memory-mapped arrays); a fresh in-memory array."""
    _check_global_array(array, leaf)
    s = leaf.sharding
    leaf.check_global_io("the value")
    fill = pad_value(array.dtype, padding)
    local = leaf.local_shape.dims
    if s.kind == "maximal" and s.device != partition:
        return np.full(local, fill, array.dtype)
    if s.kind != "tiled":
        return _copy(array)
    start, limit = s.valid_range_table(leaf.global_shape, num_partitions)
    piece = np.asarray(array[tuple(slice(a, b) for a, b in zip(start[partition],
                                                                limit[partition]))])
    if piece.shape == local:
        return _copy(piece)
    out = spill.full(local, fill, array.dtype)
    out[tuple(slice(0, k) for k in piece.shape)] = piece
    return out


def _copy(array: np.ndarray) -> np.ndarray:
    """`array` copied into memory, C-ordered and, when large, aligned to a cache line
    (`allocation.aligned_empty`: products read it)."""
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def split_leaf(array: np.ndarray, leaf: ShardedLeaf, num_partitions: int, *,
               padding: str = "zeros") -> list[np.ndarray]:
    """Every partition's shard of the global `array` (partition order), computed at once: pad to
    whole tiles (when the tiles overhang it), expose tiles as an array axis, take each
    partition's tile of it (views of the padded array)."""
    _check_global_array(array, leaf)
    leaf.check_global_io("the value")
    s, n = leaf.sharding, num_partitions
    fill = pad_value(array.dtype, padding)
    if s.kind == "maximal":
        others = np.full(leaf.local_shape.dims, fill, array.dtype)
        return [array if p == s.device else others for p in range(n)]
    if s.kind != "tiled":
        return [array] * n
    counts, shard = s.tile_counts, leaf.local_shape.dims
    whole = tuple(t * k for t, k in zip(counts, shard))
    if whole == array.shape:
        padded = array
    else:
        padded = spill.full(whole, fill, array.dtype)
        padded[tuple(slice(0, d) for d in array.shape)] = array
    rank = len(shard)
    interleaved = padded.reshape([x for t, k in zip(counts, shard) for x in (t, k)])
    tiles = interleaved.transpose(list(range(0, 2 * rank, 2)) + list(range(1, 2 * rank, 2)))
    return [tiles[tuple(i)] for i in s.tile_indices()[:n].tolist()]     # views, no copies


def _check_global_array(array: np.ndarray, leaf: ShardedLeaf) -> None:
    want = dtypes.numpy_dtype(leaf.global_shape.element_type)
    if tuple(array.shape) != leaf.global_shape.dims or array.dtype != want:
        raise GspmdcError(f"expected a global {leaf.global_shape}, got an array of dtype "
                          f"{array.dtype} and shape {list(array.shape)}")


def split_value(value: Any, sharded: ShardedValue, num_partitions: int, *,
                padding: str = "zeros") -> list[Any]:
    """Every partition's part of a global value (an array, or nested tuples for tuple shapes)."""
    per_leaf = [split_leaf(a, leaf, num_partitions, padding=padding)
                for a, leaf in zip(flatten_value(value, sharded.global_shape), sharded.leaves)]
    return [unflatten_value([pieces[p] for pieces in per_leaf], sharded.local_shape)
            for p in range(num_partitions)]


def shard_value(value: Any, sharded: ShardedValue, partition: int, num_partitions: int, *,
                padding: str = "zeros") -> Any:
    """One partition's part of a global value (reads only its slices)."""
    return unflatten_value([shard_leaf(a, leaf, partition, num_partitions, padding=padding)
                       for a, leaf in zip(flatten_value(value, sharded.global_shape), sharded.leaves)],
                      sharded.local_shape)


def split_inputs(signature: SpmdSignature, global_args: Sequence[Any], *,
                 padding: str = "zeros") -> list[list[Any]]:
    """`result[p]` = partition p's entry arguments, from the global arguments."""
    if len(global_args) != len(signature.parameters):
        raise GspmdcError(f"{len(global_args)} global arguments for "
                          f"{len(signature.parameters)} entry parameters")
    n = signature.num_partitions
    per_param = [split_value(a, v, n, padding=padding)
                 for a, v in zip(global_args, signature.parameters)]
    return [[parts[p] for parts in per_param] for p in range(n)]


# ============================================================================ assembling

def source_partitions(leaf: ShardedLeaf, num_partitions: int) -> np.ndarray:
    """The partitions whose pieces `assemble_leaf` reads, in row-major tile order: per tile the
    first device of its replication group, or all its unreduced members in subgroup order
    (partition 0 for replicated values, the device of a maximal one, every partition for an
    `{unreduced}` value)."""
    leaf.check_global_io("the value", output=True)
    s = leaf.sharding
    if s.kind == "maximal":
        return np.asarray([s.device])
    if s.kind == "unreduced":
        return np.arange(num_partitions)
    if s.kind != "tiled":
        return np.asarray([0])
    array = s.tile_assignment.array
    members = array.reshape((s.num_tiles,) + array.shape[array.ndim - len(s.subgroup_types):])
    pick = tuple(slice(None) if kind == "unreduced" else 0 for kind in s.subgroup_types)
    return members[(slice(None),) + pick].reshape(-1)


def assemble_tiles(tiles: np.ndarray, leaf: ShardedLeaf,
                   combine: np.ufunc = np.add) -> np.ndarray:
    """The global array from `tiles` = the source partitions' pieces stacked on a leading axis (in
    `source_partitions` order; unreduced members' pieces are combined with `combine`: added,
    unless the reduction they await is another), without the padding."""
    s = leaf.sharding
    if s.has_unreduced:
        parts = len(tiles) // (s.num_tiles if s.kind == "tiled" else 1)
        tiles = combine.reduce(tiles.reshape((len(tiles) // parts, parts) + tiles.shape[1:]),
                               axis=1, dtype=tiles.dtype)
    if s.kind != "tiled":
        return tiles[0]
    counts, shard = s.tile_counts, leaf.local_shape.dims
    rank = len(shard)
    blocks = tiles.reshape(tuple(counts) + tuple(shard))
    order = [x for d in range(rank) for x in (d, rank + d)]
    padded = blocks.transpose(order).reshape([t * k for t, k in zip(counts, shard)])
    return padded[tuple(slice(0, d) for d in leaf.global_shape.dims)]


def assemble_leaf(pieces: Sequence[np.ndarray | None], leaf: ShardedLeaf,
                  combine: np.ufunc = np.add) -> np.ndarray:
    """The global array from every partition's piece (pieces not in `source_partitions` may be
    None; unreduced pieces combined with `combine`)."""
    sources = source_partitions(leaf, len(pieces))
    tiles = np.stack([np.asarray(pieces[p]) for p in sources])
    if tiles.shape[1:] != leaf.local_shape.dims:
        raise GspmdcError(f"partition pieces have shape {list(tiles.shape[1:])}, expected "
                          f"{leaf.local_shape}")
    return assemble_tiles(tiles, leaf, combine)


def assemble_value(per_partition: Sequence[Any], sharded: ShardedValue) -> Any:
    """The global value from every partition's value (arrays or nested tuples)."""
    flat = [flatten_value(v, sharded.local_shape) for v in per_partition]
    leaves = [assemble_leaf([f[i] for f in flat], leaf)
              for i, leaf in enumerate(sharded.leaves)]
    return unflatten_value(leaves, sharded.global_shape)


def assemble_outputs(signature: SpmdSignature, results: Sequence[Any]) -> Any:
    """The global result from every partition's root value."""
    if len(results) != signature.num_partitions:
        raise GspmdcError(f"{len(results)} partition results for {signature.num_partitions} "
                          "partitions")
    return assemble_value(results, signature.output)


def flatten_value(value: Any, shape: Shape) -> list:
    """The array leaves of a value of `shape` (nested tuples), in pre-order."""
    if isinstance(shape, TupleShape):
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.elements):
            raise GspmdcError(f"expected a tuple value of shape {shape}")
        return [leaf for v, s in zip(value, shape.elements) for leaf in flatten_value(v, s)]
    return [value]


def unflatten_value(leaves: list, shape: Shape) -> Any:
    """The value of `shape` with the given array leaves (inverse of `flatten_value`)."""
    it = iter(leaves)

    def build(s: Shape):
        if isinstance(s, TupleShape):
            return tuple(build(e) for e in s.elements)
        return next(it)
    return build(shape)
