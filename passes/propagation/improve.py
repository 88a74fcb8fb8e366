"""The "improve" decision of sharding propagation: whether a candidate sharding should replace an
instruction's current one (XLA's ReturnImprovedShardingImpl; docs/design/sharding-algebra.md
describes it with the algebra it is built from)."""
from __future__ import annotations

from gspmdc.ir.shapes import ArrayShape, Shape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import (
    cached, for_shape, is_spatially_partitioned, is_subtiling_or_equal, merge_sharding,
)


def is_strictly_better(a: HloSharding, b: HloSharding) -> bool:
    """Manual beats tile-maximal; tuples: no leaf worse and at least one better."""
    if a.is_tuple:
        better = False
        for x, y in zip(a.elements, b.elements):
            if is_strictly_better(y, x):
                return False
            better |= is_strictly_better(x, y)
        return better
    return a.kind == "manual" and b.is_tile_maximal


def improved_sharding(candidate: HloSharding, current: HloSharding | None, shape: Shape, *,
                      may_combine: bool, aggressive: bool = False) -> HloSharding | None:
    """The sharding `current` should become given the `candidate`, or None for "no change": a
    strictly better candidate wins; a single-device candidate never propagates; otherwise the two
    are merged (`merge_sharding`) and, unless `aggressive`, a merge that keeps the tile count but
    moves some device's region outside its current one is refused. A candidate equal to
    `current` never changes it (no sharding is strictly better than, more specific than, or
    merges into more tiles with itself): two thirds of the questions propagation asks, answered
    without the memo table."""
    if current is not None and (candidate is current or candidate == current):
        return None
    return _improved(candidate, current, shape, may_combine, aggressive)


@cached
def _improved(candidate: HloSharding, current: HloSharding | None, shape: Shape,
              may_combine: bool, aggressive: bool) -> HloSharding | None:
    candidate = for_shape(candidate, shape)
    if current is not None and is_strictly_better(candidate, current):
        return candidate
    if not is_spatially_partitioned(candidate):
        return None
    if current is None:
        return candidate
    if candidate.is_manual:
        return None
    tiles = candidate.num_tiles if not candidate.is_tuple else None
    changed, result = merge_sharding(current, candidate, may_combine)
    if not changed:
        return None
    if not aggressive and isinstance(shape, ArrayShape) and not current.is_tile_maximal and \
            result.num_tiles == tiles and not is_subtiling_or_equal(result, current, shape.dims):
        return None
    return result


__all__ = ["is_strictly_better", "improved_sharding"]
