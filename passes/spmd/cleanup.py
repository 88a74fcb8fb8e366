"""The cleanup pass after partitioning (docs/design/partitioning.md#clean-up): tuple simplification,
common-subexpression elimination and dead-code elimination of the entry computation and of
its control-flow callees (each computation on its own).

- `get-tuple-element(tuple(x0, x1, ...)), index=i` becomes `xi`;
- CSE merges instructions with the same opcode, shape, operands and attributes (ignoring
  `channel_id` and `metadata`) and equal literals: the partition-id tables, offsets, iotas and
  masks the lowering creates per use collapse to one each. Every partition merges alike, so
  merging collectives keeps the program SPMD;
- DCE removes what the root does not use (parameters and ops with effects always stay; an unused
  `rng-bit-generator` goes, as its values depend on its state operand only; collectives whose
  results are unused go too, on every partition alike).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.ops import SIDE_EFFECTING, opcodes
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .call_graph import partitioned_computations

#: opcodes never merged or removed: parameters, and the ops with effects (whose instances differ
#: even with equal operands). `rng-bit-generator` is not one of them: its bits and new state are
#: a function of its state operand alone, so an unused one goes and equal ones merge
_KEEP = SIDE_EFFECTING | opcodes("parameter")
_IGNORED_ATTRS = ("channel_id", "metadata")


@dataclass(frozen=True)
class Cleanup(ModulePass):
    """Tuple simplification, CSE and DCE of the entry computation and its control-flow callees."""

    name = "cleanup"

    def apply(self, ctx: PassContext, module: Module) -> Module:
        for comp in partitioned_computations(module):
            simplify_tuples(comp)
            eliminate_common_subexpressions(comp)
            eliminate_dead_code(comp)
        return module


def _replace_uses(comp: Computation, mapping: dict[Instruction, Instruction]) -> None:
    """Redirect uses through `mapping`; a replaced root passes its sharding (the layout of the
    module's result) to its replacement, which holds the same value."""
    if not mapping:
        return
    for inst in comp.instructions:
        inst.operands = [mapping.get(o, o) for o in inst.operands]
    root = mapping.get(comp.root, comp.root)
    if root is not comp.root:
        root.sharding = comp.root.sharding
        comp.root = root


def simplify_tuples(comp: Computation) -> None:
    mapping: dict[Instruction, Instruction] = {}
    for inst in comp.instructions:
        if mapping:
            inst.operands = [mapping.get(o, o) for o in inst.operands]
        if inst.opcode == "get-tuple-element" and inst.operands[0].opcode == "tuple":
            mapping[inst] = inst.operands[0].operands[inst.attr("index")]
    _replace_uses(comp, mapping)


def _key(inst: Instruction):
    attrs = tuple([item for item in inst.attrs.items() if item[0] not in _IGNORED_ATTRS])
    literal = None
    if inst.literal is not None and inst.literal.value is not None:
        value = inst.literal.value
        literal = (value.dtype.str, value.shape, value.tobytes())
    elif inst.literal is not None:
        return None
    return (inst.opcode, inst.shape, tuple([id(o) for o in inst.operands]), attrs, literal)


def eliminate_common_subexpressions(comp: Computation, annotated: frozenset[str] = frozenset()
                                    ) -> None:
    """Merge equal instructions (see the module's docstring). `annotated`: the computation is
    not partitioned yet; instructions merge only with equal shardings, and never those of the
    opcodes `annotated` names."""
    seen: dict = {}
    #: per opcode and operands, the first instruction with them while no other has them: its
    #: whole key (`_key`) is made only when a second one comes (most instructions have no
    #: twin; an instruction equal to an earlier one has its opcode and operands)
    alone: dict = {}
    mapping: dict[Instruction, Instruction] = {}
    kept = []
    skipped = _KEEP | annotated
    if annotated:
        # before partitioning only ops sharing their first operand are looked at (constants
        # and iotas are computed again for free wherever they are needed)
        first_uses = Counter(id(i.operands[0]) for i in comp.instructions if i.operands)
    for inst in comp.instructions:
        if mapping:
            inst.operands = [mapping.get(o, o) for o in inst.operands]
        if inst.opcode in skipped or inst.attr("custom_call_has_side_effect") or \
                (annotated and (not inst.operands or first_uses[id(inst.operands[0])] < 2)):
            kept.append(inst)
            continue
        twin = (inst.opcode, tuple([id(o) for o in inst.operands]))
        first = alone.setdefault(twin, inst)
        if first is inst:
            kept.append(inst)
            continue
        if first is not None:
            alone[twin] = None
            key = _full_key(first, annotated)
            if key is not None:
                seen[key] = first
        key = _full_key(inst, annotated)
        if key is not None:
            # one hash of the key for the common case (a key seen for the first time)
            found = seen.setdefault(key, inst)
            if found is not inst:
                if inst is not comp.root:
                    mapping[inst] = found
                    continue
                seen[key] = inst
        kept.append(inst)
    comp.instructions = kept
    _replace_uses(comp, mapping)


def _full_key(inst: Instruction, annotated: frozenset[str]):
    """`_key`, with the sharding where the computation is not partitioned yet."""
    key = _key(inst)
    return (key, inst.sharding) if key is not None and annotated else key


def live_instructions(comp: Computation) -> set[Instruction]:
    """The instructions DCE keeps: what the root uses, and the ops never removed."""
    live = {comp.root}
    for inst in reversed(comp.instructions):
        if inst in live or inst.opcode in _KEEP:
            live.add(inst)
            live.update(inst.operands)
    return live


def live_operands(comp: Computation) -> dict[Instruction, frozenset[int]]:
    """Per instruction whose value reaches the root once `simplify_tuples` has forwarded each
    `get-tuple-element` of a `tuple` to the element (and the ops never removed), the
    positions of its operands whose values reach the root through it: all of them, but of a
    tuple only read by get-tuple-elements just the elements they read (the others are dead
    after the forwarding), and none of a `get-dimension-size` (it reads its operand's shape
    only: partitioned, it is a constant)."""
    read: dict[Instruction, set[int] | None] = {comp.root: None}
    for inst in reversed(comp.instructions):
        if inst not in read and inst.opcode not in _KEEP:
            continue
        indices = read.setdefault(inst, None)
        if inst.opcode == "get-dimension-size":
            read[inst] = indices = set()
        positions = range(len(inst.operands)) if indices is None else indices
        for i in positions:
            operand = inst.operands[i]
            if inst.opcode == "get-tuple-element" and operand.opcode == "tuple":
                if operand in read and read[operand] is None:
                    continue
                read.setdefault(operand, set()).add(inst.attr("index"))
            else:
                read[operand] = None
    return {inst: frozenset(range(len(inst.operands)) if indices is None else indices)
            for inst, indices in read.items()}


def eliminate_dead_code(comp: Computation) -> None:
    live = live_instructions(comp)
    comp.instructions = [i for i in comp.instructions if i in live]


__all__ = ["Cleanup", "simplify_tuples", "eliminate_common_subexpressions",
           "live_instructions", "live_operands", "eliminate_dead_code"]
