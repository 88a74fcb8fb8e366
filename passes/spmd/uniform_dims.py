"""Uniform dims: the dims along which every element of a value is known to be equal
(docs/design/partitioning.md#values-uniform-along-a-dim), so that a reshard changing only how
those dims are tiled moves nothing (`reshard_uniform.py`).

XLA's partitioner keeps the same knowledge about the instructions it creates (the dims a
broadcast adds, carried through elementwise ops, copies, transposes, reshapes, slices and pads)
and reshards such a value between two device orders by a local copy. Here it is worked out on
the global program before lowering, per array value of one computation:

- `broadcast`: the dims it adds, and those of its operand's uniform dims;
- a splat `constant`: every dim; `iota`: every dim but its iota dimension;
- pure elementwise ops (copies and `Sharding` annotations included, not `bitcast-convert`): the
  dims uniform in every operand (a scalar operand is uniform along every dim);
- `transpose` and `reshape`: the operand's uniform dims where they land (a reshape's run of dims
  that merges or splits dims is uniform when every operand dim of the run is);
- `slice`, `dynamic-slice`, `reverse`: the operand's; `pad`: the operand's not padded;
- a `get-tuple-element` of a `tuple`: the element's;
- a dim of size 1 is always uniform; anything else knows no uniform dim.

Inside a fully manual region a value is per-device data: its uniform dims say that each
device's local value is uniform along them, and it is also known whether the local value is the
same on every device (constants, iotas, values entering the region from a value uniform along
every dim its sharding tiles evenly, and what pure ops make of those; values outside a region
count as the same everywhere, since manual code reads them replicated). Leaving the region
(`SPMDShardToFullShape`), a local value the same on every device keeps its uniform dims; any
other keeps only those its result sharding does not tile (devices hold different parts).

A manual value computed element by element (pure elementwise ops) from values entering its
region in one *layout* (global dims and the tile each device holds) also has the uniform dims
of the global value its devices' real elements make up in that layout: each entering value
gives its own global uniform dims (the padding of an uneven tile is left out, so uneven dims
count too), a local value the same on every device its uniform dims, any other local value
its uniform dims the layout does not tile. Leaving the region in the same layout, the result
has those dims as well. Partially manual boundaries give no uniform dims.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.custom_call_targets import (
    MANUAL_BOUNDARIES, MANUAL_ENTRIES, MANUAL_EXITS, target_of,
)
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import ELEMENTWISE_PURE, PARTITION_DEPENDENT
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape

from .op_rules_data import is_splat
from .reshard_nodes import is_reshard

#: elementwise ops whose result element depends only on the operands' elements at its index
_POINTWISE = ELEMENTWISE_PURE - PARTITION_DEPENDENT - {"bitcast-convert"}
#: ops whose result along a dim reads its operand's elements along the same dim
_SAME_DIMS = frozenset({"slice", "dynamic-slice", "reverse"})
#: opcodes whose rule reads their operands' facts
_READS = _POINTWISE | _SAME_DIMS | {"broadcast", "transpose", "reshape", "pad"}


class _Layout(NamedTuple):
    """Global dims, tile counts and the devices holding each tile (replicas in ascending order;
    none listed for a replicated value)."""

    dims: tuple[int, ...]
    counts: tuple[int, ...]
    tiles: tuple


class _Fact(NamedTuple):
    dims: frozenset[int]
    #: for a manual value: the same on every device (any value outside a region: True)
    everywhere: bool
    #: for a manual value computed element by element from values entering its region in one
    #: layout: that layout (else None) ...
    layout: _Layout | None = None
    #: ... and the uniform dims of the global value its devices' real elements make up in it
    global_dims: frozenset[int] = frozenset()


_NOTHING = _Fact(frozenset(), False)


class UniformDims:
    """The uniform dims of the values of one computation, worked out on demand (lower-spmd
    asks only about the values it reshards) and remembered."""

    def __init__(self) -> None:
        self._facts: dict[Instruction, _Fact] = {}

    def __call__(self, inst: Instruction) -> frozenset[int]:
        """The uniform dims longer than 1 of `inst`, an array value outside manual regions (a
        dim of size 1 is trivially uniform and reshards alike either way); else none."""
        if not isinstance(inst.shape, ArrayShape) or _manual(inst.sharding):
            return frozenset()
        return frozenset(d for d in self._fact(inst).dims if inst.shape.dims[d] > 1)

    def _fact(self, inst: Instruction) -> _Fact:
        facts = self._facts
        stack = [inst]
        while stack:
            top = stack[-1]
            if top in facts:
                stack.pop()
                continue
            missing = [o for o in _read(top) if o not in facts]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            facts[top] = _fact(top, facts)
        return facts[inst]


def _read(inst: Instruction) -> list[Instruction] | tuple:
    """The values `inst`'s rule reads the facts of (none where it knows nothing)."""
    op = inst.opcode
    if op == "get-tuple-element":
        tuple_ = inst.operands[0]
        return [tuple_.operands[inst.attr("index")]] if tuple_.opcode == "tuple" else ()
    if op in _READS or (op == "custom-call" and (is_reshard(inst) or
                                                 target_of(inst) in MANUAL_BOUNDARIES)):
        return inst.operands
    return ()


def _manual(sharding: HloSharding | None) -> bool:
    return sharding is not None and sharding.has_manual_leaf


def _fact(inst: Instruction, facts: dict[Instruction, _Fact]) -> _Fact:
    if not isinstance(inst.shape, ArrayShape):
        return _NOTHING
    fact = _rule(inst, facts)
    dims = inst.shape.dims
    everywhere = fact.everywhere or not _manual(inst.sharding)
    if 1 in dims:
        return fact._replace(dims=fact.dims | {d for d, n in enumerate(dims) if n == 1},
                             everywhere=everywhere)
    if everywhere == fact.everywhere:
        return fact
    return fact._replace(everywhere=everywhere)


def _rule(inst: Instruction, facts: dict[Instruction, _Fact]) -> _Fact:
    op, operands = inst.opcode, inst.operands
    rank = inst.shape.rank
    if op == "constant":
        return _Fact(frozenset(range(rank)), True) if is_splat(inst) else _NOTHING
    if op == "iota":
        return _Fact(frozenset(range(rank)) - {inst.attr("iota_dimension")}, True)
    inputs = [facts.get(o, _NOTHING) for o in operands]
    everywhere = all(f.everywhere for f in inputs)
    if op == "broadcast":
        kept = tuple(inst.attr("dimensions", ()))
        added = frozenset(range(rank)) - set(kept)
        return _Fact(added | {kept[i] for i in inputs[0].dims}, everywhere)
    if op in _POINTWISE or is_reshard(inst):
        dims = frozenset(range(rank))
        for operand, fact in zip(operands, inputs):
            if not isinstance(operand.shape, ArrayShape):
                return _NOTHING
            if operand.shape.rank:
                dims &= fact.dims
        layout, global_dims = _in_layout(operands, inputs)
        if not (dims or everywhere or global_dims):
            return _NOTHING
        return _Fact(dims, everywhere, layout, global_dims)
    if op == "transpose":
        perm = inst.attr("dimensions")
        return _Fact(frozenset(i for i, p in enumerate(perm) if p in inputs[0].dims), everywhere)
    if op == "reshape":
        return _Fact(_reshaped(operands[0].shape.dims, inst.shape.dims, inputs[0].dims),
                     everywhere)
    if op in _SAME_DIMS:
        return _Fact(inputs[0].dims, everywhere)
    if op == "pad":
        padded = {d for d, p in enumerate(inst.attr("padding"))
                  if p.low or p.high or p.interior}
        return _Fact(inputs[0].dims - padded, everywhere)
    if op == "get-tuple-element" and operands[0].opcode == "tuple":
        return facts[operands[0].operands[inst.attr("index")]]
    target = target_of(inst)
    if target in MANUAL_ENTRIES:
        return _entered(operands[0], inst.sharding, inputs[0])
    if target in MANUAL_EXITS:
        return _left(operands[0].sharding, inst, inputs[0])
    return _NOTHING


def _entered(operand: Instruction, manual: HloSharding | None, fact: _Fact) -> _Fact:
    """A value entering a fully manual region: each device's shard of `operand`."""
    source = operand.sharding
    if manual is None or not manual.is_manual or source is None or _manual(source) or \
            not (source.is_replicated or source.is_tiled) or source.has_unreduced:
        return _NOTHING
    counts = source.tile_counts_for_rank(operand.shape.rank) if source.is_tiled else ()
    dims = operand.shape.dims
    split = {d for d, t in enumerate(counts) if t > 1}
    uneven = {d for d in split if dims[d] % counts[d]}
    return _Fact(fact.dims - uneven, split <= fact.dims and not uneven,
                 _layout(operand.shape, source), fact.dims)


def _left(manual: HloSharding | None, inst: Instruction, fact: _Fact) -> _Fact:
    """A value leaving a fully manual region: each device's local value is its shard of
    `inst`."""
    result = inst.sharding
    if manual is None or not manual.is_manual or result is None or _manual(result) or \
            not (result.is_replicated or result.is_tiled):
        return _NOTHING
    laid_out = fact.global_dims if fact.layout is not None and \
        fact.layout == _layout(inst.shape, result) else frozenset()
    if fact.everywhere or result.is_replicated:
        return _Fact(fact.dims | laid_out, True)
    return _Fact((fact.dims - _tiled(result, inst.shape.rank)) | laid_out, True)


def _layout(shape: ArrayShape, sharding: HloSharding) -> _Layout:
    """The layout of a value of `shape` in a replicated or tiled `sharding`."""
    counts = sharding.tile_counts_for_rank(shape.rank)
    if not sharding.is_tiled:
        return _Layout(shape.dims, counts, ())
    tiles = algebra.device_array(sharding, shape.rank, sharding.tile_assignment.num_devices)
    return _Layout(shape.dims, counts, tuple(map(tuple, np.sort(
        tiles.reshape(-1, tiles.shape[-2] * tiles.shape[-1]), axis=-1).tolist())))


def _tiled(sharding: HloSharding, rank: int) -> frozenset[int]:
    """The dims `sharding` cuts into more than one tile."""
    return frozenset(d for d, t in enumerate(sharding.tile_counts_for_rank(rank)) if t > 1)


def _in_layout(operands: list[Instruction], inputs: list[_Fact]
               ) -> tuple[_Layout | None, frozenset[int]]:
    """The layout of a pure elementwise op's operands that have one (when they share it) and
    the uniform dims of the global value the op's result makes up in it."""
    layouts = {f.layout for f in inputs if f.layout is not None}
    if len(layouts) != 1:
        return None, frozenset()
    layout = layouts.pop()
    everything = frozenset(range(len(layout.dims)))
    tiled = frozenset(d for d, t in enumerate(layout.counts) if t > 1)
    dims = everything
    for operand, fact in zip(operands, inputs):
        if fact.layout is not None:
            dims &= fact.global_dims
        else:
            own = fact.dims if operand.shape.rank else everything
            dims &= own if fact.everywhere else own - tiled
    return layout, dims


def _reshaped(source: tuple[int, ...], target: tuple[int, ...],
              uniform: frozenset[int]) -> frozenset[int]:
    """The uniform dims of a reshape's result: the shapes split into the shortest runs of dims
    with equal element counts; the target dims of a run are uniform when its source dims
    all are (size-1 dims are left to the caller)."""
    if 0 in source or 0 in target:
        return frozenset()
    result: set[int] = set()
    i = j = 0
    while i < len(source) and j < len(target):
        run_in, run_out = [i], [j]
        a, b = source[i], target[j]
        i, j = i + 1, j + 1
        while a != b:
            if a < b:
                a *= source[i]
                run_in.append(i)
                i += 1
            else:
                b *= target[j]
                run_out.append(j)
                j += 1
        if all(d in uniform for d in run_in):
            result.update(run_out)
    return frozenset(result)


__all__ = ["UniformDims"]
