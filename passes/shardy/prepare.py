"""Shardy's import steps, before propagation.

* `split_constants(module)`: a constant expression (constants, iotas, and broadcasts, reshapes,
  slices and elementwise ops of constant expressions) or a broadcast of a scalar is copied for
  each of its non-constant users, so that each use can be sharded its own way instead of one
  sharding being imposed on all of them. Scalars are shared (they are never sharded).
* `shorten_constraint_chains(module)`: a chain of sharding constraints on an unsharded value
  whose only other users follow the chain: those users read the chain's end instead, as the
  constrained value is what the program means them to see.
* `apply_constraints(graph)`: a fully closed sharding constraint (or a manual computation's
  in-sharding) on an unsharded value that no differently constrained user shares becomes that
  value's own sharding.
* `open_conflicting_groups(graph)`: when the members of a sharding group start with different
  shardings, each member is followed by an open sharding constraint that takes its place in the
  group and for its users: the members keep their shardings, the group propagates as one.
"""
from __future__ import annotations

from gspmdc.ir.frontend_attributes import set_frontend_attribute
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sdy import FUNC_RESULT_SHARDING, GLOBAL_TO_LOCAL, instruction_shardings

from .factor_rules import is_elementwise
from .graph import Change, EdgeOp, Graph, ManualView, RuleOp, target

__all__ = ["split_constants", "shorten_constraint_chains", "apply_constraints", "reapply",
           "open_conflicting_groups"]

_CONSTANT_PRESERVING = frozenset({"broadcast", "reshape", "slice"})


def _is_scalar(inst: Instruction) -> bool:
    return not inst.shape.is_tuple and inst.shape.rank == 0


def _pure(inst: Instruction) -> bool:
    return inst.opcode != "custom-call" and inst.opcode not in ("rng", "rng-bit-generator")


def split_constants(module: Module, computations: list[Computation]) -> None:
    """Give every non-constant user its own copy of the constant expressions it reads."""
    for comp in computations:
        _split_in(comp)


def _split_in(comp: Computation) -> None:
    from gspmdc.passes.spmd.builder import NameUniquer
    names = NameUniquer(i.name for i in comp.instructions)
    constant: set[int] = set()
    expansion: set[int] = set()
    result: list[Instruction] = []
    for inst in comp.instructions:
        if inst.opcode in ("constant", "iota") or (
                _pure(inst) and (inst.opcode in _CONSTANT_PRESERVING or is_elementwise(inst))
                and all(id(o) in constant for o in inst.operands)):
            constant.add(id(inst))
            result.append(inst)
            continue
        if inst.opcode == "broadcast" and _is_scalar(inst.operands[0]):
            expansion.add(id(inst))
            result.append(inst)
            continue
        for k, operand in enumerate(inst.operands):
            if id(operand) in constant or id(operand) in expansion:
                inst.operands[k] = _clone(operand, names, result, {})
        result.append(inst)
    copied = constant | expansion
    used: set[int] = set()
    kept = []
    for inst in reversed(result):           # drop the originals left without users
        if id(inst) in copied and inst is not comp.root and id(inst) not in used:
            continue
        kept.append(inst)
        used.update(id(o) for o in inst.operands)
    comp.instructions = kept[::-1]


def _clone(inst: Instruction, names, out: list[Instruction], mapping: dict) -> Instruction:
    if _is_scalar(inst):
        return inst
    if id(inst) in mapping:
        return mapping[id(inst)]
    operands = [_clone(o, names, out, mapping) for o in inst.operands]
    copy = Instruction(names(inst.name), inst.opcode, inst.shape, operands, dict(inst.attrs),
                       sharding=inst.sharding, literal=inst.literal)
    mapping[id(inst)] = copy
    out.append(copy)
    return copy


def _is_constraint(inst: Instruction) -> bool:
    return target(inst) == "Sharding"


def shorten_constraint_chains(module: Module, computations: list[Computation]) -> None:
    """See the module docstring."""
    for comp in computations:
        users: dict[int, list[Instruction]] = {}
        for inst in comp.instructions:
            for o in inst.operands:
                users.setdefault(id(o), []).append(inst)
        position = {id(i): k for k, i in enumerate(comp.instructions)}
        returned = _returned(module, comp)
        for head in list(comp.instructions):
            if not _is_constraint(head):
                continue
            source = head.operands[0]
            if _is_constraint(source) or instruction_shardings(source) is not None:
                continue
            if any(u is not head and (_is_constraint(u) or target(u) == GLOBAL_TO_LOCAL)
                   for u in users.get(id(source), [])):
                continue
            tail = head
            while len(users.get(id(tail), [])) == 1 and _is_constraint(users[id(tail)][0]):
                tail = users[id(tail)][0]
            if tail is head or any(_is_constraint(u) or target(u) == GLOBAL_TO_LOCAL
                                   for u in users.get(id(tail), [])):
                continue
            for user in users.get(id(source), []):
                if user is head or id(user) in returned or \
                        position[id(user)] <= position[id(tail)]:
                    continue
                user.operands = [tail if o is source else o for o in user.operands]


def _returned(module: Module, comp: Computation) -> set[int]:
    """The instructions that are the entry's return (its root tuple, result-sharding calls)."""
    if comp is not module.entry:
        return set()
    out = {id(i) for i in comp.instructions if target(i) == FUNC_RESULT_SHARDING}
    if comp.root.opcode == "tuple":
        out.add(id(comp.root))
    return out


def apply_constraints(graph: Graph) -> list:
    """See the module docstring; returns what was applied, [(instruction, leaf, sharding)], so
    that `reapply` can redo it on a rebuilt graph."""
    applied = []
    for op in graph.order:
        if isinstance(op, RuleOp) and _is_constraint(op.instruction):
            applied += _apply(graph, op.operands[0], op.results[0].get(), op.results[0].slot)
    for mc in graph.manual:
        operands = [v for o in mc.call.global_to_local.operands for v in graph.leaves(o)]
        for view, slot in zip(operands, mc.in_slots):
            applied += _apply(graph, view, slot.sharding, slot)
    return applied


def reapply(graph: Graph, applied: list) -> None:
    """Give the rebuilt graph's slots the shardings `apply_constraints` gave them before."""
    for inst, leaf, sharding in applied:
        slot = graph.view(inst, leaf).slot
        slot.sharding = sharding
        slot.history.append(Change(sharding, "constraint", "Sharding"))


def _apply(graph: Graph, view, sharding, source) -> list:
    slot = view.slot
    if sharding is None or view.get() is not None or not sharding.is_fully_closed():
        return []
    if isinstance(view, ManualView) or isinstance(slot.definer, EdgeOp):
        return []                       # a data-flow edge's value: left alone
    for user in slot.users:
        if isinstance(user, RuleOp) and _is_constraint(user.instruction):
            if user.results[0].get() != sharding:
                return []
    for mc in graph.manual:
        operands = [v.slot for o in mc.call.global_to_local.operands for v in graph.leaves(o)]
        for s, in_slot in zip(operands, mc.in_slots):
            if s is slot and in_slot.sharding != sharding:
                return []
    slot.sharding = sharding
    slot.history.append(Change(sharding, "constraint", "Sharding", ((source, 0),)))
    return [(slot.instruction, slot.leaf, sharding)]


def _common(slots):
    """The members' one sharding (ignoring open empty ones): (sharding, conflict?)."""
    common = None
    for slot in slots:
        s = slot.sharding
        if s is None or all(not d.axes and not d.closed for d in s.dims):
            continue
        if common is None:
            common = s
        elif s != common:
            return common, True
    return common, False


def open_conflicting_groups(graph: Graph) -> bool:
    """See the module docstring; True when the module changed (the graph must be rebuilt)."""
    changed = False
    for members in graph.groups.values():
        common, conflict = _common(members)
        if not conflict:
            continue
        for slot in dict.fromkeys(members):
            _open_constraint_after(graph.module, slot.instruction, common)
        changed = True
    return changed


def _open_constraint_after(module: Module, inst: Instruction, like) -> None:
    from gspmdc.ir.sdy import DimSharding, ShardingPerValue, TensorSharding
    open_sharding = TensorSharding(like.mesh, tuple(DimSharding((), False)
                                                    for _ in range(inst.shape.rank)))
    for comp in module.computations.values():
        if inst not in comp.instructions:
            continue
        constraint = Instruction(f"{inst.name}.group", "custom-call", inst.shape, [inst],
                                 {"custom_call_target": "Sharding"})
        set_frontend_attribute(constraint, "xla.sdy.sharding", ShardingPerValue((open_sharding,)))
        for user in comp.instructions:
            user.operands = [constraint if o is inst else o for o in user.operands]
        comp.instructions.insert(comp.instructions.index(inst) + 1, constraint)
        if comp.root is inst:
            comp.root = constraint
