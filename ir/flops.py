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

from . import ops
from .module import Computation, Instruction, Module

#: elementwise opcodes counted as one operation per result element: the catalogue's elementwise
#: ops but those that only convert, copy or take apart their elements (no arithmetic)
ARITHMETIC = ops.ELEMENTWISE_PURE - ops.opcodes(
    "convert", "bitcast-convert", "copy", "reduce-precision", "stochastic-convert", "complex",
    "real", "imag")

#: instructions that run computations as steps of the program (not as reducers)
_STEP_RUNNERS = ops.with_trait(ops.Trait.CONTROL_FLOW, ops.Trait.ASYNC)


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
    if opcode in ARITHMETIC:
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
    """The computations `inst` runs as program steps (its called-computation attributes in the
    catalogue; a conditional's branches)."""
    if inst.opcode not in _STEP_RUNNERS:
        return []
    names = []
    for attribute in ops.CATALOGUE[inst.opcode].calls:
        called = inst.attr(attribute)
        for computation in called if isinstance(called, (list, tuple)) else (called,):
            if computation is not None:
                names.append(computation.name)
    return names


def _reducer_flops(inst: Instruction, module: Module) -> int:
    """Operations of one application of `inst`'s reducer (at least one)."""
    reducer = inst.attr("to_apply")
    if reducer is None:
        return 1
    comp = module.computation(reducer.name)
    return max(sum(1 for i in comp.instructions if i.opcode in ARITHMETIC), 1)


def _elements(shape) -> int:
    return sum(prod(leaf.dims) for leaf in shape.leaves() if not leaf.is_token)


__all__ = ["instruction_flops", "executed_computations", "ARITHMETIC"]
