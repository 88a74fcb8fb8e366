"""Partitioning of ops along their *pass-through* dims: dims along which the op works independently
on every index, with the same size in the result and in the operands that have them.

| op | pass-through dims |
|---|---|
| `cholesky`, `triangular-solve`, `fft` | batch dims (all but the last two / the transformed ones) |

The result takes a tiling of its pass-through dims only (the others whole); each operand takes that
tiling mapped to its own dims, replicated over result dims it does not have; scalar operands (init
and pad values, dynamic indices) are replicated. Candidates: the annotated result sharding
restricted to pass-through dims, the first operand's sharding carried through, each of those
two with the tiles of its other dims moved into a pass-through dim instead (as XLA replicates
the dims an op cannot split, `HandleElementwiseWithDimsToReplicate`: each such dim's tiles go
to the first pass-through dim whose size the merged tile count divides; the reshards are then
all-to-alls, not all-gathers: `cholesky` of f32[4,4,4] tiled 4 ways on a matrix dim runs on
batch tiles), and everything replicated (the default action); the fewest bytes moved wins.
Padding of uneven pass-through dims only ever meets padding. Windowed and indexed dims that are tiled need halo exchange or index
arithmetic, which these rules leave to resharding: such dims are simply gathered.
"""
from __future__ import annotations

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .op_rules import OpPlan, PartitionRule, without_partials
from .tiling import remap

#: per operand, the operand dim of each result dim (-1: none)
DimMaps = list[list[int]]


def _identity_maps(inst: Instruction, free: set[int], operands=None) -> DimMaps:
    """Array operands of the result's rank share the result's dims; others map nothing."""
    rank = _result_leaf(inst).rank
    maps = []
    for k, operand in enumerate(inst.operands):
        shape = operand.shape
        same = isinstance(shape, ArrayShape) and shape.rank == rank and \
            (operands is None or k in operands)
        maps.append([r if same and r in free else -1 for r in range(rank)])
    return maps


def _result_leaf(inst: Instruction) -> ArrayShape:
    shape = inst.shape
    return shape.elements[0] if isinstance(shape, TupleShape) else shape


def _batch_dims(count_trailing: int):
    def maps(inst):
        rank = _result_leaf(inst).rank
        return _identity_maps(inst, set(range(rank - count_trailing)))
    return maps


def _fft(inst):
    return _batch_dims(len(inst.attr("fft_length")))(inst)


_MAPS = {
    "cholesky": _batch_dims(2), "triangular-solve": _batch_dims(2), "fft": _fft,
}


def _maps_for(inst: Instruction) -> DimMaps:
    return _MAPS[inst.opcode](inst)


@PARTITION_RULES.register(*_MAPS, instance=True)
class PassThroughRule(PartitionRule):
    def plan(self, inst, ctx):
        maps = _maps_for(inst)
        leaf = _result_leaf(inst)
        rank = leaf.rank
        leaves = sum(1 for _ in inst.shape.leaves())
        free = [r for r in range(rank) if any(m[r] >= 0 for m in maps)]
        fixed = [r for r in range(rank) if r not in free]
        target = without_partials(inst.sharding.leaf_shardings(inst.shape)[0])

        def plan(result, reason):
            operands = []
            for operand, mapping in zip(inst.operands, maps):
                if result.kind == "maximal":
                    operands.append(result)
                else:
                    operands.append(remap(ctx.tiling(result, rank).sharding, mapping,
                                          operand.shape.rank))
            whole = HloSharding.tuple([result] * leaves) if isinstance(inst.shape, TupleShape) \
                else result
            return OpPlan(tuple(operands), whole, reason)

        if target.kind == "maximal":
            return plan(target, f"{inst.opcode} on one device")
        tiled = ctx.tiling(target, rank).sharding
        candidates = [plan(algebra.partially_replicate_on_dims(tiled, fixed),
                           f"{inst.opcode} keeps the result's tiling of its pass-through dims")]
        moved = tiles_moved(tiled, leaf.dims, fixed, free)
        if moved is not None:
            candidates.append(plan(moved, f"{inst.opcode} moves the result's tiles of its other "
                                          "dims into its pass-through dims"))
        source = inst.operands[0].sharding
        first = inst.operands[0].shape
        if source.is_tiled and source == without_partials(source) and \
                isinstance(first, ArrayShape):
            to_result = [-1] * first.rank
            for r, d in enumerate(maps[0]):
                if d >= 0:
                    to_result[d] = r
            carried = remap(ctx.tiling(source, first.rank).sharding, to_result, rank)
            candidates.append(plan(carried, f"{inst.opcode} keeps its operand's tiling of its "
                                             "pass-through dims"))
            moved = tiles_moved(ctx.tiling(source, first.rank).sharding, first.dims,
                                 [d for d in range(first.rank) if d not in maps[0]],
                                 [d for d in maps[0] if d >= 0])
            if moved is not None:
                candidates.append(plan(remap(moved, to_result, rank),
                                       f"{inst.opcode} moves its operand's tiles of its other "
                                       "dims into its pass-through dims"))
        candidates.append(plan(HloSharding.replicate(), f"{inst.opcode} runs replicated"))
        return ctx.choose(inst, candidates)


def tiles_moved(sharding: HloSharding, dims, fixed: list[int],
                 free: list[int]) -> HloSharding | None:
    """`sharding` (tiled, of an array of `dims`) with the tiles of each dim of `fixed` moved
    into the first dim of `free` whose size the merged tile count divides (XLA's
    GetFirstTargetDimToMoveShardingTiles, then MoveAndMergeShardingTiles), and the tiles that
    found no such dim replicated (PartiallyReplicateTiledShardingOnDims): every dim of `fixed`
    is whole. None when no tile moves."""
    if not sharding.is_tiled:
        return None
    moved = sharding
    for source in fixed:
        count = moved.tile_assignment.dims[source]
        if count == 1 or dims[source] == 1:
            continue
        for target in free:
            if dims[target] % (moved.tile_assignment.dims[target] * count) == 0:
                moved = algebra.move_and_merge(moved, source, target)
                break
    return None if moved is sharding else algebra.partially_replicate_on_dims(moved, fixed)


__all__ = ["PassThroughRule", "tiles_moved"]
