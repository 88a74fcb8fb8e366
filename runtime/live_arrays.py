"""Measuring the memory a partition's values hold: the peak of its live arrays.

A `LiveArrays` is handed to the interpreter (`evaluate(..., live_arrays=tracker)`), which holds
every value when it is defined and drops it when its last user has run, in every computation it
evaluates (called computations, loop bodies and conditions, branches); the entry arguments are
held for the whole evaluation. An array counts while at least one value holds it: each array
object is counted once, at its own size (`nbytes`), however many values (tuple elements,
`get-tuple-element`s, `copy`s returning their operand) refer to it. `peak` is the most bytes
held at once.

A collective a backend starts and finishes later (a `Pending` value) defines its value when it
starts, as a synchronous one would: its result counts from then, at the bytes of the
instruction's shape (`hold_pending`; the backend allocated its receive buffers when it started),
and is replaced by the finished arrays when the interpreter finishes it (`settle`), so the
operands and the result of a collective overlap as they do in program order.

This is what `gspmdc run --profile` reports as the measured peak memory per rank, the counterpart
of the liveness analysis of `gspmdc cost` (`gspmdc.ir.liveness`). It counts the values of the
program, not the interpreter's own temporaries inside a kernel or MPI's buffers.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class LiveArrays:
    """Reference counts of the arrays the values of one evaluation hold (see the module
    docstring); `bytes` is what they hold now, `peak` the most they held at once."""

    __slots__ = ("_held", "bytes", "peak")

    def __init__(self):
        self._held: dict[int, list] = {}
        self.bytes = 0
        self.peak = 0

    def hold(self, value: Any) -> None:
        """One more value refers to `value` (an array, a tuple of values, or a token)."""
        if type(value) is tuple:
            for element in value:
                self.hold(element)
            return
        if not isinstance(value, np.ndarray):
            return
        entry = self._held.get(id(value))
        if entry is not None:
            entry[0] += 1
            return
        self._held[id(value)] = [1, value.nbytes]
        self.bytes += value.nbytes
        if self.bytes > self.peak:
            self.peak = self.bytes

    def hold_pending(self, pending: Any, nbytes: int) -> None:
        """A started collective's value, `nbytes` of arrays once finished, is defined now."""
        self._held[id(pending)] = [1, nbytes]
        self.bytes += nbytes
        if self.bytes > self.peak:
            self.peak = self.bytes

    def settle(self, pending: Any, value: Any) -> None:
        """The started collective `pending` finished as `value`, which its holders now hold."""
        entry = self._held.pop(id(pending), None)
        if entry is None:               # dropped before it finished: nothing holds its value
            return
        self.bytes -= entry[1]
        for _ in range(entry[0]):
            self.hold(value)

    def drop(self, value: Any) -> None:
        """A value that referred to `value` is gone."""
        if type(value) is tuple:
            for element in value:
                self.drop(element)
            return
        if not isinstance(value, np.ndarray) and id(value) not in self._held:
            return
        entry = self._held[id(value)]
        entry[0] -= 1
        if entry[0] == 0:
            del self._held[id(value)]
            self.bytes -= entry[1]


__all__ = ["LiveArrays"]
