"""Collective kernels: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute,
collective-broadcast.

Each kernel reads the instruction's attributes, builds the reducer from `to_apply` where there is
one, and hands the operands to `ctx.backend` (see `runtime/collectives.py` for the group rules and
the exact semantics). Several operands give a tuple result, one operand an array (the tuple form
of all-to-all always gives a tuple). A collective-broadcast gives every member of a group the
operands of the group's first member: the backend gathers them along a new leading dim and each
member reads position 0. A backend's `Pending` result stays pending.

A bf16 all-reduce or reduce-scatter reduces in f32 and rounds its results once, as XLA's CPU
backend does (it promotes them to f32): bf16 operands are converted to f32 first, unless they come
unrounded in f32 already (`rounding.py`).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.shapes import TupleShape

from .. import computation_patterns as patterns
from ..collectives import Pending, Reduction


def _reduction(inst, ctx) -> Reduction:
    """The reducer of `inst`, built once per computation and evaluation context."""
    name = inst.attrs["to_apply"].name
    reduction = ctx.cache.get(("reduction", name))
    if reduction is None:
        reduction = ctx.cache[("reduction", name)] = Reduction(
            combine=lambda a, b: patterns.apply_binary_computation(ctx, name, a, b),
            ufunc=patterns.reducer_ufunc_of(ctx, name))
    return reduction


def _result(inst, values):
    """The instruction's value from the backend's list of results (or a pending one)."""
    if type(values) is Pending:
        return values.then(lambda finished: _result(inst, finished))
    return tuple(values) if isinstance(inst.shape, TupleShape) else values[0]


_BF16 = np.dtype(ml_dtypes.bfloat16)


def _in_f32(args):
    return [a.astype(np.float32) if a.dtype == _BF16 else a for a in args]


def _reduced(inst, args, ctx, reduce):
    """`reduce(operands)` (the backend's reduction of the operands, a list or a pending one) in
    the instruction's result types: when an operand's type is not its result's (bf16, or an
    unrounded f32 value), the operands are reduced in f32 and the results rounded."""
    types = ctx.cache.get(("result-types", id(inst)))
    if types is None:
        types = ctx.cache[("result-types", id(inst))] = tuple(
            dtypes.numpy_dtype(shape.element_type) for shape in inst.shape.leaves())
    if _BF16 not in types and all(a.dtype == t for a, t in zip(args, types)):
        return reduce(args)
    return _rounded(types, reduce(_in_f32(args)))


def _rounded(types, values):
    """Reduced values in the result `types` (bf16 results were reduced in f32), or a pending
    list of them."""
    if type(values) is Pending:
        return values.then(lambda finished: _rounded(types, finished))
    return [v.astype(t, copy=False) for v, t in zip(values, types)]


@KERNELS.register("all-reduce")
def _all_reduce(inst, args, ctx):
    reduction = _reduction(inst, ctx)
    return _result(inst, _reduced(inst, args, ctx,
                                  lambda xs: ctx.backend.all_reduce(inst, xs, reduction)))


@KERNELS.register("all-gather")
def _all_gather(inst, args, ctx):
    return _result(inst, ctx.backend.all_gather(inst, args, inst.attrs["dimensions"][0]))


@KERNELS.register("reduce-scatter")
def _reduce_scatter(inst, args, ctx):
    dim, reduction = inst.attrs["dimensions"][0], _reduction(inst, ctx)
    return _result(inst, _reduced(inst, args, ctx, lambda xs: ctx.backend.reduce_scatter(
        inst, xs, dim, reduction)))


@KERNELS.register("all-to-all")
def _all_to_all(inst, args, ctx):
    dims = inst.attrs.get("dimensions")
    return _result(inst, ctx.backend.all_to_all(inst, args, dims[0] if dims else None))


@KERNELS.register("collective-broadcast")
def _collective_broadcast(inst, args, ctx):
    gathered = ctx.backend.all_gather(inst, [a[np.newaxis] for a in args], 0)
    return _result(inst, _first_members(gathered))


def _first_members(gathered):
    """The first member's operands from the all-gathered values (or a pending list of them)."""
    if type(gathered) is Pending:
        return gathered.then(_first_members)
    return [g[0, ...] for g in gathered]


@KERNELS.register("collective-permute")
def _collective_permute(inst, args, ctx):
    return ctx.backend.collective_permute(inst, args[0])
