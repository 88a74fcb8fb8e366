"""Control flow (docs/design/propagation.md#control-flow): instructions tied through called
computations share one sharding.

* `while`: the loop, its body root, its body parameter and its condition parameter;
* `conditional`: the conditional and every branch root (branch parameter i follows operand i+1,
  through the forward rule for parameters, and is copied back to that operand);
* `call`: the call and the callee root (callee parameter i follows operand i, and back).

`sync_all` makes each group agree before propagation starts (the first sharded member wins);
`follow_change` spreads one instruction's new sharding across its groups (XLA's
maybe_computation_propagation) and reports what changed and from where.
"""
from __future__ import annotations

from gspmdc.ir.module import Instruction

from .graph import ModuleGraph


#: the instructions other than a computation's root that can belong to a group: control
#: flow and the parameters of its callees
_TIED = frozenset({"while", "conditional", "call", "parameter"})


def related(graph: ModuleGraph, inst: Instruction) -> list[Instruction]:
    """The members of `inst`'s control-flow group (empty for other opcodes)."""
    if inst.opcode == "while":
        body = graph.computation(inst.attrs["body"].name)
        cond = graph.computation(inst.attrs["condition"].name)
        return [inst, body.root, body.parameters[0], cond.parameters[0]]
    if inst.opcode == "conditional":
        return [inst] + [graph.computation(n).root for n in inst.branch_computation_names()]
    if inst.opcode == "call":
        return [inst, graph.computation(inst.called_computation_names()[0]).root]
    return []


def sync_all(graph: ModuleGraph) -> list[tuple[Instruction, Instruction]]:
    """Give every member of each group the sharding of its first sharded member; returns the
    `(member, source)` pairs that changed."""
    changed = []
    for comp in graph.computations:
        for inst in comp.instructions:
            if inst.opcode not in ("while", "conditional", "call"):
                continue
            members = related(graph, inst)
            source = next((m for m in members if m.sharding is not None), None)
            if source is None:
                continue
            for m in members:
                if m.sharding != source.sharding:
                    m.sharding = source.sharding
                    changed.append((m, source))
    return changed


def caller_operand(graph: ModuleGraph, param: Instruction) -> Instruction | None:
    """The operand of a conditional / call that feeds callee parameter `param`."""
    comp = graph.computation_of[param]
    caller = graph.caller.get(comp.name)
    if caller is None:
        return None
    if caller.opcode == "conditional":
        return caller.operands[caller.branch_computation_names().index(comp.name) + 1]
    if caller.opcode == "call":
        return caller.operands[param.parameter_number]
    return None


def follow_change(graph: ModuleGraph, inst: Instruction,
                  fixed: set[Instruction]) -> list[tuple[Instruction, Instruction]]:
    """After `inst` changed: copy its sharding to the other members of every group it belongs to
    (recursively), and from a callee parameter back to the caller's operand unless that operand's
    sharding is fixed. Returns the `(changed, source)` pairs."""
    if inst.opcode not in _TIED and graph.computation_of[inst].root is not inst:
        return []                   # in no group: most instructions, on every change
    changed: list[tuple[Instruction, Instruction]] = []

    def spread(member: Instruction) -> None:
        def to_group(anchor: Instruction) -> None:
            group = related(graph, anchor)
            if member not in group:
                return
            for other in group:
                if other.sharding is None or other.sharding != member.sharding:
                    other.sharding = member.sharding
                    changed.append((other, member))
                    spread(other)

        if member.opcode in ("while", "conditional", "call"):
            to_group(member)
        comp = graph.computation_of[member]
        if member.opcode != "parameter" and comp.root is not member:
            return
        caller = graph.caller.get(comp.name)
        if caller is None:
            return
        to_group(caller)
        if member.opcode == "parameter":
            operand = caller_operand(graph, member)
            if operand is not None and operand not in fixed and operand.sharding != member.sharding:
                operand.sharding = member.sharding
                changed.append((operand, member))

    spread(inst)
    return changed
