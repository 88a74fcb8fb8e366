"""Kernels specialised to one instruction when the interpreter makes a plan.

A kernel of `KERNELS` is `fn(inst, args, ctx)`, and reads the instruction's attributes and
operand types on every call. For small arrays in loops (a few microseconds per numpy call) that
decoding is a good part of a step's time, so a kernel may be registered as a
`SpecialisedKernel`: called as it is, it is the generic kernel (what `computation_patterns` and
any other caller use); `specialise(inst)` gives a kernel for that one instruction with its
attributes decoded and its operand types read once, which the interpreter's plans run. Both
compute the same values with the same numpy calls; only the decoding moves. An elementwise
kernel may also have an in-place variant (`in_place_kernel_for`), which the plans run where an
operand's memory is dead (`runtime/buffer_donation.py`): the same ufunc with that operand as its
output, so the same values.
"""
from __future__ import annotations

from typing import Any, Callable

Kernel = Callable[[Any, list, Any], Any]


class SpecialisedKernel:
    """A kernel (`generic`) with `specialise(inst) -> kernel` for one instruction, and, for
    elementwise kernels that can write their result over an operand, `in_place(inst, k)`: a
    kernel for `inst` that computes the same values into operand `k`'s array and returns it (None
    where this instruction's kernel cannot)."""

    __slots__ = ("generic", "specialise", "in_place")

    def __init__(self, generic: Kernel, specialise: Callable[[Any], Kernel],
                 in_place: Callable[[Any, int], Kernel | None] | None = None):
        self.generic = generic
        self.specialise = specialise
        self.in_place = in_place

    def __call__(self, inst, args: list, ctx) -> Any:
        return self.generic(inst, args, ctx)


def kernel_for(kernel: Any, inst) -> Any:
    """`kernel` (a `KERNELS` entry) for the one instruction `inst`: its specialisation when it
    has one."""
    if type(kernel) is SpecialisedKernel:
        return kernel.specialise(inst)
    return kernel


def in_place_kernel_for(kernel: Any, inst, k: int) -> Any:
    """`kernel` (a `KERNELS` entry) for `inst` writing its result into operand `k`, or None when
    it has no such variant for `inst`. The caller makes sure nothing else reads that operand's
    memory (`runtime/buffer_donation.py`)."""
    if type(kernel) is SpecialisedKernel and kernel.in_place is not None:
        return kernel.in_place(inst, k)
    return None
