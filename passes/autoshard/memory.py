"""Memory per device of a plan, from the liveness of the program's values.

The model is that of `gspmdc cost`'s peak memory, on the values autoshard decides: every
result leaf of a node of the sharding graph is a buffer of its shard's bytes, live from the
instruction defining it to its last use in program order (uses through `tuple`,
`get-tuple-element` and other aliases count); the entry's parameters live for the whole
program and its result to the end. A loop's body runs while the loop's state and everything
live around the loop is: each point of the body adds to what the caller holds at the loop.
What the partitioner adds (reshard temporaries, padding masks, halos) is not modelled here:
`gspmdc autoshard` checks its plan with the partitioned program's own figure.

`memory_rows` turns the points into rows of the integer program: one per distinct live set
that is not contained in the live set of the point before or after it (a point holding less
than its neighbour can never be the peak).
"""
from __future__ import annotations

from math import prod

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Computation
from gspmdc.passes.spmd.call_graph import control_flow_callees

from .graph import Ref
from .problem import Problem
from .solve import MemoryRow


class _Live:
    """The buffers live at a point, and their bytes per strategy summed by choice (a buffer
    live through several nested computations counts once)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.count: dict[Ref, int] = {}
        self.terms: dict[int, np.ndarray] = {}
        self.buffers: dict[int, int] = {}

    def add(self, ref: Ref) -> None:
        k = self.count.get(ref, 0)
        self.count[ref] = k + 1
        if k == 0:
            c = self.problem.choice_of[ref.node]
            vector = ref_bytes(self.problem, ref)
            self.terms[c] = self.terms[c] + vector if c in self.terms else vector
            self.buffers[c] = self.buffers.get(c, 0) + 1

    def remove(self, ref: Ref) -> None:
        k = self.count[ref] - 1
        self.count[ref] = k
        if k == 0:
            c = self.problem.choice_of[ref.node]
            self.buffers[c] -= 1
            if self.buffers[c] == 0:
                del self.terms[c], self.buffers[c]
            else:
                self.terms[c] = self.terms[c] - ref_bytes(self.problem, ref)


def _walk(problem: Problem, comps, comp: Computation, live: _Live, is_entry: bool, visit):
    """Call `visit((computation, instruction), live)` at every point of `comp` (and of the
    computations its loops and branches run, nested at their instruction), `live` holding the
    buffers live there."""
    refs = problem.graph.refs
    name = comp.name
    last_use: dict[Ref, int] = {}
    defined: dict[Ref, int] = {}
    for t, inst in enumerate(comp.instructions):
        for ref in refs.get((name, inst.name), ()):
            defined.setdefault(ref, t)
        for operand in inst.operands:
            for ref in refs.get((name, operand.name), ()):
                last_use[ref] = t
    end = len(comp.instructions)
    for ref in refs.get((name, comp.root.name), ()):
        last_use[ref] = end
    if is_entry:
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                for ref in refs.get((name, inst.name), ()):
                    defined[ref] = 0
                    last_use[ref] = end
    starting: dict[int, list[Ref]] = {}
    ending: dict[int, list[Ref]] = {}
    for ref, start in defined.items():
        starting.setdefault(start, []).append(ref)
        ending.setdefault(max(last_use.get(ref, start), start), []).append(ref)
    for t, inst in enumerate(comp.instructions):
        for ref in starting.get(t, ()):
            live.add(ref)
        visit((name, inst.name), live)
        if inst.opcode == "while":
            for callee in (inst.attr("condition").name, inst.attr("body").name):
                _walk(problem, comps, comps[callee], live, False, visit)
        elif inst.opcode == "conditional":
            for callee in control_flow_callees(inst):
                _walk(problem, comps, comps[callee], live, False, visit)
        for ref in ending.get(t, ()):
            live.remove(ref)
    for ref in ending.get(end, ()):
        live.remove(ref)


def ref_bytes(problem: Problem, ref: Ref) -> np.ndarray:
    """Bytes per device of buffer `ref` under each strategy of its node's choice."""
    node = problem.graph.nodes[ref.node]
    key = (id(node.strategies), ref.leaf, node.shapes[ref.leaf])
    found = problem.byte_cache.get(key)
    if found is None:
        shape = node.shapes[ref.leaf]
        found = problem.byte_cache[key] = np.array(
            [float(_bytes(s.results[ref.leaf], shape)) for s in node.strategies])
    return found[problem.strategy_map[ref.node]]


@algebra.cached
def _bytes(sharding, shape) -> int:
    """Bytes of one shard (padded) of an array of `shape`."""
    width = max(dtypes.byte_width(shape.element_type), 1)
    return prod(sharding.shard_shape(shape).dims) * width


def point_rows(problem: Problem, limit: float = float("inf")) -> list[MemoryRow]:
    """One row per program point: the buffers live there, the partial results its instruction
    resolves (`Strategy.scratch`) and the resharded copies of the operands it reads (an
    operand whose need differs from its sharding is read from a new buffer)."""
    graph = problem.graph
    edges_at: dict[tuple[str, str], list] = {}
    for edge in graph.edges:
        edges_at.setdefault(edge.where, []).append(edge)
    scratch_at: dict[tuple[str, str], int] = {}
    for node in graph.nodes:
        if node.kind == "op" and node.members and any(s.scratch for s in node.strategies):
            comp, name, _ = node.members[0]
            scratch_at[(comp, name)] = node.index
    rows = []

    def visit(key, live):
        terms = dict(live.terms)
        pair_terms: dict[int, np.ndarray] = {}

        def add(c, vector):
            terms[c] = terms[c] + vector if c in terms else np.asarray(vector, dtype=float)
        if key in scratch_at:
            i = scratch_at[key]
            node = graph.nodes[i]
            add(problem.choice_of[i], np.array([float(node.strategies[s].scratch)
                                                for s in problem.strategy_map[i]]))
        for edge in edges_at.get(key, ()):
            kind, index, values, needs = problem.edge_terms(edge)
            shape = edge.shape
            if kind == "choice":
                add(index, [_bytes(b, shape) if a != b else 0 for a, b in zip(values, needs)])
            elif kind == "source":
                add(index, [_bytes(needs, shape) if a != needs else 0 for a in values])
            elif kind == "target":
                add(index, [_bytes(b, shape) if values != b else 0 for b in needs])
            elif index is not None:
                matrix = np.array([[_bytes(b, shape) if a != b else 0 for b in needs]
                                   for a in values], dtype=float)
                pair_terms[index] = pair_terms[index] + matrix if index in pair_terms else matrix
        rows.append(MemoryRow(terms, pair_terms, limit, "/".join(key)))

    comps = {c.name: c for c in graph.computations}
    _walk(problem, comps, graph.computations[0], _Live(problem), True, visit)
    return rows


def memory_rows(problem: Problem, limit: int | None) -> list[MemoryRow]:
    """The rows keeping every program point within `limit` (none without a limit); a row that
    never holds more than its neighbour's (each of its terms at most the neighbour's) is left
    out (it can never be the peak alone), and equal rows are kept once."""
    if limit is None:
        return []
    rows = point_rows(problem, float(limit))
    kept, seen = [], set()
    for k, row in enumerate(rows):
        neighbours = rows[max(k - 1, 0):k] + rows[k + 1:k + 2]
        if any(_within(row, other) for other in neighbours):
            continue
        key = (tuple(sorted((c, v.tobytes()) for c, v in row.terms.items())),
               tuple(sorted((p, m.tobytes()) for p, m in row.pair_terms.items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(row)
    return kept


def _within(row: MemoryRow, other: MemoryRow) -> bool:
    """Whether `row` holds at most `other`'s bytes under every plan, and strictly less
    somewhere (equal rows are deduplicated instead)."""
    if row.pair_terms or other.pair_terms:
        return False
    smaller = False
    for c, v in row.terms.items():
        w = other.terms.get(c)
        if w is None or (v > w).any():
            return False
        smaller = smaller or (v < w).any()
    return smaller or len(other.terms) > len(row.terms)


class _Total:
    """The bytes of the buffers live at a point under one plan (a buffer live through
    several nested computations counts once)."""

    def __init__(self, size):
        self.size = size
        self.count: dict[Ref, int] = {}
        self.bytes = 0.0

    def add(self, ref: Ref) -> None:
        k = self.count.get(ref, 0)
        self.count[ref] = k + 1
        if k == 0:
            self.bytes += self.size(ref)

    def remove(self, ref: Ref) -> None:
        self.count[ref] -= 1
        if self.count[ref] == 0:
            self.bytes -= self.size(ref)


def plan_memory(problem: Problem, assignment: list[int]) -> tuple[int, str]:
    """The modelled peak bytes per device of an assignment, and where it is reached: the
    figure of `point_rows` under the assignment, computed for it alone."""
    graph = problem.graph
    chosen = [problem.node_strategy(i, assignment[problem.choice_of[i]])
              for i in range(len(graph.nodes))]
    extra: dict[tuple[str, str], float] = {}
    for node in graph.nodes:
        scratch = node.strategies[chosen[node.index]].scratch
        if node.kind == "op" and node.members and scratch:
            comp, name, _ = node.members[0]
            extra[(comp, name)] = extra.get((comp, name), 0.0) + scratch
    for edge in graph.edges:
        value = graph.nodes[edge.source.node].strategies[chosen[edge.source.node]] \
            .results[edge.source.leaf]
        target = graph.nodes[edge.target].strategies[chosen[edge.target]]
        need = target.results[0] if edge.operand is None else target.operands[edge.operand]
        if value != need:
            extra[edge.where] = extra.get(edge.where, 0.0) + _bytes(need, edge.shape)

    def size(ref):
        node = graph.nodes[ref.node]
        return _bytes(node.strategies[chosen[ref.node]].results[ref.leaf], node.shapes[ref.leaf])
    best = [0.0, ""]

    def visit(key, live):
        load = live.bytes + extra.get(key, 0.0)
        if load > best[0]:
            best[:] = [load, "/".join(key)]

    comps = {c.name: c for c in graph.computations}
    _walk(problem, comps, graph.computations[0], _Total(size), True, visit)
    return int(best[0]), best[1]


__all__ = ["point_rows", "memory_rows", "plan_memory", "ref_bytes"]
