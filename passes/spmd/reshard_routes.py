"""The route of every reshard chosen for the whole program (docs/partitioning.md, "Resharding";
docs/design/partitioning.md#reshard-routes-for-the-whole-program).

lower-spmd lowers each reshard node by the plan whose busiest device sends least
(`plan_reshard`). A program's bytes are summed per device over all its collectives
(docs/design/cost-model.md#a-programs-bytes), so a plan cheapest on its own can put its bytes
on a device that other collectives already load, where another plan of the same reshard
(`plan_routes`) would load devices idle elsewhere. Once every computation is lowered, `balance`
starts from the plans chosen one by one and makes, again and again, the one change of one
reshard's route that lowers the program's (busiest device's bytes, then all devices' bytes)
most, until no change lowers them. A change is only taken when it lowers them strictly, so no
program sends more than with the plans chosen one by one, and the choice is deterministic
(reshards in program order, routes in planning order, the first of equals).

The bytes are the cost model's (`gspmdc.ir.cost`) over the collectives DCE keeps, each times
its executions per run (`traffic.execution_counts`); nothing is changed where some count is
unknown. A reshard whose emitted collectives do not send exactly its plan's bytes (shared with
other code, or dead) keeps its route, and so do reshards emitted by the same plan in one
computation (clean-up may merge them: one re-routed would then add bytes instead of moving
them). A changed reshard's code is emitted again right after the first, the first's users read
the new result, the first's code no one else reads goes, and the computation is put back in an
order where every operand comes before its users (the partition tables are shared by all the
code of a computation).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.cost import instruction_traffic
from gspmdc.ir.module import Computation, Instruction, Module

from .cleanup import live_instructions
from .reshard import EmitContext, emit_reshard
from .reshard_plan import ReshardPlan, Routes, plan_routes
from .traffic import execution_counts

@dataclass
class LoweredReshard:
    """One reshard node as lower-spmd emitted it: the global `node`, the local `value` it
    reshards, the `plan` emitted, the combiner of partial values and metadata it was emitted
    with, the instructions emitted (`code`) and the one holding the result."""

    node: Instruction
    value: Instruction
    plan: ReshardPlan
    reducer: str | None
    metadata: KeyValueList | None
    code: list[Instruction]
    result: Instruction


@dataclass
class _Choice:
    comp: Computation
    ctx: EmitContext
    reshard: LoweredReshard
    routes: Routes
    sent: np.ndarray = None           # [routes, devices]: each route's bytes per run
    route: int = 0                    # the one taken


def balance(module: Module, lowered: list[tuple[Computation, EmitContext]],
            num_devices: int) -> None:
    """Re-route the reshards of the lowered `module` where that lowers the program's bytes (see
    the module docstring): each computation comes with the context that lowered it, whose
    `reshards` lists its `LoweredReshard`s."""
    choices = [_Choice(comp, ctx, r, routes) for comp, ctx in lowered for r in ctx.reshards
               if len((routes := plan_routes(r.node.shape, r.node.operands[0].sharding,
                                             r.node.sharding, num_devices)).plans) > 1]
    if not choices:
        return
    counts = execution_counts(module)
    program = _program_bytes(module, counts, num_devices)
    if program is None:
        return
    total, live = program
    choices = [c for c in choices if _priced(c, counts[c.comp.name], live[c.comp.name],
                                             num_devices)]
    # the same plan twice in a computation may be emitted on values clean-up merges, and its
    # collectives with them: re-routing one would then add its bytes rather than move them
    twice = Counter((id(c.comp), id(c.reshard.plan)) for c in choices)
    choices = [c for c in choices if twice[id(c.comp), id(c.reshard.plan)] == 1]
    changed = False
    while True:
        best, best_key = None, _key(total)
        for i, choice in enumerate(choices):
            options = total - choice.sent[choice.route] + choice.sent
            busiest, everyone = options.max(axis=1), options.sum(axis=1)
            k = int(np.lexsort((everyone, busiest))[0])
            if (key := (int(busiest[k]), int(everyone[k]))) < best_key:
                best, best_key = (i, k), key
        if best is None:
            break
        choice = choices[best[0]]
        total = total - choice.sent[choice.route] + choice.sent[best[1]]
        choice.route, changed = best[1], True
    if not changed:
        return
    replaced: dict[Instruction, Instruction] = {}
    rerouted = [c for c in choices if c.route]
    for choice in rerouted:
        _reemit(choice, choice.routes.plans[choice.route], replaced)
    for comp in {id(c.comp): c.comp for c in rerouted}.values():
        _restore_order(comp)
        _remove_dead(comp, {inst for c in rerouted if c.comp is comp for inst in c.reshard.code})


def _key(sent: np.ndarray) -> tuple[int, int]:
    return int(sent.max()), int(sent.sum())


def _program_bytes(module: Module, counts: dict[str, int | None], num_devices: int
                   ) -> tuple[np.ndarray, dict[str, set[Instruction]]] | None:
    """The bytes each device sends in one run of the lowered `module` over the collectives DCE
    keeps, and those kept instructions per computation; None where some collective's
    executions are unknown."""
    total = np.zeros(num_devices, dtype=np.int64)
    live: dict[str, set[Instruction]] = {}
    for comp in module.computations.values():
        if comp.name not in counts:
            continue
        live[comp.name] = kept = live_instructions(comp)
        for inst in comp.instructions:
            if inst in kept and (t := instruction_traffic(inst, num_devices,
                                                          module.computations)) is not None:
                if counts[comp.name] is None:
                    return None
                total += t.sent * counts[comp.name]
    return total, live


def _priced(choice: _Choice, executions: int | None, live: set[Instruction],
            num_devices: int) -> bool:
    """Whether `choice` may change route (its `sent` then set): it is live, and its emitted
    collectives send exactly its plan's bytes."""
    r = choice.reshard
    if executions is None or r.result not in live:
        return False
    sent = np.zeros(num_devices, dtype=np.int64)
    for inst in r.code:
        if inst in live and (t := instruction_traffic(inst, num_devices)) is not None:
            sent += t.sent
    if not np.array_equal(sent, choice.routes.sent[0]):
        return False
    choice.sent = choice.routes.sent * executions
    return True


def _reemit(choice: _Choice, plan: ReshardPlan,
            replaced: dict[Instruction, Instruction]) -> None:
    """`choice`'s reshard emitted again by `plan` right after its first code, whose users then
    read the new result instead (`replaced`: the first results so far and their new ones)."""
    comp, r = choice.comp, choice.reshard
    instructions = choice.ctx.builder.instructions
    start = len(instructions)
    result = emit_reshard(choice.ctx, replaced.get(r.value, r.value), r.node.shape, plan,
                          r.reducer, r.metadata)
    code = instructions[start:]
    del instructions[start:]
    at = next(k for k, inst in enumerate(instructions) if inst is r.result) + 1
    instructions[at:at] = code
    for inst in instructions:
        if any(o is r.result for o in inst.operands):
            inst.operands = [result if o is r.result else o for o in inst.operands]
    if comp.root is r.result:
        result.sharding = comp.root.sharding
        comp.root = result
    replaced[r.result] = result


def _remove_dead(comp: Computation, candidates: set[Instruction]) -> None:
    """Remove the `candidates` (the first code of re-emitted reshards) DCE would remove."""
    live = live_instructions(comp)
    comp.instructions[:] = [i for i in comp.instructions if i in live or i not in candidates]


def _restore_order(comp: Computation) -> None:
    """`comp`'s instructions in their order, except that an operand defined after a user moves
    to just before it."""
    placed: set[Instruction] = set()
    order: list[Instruction] = []
    for inst in comp.instructions:
        stack = [(inst, False)]
        while stack:
            node, ready = stack.pop()
            if node in placed:
                continue
            if ready:
                placed.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((o, False) for o in reversed(node.operands) if o not in placed)
    comp.instructions[:] = order


__all__ = ["LoweredReshard", "balance"]
