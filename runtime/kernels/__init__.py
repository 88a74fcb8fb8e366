"""The kernel table: one numpy implementation per HLO opcode.

A kernel is `fn(inst, args, ctx) -> value` where `inst` is the `Instruction`, `args` the operand
values (numpy arrays for arrays, Python tuples for tuples, `TOKEN` for tokens) and `ctx` the
`EvalContext` of the interpreter (sub-computation calls, collective backend, partition id). The
same table serves the single-device reference interpreter and every SPMD partition.

Kernel modules register themselves with `@kernel("opcode", ...)`; importing this package imports
all of them, so `KERNELS` is complete after `import gspmdc.runtime.kernels`.
"""
from __future__ import annotations

from typing import Any, Callable

KERNELS: dict[str, Callable[..., Any]] = {}


class Token:
    """The value of a `token[]` (ordering only, no data)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TOKEN"


TOKEN = Token()


def kernel(*opcodes: str):
    """Register the decorated function as the kernel of each opcode (one entry per opcode)."""
    def register(fn):
        for opcode in opcodes:
            if opcode in KERNELS:
                raise RuntimeError(f"two kernels registered for opcode {opcode!r}")
            KERNELS[opcode] = fn
        return fn
    return register


def _load_kernel_modules() -> None:
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_load_kernel_modules()
