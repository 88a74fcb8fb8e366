"""Structural kernels: tuples, constants, data movement, shape changes and type conversions.

Semantics are XLA's:
- `broadcast` maps operand dim i to output dim `dimensions[i]`; `transpose` gives output dim i the
  operand dim `dimensions[i]`; `reshape` is row-major;
- `bitcast` reinterprets the physical buffer: logical -> layout order (major to minor), row-major
  reshape, back to logical order of the result's layout (a plain reshape under default layouts);
- `bitcast-convert` reinterprets bits; between types of different widths the minor dimension
  holds the ratio of the widths;
- `convert` float -> int truncates toward zero and saturates, NaN -> 0; anything -> pred is `!= 0`;
- `pad` takes per-dim low/high (negative: cropping) and interior padding;
- `partition-id` is this partition's id (`u32[]`), `replica-id` is 0 (one replica);
- host I/O (`infeed`, `outfeed`, `send`, `recv` and their `-done`s) is not supported.

`copy`, `reshape`, `transpose`, `slice`, `reverse` and `broadcast` may return views of their operand
(values are immutable).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from gspmdc.errors import UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.shapes import ArrayShape

from . import TOKEN
from .specialising import SpecialisedKernel
from .. import spill

_BF16 = np.dtype(ml_dtypes.bfloat16)


# ------------------------------------------------------------------------------------- tuples etc.

@KERNELS.register("tuple")
def _tuple(inst, args, ctx):
    return tuple(args)


@KERNELS.register("get-tuple-element")
def _get_tuple_element(inst, args, ctx):
    return args[0][inst.attrs["index"]]


@KERNELS.register("constant")
def _constant(inst, args, ctx):
    return _literal_value(inst.literal, inst)


def _literal_value(literal, inst):
    if literal is None or literal.elided:
        raise UnsupportedError(f"constant {inst.name} has an elided value ({{...}}); the "
                               "interpreter needs the literal's data")
    if literal.elements is not None:
        return tuple(_literal_value(e, inst) for e in literal.elements)
    return literal.value


@KERNELS.register("copy", "opt-barrier", "add-dependency")
def _identity(inst, args, ctx):
    return args[0]


@KERNELS.register("after-all")
def _after_all(inst, args, ctx):
    return TOKEN


@KERNELS.register("partition-id")
def _partition_id(inst, args, ctx):
    return np.array(ctx.partition_id, np.uint32)


@KERNELS.register("replica-id")
def _replica_id(inst, args, ctx):
    return np.array(0, np.uint32)


@KERNELS.register("infeed", "outfeed", "send", "send-done", "recv", "recv-done")
def _host_io(inst, args, ctx):
    raise UnsupportedError(f"{inst.opcode} {inst.name}: host I/O ({inst.opcode}) is not supported "
                           "by the interpreter")


# ------------------------------------------------------------------------------- shape changes

@KERNELS.register("iota")
def _iota(inst, args, ctx):
    shape = inst.shape
    dim = inst.attrs["iota_dimension"]
    counts = np.arange(shape.dims[dim], dtype=np.int64)
    if shape.element_type == "pred":
        counts = counts != 0
    counts = counts.astype(dtypes.numpy_dtype(shape.element_type))
    view = [1] * len(shape.dims)
    view[dim] = shape.dims[dim]
    return np.broadcast_to(counts.reshape(view), shape.dims)


def _broadcast_for(inst):
    """The broadcast kernel of `inst`: a read-only view of the operand, where result dim
    `dimensions[k]` steps like operand dim `k` and every other result dim has stride 0 (for a
    contiguous operand the view is made directly, a few times faster than `np.broadcast_to`)."""
    dims = tuple(inst.attrs.get("dimensions", ()))
    shape = inst.shape.dims
    order = sorted(range(len(dims)), key=dims.__getitem__)

    def kernel(inst, args, ctx):
        x = args[0]
        if x.flags.c_contiguous and x.size:
            strides = [0] * len(shape)
            for k, d in enumerate(dims):
                strides[d] = x.strides[k]
            view = np.ndarray(shape, x.dtype, x, 0, strides)
            view.flags.writeable = False
            return view
        view_dims = [1] * len(shape)
        for k in order:
            view_dims[dims[k]] = x.shape[k]
        return np.broadcast_to(x.transpose(order).reshape(view_dims), shape)
    return kernel


def _broadcast(inst, args, ctx):
    return _broadcast_for(inst)(inst, args, ctx)


KERNELS.add(SpecialisedKernel(_broadcast, _broadcast_for), "broadcast")


def _reshape_for(inst):
    """The reshape kernel of `inst` (row-major; a view where numpy can make one)."""
    shape = inst.shape.dims
    return lambda inst, args, ctx: args[0].reshape(shape)


def _reshape(inst, args, ctx):
    return _reshape_for(inst)(inst, args, ctx)


KERNELS.add(SpecialisedKernel(_reshape, _reshape_for), "reshape")


@KERNELS.register("transpose")
def _transpose(inst, args, ctx):
    return args[0].transpose(tuple(inst.attrs["dimensions"]))


@KERNELS.register("reverse")
def _reverse(inst, args, ctx):
    return np.flip(args[0], tuple(inst.attrs["dimensions"]))


@KERNELS.register("concatenate")
def _concatenate(inst, args, ctx):
    return np.concatenate(args, axis=inst.attrs["dimensions"][0])


def _slice_for(inst):
    """The slice kernel of `inst`: a view of the operand."""
    window = tuple(slice(s.start, s.limit, s.stride) for s in inst.attrs["slice"])
    return lambda inst, args, ctx: args[0][window]


def _slice(inst, args, ctx):
    return _slice_for(inst)(inst, args, ctx)


KERNELS.add(SpecialisedKernel(_slice, _slice_for), "slice")


@KERNELS.register("pad")
def _pad(inst, args, ctx):
    x, value = args
    return pad_array(x, value, inst.attrs["padding"])


def pad_array(x: np.ndarray, value, pads) -> np.ndarray:
    """HLO `pad`: per dimension `pads[d].low` / `.high` elements of `value` before / after (negative
    amounts crop) and `.interior` elements between neighbours."""
    if all(p.interior == 0 and p.low <= 0 and p.high <= 0 for p in pads):
        return x[tuple(slice(-p.low, n + p.high) for n, p in zip(x.shape, pads))]
    core = [n + max(n - 1, 0) * p.interior for n, p in zip(x.shape, pads)]
    full = [max(p.low, 0) + c + max(p.high, 0) for c, p in zip(core, pads)]
    out = spill.full(full, value, x.dtype)
    out[tuple(slice(max(p.low, 0), max(p.low, 0) + c, p.interior + 1)
              for c, p in zip(core, pads))] = x
    return out[tuple(slice(max(-p.low, 0), f - max(-p.high, 0)) for f, p in zip(full, pads))]


@KERNELS.register("bitcast")
def _bitcast(inst, args, ctx):
    x = args[0]
    source, target = inst.operands[0].shape, inst.shape
    in_order, out_order = _major_to_minor(source, inst), _major_to_minor(target, inst)
    flat = np.ascontiguousarray(x.transpose(in_order)).reshape(-1)
    dtype = dtypes.numpy_dtype(target.element_type)
    if flat.dtype != dtype:
        flat = flat.view(dtype)
    physical = flat.reshape([target.dims[d] for d in out_order])
    return physical.transpose(np.argsort(out_order))


def _major_to_minor(shape: ArrayShape, inst) -> tuple[int, ...]:
    """The dimensions of `shape` from major to minor per its layout (default: row-major)."""
    layout = shape.layout
    if not layout or layout.startswith(":"):
        return tuple(range(len(shape.dims)))
    minor_to_major, _, extension = layout.partition(":")
    if "T(" in extension:
        raise UnsupportedError(f"bitcast {inst.name}: tiled layout {{{layout}}} is not supported "
                               "by the interpreter")
    return tuple(int(d) for d in reversed(minor_to_major.split(",")))


# ------------------------------------------------------------------------------------ conversions

@KERNELS.register("bitcast-convert")
def _bitcast_convert(inst, args, ctx):
    x = args[0]
    dtype = dtypes.numpy_dtype(inst.shape.element_type)
    if dtype.itemsize == x.dtype.itemsize:
        return x.view(dtype)
    return np.ascontiguousarray(x).view(dtype).reshape(inst.shape.dims)


@KERNELS.register("convert")
def _convert(inst, args, ctx):
    return convert_array(args[0], inst.shape.element_type)


def convert_array(x: np.ndarray, element_type: str) -> np.ndarray:
    """HLO `convert` of `x` to `element_type` (see the module docstring for the rules)."""
    dtype = dtypes.numpy_dtype(element_type)
    if x.dtype == dtype:
        return x
    if x.dtype == _BF16:
        x = x.astype(np.float32)
    if element_type == "pred":
        return x != 0
    if x.dtype.kind == "c" and not dtypes.is_complex(element_type):
        x = x.real
    if x.dtype.kind == "f" and dtypes.is_integer(element_type):
        return _float_to_int(x, dtype)
    return x.astype(dtype)


def _float_to_int(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Truncate toward zero, saturating to the target range; NaN becomes 0."""
    info = np.iinfo(dtype)
    t = np.trunc(x.astype(np.float64))
    above = t >= math.ldexp(1.0, info.bits - (1 if info.min < 0 else 0))
    below = t < float(info.min)
    inside = np.where(above | below | np.isnan(t), 0.0, t).astype(dtype)
    return np.where(above, np.array(info.max, dtype), np.where(below, np.array(info.min, dtype), inside))


@KERNELS.register("domain")
def _domain(inst, args, ctx):
    """`domain` marks a sharding-domain boundary: the value passes through unchanged."""
    return args[0]


@KERNELS.register("get-dimension-size")
def _get_dimension_size(inst, args, ctx):
    """`get-dimension-size(x), dimensions={d}`: the (static) size of dimension d as s32[]."""
    (dim,) = inst.attrs["dimensions"]
    return np.asarray(args[0].shape[dim], dtype=np.int32)
