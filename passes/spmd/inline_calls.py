"""The inline-calls pass: replace every `call` in the entry computation and in the computations
its control flow runs (while bodies and conditions, branches) by the body of its callee (XLA's
CallInliner, which its SPMD pipeline runs before sharding propagation). An asynchronous call
(`call-done(call-start(...))`) is made synchronous first and inlined the same way.

JAX wraps small functions (`relu`, `_where`, ...) in `call`s; inlining them lets propagation and
partitioning see through them. Callee instructions are copied with their attributes and
shardings under names unique in the caller; callee parameters become the call's operands. When the
call itself carries a sharding, the inlined result takes it, its Shardy sharding too (a `copy`
carries it when the result is an operand of the call or already has a different sharding).
Calls marked `frontend_attributes={inlineable="false"}` stay. Computations no longer reachable
from the entry are removed. A computation without calls (nor asynchronous ones) is left as it is:
its instructions and their operand lists are not rebuilt.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.ir.frontend_attributes import frontend_attribute, set_frontend_attribute
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sdy import SHARDING
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .builder import Builder, NameUniquer
from .call_graph import partitioned_computations


@dataclass(frozen=True)
class InlineCalls(ModulePass):
    """Inline the calls of the entry and of its control-flow callees (recursively)."""

    name = "inline-calls"
    accepts = frozenset({Stage.GLOBAL, Stage.PROPAGATED})

    def apply(self, ctx: PassContext, module: Module) -> Module:
        for comp in partitioned_computations(module):
            opcodes = {inst.opcode for inst in comp.instructions}
            if "call-start" in opcodes:
                _synchronous_calls(comp)
            if opcodes & {"call", "call-start"}:
                while any(_inlineable(i) for i in comp.instructions):
                    _inline_once(module, comp)
        _drop_unreachable(module)
        return module


def _inlineable(inst: Instruction) -> bool:
    """A call not marked `frontend_attributes={inlineable="false"}` (as XLA's CallInliner: JAX
    marks the bodies of shard_maps so, which Shardy's propagation treats as a unit)."""
    if inst.opcode != "call":
        return False
    kv = inst.attrs.get("frontend_attributes")
    return kv is None or kv.get("inlineable") != "false"


def _synchronous_calls(comp: Computation) -> None:
    """`call-done(call-start(args))` becomes `call(args)` (named and sharded like the
    call-done) when the call-done is the call-start's only user: an asynchronous call's value
    is its callee's on its operands, only the schedule differs. The call is then inlined."""
    users: dict[Instruction, list[Instruction]] = {}
    for inst in comp.instructions:
        for operand in inst.operands:
            users.setdefault(operand, []).append(inst)

    def wrapped(start: Instruction) -> bool:
        return start.opcode == "call-start" and \
            [u.opcode for u in users.get(start, [])] == ["call-done"] and start is not comp.root
    replacement: dict[Instruction, Instruction] = {}
    kept = []
    for inst in comp.instructions:
        inst.operands = [replacement.get(o, o) for o in inst.operands]
        if wrapped(inst):
            continue                                    # replaced at its call-done
        if inst.opcode == "call-done" and wrapped(inst.operands[0]):
            start = inst.operands[0]
            call = Instruction(inst.name, "call", inst.shape, list(start.operands),
                               {"to_apply": start.attr("to_apply")}, sharding=inst.sharding)
            replacement[inst] = call
            inst = call
        kept.append(inst)
    comp.instructions = kept
    comp.root = replacement.get(comp.root, comp.root)


def _inline_once(module: Module, comp: Computation) -> None:
    b = Builder(NameUniquer(i.name for i in comp.instructions))
    replacement: dict[Instruction, Instruction] = {}
    for inst in comp.instructions:
        inst.operands = [replacement.get(o, o) for o in inst.operands]
        if not _inlineable(inst):
            b.append(inst)
            continue
        callee = module.computation(inst.attr("to_apply").name)
        mapping: dict[Instruction, Instruction] = {}
        for inner in callee.instructions:
            if inner.opcode == "parameter":
                mapping[inner] = inst.operands[inner.parameter_number]
                continue
            mapping[inner] = b.add(inner.opcode, inner.shape,
                                   [mapping[o] for o in inner.operands], dict(inner.attrs),
                                   name=inner.name, sharding=inner.sharding,
                                   literal=inner.literal)
        result = mapping[callee.root]
        if inst.sharding is not None and result.sharding != inst.sharding:
            if result.sharding is None and result not in inst.operands:
                result.sharding = inst.sharding
            else:
                result = b.add("copy", inst.shape, [result], name=inst.name,
                               sharding=inst.sharding)
            _carry_shardy_sharding(inst, result)
        replacement[inst] = result
    comp.instructions = b.instructions
    comp.root = replacement.get(comp.root, comp.root)


def _carry_shardy_sharding(call: Instruction, result: Instruction) -> None:
    """The call's Shardy sharding (`xla.sdy.sharding`, which a module in Shardy form writes
    next to the HloSharding) goes where its HloSharding went."""
    value = frontend_attribute(call, SHARDING)
    if value is not None:
        set_frontend_attribute(result, SHARDING, value)


def _drop_unreachable(module: Module) -> None:
    reachable, pending = set(), [module.entry_name]
    while pending:
        name = pending.pop()
        if name in reachable:
            continue
        reachable.add(name)
        for inst in module.computations[name].instructions:
            pending.extend(inst.called_computation_names())
    module.computations = {k: c for k, c in module.computations.items() if k in reachable}


__all__ = ["InlineCalls"]
