"""Structurally identical values: the repeated layers of a model, found without being told.

Two nodes of the sharding graph are *structurally identical* when they have the same strategies
(the same instruction form, so the same strategy tuple from `strategies.StrategyTable`, or the
same candidate shardings for a parameter, loop state or branch result), the same executions and
pin, and their neighbourhoods up to `ROUNDS` edges away look alike: colour refinement (the
Weisfeiler-Leman test) over the edges, each labelled with the operand position and result leaf
it joins, and over the sinks. In a stack of identical layers, every node of an inner layer is
identical to its counterpart in every other inner layer; nodes within `ROUNDS` edges of
something different (the first and last layers, next to a pinned input or output) keep their
own colour.

`problem.build_problem` gives the nodes of one class one choice (the same strategy each):
the integer program then has the size of one layer, whatever the depth of the stack. This is a
restriction of the plan (every layer planned alike, as an expert annotates a model); where the
restricted program has no plan under the memory limit, `plan.autoshard` solves the
unrestricted one.
"""
from __future__ import annotations

from .graph import ShardingGraph

#: edges of neighbourhood compared
ROUNDS = 4


def identical_values(graph: ShardingGraph, rounds: int = ROUNDS) -> list[list[int]]:
    """Classes (of at least two nodes, each in node order, classes by first node) of
    structurally identical nodes of `graph`."""
    nodes = graph.nodes
    colour = _intern([_initial(node) for node in nodes])
    incoming: list[list[tuple]] = [[] for _ in nodes]
    outgoing: list[list[tuple]] = [[] for _ in nodes]
    for edge in graph.edges:
        operand = -1 if edge.operand is None else edge.operand
        incoming[edge.target].append((operand, edge.source.node, edge.source.leaf,
                                      edge.executions))
        outgoing[edge.source.node].append((edge.source.leaf, operand, edge.target,
                                           edge.executions))
    sinks: list[list[tuple]] = [[] for _ in nodes]
    for sink in graph.sinks:
        sinks[sink.source.node].append((sink.source.leaf, sink.sharding, sink.executions))
    sink_keys = [tuple(sorted(s, key=repr)) for s in sinks]
    distinct = len(set(colour))
    for _ in range(rounds):
        colour = _intern([
            (colour[i],
             tuple(sorted((op, colour[src], leaf, ex) for op, src, leaf, ex in incoming[i])),
             tuple(sorted((leaf, op, colour[dst], ex) for leaf, op, dst, ex in outgoing[i])),
             sink_keys[i])
            for i in range(len(nodes))])
        now = len(set(colour))
        if now == distinct:
            break
        distinct = now
    classes: dict[int, list[int]] = {}
    for i, c in enumerate(colour):
        classes.setdefault(c, []).append(i)
    return [members for members in classes.values() if len(members) > 1]


def _initial(node) -> tuple:
    if node.kind == "op":
        # nodes of one instruction form share their strategy tuple (StrategyTable's cache)
        strategies = id(node.strategies)
    else:
        strategies = tuple(s.results for s in node.strategies)
    return node.kind, node.shapes, strategies, node.executions, node.pinned


def _intern(keys: list) -> list[int]:
    """Each key as a small integer, equal keys equal."""
    table: dict = {}
    return [table.setdefault(key, len(table)) for key in keys]


__all__ = ["identical_values", "ROUNDS"]
