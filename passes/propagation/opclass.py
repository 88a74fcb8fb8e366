"""Op classes that sharding propagation distinguishes (XLA's sharding_propagation.cc helpers).

* `is_elementwise`: XLA's `IsElementwise` (`ir/elementwise.py`: the catalogue's `ELEMENTWISE`
  ops, `bitcast-convert` only between equal bit widths, and fusions whose fused computation is
  elementwise).
* `passes_at_level`: which ops may pass a sharding through at an aggressiveness level
(docs/design/propagation.md#the-driver).
* `supports_spatial_partitioning`: which instructions may receive a sharding at all
(docs/design/propagation.md#which-instructions-take-a-sharding).
* `representative_operand`: the operand whose sharding an op inherits
(docs/design/propagation.md#forward-rules).
* which custom-calls are barriers or pass a sharding through (targets: `ir/custom_call_targets`).
"""
from __future__ import annotations

from gspmdc.ir.custom_call_targets import (
    BARRIERS, PASS_THROUGH, SAME_RANK_PASS_THROUGH, SHARDING, target_of,
)
from gspmdc.ir.elementwise import is_elementwise_fusion, is_elementwise_op
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.ops import ELEMENTWISE, opcodes
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.sharding_algebra import is_more_specific

from .graph import ModuleGraph

#: ops (besides elementwise ones and the Sharding custom-call) that pass shardings at level 0
_LEVEL0 = opcodes("transpose", "reshape", "tuple", "get-tuple-element", "while", "dynamic-slice",
                  "dynamic-update-slice", "opt-barrier", "concatenate", "call", "copy")

#: ops that always support spatial partitioning
#: (docs/design/propagation.md#which-instructions-take-a-sharding)
_PARTITIONABLE = opcodes(
    "broadcast", "concatenate", "conditional", "constant", "convolution", "opt-barrier", "dot",
    "dynamic-slice", "dynamic-update-slice", "gather", "get-tuple-element", "infeed", "iota",
    "pad", "reduce-window", "reshape", "scatter", "select-and-scatter", "slice", "sort",
    "transpose", "tuple", "while", "reduce", "rng-bit-generator", "all-reduce", "reduce-scatter",
    "collective-permute", "all-to-all",
)

#: shift/power-like ops whose output follows operand 0 (PickRepresentativeOperand)
_FIRST_OPERAND = opcodes("map", "pad", "power", "opt-barrier", "reverse", "slice", "shift-left",
                         "shift-right-arithmetic", "shift-right-logical")
#: ops whose output may follow any operand: the most specific one wins
_ANY_OPERAND = (ELEMENTWISE - _FIRST_OPERAND - {"rng"}) | opcodes(
    "concatenate", "all-gather", "all-reduce", "reduce-scatter", "all-to-all",
    "collective-permute", "topk", "sort", "while",
)


def is_custom_call(inst: Instruction, name: str) -> bool:
    return target_of(inst) == name


def is_elementwise(inst: Instruction, graph: ModuleGraph | None = None) -> bool:
    """XLA's `IsElementwise`; a fusion counts only with the `graph` to read its fused
    computation in (answered once per fusion)."""
    if inst.opcode == "fusion":
        return graph is not None and graph.derived("elementwise fusion", inst, _fusion, graph)
    return is_elementwise_op(inst)


def _fusion(inst: Instruction, graph: ModuleGraph) -> bool:
    return is_elementwise_fusion(inst, graph.module.computations)


def is_pass_through_custom_call(inst: Instruction) -> bool:
    """XLA's IsPassthroughCustomOps: constraint-like calls that keep their operand's layout."""
    name = target_of(inst)
    if name in PASS_THROUGH:
        return True
    if name not in SAME_RANK_PASS_THROUGH or len(inst.operands) != 1:
        return False
    operand = inst.operands[0].shape
    return isinstance(inst.shape, ArrayShape) and isinstance(operand, ArrayShape) and \
        operand.rank == inst.shape.rank


def is_barrier(inst: Instruction) -> bool:
    return target_of(inst) in BARRIERS


def passes_at_level(inst: Instruction, level: int, graph: ModuleGraph | None = None) -> bool:
    """XLA's CanPropagateThroughAtAggressiveLevel: level 0 admits only pass-through ops, levels
    below 2 exclude broadcast."""
    if level < 1 and not (is_elementwise(inst, graph) or is_custom_call(inst, SHARDING)) \
            and inst.opcode not in _LEVEL0:
        return False
    return not (level < 2 and inst.opcode == "broadcast")


def supports_spatial_partitioning(inst: Instruction, comp: Computation, *, is_spmd: bool,
                                  is_callee: bool, to_output: bool, to_parameters: bool,
                                  graph: ModuleGraph | None = None) -> bool:
    """XLA's SupportSpatialPartitioning. `is_callee`: `comp` is a control-flow callee;
    `to_output` / `to_parameters`: propagation into the entry root / entry parameters allowed;
    `graph`: where an elementwise fusion's computation is read."""
    if comp.root is inst and not is_callee and not (comp.is_entry and to_output):
        return False
    if is_elementwise(inst, graph) and (inst.opcode != "rng" or is_spmd):
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
