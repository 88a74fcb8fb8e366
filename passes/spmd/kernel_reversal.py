"""A convolution reversing its kernel along a spatial dim where the kernel and the input are
tiled the same number of ways reads the kernel through a `reverse` of those dims instead, the
reverse sharded as the kernel flipped along them (XLA's ReverseSharding), and no longer reverses
its window there. XLA's partitioner does the same for operands both tiled on spatial dims: it
moves the kernel shards' padding to the front (its halo exchange to pad on the left) and aligns
the kernel by the reversed sharding, the local convolution reversing the taps. Here the
`reverse` rule does both (its operand is the kernel as it is, an uneven dim's padding shifted to
the front by one halo exchange), and the convolution then contracts the window dims tiled alike
on both operands as a weight gradient does, instead of gathering both.

`reverse_tiled_kernels(comp)` rewrites every such convolution of `comp` in place."""
from __future__ import annotations

from dataclasses import replace

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import Window
from gspmdc.ir.module import Computation, Instruction

from .builder import NameUniquer


def reverse_tiled_kernels(comp: Computation) -> None:
    names = None
    instructions = []
    for inst in comp.instructions:
        dims = _reversed_tiled_dims(inst) if inst.opcode == "convolution" else ()
        if dims:
            names = names or NameUniquer(i.name for i in comp.instructions)
            lhs, rhs = inst.operands
            spatial = inst.attr("dim_labels").rhs_spatial
            kernel = tuple(spatial[k] for k in dims)
            attrs = {"dimensions": kernel}
            if inst.attr("metadata") is not None:
                attrs["metadata"] = inst.attr("metadata")
            reversed_rhs = Instruction(names(f"{rhs.name}.reversed"), "reverse", rhs.shape,
                                       [rhs], attrs, sharding=algebra.reverse(rhs.sharding,
                                                                              kernel))
            instructions.append(reversed_rhs)
            inst.operands = [lhs, reversed_rhs]
            window = inst.attr("window")
            inst.attrs["window"] = Window(tuple(
                replace(w, window_reversal=False) if k in dims else w
                for k, w in enumerate(window.dims)))
        instructions.append(inst)
    comp.instructions = instructions


def _reversed_tiled_dims(conv: Instruction) -> tuple[int, ...]:
    """The window dims `conv` reverses where its kernel is tiled, as many ways as its input."""
    window = conv.attr("window")
    lhs, rhs = (o.sharding for o in conv.operands)
    if window is None or not (lhs.is_tiled and rhs.is_tiled) or \
            lhs.has_manual_leaf or rhs.has_manual_leaf or lhs.has_unreduced or rhs.has_unreduced:
        return ()
    labels = conv.attr("dim_labels")
    return tuple(k for k, w in enumerate(window.dims)
                 if w.window_reversal and rhs.tile_counts[labels.rhs_spatial[k]] > 1 and
                 rhs.tile_counts[labels.rhs_spatial[k]] ==
                 lhs.tile_counts[labels.lhs_spatial[k]])


__all__ = ["reverse_tiled_kernels"]
