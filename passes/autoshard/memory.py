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

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation
from gspmdc.passes.spmd.call_graph import control_flow_callees

from .graph import Ref
from .problem import Problem
from .solve import MemoryRow


def live_points(problem: Problem) -> list[tuple[str, frozenset[Ref]]]:
    """(where, live buffers) at every point of the program (loop bodies nested)."""
    graph = problem.graph
    comps = {c.name: c for c in graph.computations}
    entry = graph.computations[0]
    return _points(graph, comps, entry, frozenset(), is_entry=True)


def _points(graph, comps, comp: Computation, around: frozenset, is_entry: bool):
    refs = graph.refs
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
    points = []
    current: set[Ref] = set()
    for t, inst in enumerate(comp.instructions):
        current.update(starting.get(t, ()))
        live = frozenset(current) | around
        current.difference_update(ending.get(t, ()))
        points.append((f"{name}/{inst.name}", live))
        if inst.opcode == "while":
            for callee in (inst.attr("condition").name, inst.attr("body").name):
                points.extend(_points(graph, comps, comps[callee], live, False))
        elif inst.opcode == "conditional":
            for callee in control_flow_callees(inst):
                points.extend(_points(graph, comps, comps[callee], live, False))
    return points


def ref_bytes(problem: Problem, ref: Ref) -> np.ndarray:
    """Bytes per device of buffer `ref` under each strategy of its node's choice."""
    node = problem.graph.nodes[ref.node]
    shape = node.shapes[ref.leaf]
    return np.array([float(_bytes(node.strategies[s].results[ref.leaf], shape))
                     for s in problem.strategy_map[ref.node]])


def _bytes(sharding, shape) -> int:
    width = max(dtypes.byte_width(shape.element_type), 1)
    return int(np.prod(sharding.shard_shape(shape).dims)) * width


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
    cache: dict[Ref, np.ndarray] = {}
    rows = []
    for where, live in live_points(problem):
        terms: dict[int, np.ndarray] = {}
        pair_terms: dict[int, np.ndarray] = {}

        def add(c, vector):
            terms[c] = terms[c] + vector if c in terms else np.asarray(vector, dtype=float)
        for ref in live:
            if ref not in cache:
                cache[ref] = ref_bytes(problem, ref)
            add(problem.choice_of[ref.node], cache[ref])
        key = tuple(where.split("/", 1))
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
        rows.append(MemoryRow(terms, pair_terms, limit, where))
    return rows


def memory_rows(problem: Problem, limit: int | None) -> list[MemoryRow]:
    """The rows keeping every program point within `limit` (none without a limit); a point
    holding a subset of its neighbour's buffers and reading no resharded copy is left out
    (it can never be the peak), and equal rows are kept once."""
    if limit is None:
        return []
    rows = point_rows(problem, float(limit))
    points = live_points(problem)
    kept, seen = [], set()
    for k, row in enumerate(rows):
        live = points[k][1]
        before = points[k - 1][1] if k > 0 else frozenset()
        after = points[k + 1][1] if k + 1 < len(points) else frozenset()
        plain = not row.pair_terms and set(row.terms) <= {problem.choice_of[r.node] for r in live}
        if plain and (live < before or live < after):
            continue
        key = (tuple(sorted((c, v.tobytes()) for c, v in row.terms.items())),
               tuple(sorted((p, m.tobytes()) for p, m in row.pair_terms.items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(row)
    return kept


def plan_memory(problem: Problem, assignment: list[int]) -> tuple[int, str]:
    """The modelled peak bytes per device of an assignment, and where it is reached."""
    best = (0.0, "")
    for row in point_rows(problem):
        load = row.bytes(problem, assignment)
        if load > best[0]:
            best = (load, row.where)
    return int(best[0]), best[1]


def lower_bound(problem: Problem) -> tuple[int, str]:
    """Bytes per device that every plan needs at some point (each value as small as its
    strategies allow), and where."""
    best = (0.0, "")
    for row in point_rows(problem):
        load = sum(float(v.min()) for v in row.terms.values())
        if load > best[0]:
            best = (load, row.where)
    return int(best[0]), best[1]


__all__ = ["live_points", "point_rows", "memory_rows", "plan_memory", "lower_bound",
           "ref_bytes"]
