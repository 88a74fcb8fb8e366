"""Floating-point (and integer) operations of an instruction, the measure of `gspmdc cost`'s
FLOPs per device and of `run --profile`'s counted counterpart.

One execution of an instruction, on the shapes it has (per device in a partitioned module):

- `dot`: 2 × result elements × the product of the contracting dimensions (a multiply and an
  add per term);
- `convolution`: 2 × result elements × the kernel elements one output element reads (the
  kernel's size over its output-feature dimension);
- elementwise arithmetic, comparisons, selects and transcendental functions: one per result
  element;
- `reduce`: one application of the reducer per input element beyond the first of each
  output element, times the reducer's own operations (a variadic reduce counts its first
  operand); `reduce-window`: the window size minus one per output element, likewise;
- everything else (data movement, collectives, control flow): none of its own.

The instructions of a reducer (`to_apply` of a reduce, an all-reduce, a sort comparator) are
counted in their caller; `executed_computations` names the computations whose instructions run
as program steps.
"""
from __future__ import annotations

from math import prod

from .module import Computation, Instruction, Module

#: elementwise opcodes counted as one operation per result element
ELEMENTWISE = frozenset("""
    add subtract multiply divide remainder power maximum minimum atan2 and or xor not negate abs
    sign floor ceil round-nearest-afz round-nearest-even exponential exponential-minus-one log
    log-plus-one sqrt rsqrt cbrt tanh logistic sine cosine tan erf compare select clamp
    shift-left shift-right-arithmetic shift-right-logical popcnt count-leading-zeros is-finite
    """.split())

#: instructions that run computations as steps of the program (not as reducers)
_CONTROL_FLOW_CALLS = {"while": ("condition", "body"), "call": ("to_apply",),
                       "fusion": ("calls",), "call-start": ("to_apply",),
                       "async-start": ("calls",)}


def instruction_flops(inst: Instruction, module: Module) -> int:
    """Operations of one execution of `inst` (see the module docstring)."""
    opcode = inst.opcode
    shape = inst.shape
    if opcode == "dot":
        lhs = inst.operands[0].shape
        contracting = prod(lhs.dims[d] for d in inst.attr("lhs_contracting_dims", ()))
        return 2 * _elements(shape) * contracting
    if opcode == "convolution":
        labels = inst.attr("dim_labels")
        kernel = inst.operands[1].shape
        return 2 * _elements(shape) * prod(kernel.dims) // kernel.dims[labels.rhs_output_feature]
    if opcode in ELEMENTWISE:
        return _elements(shape)
    if opcode == "reduce":
        result = next(shape.leaves())
        return (_elements(inst.operands[0].shape) - _elements(result)) * \
            _reducer_flops(inst, module)
    if opcode == "reduce-window":
        window = inst.attr("window")
        size = prod(d.size for d in window.dims) if window is not None else 1
        return _elements(next(shape.leaves())) * (size - 1) * _reducer_flops(inst, module)
    return 0


def executed_computations(module: Module) -> list[Computation]:
    """The entry and every computation control flow runs from it (loop conditions and bodies,
    called computations, conditional branches), in discovery order: the computations whose
    instructions are program steps."""
    found = {module.entry_name: module.entry}
    order = [module.entry]
    for comp in order:
        for inst in comp.instructions:
            for name in _control_flow_callees(inst):
                if name not in found:
                    found[name] = module.computation(name)
                    order.append(found[name])
    return order


def _control_flow_callees(inst: Instruction) -> list[str]:
    if inst.opcode == "conditional":
        branches = inst.attr("branch_computations") or \
            [inst.attr("true_computation"), inst.attr("false_computation")]
        return [b.name for b in branches]
    return [inst.attr(a).name for a in _CONTROL_FLOW_CALLS.get(inst.opcode, ())
            if inst.attr(a) is not None]


def _reducer_flops(inst: Instruction, module: Module) -> int:
    """Operations of one application of `inst`'s reducer (at least one)."""
    reducer = inst.attr("to_apply")
    if reducer is None:
        return 1
    comp = module.computation(reducer.name)
    return max(sum(1 for i in comp.instructions if i.opcode in ELEMENTWISE), 1)


def _elements(shape) -> int:
    return sum(prod(leaf.dims) for leaf in shape.leaves() if not leaf.is_token)


__all__ = ["instruction_flops", "executed_computations", "ELEMENTWISE"]
