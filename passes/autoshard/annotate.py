"""Writing a plan into the module, with the record `explain` reads.

Every instruction of the partitioned computations gets the sharding its node's chosen strategy
gives (tuple-shaped ones: their leaves'). Where a strategy needs an operand in another sharding
than the operand's, the reshard is written as a `Sharding` custom-call of the needed sharding
(`<operand>.reshard`, with the frontend attribute `autoshard_reshard` naming its users), once
per value and needed sharding: the partitioner reshards exactly where the plan does. The header
gets the mesh (`mesh={x=2, y=4}`) and the frontend attribute `autoshard` with the plan's
summary.

Each instruction whose sharding was chosen (not pinned) carries the frontend attribute
`autoshard`: entries separated by ` | `, the first the chosen sharding's, then the rejected
shardings of that instruction, cheapest first (at most `ALTERNATIVES`):

    chosen: compute 1.2e-06 s, communication 0 s, 4096 bytes
    {replicated}: +3.4e-06 s (compute +3.4e-06 s, communication +0 s), 16384 bytes
    {devices=[8,1]<=[8]}: +5e-07 s (compute -1e-07 s, communication +6e-07 s), 2048 bytes, over the memory limit

The costs are those of the instruction's *choice* (the group of values the simplification
merged, which change together): the chosen entry gives the choice's modelled seconds per run
split into computation and communication (its own collectives and the reshards inside it) and
the instruction's bytes per device; an alternative gives the change of the whole plan's
modelled step time if this choice alone took the strategy that gives the instruction that
sharding (everything else as planned: its reshards to and from its neighbours included), how
the change splits, the instruction's bytes per device under it, and whether the plan would then
exceed the memory limit. Frontend attributes are printed and re-parsed with the module, and the
partitioner keeps them, so the record survives `compile`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.custom_call_targets import SHARDING
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape

from .memory import ref_bytes
from .problem import Problem
from .solve import MemoryRow, Solution

#: the frontend attribute of the record (on instructions and in the header)
ATTRIBUTE = "autoshard"
#: the frontend attribute of a reshard autoshard placed (its users)
RESHARD_ATTRIBUTE = "autoshard_reshard"
#: rejected shardings recorded per instruction
ALTERNATIVES = 6


def annotate(module: Module, mesh: Mesh, problem: Problem, solution: Solution,
             rows: list[MemoryRow], summary: str) -> None:
    """Write the shardings of `solution` and the records (see the module docstring)."""
    graph = problem.graph
    assignment = solution.assignment
    chosen = [problem.node_strategy(i, assignment[problem.choice_of[i]])
              for i in range(len(graph.nodes))]
    deltas = _deltas(problem, assignment)
    over = _over_memory(problem, solution, rows)
    by_name = {c.name: {i.name: i for i in module.computations[c.name].instructions}
               for c in graph.computations}
    for (comp, name), refs in graph.refs.items():
        inst = by_name[comp][name]
        inst.sharding = _sharding(inst, [graph.nodes[r.node].strategies[chosen[r.node]]
                                         .results[r.leaf] for r in refs])
        if not refs or any(graph.nodes[r.node].pinned for r in refs):
            _set_record(inst, None)
            continue
        _set_record(inst, _record(problem, refs, assignment, deltas, over))
    _place_reshards(module, problem, chosen, by_name)
    module.attrs["mesh"] = mesh
    _set_header(module, f"mesh {mesh.to_text()}: {summary}")


def _place_reshards(module: Module, problem: Problem, chosen: list[int], by_name) -> None:
    """Write each reshard of the plan as a `Sharding` custom-call of the needed sharding: once
    per value and needed sharding, before its first user, the users reading it. The partitioner
    then reshards where the plan does (once for all users needing one sharding) and each user
    finds its operands as its strategy needs them."""
    graph = problem.graph
    names = {i.name for c in module.computations.values() for i in c.instructions}
    placed: dict[tuple, Instruction] = {}
    readers: dict[int, list[str]] = {}
    for edge in graph.edges:
        node = graph.nodes[edge.target]
        if edge.operand is None or node.kind != "op":
            continue
        value = graph.nodes[edge.source.node].strategies[chosen[edge.source.node]] \
            .results[edge.source.leaf]
        need = node.strategies[chosen[edge.target]].operands[edge.operand]
        if value == need:
            continue
        comp_name, user_name = edge.where
        user = by_name[comp_name][user_name]
        position = _array_operand(user, edge.operand)
        if position is None:
            continue
        operand = user.operands[position]
        key = (comp_name, operand.name, need)
        copy = placed.get(key)
        if copy is None:
            name = f"{operand.name}.reshard"
            k = 1
            while name in names:
                k += 1
                name = f"{operand.name}.reshard{k}"
            names.add(name)
            copy = Instruction(name, "custom-call", operand.shape, [operand],
                               {"custom_call_target": SHARDING}, sharding=need)
            comp = module.computations[comp_name]
            comp.instructions.insert(comp.instructions.index(user), copy)
            placed[key] = copy
        user.operands[position] = copy
        readers.setdefault(id(copy), []).append(user.name)
    for copy in placed.values():
        users = ", ".join(dict.fromkeys(readers[id(copy)]))
        _set_attribute(copy, RESHARD_ATTRIBUTE, f"for {users}")


def _array_operand(inst: Instruction, leaf: int) -> int | None:
    """The operand position of flattened operand leaf `leaf`, when that operand is an array."""
    k = 0
    for position, operand in enumerate(inst.operands):
        count = sum(1 for _ in operand.shape.leaves())
        if leaf < k + count:
            return position if isinstance(operand.shape, ArrayShape) else None
        k += count
    return None


def _sharding(inst: Instruction, leaves: list[HloSharding]) -> HloSharding:
    if isinstance(inst.shape, ArrayShape):
        return leaves[0]
    return HloSharding.tuple(leaves)


@dataclass
class _Delta:
    total: np.ndarray
    compute: np.ndarray


def _deltas(problem: Problem, assignment: list[int]) -> list[_Delta]:
    """Per choice: the change of the objective for each of its strategies, others fixed."""
    deltas = []
    for c in range(problem.num_choices):
        total = problem.unary[c] - problem.unary[c][assignment[c]]
        deltas.append(_Delta(total.copy(), problem.compute[c] - problem.compute[c][assignment[c]]))
    for p in problem.pairs:
        row = p.cost[:, p.groups_v[assignment[p.v]]][p.groups_u]
        deltas[p.u].total += row - row[assignment[p.u]]
        column = p.cost[p.groups_u[assignment[p.u]], :][p.groups_v]
        deltas[p.v].total += column - column[assignment[p.v]]
    for c in problem.shared_of:
        scores = problem.shared_scores(c, assignment)
        deltas[c].total += scores - scores[assignment[c]]
    return deltas


def _over_memory(problem: Problem, solution: Solution,
                 rows: list[MemoryRow]) -> dict[int, np.ndarray] | None:
    """Per choice: whether each strategy (others as planned) breaks a memory row."""
    if not rows:
        return None
    assignment = solution.assignment
    over: dict[int, np.ndarray] = {}
    for row in rows:
        involved = set(row.terms) | {x for p in row.pair_terms
                                     for x in (problem.pairs[p].u, problem.pairs[p].v)}
        for c in involved:
            exceeds = np.array([row.bytes(problem, assignment[:c] + [a] + assignment[c + 1:])
                                > row.limit for a in range(problem.size(c))])
            over[c] = exceeds if c not in over else over[c] | exceeds
    return over


def _record(problem: Problem, refs, assignment, deltas, over) -> str:
    graph = problem.graph
    c = problem.choice_of[refs[0].node]
    a = assignment[c]
    mine = [r for r in refs if problem.choice_of[r.node] == c]

    def bytes_under(b):
        return int(sum(ref_bytes(problem, r)[b] for r in mine))

    def sharding_under(b):
        return tuple(graph.nodes[r.node].strategies[problem.node_strategy(r.node, b)]
                     .results[r.leaf] for r in mine)

    unary, compute = float(problem.unary[c][a]), float(problem.compute[c][a])
    entries = [f"chosen: compute {compute:.3g} s, communication {unary - compute:.3g} s, "
               f"{bytes_under(a)} bytes"]
    mine_now = sharding_under(a)
    best: dict[tuple, int] = {}
    for b in np.argsort(deltas[c].total, kind="stable"):
        b = int(b)
        key = sharding_under(b)
        if key != mine_now and key not in best:
            best[key] = b
    for key, b in list(best.items())[:ALTERNATIVES]:
        d, dc = float(deltas[c].total[b]), float(deltas[c].compute[b])
        text = " ".join(s.to_text(False) for s in key)
        entry = f"{text}: {d:+.3g} s (compute {dc:+.3g} s, communication {d - dc:+.3g} s), " \
                f"{bytes_under(b)} bytes"
        if over is not None and c in over and over[c][b]:
            entry += ", over the memory limit"
        entries.append(entry)
    return " | ".join(entries)


def _set_record(inst: Instruction, value: str | None) -> None:
    _set_attribute(inst, ATTRIBUTE, value)


def _set_attribute(inst: Instruction, key: str, value: str | None) -> None:
    attrs = inst.attrs.get("frontend_attributes")
    items = [kv for kv in (attrs.items if isinstance(attrs, KeyValueList) else ())
             if kv[0] != key]
    if value is not None:
        items.append((key, value))
    if items:
        inst.attrs["frontend_attributes"] = KeyValueList(tuple(items), ", ")
    else:
        inst.attrs.pop("frontend_attributes", None)


def _set_header(module: Module, value: str) -> None:
    attrs = module.attrs.get("frontend_attributes")
    items = tuple(kv for kv in (attrs.items if isinstance(attrs, KeyValueList) else ())
                  if kv[0] != ATTRIBUTE)
    module.attrs["frontend_attributes"] = KeyValueList(items + ((ATTRIBUTE, value),), ", ")


# ---- reading the record back (explain) -----------------------------------------------------------

_ENTRY = re.compile(r"^(?P<sharding>.*): (?P<delta>[-+][^ ]+) s \(compute (?P<compute>[-+][^ ]+) s, "
                    r"communication (?P<communication>[-+][^ ]+) s\), (?P<bytes>\d+) bytes"
                    r"(?P<over>, over the memory limit)?$")
_CHOSEN = re.compile(r"^chosen: compute (?P<compute>[^ ]+) s, communication "
                     r"(?P<communication>[^ ]+) s, (?P<bytes>\d+) bytes$")


@dataclass(frozen=True)
class Alternative:
    """A rejected sharding and the change of the modelled step time it would make."""

    sharding: str
    delta: float
    compute: float
    communication: float
    bytes: int
    over_memory: bool


@dataclass(frozen=True)
class Record:
    """An instruction's autoshard record (see the module docstring)."""

    compute: float
    communication: float
    bytes: int
    alternatives: tuple[Alternative, ...]


def read_record(inst: Instruction) -> Record | None:
    """The record on `inst`, or None; ValueError when it is malformed."""
    attrs = inst.attrs.get("frontend_attributes")
    text = attrs.get(ATTRIBUTE) if isinstance(attrs, KeyValueList) else None
    if text is None:
        return None
    entries = text.split(" | ")
    chosen = _CHOSEN.match(entries[0])
    if chosen is None:
        raise ValueError(f"malformed autoshard record on {inst.name}: {entries[0]!r}")
    alternatives = []
    for entry in entries[1:]:
        m = _ENTRY.match(entry)
        if m is None:
            raise ValueError(f"malformed autoshard record on {inst.name}: {entry!r}")
        alternatives.append(Alternative(m["sharding"], float(m["delta"]), float(m["compute"]),
                                        float(m["communication"]), int(m["bytes"]),
                                        m["over"] is not None))
    return Record(float(chosen["compute"]), float(chosen["communication"]), int(chosen["bytes"]),
                  tuple(alternatives))


def reshard_users(inst: Instruction) -> str | None:
    """The users of a reshard autoshard placed (`inst` a `Sharding` custom-call it wrote)."""
    attrs = inst.attrs.get("frontend_attributes")
    return attrs.get(RESHARD_ATTRIBUTE) if isinstance(attrs, KeyValueList) else None


def header_summary(module: Module) -> str | None:
    attrs = module.attrs.get("frontend_attributes")
    return attrs.get(ATTRIBUTE) if isinstance(attrs, KeyValueList) else None


__all__ = ["annotate", "read_record", "reshard_users", "header_summary", "RESHARD_ATTRIBUTE", "Record", "Alternative", "ATTRIBUTE",
           "ALTERNATIVES"]
