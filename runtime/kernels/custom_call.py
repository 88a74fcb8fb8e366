"""The custom-call kernel: a table of the custom-call targets gspmdc can execute.

- Annotations are the identity on the single-device reference: the result is the operand (or the
  tuple of the operands): `Sharding`, `ShardBarrierFrom`, `ShardBarrierTo`, `LayoutConstraint`,
  `MoveToHost`, `MoveToDevice`, `PinToDevice`, `annotate_device_placement`, and Shardy's
  `xla.sdy.FuncResultSharding`, `xla.sdy.PropagationBarrier`.
  `xla.sdy.ShardingGroup` has no result (an empty tuple).
- Manual-region boundaries (`SPMDFullToShardShape`, `SPMDShardToFullShape`,
  `xla.sdy.GlobalToLocalShape`, `xla.sdy.LocalToGlobalShape`) are the identity when they keep the
  shape (a region over one partition); one that changes the shape only has a meaning per
  partition, after SPMD partitioning, and is rejected with UnsupportedError.
- `TopK`: `(values, indices)` of the k largest elements along the last dim (k = the result's last
  dim), in descending order; equal elements keep their index order; floats compare in total order
  (NaN above +inf, +0 above -0).

Any other target raises UnsupportedError naming it.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir import dtypes
from gspmdc.ir.custom_call_targets import ANNOTATIONS, MANUAL_BOUNDARIES, TOPK
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from . import Token

#: custom_call_target -> fn(inst, args, ctx)
CUSTOM_CALL_TARGETS: dict[str, Callable[..., Any]] = {}


@KERNELS.register("custom-call")
def custom_call(inst, args, ctx):
    """Dispatch on `custom_call_target`."""
    target = inst.attr("custom_call_target")
    handler = CUSTOM_CALL_TARGETS.get(target)
    if handler is None:
        raise UnsupportedError(f"{inst.name}: custom-call target {target!r} is not supported "
                               f"(known targets: {', '.join(sorted(CUSTOM_CALL_TARGETS))})")
    return handler(inst, args, ctx)


def _conforms(value: Any, shape: Shape) -> bool:
    if isinstance(shape, TupleShape):
        return (isinstance(value, tuple) and len(value) == len(shape.elements)
                and all(_conforms(v, s) for v, s in zip(value, shape.elements)))
    if shape.is_token:
        return isinstance(value, Token)
    return (isinstance(value, np.ndarray) and value.shape == shape.dims
            and value.dtype == dtypes.numpy_dtype(shape.element_type))


def _describe(args) -> str:
    return ", ".join(f"{dtypes.element_type_of(a.dtype)}[{','.join(map(str, a.shape))}]"
                     if isinstance(a, np.ndarray) else repr(a) for a in args)


def _identity(inst, args, ctx):
    """The operand (one) or the tuple of operands; the empty tuple for a result-less annotation."""
    if isinstance(inst.shape, TupleShape) and not inst.shape.elements:
        return ()
    value = args[0] if len(args) == 1 else tuple(args)
    if not _conforms(value, inst.shape):
        target = inst.attr("custom_call_target")
        kind = "a manual region boundary that changes the shape" \
            if target in MANUAL_BOUNDARIES else "an annotation that changes the shape"
        raise UnsupportedError(
            f"{inst.name}: custom-call {target!r} maps ({_describe(args)}) to {inst.shape}: "
            f"{kind} has no single-device meaning (partition the program first)")
    return value


CUSTOM_CALL_TARGETS.update(dict.fromkeys(ANNOTATIONS | MANUAL_BOUNDARIES, _identity))


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """Integers ordered like `x` in HLO's total order (floats: -NaN < -inf < ... < -0 < +0 < ...
    < +inf < +NaN)."""
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    if x.dtype.kind in "iu":
        return x
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise UnsupportedError(f"TopK of {x.dtype} values is not supported")
    signed = np.dtype(f"i{x.dtype.itemsize}")
    bits = x.view(signed)
    magnitude = np.array(np.iinfo(signed).max, signed)
    return bits ^ ((bits >> np.array(8 * x.dtype.itemsize - 1, signed)) & magnitude)


def top_k(x: np.ndarray, k: int, index_dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
    """The k largest elements along the last dim of `x` and their indices, descending, stable."""
    if not 0 <= k <= x.shape[-1]:
        raise VerificationError(f"TopK: k={k} is out of range for {x.shape[-1]} elements")
    order = np.argsort(~_total_order_key(x), axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, axis=-1), order.astype(index_dtype)


def _top_k(inst, args, ctx):
    (x,) = args
    values_shape, indices_shape = inst.shape.elements
    if not isinstance(values_shape, ArrayShape) or values_shape.dims[:-1] != x.shape[:-1]:
        raise VerificationError(f"{inst.name}: TopK result {inst.shape} does not fit operand "
                                f"{list(x.shape)}")
    return top_k(x, values_shape.dims[-1], dtypes.numpy_dtype(indices_shape.element_type))


CUSTOM_CALL_TARGETS[TOPK] = _top_k


@KERNELS.register("topk")
def _topk_opcode(inst, args, ctx):
    """The `topk(x), k=K, largest=B` opcode: (values, s32 indices) along the last dim, stable;
    `largest=false` takes the K smallest."""
    (x,) = args
    k = inst.attrs["k"]
    if inst.attr("largest", True):
        return top_k(x, k)
    order = np.argsort(_total_order_key(x), axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, axis=-1), order.astype(np.int32)
