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
    width = max(dtypes.byte_width(shape.element_type), 1)
    return np.array([float(np.prod(node.strategies[s].results[ref.leaf].shard_shape(shape).dims))
                     * width for s in problem.strategy_map[ref.node]])


def memory_rows(problem: Problem, limit: int | None) -> list[MemoryRow]:
    """The rows keeping every candidate peak point within `limit` (none without a limit)."""
    if limit is None:
        return []
    points = live_points(problem)
    kept: dict[frozenset, str] = {}
    for k, (where, live) in enumerate(points):
        before = points[k - 1][1] if k > 0 else frozenset()
        after = points[k + 1][1] if k + 1 < len(points) else frozenset()
        if (live < before) or (live < after) or live in kept:
            continue
        kept[live] = where
    rows = []
    cache: dict[Ref, np.ndarray] = {}
    for live, where in kept.items():
        terms: dict[int, np.ndarray] = {}
        for ref in live:
            if ref not in cache:
                cache[ref] = ref_bytes(problem, ref)
            c = problem.choice_of[ref.node]
            terms[c] = terms[c] + cache[ref] if c in terms else cache[ref]
        rows.append(MemoryRow(terms, float(limit), where))
    return rows


def plan_memory(problem: Problem, assignment: list[int]) -> int:
    """The modelled peak bytes per device of an assignment."""
    peak = 0.0
    cache: dict[Ref, float] = {}
    for _, live in live_points(problem):
        total = 0.0
        for ref in live:
            if ref not in cache:
                cache[ref] = float(ref_bytes(problem, ref)[assignment[problem.choice_of[ref.node]]])
            total += cache[ref]
        peak = max(peak, total)
    return int(peak)


__all__ = ["live_points", "memory_rows", "plan_memory", "ref_bytes"]
