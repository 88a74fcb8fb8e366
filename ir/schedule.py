"""The order the instructions of a computation execute in, on every partition alike.

Program order, except that every collective is issued as early as its operands allow: right
after the last of the instructions computing its operands, the previous collective and the
previous *barrier* (an instruction with effects, a custom-call, or one calling a computation
that has collectives). Collectives keep their relative order and never pass a barrier, so every
partition issues the same collectives in the same order, and communication overlaps the
computation between a collective's operands and its first use.

The interpreter executes computations in this order (`runtime/interpreter.py`) and the liveness
analysis counts memory in it (`ir/liveness.py`): a collective issued early holds its result from
its issue on, so the two must agree on where it runs. Both also fuse a pad into its only user,
a dynamic-slice (`fused_pads`): the padded array is never built.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from .module import Computation, Instruction, Module
from .ops import COLLECTIVES, SIDE_EFFECTING, opcodes

#: instructions no collective is issued before (besides calls of computations with collectives)
BARRIER_OPCODES = SIDE_EFFECTING | opcodes("custom-call")


def fused_pads(comp: Computation) -> dict[Instruction, Instruction]:
    """`{pad: dynamic-slice}` for every pad of `comp` (no interior padding, not the root) whose
    only user is a dynamic-slice of it (as its sliced operand only): the slice reads its
    window from the pad's operand."""
    users = comp.users()
    return {inst: users[inst][0] for inst in comp.instructions
            if inst.opcode == "pad" and inst is not comp.root and len(users[inst]) == 1
            and users[inst][0].opcode == "dynamic-slice" and users[inst][0].operands[0] is inst
            and inst not in users[inst][0].operands[1:]
            and all(p.interior == 0 for p in inst.attrs["padding"])}


def issue_early(order: Sequence[int], reads: Mapping[int, Iterable[int]],
                collectives: set[int], barriers: set[int]) -> list[int]:
    """`order` (node ids in program order) with every node of `collectives` moved up to right
    after the last of: the nodes it `reads` (those in `order`), the previous collective, the
    previous node of `barriers`. Every other node keeps its place."""
    index = {node: k for k, node in enumerate(order)}
    keys = []
    floor = -1
    for k, node in enumerate(order):
        if node in collectives:
            anchor = max([index[s] for s in reads[node] if s in index] + [floor])
            keys.append((anchor, 1, k))
            floor = anchor
        else:
            keys.append((k, 0, k))
            if node in barriers:
                floor = k
    return [node for _, node in sorted(zip(keys, order))]


def communicating_computations(module: Module) -> Callable[[str], bool]:
    """Whether a computation of `module` (by name) has collectives, itself or in a computation
    it calls (memoized)."""
    known: dict[str, bool] = {}

    def communicates(name: str) -> bool:
        if name not in known:
            known[name] = False                 # a call cycle is not a collective
            known[name] = any(inst.opcode in COLLECTIVES or
                              any(communicates(c) for c in inst.called_computation_names())
                              for inst in module.computation(name).instructions)
        return known[name]
    return communicates


def execution_order(comp: Computation, communicates: Callable[[str], bool]) -> list[Instruction]:
    """`comp`'s instructions other than its parameters in the order they execute (see the
    module docstring; `communicates`: see `communicating_computations`)."""
    order = [inst for inst in comp.instructions if inst.opcode != "parameter"]
    collectives = {id(inst) for inst in order if inst.opcode in COLLECTIVES}
    barriers = {id(inst) for inst in order if inst.opcode in BARRIER_OPCODES or
                any(communicates(name) for name in inst.called_computation_names())}
    by_id = {id(inst): inst for inst in order}
    ids = issue_early([id(inst) for inst in order],
                      {id(inst): [id(op) for op in inst.operands]
                       for inst in order if id(inst) in collectives},
                      collectives, barriers)
    return [by_id[node] for node in ids]


__all__ = ["BARRIER_OPCODES", "issue_early", "communicating_computations", "execution_order",
           "fused_pads"]
