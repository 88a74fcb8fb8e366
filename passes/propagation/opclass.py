"""Op classes that sharding propagation distinguishes (XLA's sharding_propagation.cc helpers).

* `is_elementwise`: XLA's `IsElementwise` (unary, binary and ternary elementwise ops, `rng`, `map`;
  `bitcast-convert` only between equal bit widths).
* `passes_at_level`: which ops may pass a sharding through at an aggressiveness level (§3.3).
* `supports_spatial_partitioning`: which instructions may receive a sharding at all (§3.5).
* `representative_operand`: the operand whose sharding an op inherits (§3.6).
* the custom-call targets propagation knows (constraints, manual boundaries, shard barriers,
  pass-through calls).
"""
from __future__ import annotations

from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.shapes import ArrayShape

SHARDING = "Sharding"
FULL_TO_SHARD = "SPMDFullToShardShape"
SHARD_TO_FULL = "SPMDShardToFullShape"
BARRIER_FROM = "ShardBarrierFrom"
BARRIER_TO = "ShardBarrierTo"

_UNARY = frozenset({
    "abs", "round-nearest-afz", "round-nearest-even", "ceil", "count-leading-zeros", "clz",
    "convert", "bitcast-convert", "copy", "cosine", "erf", "exponential", "exponential-minus-one",
    "floor", "imag", "is-finite", "log", "log-plus-one", "not", "negate", "popcnt", "real",
    "reduce-precision", "rsqrt", "logistic", "sign", "sine", "sqrt", "cbrt", "tan", "tanh",
})
_BINARY = frozenset({
    "add", "atan2", "compare", "complex", "divide", "maximum", "minimum", "multiply", "power",
    "remainder", "subtract", "and", "or", "xor", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "stochastic-convert",
})
_ELEMENTWISE = _UNARY | _BINARY | {"select", "clamp", "rng", "map"}

#: ops (besides elementwise ones and the Sharding custom-call) that pass shardings at level 0
_LEVEL0 = frozenset({
    "transpose", "reshape", "tuple", "get-tuple-element", "while", "dynamic-slice",
    "dynamic-update-slice", "opt-barrier", "optimization-barrier", "concatenate", "call", "copy",
})

#: ops that always support spatial partitioning (§3.5)
_PARTITIONABLE = frozenset({
    "broadcast", "concatenate", "conditional", "constant", "convolution", "opt-barrier",
    "optimization-barrier", "dot", "dynamic-slice", "dynamic-update-slice", "gather",
    "get-tuple-element", "infeed", "iota", "pad", "reduce-window", "reshape", "scatter",
    "select-and-scatter", "slice", "sort", "transpose", "tuple", "while", "reduce",
    "rng-bit-generator", "all-reduce", "reduce-scatter", "collective-permute",
})

#: custom-call targets that forward their operand's sharding unchanged
_PASS_THROUGH_TARGETS = frozenset({SHARDING, "X64Combine", "LayoutConstraint"})
#: single-operand same-rank custom calls that behave as pass-through
_SAME_RANK_TARGETS = frozenset({
    "ResizeNearest", "ResizeBilinear", "ResizeNearestGrad", "ResizeBilinearGrad", "Cholesky",
    "MoveToHost", "MoveToDevice", "PinToDevice",
})

#: ops with side effects (XLA's HasSideEffectNoRecurse for the opcodes gspmdc knows)
_SIDE_EFFECTS = frozenset({
    "rng", "infeed", "outfeed", "send", "send-done", "recv", "recv-done",
    "rng-get-and-update-state", "after-all",
})

#: shift/power-like ops whose output follows operand 0 (PickRepresentativeOperand)
_FIRST_OPERAND = frozenset({
    "map", "pad", "power", "opt-barrier", "optimization-barrier", "reverse", "slice",
    "shift-left", "shift-right-arithmetic", "shift-right-logical",
})
#: ops whose output may follow any operand: the most specific one wins
_ANY_OPERAND = (_ELEMENTWISE - _FIRST_OPERAND - {"rng"}) | {
    "concatenate", "all-gather", "all-reduce", "reduce-scatter", "all-to-all",
    "collective-permute", "topk", "sort", "while",
}


def target(inst: Instruction) -> str | None:
    """The `custom_call_target` of a custom-call, else None."""
    return inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None


def is_custom_call(inst: Instruction, name: str) -> bool:
    return target(inst) == name


def is_elementwise(inst: Instruction) -> bool:
    if inst.opcode == "bitcast-convert":
        operand = inst.operands[0].shape
        return isinstance(operand, ArrayShape) and isinstance(inst.shape, ArrayShape) and \
            _bit_width(operand.element_type) == _bit_width(inst.shape.element_type)
    return inst.opcode in _ELEMENTWISE


def _bit_width(element_type: str) -> int:
    if element_type == "pred":
        return 1
    return dtypes.byte_width(element_type) * 8


def has_side_effect(inst: Instruction) -> bool:
    if inst.opcode == "custom-call":
        return bool(inst.attrs.get("custom_call_has_side_effect", False))
    return inst.opcode in _SIDE_EFFECTS


def is_pass_through_custom_call(inst: Instruction) -> bool:
    """XLA's IsPassthroughCustomOps: constraint-like calls that keep their operand's layout."""
    name = target(inst)
    if name in _PASS_THROUGH_TARGETS:
        return True
    if name not in _SAME_RANK_TARGETS or len(inst.operands) != 1:
        return False
    operand = inst.operands[0].shape
    return isinstance(inst.shape, ArrayShape) and isinstance(operand, ArrayShape) and \
        operand.rank == inst.shape.rank


def is_barrier(inst: Instruction) -> bool:
    return target(inst) in (BARRIER_FROM, BARRIER_TO)


def passes_at_level(inst: Instruction, level: int) -> bool:
    """XLA's CanPropagateThroughAtAggressiveLevel: level 0 admits only pass-through ops, levels
    below 2 exclude broadcast."""
    if level < 1 and not (is_elementwise(inst) or is_custom_call(inst, SHARDING)) \
            and inst.opcode not in _LEVEL0:
        return False
    return not (level < 2 and inst.opcode == "broadcast")


def supports_spatial_partitioning(inst: Instruction, comp: Computation, *, is_spmd: bool,
                                  is_callee: bool, to_output: bool, to_parameters: bool) -> bool:
    """XLA's SupportSpatialPartitioning (§3.5). `is_callee`: `comp` is a control-flow callee;
    `to_output` / `to_parameters`: propagation into the entry root / entry parameters allowed."""
    if comp.root is inst and not is_callee and not (comp.is_entry and to_output):
        return False
    if is_elementwise(inst) and (inst.opcode != "rng" or is_spmd):
        return True
    opcode = inst.opcode
    if opcode in _PARTITIONABLE:
        return True
    if opcode == "parameter":
        return to_parameters or is_callee
    if opcode == "reverse":
        return is_spmd
    if opcode == "custom-call":
        if not is_spmd:
            return False
        return is_barrier(inst) or is_pass_through_custom_call(inst)
    return False


def representative_operand(inst: Instruction) -> Instruction | None:
    """XLA's PickRepresentativeOperand: operand 0 (if sharded) for pad/slice/reverse/shifts/...,
    the operand with the most specific sharding for elementwise-like ops, operand 0 of pass-through
    custom calls; None when the op's sharding cannot be read off one operand."""
    from .sharding_algebra import is_more_specific
    opcode = inst.opcode
    if opcode in _FIRST_OPERAND:
        return inst.operands[0] if inst.operands[0].sharding is not None else None
    if opcode in _ANY_OPERAND or (is_elementwise(inst) and opcode != "rng"):
        best = None
        for op in inst.operands:
            if op.sharding is not None and (best is None or
                                            is_more_specific(op.sharding, best.sharding)):
                best = op
        return best
    if opcode == "custom-call" and is_pass_through_custom_call(inst):
        return inst.operands[0]
    return None
