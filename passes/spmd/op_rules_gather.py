"""Partitioning of `gather` and `scatter` (docs/design/partitioning.md#gather-and-scatter).

A gather's output dims are *batch* dims (one per indices dim but `index_vector_dim`, in order) and
*offset* dims (one per operand window dim — not collapsed, not a batching dim — in order). The
strategies tile an *extended* index space: the output dims plus one extra dim per *indexed*
operand dim (a dim of `start_index_map` with slice size 1 that is not a batching dim). From a
tiling `E` of that space,

- the operand takes `E`'s tiles of the output offset dims on its *pass-through* window dims
  (slice size = the whole dim: operand pass-through), of the output batch dims on its batching
  dims (explicit batch), and of the extra dims on its indexed dims (trivially sliced operand);
- the indices take `E`'s tiles of the output batch dims on their own dims (index pass-through),
  replicated over the rest;
- the local result is `E` with the extra dims' tiles as partial values (an `unreduced` subgroup).

An operand dim addressed by an index component that is an iota along an indices dim of its size
(XLA's implicit parallel dims, `implicit_parallel`) is no indexed dim: like a batching dim, it
takes the tiles of that indices dim's output batch dim (row k of the indices reads row k of the
operand), so operand, indices and result tiled alike there need nothing moved.

Locally, the start indices are clamped globally as HLO does (`[0, S_d - slice_d]`), shifted by the
partition's offset on each tiled indexed or parallel dim, and gathered from the local operand
(slice sizes of tiled pass-through dims become the shard size); results whose index fell outside
the partition's range are zeroed, so the reshard to the annotated sharding sums them (an all-reduce
or reduce-scatter over the operand's index tiles) into the one real value. Padding of uneven
indexed dims is never read (clamped indices stay below `S_d`).

Candidates (fewest bytes wins; on a tie of the busiest device, the fewest bytes over all
devices; then the first): the annotated result's
tiling with the operand's tiles of its indexed dims, the annotated result's tiling alone, the
operand's tiling carried through, the indices' tiling with the operand's indexed tiles, the
indices' tiling alone, the operand's indexed tiles with the result's or the indices' batch
tiles on the replicas of each, the result's or the indices' batch tiles with the operand's
indexed tiles on the replicas of each (`_within`: XLA's gather recursion partitions the rest
within each group of the devices one strategy keeps apart, borrowing tiles from the other side
where its replicas are too few), the operand's tiles then the indices' then the result's on
the dims each leaves (and the indices' first: `_merged`, XLA's chain of strategies, each dim
taken where the devices still form one tiling), the operand's tiling with the indices' tiles
of the output dims it leaves whole laid out on the devices of each of its tiles, and the
indices' tiling with the operand's likewise (XLA's explicit batch dims: the side with fewer
batch tiles follows the other's device groups, keeping its other tiles within each), and
everything replicated. A candidate whose device groups do not combine into one tiling is
skipped.
`pred` gathers combine their partial values by `or` (the masked results are `false`).

Scatter (`ScatterRule`) tiles its operand (= result) dims the same way: dims the updates cover
whole (updates tiled alike), batching dims (indices and updates tiled alike) and dims addressed
with window size 1 (indices and updates replicated over those tiles; each partition shifts the
indices by its offset and scatter's own bounds check drops the updates that belong to other
partitions, so any combiner is correct). A dim addressed by an index component that is an iota
along an indices dim of its size (XLA's implicit parallel dims, `implicit_parallel`, as gather's)
tiles that indices dim and its updates dim alike instead: row k of the updates goes to row k,
so each partition's rows of the indices address its own rows (rows in the padding of uneven
indices are dropped). Its extra dims are the indices' other batch dims (index
pass-through), whose tiles become partial values combined by the scatter's own computation —
only for combiners with an identity. Other dims are gathered. Its candidates also start from
the indices' tiling (the indices stay where they are), alone or with the result's or the
operand's tiles on the devices each index tile holds, and from the result's or the operand's
tiling with the indices' tiles on the devices each of its tiles holds (`_within`: a mesh of
index tiles by operand tiles, as XLA's partitioner recurses on the mesh dims one strategy
leaves replicated); and, as for gather's explicit batch dims, from the result's or the
operand's tiling with the indices' tiles of the dims it leaves whole (batching dims, and the
other batch dims where allowed) laid out on the devices of each of its tiles, and from the
indices' tiling with the operand's likewise. A scatter whose results are all on one device
runs there; one whose results are not (a variadic scatter with `{maximal device=k}` beside a
tiled result) is partitioned like any other, as XLA's (`HasUniqueDevice`), with that device
among its candidates. Updates tiled on a scatter dim the scatter cannot tile propose their tiles
moved to an operand dim the update windows cover whole (`_updates_tiles_moved`: an all-to-all
of the updates instead of gathering them).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd, prod

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import SliceDim
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.passes.propagation.indexing import IndexedOp, gather_view, scatter_view

from .op_rules import (
    LowerContext, OpPlan, PartitionRule, clone, without_partials,
)
from .reshard_nodes import is_inserted_reshard
from .tiling import Tiling, remap, tile_keys, tiling_from_coordinates


def implicit_parallel(view: IndexedOp, indices: Instruction) -> dict[int, int]:
    """Operand dim -> indices dim of the parallel dims that iota index components make (XLA's
    GetGatherScatterBatchParallelDims, as propagation finds them: `IndexedOp.implicit_parallel`),
    found behind this pass's own reshard nodes (the same values moved) of the indices and of
    what they are built from, so a plan made after those nodes exist keeps them."""
    return dict(view.implicit_parallel(indices, moved=_moved))


def _moved(inst: Instruction) -> Instruction:
    """The value that the reshard nodes this pass inserted in front of it move, else `inst`."""
    while is_inserted_reshard(inst):
        inst = inst.operands[0]
    return inst


@dataclass(frozen=True)
class GatherDims:
    """How a gather's output dims, extra (indexed) dims, operand dims and indices dims relate."""

    output_rank: int
    operand_rank: int
    indices_rank: int
    index_vector_dim: int
    #: per extended dim (output dims, then one per indexed operand dim): the operand dim it maps
    #: to (-1: none) and the indices dim it maps to (-1: none)
    to_operand: tuple[int, ...]
    to_indices: tuple[int, ...]
    #: the operand dims addressed with slice size 1 (the extra dims, in order)
    indexed: tuple[int, ...]
    #: the output batch dims, in order (one per indices dim but index_vector_dim)
    batch: tuple[int, ...]
    #: the operand dims an iota index component addresses (implicit parallel dims: tiled with
    #: their indices and output batch dims, shifted by the partition's offset)
    parallel: tuple[int, ...]

    @classmethod
    def of(cls, inst: Instruction) -> "GatherDims":
        operand, indices = inst.operands[0].shape, inst.operands[1].shape
        rank = inst.shape.rank
        ivd = inst.attr("index_vector_dim")
        offset_dims = sorted(inst.attr("offset_dims", ()))
        collapsed = set(inst.attr("collapsed_slice_dims", ()))
        op_batching = list(inst.attr("operand_batching_dims", ()))
        idx_batching = list(inst.attr("start_indices_batching_dims", ()))
        start_map = list(inst.attr("start_index_map", ()))
        sizes = inst.attr("slice_sizes")
        window = [d for d in range(operand.rank) if d not in collapsed and d not in op_batching]
        batch = [d for d in range(rank) if d not in offset_dims]
        indices_dims = [d for d in range(indices.rank) if d != ivd]
        to_operand, to_indices = [-1] * rank, [-1] * rank
        for out, w in zip(offset_dims, window):
            if sizes[w] == operand.dims[w]:
                to_operand[out] = w
        parallel = {i: d for d, i in implicit_parallel(gather_view(inst),
                                                       inst.operands[1]).items()}
        parallel_dims = []
        for out, i in zip(batch, indices_dims):
            to_indices[out] = i
            if i in idx_batching:
                to_operand[out] = op_batching[idx_batching.index(i)]
            elif i in parallel and parallel[i] not in to_operand:
                to_operand[out] = parallel[i]
                parallel_dims.append(parallel[i])
        # a size-1 dim sliced whole is a pass-through dim already
        indexed = tuple(d for d in start_map if sizes[d] == 1 and d not in op_batching
                        and d not in to_operand)
        return cls(rank, operand.rank, indices.rank, ivd, tuple(to_operand) + indexed,
                   tuple(to_indices) + (-1,) * len(indexed), indexed, tuple(batch),
                   tuple(parallel_dims))

    @property
    def extra(self) -> list[int]:
        return list(range(self.output_rank, len(self.to_operand)))


def _coordinates(ctx, sharding: HloSharding, rank: int, mapping, width: int):
    """Per device, its tile index on each extended dim that `mapping` (extended dim -> dim of the
    value, -1: none) takes from `sharding` (of a rank-`rank` value), and the tile counts."""
    coords = np.zeros((ctx.num_devices, width), np.int64)
    counts = [1] * width
    if not sharding.is_tiled or sharding != without_partials(sharding):
        return coords, counts
    tiling = ctx.tiling(sharding, rank)
    table = tiling.coordinates()
    for e, d in enumerate(mapping):
        if d >= 0 and tiling.counts[d] > 1:
            coords[:, e], counts[e] = table[:, d], tiling.counts[d]
    return coords, counts


def _extended_tilings(ctx, width: int, sources) -> list[tuple[Tiling, str]]:
    """For each source `((coordinates, dims taken), ..., reason)`, the tiling of the extended
    space whose dims take their tiles from the named coordinates (None sources skipped: their
    device groups do not form one tiling)."""
    found = []
    for *parts, reason in sources:
        coords = np.zeros((ctx.num_devices, width), np.int64)
        counts = [1] * width
        for (part_coords, part_counts), taken in parts:
            for e in taken:
                coords[:, e], counts[e] = part_coords[:, e], part_counts[e]
        tiling = tiling_from_coordinates(coords, tuple(counts))
        if tiling is not None:
            found.append((tiling, reason))
    return found


def _merged(parts, num_devices: int):
    """The tiles of `parts` (`((coordinates, counts), dims taken)`, in priority order) merged
    dim by dim: each extended dim takes the tiles of the first part that tiles it, where the
    devices then still form one tiling, else the next part's (XLA's gather recursion: a
    strategy keeps its value's tiles and partitions the rest within each group of their
    devices, the next strategy by the next value's tiles that vary within the groups, the
    result's own tiles merged where compatible)."""
    width = parts[0][0][0].shape[1]
    coords = np.zeros((num_devices, width), np.int64)
    counts = [1] * width
    for (part_coords, part_counts), taken in parts:
        for e in taken:
            if counts[e] > 1 or part_counts[e] == 1:
                continue
            trial_coords, trial_counts = coords.copy(), list(counts)
            trial_coords[:, e], trial_counts[e] = part_coords[:, e], part_counts[e]
            if tile_keys(trial_coords, trial_counts) is not None:
                coords, counts = trial_coords, trial_counts
    return coords, counts


def _within(part, taken, other, others_taken, num_devices: int):
    """`part` (`(coordinates, counts)`) coarsened on its dims `taken` to the devices each tile
    of `other` on its dims `others_taken` holds: each dim's count cut to its greatest common
    divisor with the room left (adjacent tiles merged), so that the two combine into one tiling
    of a device mesh, `other`'s tiles on one axis and `part`'s on the replicas of each (XLA's
    recursion on the mesh dims a strategy leaves replicated, the group's devices in their
    order). Where `part`'s tiles are not spread evenly over the devices of each tile of
    `other` (the two share a mesh axis), they are laid out again over each such group: its
    devices in the order of their tile of `part`, then of device id, take the tiles in
    row-major order (evenly spread tiles keep their devices)."""
    coords, counts = part[0].copy(), list(part[1])
    room = num_devices // prod(other[1][e] for e in others_taken)
    for e in taken:
        count = gcd(counts[e], room)
        coords[:, e] = coords[:, e] * count // counts[e]
        counts[e] = count
        room //= count
    if not taken:
        return coords, counts
    tiles = prod(counts[e] for e in taken)
    groups = _keys(other[0], other[1], others_taken)
    keys = _keys(coords, counts, taken)
    size = num_devices // len(np.unique(groups))
    order = np.lexsort((np.arange(num_devices), keys, groups))
    rank = np.empty(num_devices, np.int64)
    rank[order] = np.arange(num_devices) % size
    laid = np.unravel_index(rank * tiles // size, [counts[e] for e in taken])
    for e, column in zip(taken, laid):
        coords[:, e] = column
    return coords, counts


def _whole(part, dims) -> list[int]:
    """The dims of `dims` that `part` (`(coordinates, counts)`) leaves in one tile."""
    return [e for e in dims if part[1][e] == 1]


def _keys(coords: np.ndarray, counts, taken) -> np.ndarray:
    """Per device, the row-major index of its tile on the dims `taken` (0 for none)."""
    if not taken:
        return np.zeros(coords.shape[0], np.int64)
    return np.ravel_multi_index(tuple(coords[:, e] for e in taken),
                                [counts[e] for e in taken])


def _index_vectors(b, indices: Instruction, ivd: int) -> Instruction:
    """The indices with an explicit index vector dim (a trailing dim of 1 when `ivd` is the
    rank)."""
    if ivd == indices.shape.rank:
        return b.reshape(indices, indices.shape.dims + (1,))
    return indices


def _offset_vector(ctx, tiling: Tiling, dims, components, shape: ArrayShape,
                   ivd: int, shifted=None) -> Instruction:
    """`shape`-shaped: this partition's offset on operand dim `components[c]` at position c of
    the index vector dim, in the indices' element type; 0 for a component whose dim is not in
    `shifted` (when given)."""
    b = ctx.builder
    offsets = ctx.tables.offsets(tiling, dims)
    parts = [b.reshape(offsets[d], (1,)) if shifted is None or d in shifted
             else b.constant([0], "s32") for d in components]
    vector = b.add("concatenate", ArrayShape("s32", (len(components),)), parts,
                   {"dimensions": (0,)})
    return b.broadcast(b.convert(vector, shape.element_type), shape.dims, (ivd,))


@PARTITION_RULES.register("gather", instance=True)
class GatherRule(PartitionRule):
    def plan(self, inst, ctx):
        dims = GatherDims.of(inst)
        target = without_partials(inst.sharding)
        if target.kind == "maximal":
            return OpPlan((target, target), target, "gather on one device")
        operand, indices = inst.operands
        width = len(dims.to_operand)
        output = list(range(dims.output_rank))
        legal = [e if dims.to_operand[e] >= 0 or dims.to_indices[e] >= 0 else -1 for e in output]
        from_target = _coordinates(ctx, target, dims.output_rank, legal, width)
        from_operand = _coordinates(ctx, operand.sharding, operand.shape.rank, dims.to_operand,
                                    width)
        from_indices = _coordinates(ctx, indices.sharding, indices.shape.rank, dims.to_indices,
                                    width)
        extra = dims.extra
        n = ctx.num_devices
        masked = "masked local gathers summed over the operand's index tiles"
        replicas = "on each group of the operand's replicas"
        beside_operand = _whole(from_operand, output)
        beside_indices = _whole(from_indices, output) + extra
        tilings = _extended_tilings(ctx, width, [
            ((from_target, output), (from_operand, extra), f"the result's tiling, {masked}"),
            ((from_target, output), "gather keeps the result's tiling"),
            ((from_operand, output + extra), "gather keeps its operand's tiling"),
            ((from_indices, output), (from_operand, extra), f"the indices' tiling, {masked}"),
            ((from_indices, output), "gather keeps its indices' tiling"),
            ((_within(from_target, output, from_operand, extra, n), output),
             (from_operand, extra), f"{masked}, the result's tiling {replicas}"),
            ((_within(from_indices, output, from_operand, extra, n), output),
             (from_operand, extra), f"{masked}, the indices' tiling {replicas}"),
            ((from_target, output), (_within(from_operand, extra, from_target, output, n), extra),
             f"the result's tiling, {masked} on each group of its replicas"),
            ((from_indices, output),
             (_within(from_operand, extra, from_indices, output, n), extra),
             f"the indices' tiling, {masked} on each group of their replicas"),
            ((_merged([(from_operand, output + extra), (from_indices, output),
                       (from_target, output)], n), output + extra),
             "the operand's tiling, the indices' and the result's tiles on the devices of each "
             "of its tiles"),
            ((_merged([(from_indices, output), (from_operand, output + extra),
                       (from_target, output)], n), output + extra),
             "the indices' tiling, the operand's and the result's tiles on the devices of each "
             "of their tiles"),
            ((from_operand, output + extra),
             (_within(from_indices, beside_operand, from_operand, output + extra, n),
              beside_operand),
             "the operand's tiling, the indices' tiles on the devices of each of its tiles"),
            ((from_indices, output),
             (_within(from_operand, beside_indices, from_indices, output, n), beside_indices),
             "the indices' tiling, the operand's tiles on the devices of each of their tiles"),
        ])
        candidates = [self._plan(dims, tiling, reason) for tiling, reason in tilings]
        replicated = HloSharding.replicate()
        candidates.append(OpPlan((replicated, replicated), replicated, "gather runs replicated"))
        return ctx.choose(inst, candidates, totals=True)

    @staticmethod
    def _plan(dims: GatherDims, extended: Tiling, reason: str) -> OpPlan:
        s = extended.sharding
        on_operand = remap(s, dims.to_operand, dims.operand_rank)
        on_indices = remap(s, dims.to_indices, dims.indices_rank)
        result = algebra.remove_dims(algebra.unreduce_on_dims(s, dims.extra), dims.extra)
        return OpPlan((on_operand, on_indices), result, reason)

    def lower(self, inst, ctx: LowerContext):
        operand = inst.operands[0]
        local_operand, local_indices = ctx.operands(inst)
        dims = GatherDims.of(inst)
        tiling = Tiling(operand.sharding, operand.shape.rank, ctx.num_devices) \
            if operand.sharding.is_tiled else None
        # a parallel dim is shifted and masked as an indexed dim is: its real rows always fall
        # in their partition's range, so only padding rows are zeroed
        tiled = [d for d in dims.indexed + dims.parallel
                 if tiling is not None and tiling.counts[d] > 1]
        new_indices = local_indices
        valid = None
        if tiled:
            new_indices, valid = _shift_indices(inst, ctx, local_indices, tiling, tiled)
        local = clone(inst, ctx, [local_operand, new_indices])
        sizes = list(inst.attr("slice_sizes"))
        for d, size in enumerate(sizes):
            if size == operand.shape.dims[d]:
                sizes[d] = local_operand.shape.dims[d]
        local.attrs["slice_sizes"] = tuple(sizes)
        if valid is None:
            return local
        b = ctx.builder
        local.name = b.names(f"{inst.name}.local")
        mask = b.add("broadcast", ArrayShape("pred", local.shape.dims), [valid],
                     {"dimensions": dims.batch})
        zero = b.broadcast(b.zero(inst.shape.element_type), local.shape.dims)
        return b.append(Instruction(inst.name, "select", local.shape, [mask, local, zero],
                                    {"metadata": inst.attrs["metadata"]}
                                    if "metadata" in inst.attrs else {},
                                    sharding=inst.sharding))


@dataclass(frozen=True)
class ScatterDims:
    """How a scatter's operand dims (= result dims) relate to its indices and updates dims. The
    extended space is the operand dims plus one *extra* dim per indices batch dim that is not a
    batching dim (index pass-through: those updates spread over partitions). Per extended dim,
    the operand, indices and update dim carrying its tiles (-1: none; -1 in `to_operand` for an
    operand dim that cannot be tiled)."""

    count: int
    operand_rank: int
    indices_rank: int
    update_rank: int
    to_operand: tuple[int, ...]
    to_indices: tuple[int, ...]
    to_updates: tuple[int, ...]
    #: operand dims addressed with window size 1 (shifted by the partition's offset when tiled);
    #: those an iota component addresses are tiled with their indices and updates dims
    indexed: tuple[int, ...]

    @classmethod
    def of(cls, inst: Instruction) -> "ScatterDims":
        count = len(inst.operands) // 2
        operand = inst.operands[0].shape
        indices = inst.operands[count].shape
        update = inst.operands[count + 1].shape
        ivd = inst.attr("index_vector_dim")
        window_dims = list(inst.attr("update_window_dims", ()))
        inserted = set(inst.attr("inserted_window_dims", ()))
        batching = list(inst.attr("input_batching_dims", ()))
        index_batching = list(inst.attr("scatter_indices_batching_dims", ()))
        to_operand_map = list(inst.attr("scatter_dims_to_operand_dims", ()))
        targets = [d for d in range(operand.rank) if d not in inserted and d not in batching]
        window = dict(zip(targets, window_dims))
        indices_dims = [d for d in range(indices.rank) if d != ivd]
        scatter_dims = [d for d in range(update.rank) if d not in window_dims]
        update_of_indices = dict(zip(indices_dims, scatter_dims))
        parallel = implicit_parallel(scatter_view(inst), inst.operands[count])
        to_operand, to_indices, to_updates = [], [], []
        indexed = []
        for d in range(operand.rank):
            size = update.dims[window[d]] if d in window else 1
            if d in batching:
                i = index_batching[batching.index(d)]
                to_operand.append(d)
                to_indices.append(i)
                to_updates.append(update_of_indices[i])
            elif size == operand.dims[d] and d in window:
                to_operand.append(d)
                to_indices.append(-1)
                to_updates.append(window[d])
            elif size == 1 and d in to_operand_map:
                i = parallel.get(d, -1)
                indexed.append(d)
                to_operand.append(d)
                to_indices.append(i)
                to_updates.append(update_of_indices[i] if i >= 0 else -1)
            else:
                to_operand.append(-1)
                to_indices.append(-1)
                to_updates.append(-1)
        for i in indices_dims:
            if i not in index_batching and i not in parallel.values():
                to_operand.append(-1)
                to_indices.append(i)
                to_updates.append(update_of_indices[i])
        return cls(count, operand.rank, indices.rank, update.rank, tuple(to_operand),
                   tuple(to_indices), tuple(to_updates), tuple(indexed))

    @property
    def extra(self) -> list[int]:
        return list(range(self.operand_rank, len(self.to_operand)))


#: combiners whose partial results an all-reduce with the scatter's own computation combines,
#: with the identity the other partitions start from
_IDENTITIES = {"add": 0, "or": 0, "xor": 0, "multiply": 1, "and": 1, "maximum": "lowest",
               "minimum": "highest"}


def scatter_combiner(inst: Instruction, computations) -> str | None:
    """The opcode of a single-operand scatter's combiner when it is `op(x, y)` of its two
    parameters with an identity (`_IDENTITIES`), else None (e.g. assignment)."""
    if len(inst.operands) != 3:
        return None
    comp = computations.get(inst.attr("to_apply").name)
    if comp is None:
        return None
    root, params = comp.root, comp.parameters
    if root.opcode not in _IDENTITIES or len(params) != 2 or \
            set(root.operands) != set(params) or len(root.operands) != 2:
        return None
    return root.opcode


def _identity(opcode: str, element_type: str):
    value = _IDENTITIES[opcode]
    if isinstance(value, int):
        return bool(value) if element_type == "pred" else value
    dtype = dtypes.numpy_dtype(element_type)
    if element_type == "pred":
        return value == "highest"
    if dtype.kind in "fc" or element_type == "bf16":
        return -np.inf if value == "lowest" else np.inf
    info = np.iinfo(dtype)
    return info.min if value == "lowest" else info.max


@PARTITION_RULES.register("scatter", instance=True)
class ScatterRule(PartitionRule):
    """Scatter (docs/design/partitioning.md#gather-and-scatter): the operand (and result) tiled on
    dims the updates cover whole (operand
    pass-through: updates tiled alike), on batching dims (explicit batch: indices and updates
    tiled alike) and on dims addressed with window size 1 (trivially sliced operand: indices and
    updates replicated over those tiles, each partition shifts the indices by its offset and
    scatter's own bounds check drops the updates of other partitions — correct for any
    combiner). Index pass-through (indices and updates tiled on their other batch dims) needs a
    combiner with an identity (add, multiply, maximum, minimum, and, or, xor) and one operand:
    each partition scatters its share of the updates into the operand (the first partial index)
    or into the identity (the others), and the result's partial values are combined by an
    all-reduce with the scatter's own computation. Candidates: the result's, the operand's,
    the updates' and the indices' tilings (with the indices' tiles of their batch dims where
    allowed; then also the indices' tiles with the result's or the operand's coarsened onto
    each index tile's replicas, and the result's or the operand's tiles with the indices'
    coarsened onto each of their tiles' replicas; the same with the updates' batch tiles
    where they differ from the indices'), the result's or the operand's tiling with
    the indices' tiles of the dims it leaves whole laid out on the devices of each of its
    tiles, the indices' tiling with the operand's likewise (explicit batch dims in XLA's
    device groups), the updates' tiling with the tiles of a scatter dim it cannot tile moved
    to a dim the update windows cover whole, and everything replicated; the fewest bytes win
    (then the fewest over all devices), on a tie of both the result's tiling before the
    operand's, except where the
    operand is tiled on batch dims (explicit batch or index parallel dims: XLA's partitioner
    takes those strategies first, whatever they cost, and reshards the result afterwards).
    A variadic scatter runs
    all its operands in one tiling (XLA reshards them to a common sharding), so each of its
    results, operands and updates proposes its tiling too; it runs on one device only when all
    its results are on that device (XLA's `HasUniqueDevice`), else that device is one more
    candidate."""

    def plan(self, inst, ctx):
        dims = ScatterDims.of(inst)
        count = dims.count
        leaves = inst.sharding.leaf_shardings(inst.shape)
        target = without_partials(leaves[0])
        one_device = None
        if target.kind == "maximal":
            result = HloSharding.tuple([target] * count) \
                if isinstance(inst.shape, TupleShape) else target
            one_device = OpPlan((target,) * len(inst.operands), result, "scatter on one device")
            if inst.sharding.unique_device is not None:   # every result on that one device
                return one_device
        operand, indices, update = inst.operands[0], inst.operands[count], \
            inst.operands[count + 1]
        rank = dims.operand_rank
        width = len(dims.to_operand)
        every = list(range(rank))
        extra = dims.extra if scatter_combiner(inst, ctx.computations) else []
        allowed = [d if dims.to_operand[d] >= 0 else -1 for d in every]
        from_target = _coordinates(ctx, target, rank, allowed, width)
        from_operand = _coordinates(ctx, operand.sharding, rank, allowed, width)
        from_indices = _coordinates(ctx, indices.sharding, indices.shape.rank, dims.to_indices,
                                    width)
        from_updates = _coordinates(ctx, update.sharding, update.shape.rank, dims.to_updates,
                                    width)
        spread = "updates spread over partitions, combined by an all-reduce"
        kept = [((from_target, every), "scatter keeps the result's tiling"),
                ((from_operand, every), "scatter keeps its operand's tiling")]
        if any(from_operand[1][d] > 1 for d in every if dims.to_indices[d] >= 0):
            kept.reverse()      # XLA's preferred strategies: explicit batch, index parallel
        sources = kept + [
            ((from_updates, every), "scatter keeps its updates' tiling"),
            ((from_indices, every), "scatter keeps its indices' tiling"),
        ]
        for k in range(1, count):                     # a variadic scatter's other values
            sources += [
                ((_coordinates(ctx, without_partials(leaves[k]), rank, allowed, width), every),
                 f"scatter keeps its result {k}'s tiling"),
                ((_coordinates(ctx, inst.operands[k].sharding, rank, allowed, width), every),
                 f"scatter keeps its operand {k}'s tiling"),
                ((_coordinates(ctx, inst.operands[count + 1 + k].sharding, update.shape.rank,
                               dims.to_updates, width), every),
                 f"scatter keeps its updates {k}'s tiling"),
            ]
        n = ctx.num_devices
        if extra:
            sources += [
                ((from_target, every), (from_indices, extra), f"the result's tiling, {spread}"),
                ((from_operand, every), (from_indices, extra),
                 f"the operand's tiling, {spread}"),
                ((from_updates, every + extra), f"the updates' tiling, {spread}"),
                ((from_indices, every + extra), f"the indices' tiling, {spread}"),
                ((_within(from_target, every, from_indices, extra, n), every),
                 (from_indices, extra), f"the indices' tiling, {spread}, the result's tiling "
                                        "on each group of their replicas"),
                ((_within(from_operand, every, from_indices, extra, n), every),
                 (from_indices, extra), f"the indices' tiling, {spread}, the operand's "
                                        "tiling on each group of their replicas"),
                ((from_target, every), (_within(from_indices, extra, from_target, every, n), extra),
                 f"the result's tiling, {spread} on each group of its replicas"),
                ((from_operand, every),
                 (_within(from_indices, extra, from_operand, every, n), extra),
                 f"the operand's tiling, {spread} on each group of its replicas"),
            ]
            sources += _updates_spread(from_target, from_operand, from_updates, from_indices,
                                       every, extra, n)
        beside_result = _whole(from_target, every) + extra
        beside_operand = _whole(from_operand, every) + extra
        beside_indices = _whole(from_indices, every)
        spread_too = f", {spread}" if extra else ""
        sources += [
            ((from_target, every),
             (_within(from_indices, beside_result, from_target, every, n), beside_result),
             f"the result's tiling, the indices' tiles on the devices of each of its "
             f"tiles{spread_too}"),
            ((from_operand, every),
             (_within(from_indices, beside_operand, from_operand, every, n), beside_operand),
             f"the operand's tiling, the indices' tiles on the devices of each of its "
             f"tiles{spread_too}"),
            ((from_indices, every + extra),
             (_within(from_operand, beside_indices, from_indices, every + extra, n),
              beside_indices),
             f"the indices' tiling{spread_too}, the operand's tiles on the devices of each of "
             "their tiles"),
        ]
        moved = _updates_tiles_moved(ctx, dims, update, every + extra)
        if moved is not None:
            sources.append(((moved, every), "scatter keeps its updates' tiles, those of dims it "
                                            "cannot tile moved to the dims its updates cover "
                                            "whole"))
        candidates = [self._plan(inst, dims, tiling, reason)
                      for tiling, reason in _extended_tilings(ctx, width, sources)]
        candidates.append(self._plan(inst, dims, Tiling.replicated(width, n),
                                     "scatter runs replicated"))
        if one_device is not None:
            candidates.append(one_device)
        return ctx.choose(inst, candidates, totals=True)

    @staticmethod
    def _plan(inst, dims: ScatterDims, tiling: Tiling, reason: str) -> OpPlan:
        s = tiling.sharding
        on_operand = remap(s, dims.to_operand, dims.operand_rank)
        on_indices = remap(s, dims.to_indices, dims.indices_rank)
        on_updates = remap(s, dims.to_updates, dims.update_rank)
        result = algebra.remove_dims(algebra.unreduce_on_dims(s, dims.extra), dims.extra)
        if isinstance(inst.shape, TupleShape):
            result = HloSharding.tuple([result] * dims.count)
        return OpPlan((on_operand,) * dims.count + (on_indices,) + (on_updates,) * dims.count,
                      result, reason)

    def lower(self, inst, ctx: LowerContext):
        dims = ScatterDims.of(inst)
        count = dims.count
        operand, indices = inst.operands[0], inst.operands[count]
        local = ctx.operands(inst)
        b = ctx.builder
        ivd = inst.attr("index_vector_dim")
        tiling = Tiling(operand.sharding, dims.operand_rank, ctx.num_devices) \
            if operand.sharding.is_tiled else None
        shifted = tiling is not None and any(tiling.counts[d] > 1 for d in dims.indexed)
        if shifted:
            vectors = _index_vectors(b, local[count], ivd)
            # a dim the update windows cover whole keeps its index: the window is in bounds
            # on every shard exactly when it is in bounds globally (at 0)
            offsets = _offset_vector(ctx, tiling, operand.shape.dims,
                                     list(inst.attr("scatter_dims_to_operand_dims")),
                                     vectors.shape, ivd, set(dims.indexed))
            local[count] = b.binary("subtract", vectors, offsets)
        leaf = inst.sharding.leaf_shardings(inst.shape)[0]
        result = None if leaf.kind == "maximal" else \
            Tiling(leaf, dims.operand_rank, ctx.num_devices)
        partial = result is not None and result.unreduced > 1
        if shifted or partial:
            # rows in the padding of tiled indices hold no update, but their garbage, shifted,
            # could address this partition's rows
            local[count] = _drop_padding_rows(ctx, indices, local[count], dims)
        if partial:
            combiner = scatter_combiner(inst, ctx.module.computations)
            element_type = operand.shape.element_type
            first = b.compare(ctx.tables.partial_index(result), b.constant(0, "s32"), "EQ")
            shape = local[0].shape
            identity = b.broadcast(b.constant(_identity(combiner, element_type), element_type),
                                   shape.dims)
            local[0] = b.select(b.broadcast(first, shape.dims), local[0], identity)
        return clone(inst, ctx, local)


def _updates_spread(from_target, from_operand, from_updates, from_indices, every, extra,
                    n: int) -> list:
    """The sources of index pass-through by the updates' tiles of the indices' batch dims
    where those differ from the indices' own (indices replicated or tiled otherwise): the
    result's or the operand's tiling with the updates' batch tiles, on the replicas of each of
    its tiles or the other way round (XLA's trivially sliced operand hands the updates'
    grouping on to the indices, and its recursion partitions the updates within each group),
    so the updates can stay where they are while the operand moves, and the partial result is
    combined tile by tile."""
    counts = [from_updates[1][e] for e in extra]
    if all(c == 1 for c in counts) or (counts == [from_indices[1][e] for e in extra] and
                                       np.array_equal(from_updates[0][:, extra],
                                                      from_indices[0][:, extra])):
        return []
    spread = "the updates' batch tiles spread over partitions, combined by an all-reduce"
    sources = []
    for part, whose in ((from_target, "result"), (from_operand, "operand")):
        sources += [
            ((part, every), (from_updates, extra), f"the {whose}'s tiling, {spread}"),
            ((_within(part, every, from_updates, extra, n), every), (from_updates, extra),
             f"{spread}, the {whose}'s tiling on each group of their replicas"),
            ((part, every), (_within(from_updates, extra, part, every, n), extra),
             f"the {whose}'s tiling, {spread} on each group of its replicas"),
        ]
    return sources


def _updates_tiles_moved(ctx, dims: ScatterDims, update: Instruction, taken: list[int]):
    """The updates' tiling as coordinates of the extended space (`_coordinates`), the tiles of
    each update dim no extended dim of `taken` carries (a scatter dim the scatter cannot tile:
    index pass-through without a combiner that all-reduces) moved to an
    operand dim the update windows cover whole that the updates leave in one tile (the first
    whose size the count divides, else the first at least as large): the updates are
    resharded there by an all-to-all and the scatter runs in those tiles (operand
    pass-through), where gathering the updates would move all of them. None when no tile
    moves."""
    sharding = update.sharding
    if not sharding.is_tiled or sharding != without_partials(sharding):
        return None
    rank = update.shape.rank
    coords, counts = _coordinates(ctx, sharding, rank, dims.to_updates, len(dims.to_operand))
    tiling = ctx.tiling(sharding, rank)
    table = tiling.coordinates()
    free = [d for d in range(dims.operand_rank)
            if dims.to_indices[d] < 0 and dims.to_updates[d] >= 0 and counts[d] == 1]
    moved = False
    for u in range(rank):
        count = tiling.counts[u]
        if count == 1 or any(dims.to_updates[e] == u for e in taken):
            continue
        sizes = {d: update.shape.dims[dims.to_updates[d]] for d in free}
        fits = [d for d in free if sizes[d] % count == 0] or \
            [d for d in free if sizes[d] >= count]
        if not fits:
            continue
        d = fits[0]
        coords[:, d], counts[d] = table[:, u], count
        free.remove(d)
        moved = True
    return (coords, counts) if moved else None


def _drop_padding_rows(ctx, indices: Instruction, local: Instruction,
                       dims: ScatterDims) -> Instruction:
    """The local indices with the rows in the padding of uneven tiled batch dims set out of
    bounds (the type's maximum), so scatter skips them."""
    sharding = indices.sharding
    if not sharding.is_tiled:
        return local
    tiling = Tiling(sharding, indices.shape.rank, ctx.num_devices)
    uneven = [d for d in range(indices.shape.rank)
              if tiling.counts[d] > 1 and indices.shape.dims[d] % tiling.counts[d]]
    if not uneven:
        return local
    b = ctx.builder
    offsets = ctx.tables.offsets(tiling, indices.shape.dims)
    shape = indices.sharding.shard_shape(indices.shape)
    valid = None
    for d in uneven:
        position = b.binary("add", b.iota("s32", shape.dims, d),
                            b.broadcast(offsets[d], shape.dims))
        inside = b.compare(position, b.broadcast(b.constant(indices.shape.dims[d], "s32"),
                                                 shape.dims), "LT")
        valid = inside if valid is None else b.add("and", inside.shape, [valid, inside])
    element_type = local.shape.element_type
    beyond = b.constant(np.iinfo(dtypes.numpy_dtype(element_type)).max, element_type)
    if local.shape.dims != shape.dims:                # an index vector dim of 1 was appended
        valid = b.reshape(valid, local.shape.dims)
    return b.select(valid, local, b.broadcast(beyond, local.shape.dims))


def _shift_indices(inst, ctx: LowerContext, indices: Instruction, tiling: Tiling,
                   tiled: list[int]) -> tuple[Instruction, Instruction]:
    """The local start indices (clamped as HLO does, minus this partition's offset on the tiled
    indexed or parallel dims `tiled`) and `pred[batch dims]`: whether every tiled component
    falls in this partition's range."""
    b = ctx.builder
    operand = inst.operands[0].shape
    ivd = inst.attr("index_vector_dim")
    start_map = list(inst.attr("start_index_map"))
    sizes = inst.attr("slice_sizes")
    index_type = indices.shape.element_type
    batch_dims = tuple(n for k, n in enumerate(indices.shape.dims) if k != ivd)
    indices = _index_vectors(b, indices, ivd)
    shape = indices.shape
    high = b.broadcast(b.constant([operand.dims[d] - sizes[d] for d in start_map], index_type),
                       shape.dims, (ivd,))
    low = b.broadcast(b.zero(index_type), shape.dims)
    clamped = b.add("clamp", shape, [low, indices, high])
    shifted = b.binary("subtract", clamped,
                       _offset_vector(ctx, tiling, operand.dims, start_map, shape, ivd))
    shard = tiling.shard_dims(operand.dims)
    valid = None
    component_dims = shape.dims[:ivd] + (1,) + shape.dims[ivd + 1:]
    for d in tiled:
        c = start_map.index(d)
        limits = [(0, n) if k != ivd else (c, c + 1) for k, n in enumerate(shape.dims)]
        component = b.add("slice", shape.with_dims(component_dims), [shifted],
                          {"slice": tuple(SliceDim(lo, hi) for lo, hi in limits)})
        component = b.reshape(component, batch_dims)
        zero = b.broadcast(b.zero(index_type), batch_dims)
        size = b.broadcast(b.constant(shard[d], index_type), batch_dims)
        inside = b.add("and", ArrayShape("pred", batch_dims),
                       [b.compare(component, zero, "GE"), b.compare(component, size, "LT")])
        valid = inside if valid is None else b.add("and", inside.shape, [valid, inside])
    return shifted, valid


__all__ = ["GatherRule", "GatherDims", "ScatterRule", "ScatterDims", "scatter_combiner"]
