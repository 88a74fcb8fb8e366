"""Where the generator's decisions come from: one interface, two implementations.

The generator never calls `random` or hypothesis itself; it asks a `Source` for integers,
choices and coin flips. `RandomSource(seed)` answers from `random.Random(seed)` (deterministic,
fast: long campaigns); `DrawSource(draw)` answers from hypothesis draws, so a failing case
shrinks: every answer shrinks towards its simplest value (the low end of a range, the first
option of a choice, `False` for a coin), and generator code lists the simplest option first.
"""
from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


class Source:
    """The decisions the generator can ask for; subclasses implement `integer` and `shuffle`."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi] (both included); shrinks towards `lo`."""
        raise NotImplementedError

    def permutation(self, items: Sequence[T]) -> list[T]:
        """The items in a random order; shrinks towards the given order."""
        raise NotImplementedError

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability `p`; shrinks towards False."""
        return self.integer(0, 999) >= round(1000 * (1 - p))

    def choice(self, options: Sequence[T]) -> T:
        """One of `options`, uniformly; shrinks towards `options[0]`."""
        return options[self.integer(0, len(options) - 1)]

    def weighted(self, options: Sequence[tuple[T, float]]) -> T:
        """One of `options` (value, weight) with probability proportional to its weight;
        shrinks towards the first option."""
        total = sum(w for _, w in options)
        scale = 1000 / total
        point = self.integer(0, 999)
        for value, weight in options:
            point -= weight * scale
            if point < 0:
                return value
        return options[-1][0]

    def subset(self, items: Sequence[T], p: float = 0.5) -> list[T]:
        """Each item kept with probability `p` (order kept); shrinks towards the empty list."""
        return [item for item in items if self.boolean(p)]


class RandomSource(Source):
    """Decisions from `random.Random(seed)`."""

    def __init__(self, seed: int):
        self._random = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._random.randint(lo, hi)

    def permutation(self, items: Sequence[T]) -> list[T]:
        out = list(items)
        self._random.shuffle(out)
        return out


class DrawSource(Source):
    """Decisions from hypothesis' `draw` (inside `st.composite`)."""

    def __init__(self, draw: Callable):
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def permutation(self, items: Sequence[T]) -> list[T]:
        return list(self._draw(st.permutations(list(items))))
