"""Kernels specialised to one instruction when the interpreter makes a plan.

A kernel of `KERNELS` is `fn(inst, args, ctx)`, and reads the instruction's attributes and
operand types on every call. For small arrays in loops (a few microseconds per numpy call) that
decoding is a good part of a step's time, so a kernel may be registered as a
`SpecialisedKernel`: called as it is, it is the generic kernel (what `computation_patterns` and
any other caller use); `specialise(inst)` gives a kernel for that one instruction with its
attributes decoded and its operand types read once, which the interpreter's plans run. Both
compute the same values with the same numpy calls; only the decoding moves.
"""
from __future__ import annotations

from typing import Any, Callable

Kernel = Callable[[Any, list, Any], Any]


class SpecialisedKernel:
    """A kernel (`generic`) with `specialise(inst) -> kernel` for one instruction."""

    __slots__ = ("generic", "specialise")

    def __init__(self, generic: Kernel, specialise: Callable[[Any], Kernel]):
        self.generic = generic
        self.specialise = specialise

    def __call__(self, inst, args: list, ctx) -> Any:
        return self.generic(inst, args, ctx)


def kernel_for(kernel: Any, inst) -> Any:
    """`kernel` (a `KERNELS` entry) for the one instruction `inst`: its specialisation when it
    has one."""
    if type(kernel) is SpecialisedKernel:
        return kernel.specialise(inst)
    return kernel
