"""Buffer donation by liveness: which steps of a plan compute their result into the memory of
an operand whose last use they are, instead of into fresh memory.

An elementwise instruction (`tanh(h)`, `add(a, b)`) whose operand dies at it may write its
result over that operand, as XLA's buffer assignment lets an elementwise fusion reuse a dead
operand's buffer: the same ufunc computes the same bits whether its output is a fresh array or
its input (`kernels.specialising.in_place_kernel_for`), and the result neither allocates nor pulls
fresh memory through the cache: the bench's 4-layer MLP's three tanh took 0.43 ms in place
against 0.48 fresh, the ResNet block's residual add 0.25 against 0.40 ms.

Values are immutable to everything else, so an operand's memory may be written only where
nothing can still read it. `donations` gives a step operand slot `s` when all of these hold:
- the step is the last use of `s` (its value is released right after; never the root's slot);
- `s` holds memory of its own, which nothing else holds: its instruction's kernel gives fresh
  memory (`FRESH_RESULTS`: never an operand, a view of one, a constant or a collective's
  buffer), and every instruction that reads `s` keeps no part of it (its kernel is in
  `FRESH_RESULTS` too: no view, tuple, call, loop or collective of `s` outlives it); parameters,
  `get-tuple-element`s, loop states, tuples and the results of called computations are never
  donated, nor what a caller passed in or receives;
- `s` is not kept past the run: not a folded constant or a loop-invariant array (nor a candidate
  of either, which the first run keeps), not a bf16 value with an unrounded twin;
- the step's result has the operand's dimensions and element type, holds at least
  `DONATED_BYTES`, and its kernel can write it in place (`in_place_kernel_for`: one numpy ufunc
  for that type).
The caller donates only when no value hook or live-array count watches (they may hold values).
"""
from __future__ import annotations

from typing import Callable, Collection, Sequence

from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape

from .kernels.elementwise import ELEMENTWISE_FRESH

#: the smallest result computed in place: below it numpy's ufuncs take longer with an `out`
#: array than with a fresh result (an f32 `add` of 64 elements 0.38 against 0.27 us; of 16,384,
#: 2.9 against 7.2 us)
DONATED_BYTES = 64 << 10

#: the opcodes whose kernels return arrays in memory of their own: no operand's, no view of one,
#: nothing a kernel or backend keeps, and no reference to an operand once they return
FRESH_RESULTS = ELEMENTWISE_FRESH | frozenset({"dot", "convolution"})


def donations(instructions: Sequence[Instruction], operands: Sequence[tuple[int, ...] | None],
              order: Sequence[int], releases: dict[int, Sequence[int]],
              executed_readers: Sequence[Collection[int]], kept: Collection[int],
              in_place: Callable[[Instruction, int], object]) -> dict[int, object]:
    """{step slot: in-place kernel} for the steps of `order` that may write over an operand
    (module docstring). `operands[i]` are the slots step `i` reads (None: not a step),
    `releases[i]` the slots whose last use step `i` is, `executed_readers[s]` the steps that
    read slot `s` and run, `kept` the slots neither donated nor donating (those that may outlive
    their last use: folded, foldable, loop-invariant; bf16 values with an unrounded twin and the
    twins' slots, which are no instruction's own), `in_place(inst, k)` the kernel of `inst`
    writing into operand `k` or None (`kernels.specialising.in_place_kernel_for`). A step reads
    the slot it writes over, so that step's kernel is in `FRESH_RESULTS` too."""
    result: dict[int, object] = {}
    for i in order:
        dying = releases.get(i)
        if not dying or i in kept:
            continue
        inst = instructions[i]
        if not isinstance(inst.shape, ArrayShape) or inst.shape.byte_size < DONATED_BYTES:
            continue
        for k, s in enumerate(operands[i]):
            if s not in dying or s in kept or not _owned(s, instructions, executed_readers):
                continue
            if inst.operands[k].shape != inst.shape:
                continue
            kernel = in_place(inst, k)
            if kernel is not None:
                result[i] = kernel
                break
    return result


def _owned(s: int, instructions: Sequence[Instruction],
           executed_readers: Sequence[Collection[int]]) -> bool:
    """Whether slot `s`'s array is memory no other value holds (module docstring)."""
    if instructions[s].opcode not in FRESH_RESULTS:
        return False
    return all(instructions[u].opcode in FRESH_RESULTS for u in executed_readers[s])


__all__ = ["DONATED_BYTES", "FRESH_RESULTS", "donations"]
