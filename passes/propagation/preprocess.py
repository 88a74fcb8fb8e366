"""Preprocessing before the fixpoint (docs/design/propagation.md#preprocessing; XLA's
ProcessShardingInstruction and the start of
ShardingPropagation::Run).

1. CSE-prevention shardings left by an earlier `cse_prevention_only` run are dropped (or, in that
   mode, every original sharding is remembered for restoring); one sharding written for a whole
   tuple (`sharding={replicated}` on a tuple-shaped instruction) becomes one per leaf.
2. `Sharding` custom-calls become `copy` instructions (same name) carrying the constraint; their
   `unspecified_dims=[...]` are recorded; a fully specified constraint is also pushed onto an
   unsharded operand. A `{unknown}` constraint on anything but a parameter that names a shard
   group only puts its operand in the group: the operand takes the marker and the custom-call
   is removed, its users reading the operand.
3. `shard_as k` / `shard_like k` markers are recorded as groups (members in the order of the walk,
   users before operands) and stripped; `{unknown}` becomes `{replicated}` that propagation may
   replace (it constrains nothing; XLA's ShardingPropagation::Run).
4. The entry root's and parameters' shardings are saved for restoring where propagation into them
   is not allowed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gspmdc.errors import GspmdcError
from gspmdc.ir.custom_call_targets import SHARDING, target_of
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import for_shape

from .graph import ModuleGraph

CSE_PREVENTION = "_sharding_propagation_cse_prevention"
_UNSPECIFIED = re.compile(r"unspecified_dims=\[([0-9,\s]*)\]")


@dataclass
class Prepared:
    """What preprocessing found."""

    unspecified: dict[Instruction, tuple[int, ...]] = field(default_factory=dict)
    shard_as: dict[int, list[Instruction]] = field(default_factory=dict)
    shard_like: dict[int, list[Instruction]] = field(default_factory=dict)
    group_of: dict[Instruction, int] = field(default_factory=dict)
    saved_root: list[HloSharding | None] = field(default_factory=list)
    saved_parameters: dict[int, HloSharding] = field(default_factory=dict)
    cse_originals: dict[Instruction, HloSharding] | None = None
    pushed: list[tuple[Instruction, Instruction]] = field(default_factory=list)
    converted: list[Instruction] = field(default_factory=list)
    #: (computation, name) of the `Sharding` custom-calls removed
    removed: list[tuple[str, str]] = field(default_factory=list)
    #: the instructions whose sharding was `{unknown}`: they start `{replicated}`, not fixed
    unknown: set[Instruction] = field(default_factory=set)

    def group_members(self, inst: Instruction) -> list[Instruction]:
        gid = self.group_of.get(inst)
        if gid is None:
            return []
        return self.shard_as.get(gid) or self.shard_like.get(gid, [])


def unspecified_dims(inst: Instruction) -> tuple[int, ...] | None:
    """The `unspecified_dims=[...]` of a custom-call's backend_config (sorted), or None."""
    config = inst.attrs.get("backend_config")
    text = getattr(config, "text", config)
    if not isinstance(text, str):
        return None
    match = _UNSPECIFIED.search(text)
    if match is None:
        return None
    try:
        return tuple(sorted(int(x) for x in match.group(1).split(",") if x.strip()))
    except ValueError:
        raise GspmdcError(f"instruction {inst.name}: malformed backend_config {text!r}") from None


def is_cse_prevention(s: HloSharding) -> bool:
    leaves = s.elements if s.is_tuple else (s,)
    return any(m.get("op_name") == CSE_PREVENTION for leaf in leaves for m in leaf.metadata)


def _to_copy(inst: Instruction) -> None:
    """Turn a Sharding custom-call into a copy of its operand, keeping name, sharding, metadata."""
    kept = {k: v for k, v in inst.attrs.items() if k in ("metadata", "frontend_attributes")}
    inst.opcode = "copy"
    inst.attrs = kept


def preprocess(module: Module, graph: ModuleGraph, *, cse_prevention_only: bool) -> Prepared:
    prep = Prepared()
    if cse_prevention_only:
        prep.cse_originals = {inst: inst.sharding for comp in graph.computations
                              for inst in comp.instructions if inst.sharding is not None}
    else:
        for comp in graph.computations:
            for inst in comp.instructions:
                if inst.sharding is not None and is_cse_prevention(inst.sharding):
                    inst.sharding = None
    for comp in graph.computations:
        for inst in comp.instructions:
            if inst.sharding is not None:
                inst.sharding = for_shape(inst.sharding, inst.shape)
    for comp in graph.computations:
        for inst in reversed(graph.post_order(comp)):
            if target_of(inst) == SHARDING and not cse_prevention_only and \
                    _hands_group_to_operand(inst):
                operand = inst.operands[0]
                operand.sharding = (operand.sharding or HloSharding.unknown()).with_shard_group(
                    inst.sharding.shard_group)
                graph.remove(inst)
                prep.removed.append((comp.name, inst.name))
                continue
            if target_of(inst) == SHARDING:
                _constraint(inst, prep, convert=not cse_prevention_only)
            if inst.sharding is not None:
                _shard_group(inst, prep)
    entry = module.entry
    if entry.root.sharding is not None and entry.root not in prep.unknown:
        s = entry.root.sharding
        prep.saved_root = list(s.elements) if isinstance(entry.root.shape, TupleShape) and s.is_tuple \
            else [s] * (len(entry.root.shape.elements) if isinstance(entry.root.shape, TupleShape) else 1)
    for p in entry.parameters:
        if p.sharding is not None and p not in prep.unknown:
            prep.saved_parameters[p.parameter_number] = p.sharding
    return prep


def _hands_group_to_operand(inst: Instruction) -> bool:
    """Whether the `Sharding` custom-call `inst` only names a shard group for its operand (XLA's
    ProcessShardingInstruction keeps an `{unknown}` constraint on a non-parameter as a custom-call,
    passes its group to the operand and replaces the custom-call by the operand)."""
    s = inst.sharding
    return s is not None and not s.is_tuple and s.is_unknown and s.shard_group is not None \
        and inst.operands[0].opcode != "parameter"


def _constraint(inst: Instruction, prep: Prepared, convert: bool) -> None:
    unspec = unspecified_dims(inst)
    if convert:
        _to_copy(inst)
        prep.converted.append(inst)
    s = inst.sharding
    if s is None:
        return
    if unspec:
        prep.unspecified[inst] = unspec
    elif inst.operands[0].sharding is None:
        inst.operands[0].sharding = s.with_shard_group(None)
        prep.pushed.append((inst.operands[0], inst))


def _shard_group(inst: Instruction, prep: Prepared) -> None:
    s = inst.sharding
    groups = {leaf.shard_group for leaf in (s.elements if s.is_tuple else (s,))} - {None}
    if groups:
        group = groups.pop()
        table = prep.shard_as if group.kind == "as" else prep.shard_like
        table.setdefault(group.group_id, []).append(inst)
        prep.group_of[inst] = group.group_id
        s = s.with_shard_group(None)
    if s.is_unknown:
        prep.unknown.add(inst)
        s = for_shape(HloSharding.replicate(() if s.is_tuple else s.metadata), inst.shape)
    inst.sharding = s


def insert_root_copy(module: Module, graph: ModuleGraph) -> Instruction:
    """Append `copy(root)` as the entry's new root (used when the root is a while loop and output
    propagation is off, so that the loop itself stays free)."""
    entry: Computation = module.entry
    old = entry.root
    names = {i.name for c in module.computations.values() for i in c.instructions}
    name, k = f"{old.name}.copy", 1
    while name in names:
        k += 1
        name = f"{old.name}.copy.{k}"
    copy = Instruction(name, "copy", old.shape, [old], sharding=old.sharding)
    entry.instructions.append(copy)
    entry.root = copy
    graph.users[old] = graph.users[old] + [copy]
    graph.users[copy] = []
    graph.computation_of[copy] = entry
    graph.invalidate(entry)
    return copy
