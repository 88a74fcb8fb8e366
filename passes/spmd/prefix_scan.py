"""Cumulative reduce-windows along a tiled dim as a distributed prefix scan.

A window covering the whole prefix of a dim of size S (`size=S`, `stride=1`, `pad=(S-1)_0`, no
dilation: JAX's `cumsum`, `cumprod`, `cummax`, `cummin`) makes output `o` the reduction of
elements `0..o`. A halo exchange would move up to the whole dim to the last shard; instead, with
the dim tiled n ways (shard I), each partition

1. scans its own shard: the local reduce-window with `size=I pad=(I-1)_0` (uneven padding sits
   after every real element, so it only reaches padding outputs);
2. takes its shard total (the scan's last element) and all-gathers the n totals along the dim;
3. reduces the totals of the shards before it (`reduce-window size=n pad=n_-1` on the gathered
   totals: an exclusive scan, the init value for the first shard) and picks its own;
4. combines that carry with its local scan by the reducer.

This moves n-1 totals per row instead of a gather of the dim. With two shards (n = 2) the carry
is the first shard's total alone: one `collective-permute` from the first shard to the second
replaces steps 2-3 (one step as the all-gather, and only the first shard sends: half the
bytes over all devices; XLA's halo exchange of the first shard sends as much when the shard is
one element long, more otherwise), and the first shard takes the init value as its carry.

It is exact for reducers that are one associative, commutative binary opcode (`add`,
`multiply`, `maximum`, `minimum`, `and`, `or`) with an init value that is their identity (the
carry is combined with a local scan that already holds the init once); floating-point sums are
reassociated, as in any partitioned sum.
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.attributes import SliceDim, Window, WindowDim
from gspmdc.ir.module import Computation, Instruction

from .op_rules import LowerContext
from .tiling import Tiling

#: reducers a scan may re-associate, with their identity as a function of the dtype
_IDENTITIES = {
    "add": lambda t: 0,
    "multiply": lambda t: 1,
    "maximum": lambda t: -np.inf if dtypes.is_float(t) else _limits(t).min,
    "minimum": lambda t: np.inf if dtypes.is_float(t) else _limits(t).max,
    "and": lambda t: True,
    "or": lambda t: False,
}


def _limits(element_type: str):
    dtype = dtypes.numpy_dtype(element_type)
    return np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)


def cumulative_dims(inst: Instruction) -> list[int]:
    """Dims on which a single-input reduce-window's window covers the whole prefix."""
    if len(inst.operands) != 2:
        return []
    dims = inst.operands[0].shape.dims
    return [d for d, (size, w) in enumerate(zip(dims, inst.attr("window").dims))
            if size > 1 and (w.size, w.stride, w.padding_low, w.padding_high, w.base_dilation,
                             w.window_dilation) == (size, 1, size - 1, 0, 1, 1)]


def associative_reducer(inst: Instruction, computations: dict[str, Computation],
                        attr: str = "to_apply") -> str | None:
    """The opcode of `inst`'s computation `attr` when it is one re-associable binary opcode of
    its two parameters, else None."""
    comp = computations.get(inst.attr(attr).name)
    if comp is None:
        return None
    root, params = comp.root, comp.parameters
    if len(comp.instructions) != 3 or root.opcode not in _IDENTITIES or len(params) != 2 or \
            set(root.operands) != set(params):
        return None
    return root.opcode


def identity(opcode: str, element_type: str) -> np.ndarray:
    """The identity of the associative `opcode` on `element_type` scalars."""
    return np.asarray(_IDENTITIES[opcode](element_type),
                      dtype=dtypes.numpy_dtype(element_type))


def scan_opcode(inst: Instruction, computations: dict[str, Computation]) -> str | None:
    """The reducer's opcode when `inst` may be scanned (an associative reducer and a constant
    init equal to its identity), else None."""
    opcode = associative_reducer(inst, computations)
    init = inst.operands[1]
    if opcode is None or init.opcode != "constant" or init.literal is None or \
            init.literal.value is None:
        return None
    return opcode if np.array_equal(init.literal.value,
                                    identity(opcode, init.shape.element_type)) else None


def scan_bytes(local_dims, tiling: Tiling, dims, width: int) -> tuple[float, float]:
    """(bytes the busiest partition sends, bytes all partitions together send) to exchange the
    shard totals over `dims`: the all-gather's n-1 pieces from every partition; with two shards
    the first shard's one piece, from the first shard's partitions only."""
    busiest = total = 0.0
    for d in dims:
        rows = int(np.prod([n for k, n in enumerate(local_dims) if k != d]))
        piece = (tiling.counts[d] - 1) * rows * width
        senders = tiling.num_devices // 2 if tiling.counts[d] == 2 else tiling.num_devices
        busiest, total = busiest + piece, total + piece * senders
    return busiest, total


def describe_scan(tiling: Tiling, dim: int) -> str:
    if tiling.counts[dim] == 2:
        return "prefix scan over 2 shards (collective-permute of the first shard's totals)"
    return f"prefix scan over {tiling.counts[dim]} shards (all-gather of shard totals)"


def emit_prefix_scan(ctx: LowerContext, local: Instruction, tiling: Tiling, dims: list[int],
                     init: Instruction, opcode: str) -> Instruction:
    """Steps 2-4 of the module docstring on `local` (the shard-local scan reduce-window) along
    `dims` (tiled by `tiling`), one after another; `init` is the local init scalar and
    `opcode` the reducer's."""
    b = ctx.builder
    value = local
    for d in dims:
        n, shape = tiling.counts[d], value.shape
        last = [SliceDim(0, k) for k in shape.dims]
        last[d] = SliceDim(shape.dims[d] - 1, shape.dims[d])
        single = list(shape.dims)
        single[d] = 1
        totals = b.add("slice", shape.with_dims(single), [value], {"slice": tuple(last)})
        groups = np.moveaxis(tiling.devices, d, -1).reshape(-1, n)
        ordinal = ctx.tables.lookup(tiling.coordinates()[:, d], f"ordinal.{d}")
        if n == 2:
            carry = _first_shards_total(ctx, totals, groups, ordinal, init)
        else:
            gathered = b.all_gather(totals, d, groups, ctx.channels())
            window = [WindowDim(1)] * shape.rank
            window[d] = WindowDim(n, padding_low=n, padding_high=-1)
            before = b.add("reduce-window", gathered.shape.with_dims(gathered.shape.dims),
                           [gathered, init], {"window": Window(tuple(window)),
                                              "to_apply": local.attrs["to_apply"]})
            starts = [ctx.tables.zero()] * shape.rank
            starts[d] = ordinal
            carry = b.dynamic_slice(before, starts, single)
        rest = [k for k in range(shape.rank) if k != d]
        carry = b.reshape(carry, [shape.dims[k] for k in rest])
        value = b.binary(opcode, b.broadcast(carry, shape.dims, rest), value)
    return value


def _first_shards_total(ctx: LowerContext, totals: Instruction, pairs: np.ndarray,
                        ordinal: Instruction, init: Instruction) -> Instruction:
    """The carry of a scan over two shards: the first shard's `totals` on the second shard's
    partitions (one collective-permute along `pairs`, first → second), the init value on the
    first shard's (a collective-permute gives the partitions it sends nothing zeros, not the
    reducer's identity)."""
    b = ctx.builder
    received = b.collective_permute(totals, pairs, ctx.channels())
    dims = totals.shape.dims
    first = b.compare(ordinal, ctx.tables.zero(), "EQ")
    return b.select(b.broadcast(first, dims, []), b.broadcast(init, dims, []), received)


__all__ = ["cumulative_dims", "associative_reducer", "identity", "scan_opcode", "scan_bytes",
           "describe_scan", "emit_prefix_scan"]
