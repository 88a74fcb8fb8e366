"""The computations the partitioner partitions: the entry and, recursively, the computations its
control flow runs.

`while` (condition, body), `conditional` (branches) and `call` (to_apply) run their callees as
part of the program on whole values, so those callees are partitioned like the entry, each with
its call site's shardings at its boundary (docs/design/partitioning.md#contract-and-steps).
Computations applied to
elements or windows (reducers, comparators, scatter combiners, `map`) run unchanged on local
values and are not partitioned.

A control-flow callee used by more than one call site (or also applied to elements elsewhere) is
cloned per site (`unshare_callees`), so every partitioned computation has one caller and one set
of boundary shardings.
"""
from __future__ import annotations

from gspmdc.ir.attributes import ComputationRef
from gspmdc.ir.module import Computation, Instruction, Module

from .builder import NameUniquer

#: per control-flow opcode, the attributes naming the computations it runs on whole values
CONTROL_FLOW_ATTRS = {
    "while": ("condition", "body"),
    "conditional": ("true_computation", "false_computation", "branch_computations"),
    "call": ("to_apply",),
}


def control_flow_callees(inst: Instruction) -> list[str]:
    """Names of the computations `inst` runs as control flow (empty for other ops)."""
    names: list[str] = []
    for attr in CONTROL_FLOW_ATTRS.get(inst.opcode, ()):
        value = inst.attrs.get(attr)
        if isinstance(value, ComputationRef):
            names.append(value.name)
        elif isinstance(value, tuple):
            names.extend(v.name for v in value if isinstance(v, ComputationRef))
    return names


def partitioned_computations(module: Module) -> list[Computation]:
    """The entry, then every control-flow callee after its caller (depth first, program order)."""
    order: list[Computation] = []
    seen: set[str] = set()

    def visit(comp: Computation) -> None:
        seen.add(comp.name)
        order.append(comp)
        for inst in comp.instructions:
            if inst.opcode not in CONTROL_FLOW_ATTRS:
                continue                # most instructions: no callee to look for
            for name in control_flow_callees(inst):
                if name not in seen:
                    visit(module.computations[name])
    visit(module.entry)
    return order


def unshare_callees(module: Module) -> None:
    """Give every control-flow call site its own callee: a computation already reached from
    another site is cloned (with its nested control-flow callees) under a new name."""
    names = NameUniquer(module.computations)
    # computations applied to elements (reducers, comparators) stay as they are: a control-flow
    # site naming one of them gets its own copy
    reached: set[str] = {module.entry_name}
    for _, inst in module.all_instructions():
        called = inst.called_computation_names()
        if called:
            reached.update(set(called) - set(control_flow_callees(inst)))
    added: list[Computation] = []

    def visit(comp: Computation) -> None:
        for inst in comp.instructions:
            for attr in CONTROL_FLOW_ATTRS.get(inst.opcode, ()):
                value = inst.attrs.get(attr)
                if isinstance(value, ComputationRef):
                    inst.attrs[attr] = ComputationRef(own(value.name))
                elif isinstance(value, tuple):
                    inst.attrs[attr] = tuple(ComputationRef(own(v.name)) for v in value)

    def own(name: str) -> str:
        comp = module.computations[name]
        if name in reached:
            comp = clone_computation(comp, names(name))
            module.computations[comp.name] = comp
            added.append(comp)
        reached.add(comp.name)
        visit(comp)
        return comp.name

    visit(module.entry)
    if added:
        # keep the entry last, as printed modules have it
        entry = module.computations.pop(module.entry_name)
        module.computations[module.entry_name] = entry


def clone_computation(comp: Computation, name: str) -> Computation:
    """A copy of `comp` named `name` (instructions copied with their attributes and shardings)."""
    mapping: dict[Instruction, Instruction] = {}
    for inst in comp.instructions:
        mapping[inst] = Instruction(inst.name, inst.opcode, inst.shape,
                                    [mapping[o] for o in inst.operands], dict(inst.attrs),
                                    sharding=inst.sharding, literal=inst.literal,
                                    parameter_number=inst.parameter_number)
    return Computation(name, list(mapping.values()), mapping[comp.root],
                       execution_thread=comp.execution_thread)


__all__ = ["CONTROL_FLOW_ATTRS", "control_flow_callees", "partitioned_computations",
           "unshare_callees", "clone_computation"]
