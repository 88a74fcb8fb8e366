"""The kernels: one numpy implementation per HLO opcode, in the catalogue's `KERNELS` table.

A kernel is `fn(inst, args, ctx) -> value` where `inst` is the `Instruction`, `args` the operand
values (numpy arrays for arrays, Python tuples for tuples, `TOKEN` for tokens) and `ctx` the
`EvalContext` of the interpreter (sub-computation calls, collective backend, partition id). The
same table serves the single-device reference interpreter and every SPMD partition.

Kernel modules register their kernels with `@KERNELS.register("opcode", ...)` (`ir/ops.py`);
this package imports all of them, so `KERNELS` is complete after `import gspmdc.runtime.kernels`.
The kernels of the catalogue's `ELEMENTWISE_PURE` ops are shape-agnostic (numpy broadcasting; a
scalar operand broadcasts), which is what lets `computation_patterns` evaluate scalar
computations vectorised over whole arrays.
"""
from __future__ import annotations

from gspmdc.ir.ops import KERNELS


class Token:
    """The value of a `token[]` (ordering only, no data)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TOKEN"


TOKEN = Token()


from . import (  # noqa: E402,F401  (each module registers its kernels; they use TOKEN)
    collective_ops, contraction, control_flow, convolution, custom_call, elementwise, indexing,
    precision, random, reduction, sort, structural,
)

__all__ = ["KERNELS", "TOKEN", "Token"]
