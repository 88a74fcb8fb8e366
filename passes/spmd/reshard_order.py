"""The order in which insert-reshards makes one instruction's reads of one value in several
shardings (docs/design/partitioning.md#several-reads-of-one-value).

insert-reshards makes each reshard from the cheapest of the value itself and the reshards of
it that live instructions read already (XLA's reshard cache keyed by value and target). When
one instruction reads a value in several shardings (a `tuple` holding it in elements sharded
differently, the initial state of a `while`), the order they are made in decides which of them
can start from another: a tiling made first and the whole value gathered from it can move more
than gathering first and slicing the tiling from the whole value, which XLA's partitioner does
whenever its reshard to the tiling goes through the replicated value (that replicated value is
then in its cache for the other read).
"""
from __future__ import annotations

from typing import Callable, Sequence

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import Shape

Measure = Callable[[Shape, HloSharding, HloSharding], float]


def first_made(shape: Shape, have: HloSharding, held: frozenset, needs: Sequence[HloSharding],
               measure: Measure, total: Measure) -> int:
    """The index in `needs` (the distinct shardings one instruction reads a value of `shape` in,
    in operand order) of the one to make first: the one after which all of them, in operand
    order, each made from the cheapest of the value (sharded `have`), the shardings `held`
    (its reshards live instructions read already; free to read again) and the needs made
    before it, move the fewest bytes by `measure` (the planner's: the busiest device's), then
    the fewest bytes all devices together send (`total`). 0, the operand order, on a tie."""
    def cost(first: int) -> tuple[float, float]:
        made = {have, *held}
        busiest = everyone = 0.0
        for need in [needs[first], *needs[:first], *needs[first + 1:]]:
            if need not in made:
                step = min([(measure(shape, source, need), total(shape, source, need))
                            for source in made])
                busiest, everyone = busiest + step[0], everyone + step[1]
                made.add(need)
        return round(busiest, 9), round(everyone, 9)   # sums in other orders compare equal
    return min(range(len(needs)), key=cost)


__all__ = ["first_made"]
