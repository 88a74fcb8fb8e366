"""Every branch of every `conditional`, for the value check: random inputs select one branch of
each conditional, so a module is also run once per branch with that branch forced.

    for variant in branch_variants(module):
        variant.label                   # "%conditional.5 branch 1 (%branch.7)"
    forced_text(text, variant.forcings)   # the module with that branch forced

Forcing branch k of conditional C: C's selector operand `%s` is replaced by

    %C.force = pred[] constant(true)
    %C.force.tuple = (pred[]) tuple(%C.force)
    %C.force.barrier = (pred[]) opt-barrier(%C.force.tuple)
    %C.force.on = pred[] get-tuple-element(%C.force.barrier), index=0
    %C.branch.held = s32[1] constant({k})  (a pred selector: true for branch 0, false for 1)
    %C.branch = s32[] reshape(%C.branch.held)
    %C.forced = s32[] select(%C.force.on, %C.branch, %s)

so C takes branch k whatever the inputs, wherever `%s` comes from (a parameter or computed
inside the module), and nothing else changes: `%s` keeps a user, so no instruction becomes dead
(XLA's import would remove it, and with it whatever it contributed to propagation), and every
other instruction and annotation is as it was. The barrier keeps the selector unknown to the
compiler: XLA's import folds a select on a constant and inlines a conditional on a constant
selector, so without it XLA (and gspmdc, given XLA's module) would partition the branch alone
instead of the conditional. The branch number is held in a constant of a shape no constant of
the module has (`s32[1]`, else `s32[1,1]`, ...): a pass merging equal constants cannot then
replace it by one of the module's own, whose annotation (`{manual}`) would propagate to the
selector. The new instructions have no annotations. A
conditional inside another conditional's branch is reached by also forcing each enclosing
conditional to the branch that (through calls, loops and other branches) contains it;
a computation with several callers is reached through the first in text order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gspmdc import api
from gspmdc.ir.attributes import Literal
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, TupleShape


@dataclass(frozen=True)
class BranchVariant:
    """One branch of one conditional forced: `forcings` are the (computation, conditional,
    branch index) to force (`force`), that conditional's first, then the enclosing ones; `label`
    names it in reports."""

    label: str
    forcings: tuple[tuple[str, str, int], ...]


def _callers(module: Module) -> dict[str, tuple[Computation, Instruction]]:
    """Each called computation -> its first caller (computation, instruction) in text order."""
    found: dict[str, tuple[Computation, Instruction]] = {}
    for comp, inst in module.all_instructions():
        for name in inst.called_computation_names():
            found.setdefault(name, (comp, inst))
    return found


def _path(module: Module, comp: str) -> list[tuple[str, str, int]] | None:
    """The enclosing conditionals to force so that computation `comp` runs, as (computation,
    conditional, branch index) from the innermost out; None when nothing reaches `comp` from
    the entry."""
    callers = _callers(module)
    path: list[tuple[str, str, int]] = []
    seen = {comp}
    while comp != module.entry_name:
        if comp not in callers:
            return None
        caller, inst = callers[comp]
        if inst.opcode == "conditional":
            path.append((caller.name, inst.name, inst.branch_computation_names().index(comp)))
        comp = caller.name
        if comp in seen:
            return None
        seen.add(comp)
    return path


def force(module: Module, computation: str, conditional: str, branch: int) -> None:
    """Make `conditional` (in `computation`) take branch `branch` whatever its selector (in
    place; see the module docstring)."""
    comp = module.computation(computation)
    inst = comp.instruction(conditional)
    selector = inst.operands[0]
    element_type = selector.shape.element_type
    value = (branch == 0) if element_type == "pred" else branch
    scalar = ArrayShape(element_type, ())
    pred = ArrayShape("pred", ())
    on = Instruction(f"{inst.name}.force", "constant", pred, literal=Literal(np.asarray(True)))
    packed = Instruction(f"{inst.name}.force.tuple", "tuple", TupleShape((pred,)), [on])
    barrier = Instruction(f"{inst.name}.force.barrier", "opt-barrier", TupleShape((pred,)),
                          [packed])
    unknown = Instruction(f"{inst.name}.force.on", "get-tuple-element", pred, [barrier],
                          {"index": 0})
    ones = _unused_ones_shape(module, element_type)
    literal = np.asarray(value, dtype=_DTYPES[element_type]).reshape(ones.dims)
    held = Instruction(f"{inst.name}.branch.held", "constant", ones, literal=Literal(literal))
    chosen = Instruction(f"{inst.name}.branch", "reshape", scalar, [held])
    forced = Instruction(f"{inst.name}.forced", "select", scalar, [unknown, chosen, selector])
    at = comp.instructions.index(inst)
    comp.instructions[at:at] = [on, packed, barrier, unknown, held, chosen, forced]
    inst.operands[0] = forced


def _unused_ones_shape(module: Module, element_type: str) -> ArrayShape:
    """`element_type[1]`, `[1,1]`, ...: the first such shape no constant of `module` has. The
    branch number is held in it, so that no pass merging equal constants can replace it by one
    of the module's own (a `{manual}` constant of the same value would make the selector
    manual)."""
    taken = {inst.shape.without_layout() for _, inst in module.all_instructions()
             if inst.opcode == "constant"}
    rank = 1
    while ArrayShape(element_type, (1,) * rank) in taken:
        rank += 1
    return ArrayShape(element_type, (1,) * rank)


#: the numpy type of a selector's constant
_DTYPES = {"pred": np.bool_, "s32": np.int32}


def forced_text(text: str, forcings, name: str = "<branches>") -> str | None:
    """Module `text` with the conditionals of `forcings` forced (`force`); None when `text` lacks
    one of them (e.g. a reference program without the same names)."""
    module = api.parse(text, name, verify=False)
    try:
        for forcing in forcings:
            force(module, *forcing)
    except KeyError:
        return None
    return api.to_text(module)


def forced_by_origin(text: str, forcings, name: str = "<branches>") -> str | None:
    """Module `text`, made by XLA's import of the module `forcings` name things in (which
    renames instructions and computations but keeps a source instruction's name as its metadata
    op_name, and inlines calls, so one conditional may appear once per call site), with every
    conditional whose op_name is one of the forced conditionals' names forced alike; None when
    one of them is not there or no copy of it is used (the import may fold a conditional on a
    constant selector into the branch it takes, leaving a dead copy behind: forcing that copy
    would change nothing the module computes)."""
    module = api.parse(text, name, verify=False)
    for _, conditional, branch in forcings:
        found = [(comp.name, inst.name) for comp, inst in module.all_instructions()
                 if inst.opcode == "conditional" and
                 (inst.attr("metadata") or {}).get("op_name") == conditional]
        if not any(_used(module.computation(comp), inst) for comp, inst in found):
            return None
        for comp, inst in found:
            force(module, comp, inst, branch)
    return api.to_text(module)


def _used(computation: Computation, name: str) -> bool:
    """Whether instruction `name` reaches `computation`'s root through its users."""
    users = computation.users()
    seen, todo = set(), [computation.instruction(name)]
    while todo:
        inst = todo.pop()
        if inst is computation.root:
            return True
        if inst.name not in seen:
            seen.add(inst.name)
            todo.extend(users[inst])
    return False


def branch_variants(text: str, name: str = "<branches>") -> list[BranchVariant]:
    """One variant of module `text` per branch of each conditional that the entry reaches, in
    text order (none without conditionals)."""
    module = api.parse(text, name, verify=False)
    variants = []
    for comp, inst in list(module.all_instructions()):
        if inst.opcode != "conditional":
            continue
        path = _path(module, comp.name)
        if path is None:
            continue
        for k, branch in enumerate(inst.branch_computation_names()):
            variants.append(BranchVariant(f"%{inst.name} branch {k} (%{branch})",
                                          ((comp.name, inst.name, k), *path)))
    return variants
