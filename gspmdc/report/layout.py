"""A layered drawing of a directed acyclic graph (data flows downwards), for the report's
program graphs.

The classic steps of a layered (Sugiyama) drawing, kept simple:

1. layers: a node sits one layer below its lowest operand; a node without operands sits just
   above its first user (constants and parameters stay near where they are read);
2. an edge spanning several layers passes through a dummy point in every layer between, so it
   bends around the nodes there;
3. order within layers: program order, then sweeps that move each node to the mean position of
   its neighbours in the layer above (downward sweeps) or below (upward sweeps);
4. coordinates: each node as close as it can to the mean x of its neighbours, without
   overlapping the nodes beside it, alternately from above and from below.

`layout(nodes, edges, widths)` returns the position of every node (its centre) and, per edge,
the points it passes through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

#: vertical distance between layers and horizontal gap between nodes (pixels)
LAYER_HEIGHT = 78
NODE_GAP = 24
DUMMY_WIDTH = 8
SWEEPS = 6


@dataclass(frozen=True)
class Layout:
    """Node centres, edge routes (start, bends, end) and the drawing's size."""

    positions: dict[Hashable, tuple[float, float]]
    routes: dict[tuple[Hashable, Hashable], list[tuple[float, float]]]
    width: float
    height: float


def layout(nodes: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]],
           widths: dict[Hashable, float]) -> Layout:
    """Lay out the DAG `nodes` (in program order) with `edges` (operand -> user); `widths`
    are the nodes' widths in pixels."""
    edges = list(dict.fromkeys(edges))
    preds: dict = {v: [] for v in nodes}
    succs: dict = {v: [] for v in nodes}
    for u, v in edges:
        preds[v].append(u)
        succs[u].append(v)
    layer: dict = {}
    for v in nodes:                                    # program order is a topological order
        layer[v] = 1 + max((layer[u] for u in preds[v]), default=-1)
    for v in reversed(nodes):
        if not preds[v] and succs[v]:
            layer[v] = max(min(layer[w] for w in succs[v]) - 1, 0)
    # neighbours in the layers above and below, long edges through dummy points
    width_of = dict(widths)
    up: dict = {v: [] for v in nodes}
    down: dict = {v: [] for v in nodes}
    chain_of: dict[tuple, list] = {}
    for u, v in edges:
        chain = [u] + [("dummy", u, v, k) for k in range(layer[u] + 1, layer[v])] + [v]
        for a, b in zip(chain, chain[1:]):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
        for dummy in chain[1:-1]:
            layer[dummy] = dummy[3]
            width_of[dummy] = DUMMY_WIDTH
        chain_of[(u, v)] = chain
    rows: list[list] = [[] for _ in range(max(layer.values(), default=0) + 1)]
    for v in layer:
        rows[layer[v]].append(v)
    _order(rows, up, down)
    x = _coordinates(rows, up, down, width_of)
    positions = {v: (x[v], layer[v] * LAYER_HEIGHT + LAYER_HEIGHT / 2) for v in layer}
    routes = {edge: [positions[p] for p in chain] for edge, chain in chain_of.items()}
    left = min((positions[v][0] - width_of[v] / 2 for v in layer), default=0.0)
    right = max((positions[v][0] + width_of[v] / 2 for v in layer), default=0.0)
    shift = NODE_GAP - left
    positions = {v: (px + shift, py) for v, (px, py) in positions.items() if v in widths}
    routes = {e: [(px + shift, py) for px, py in r] for e, r in routes.items()}
    return Layout(positions, routes, right - left + 2 * NODE_GAP, len(rows) * LAYER_HEIGHT)


def _order(rows: list[list], up: dict, down: dict) -> None:
    """Barycentre sweeps (in place), alternately downwards and upwards."""
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        sequence = range(1, len(rows)) if downward else range(len(rows) - 2, -1, -1)
        for i in sequence:
            neighbour_row = rows[i - 1] if downward else rows[i + 1]
            index = {v: k for k, v in enumerate(neighbour_row)}
            links = up if downward else down
            current = {v: k for k, v in enumerate(rows[i])}

            def key(v):
                around = [index[w] for w in links[v] if w in index]
                return sum(around) / len(around) if around else current[v]
            rows[i].sort(key=key)


def _coordinates(rows: list[list], up: dict, down: dict, width: dict) -> dict:
    """x of every node: packed left to right, then pulled towards its neighbours' mean."""
    x: dict = {}
    for row in rows:
        cursor = 0.0
        for v in row:
            x[v] = cursor + width[v] / 2
            cursor += width[v] + NODE_GAP
    for sweep in range(2 * SWEEPS):
        downward = sweep % 2 == 0
        sequence = range(1, len(rows)) if downward else range(len(rows) - 2, -1, -1)
        for i in sequence:
            links = up if downward else down
            row = rows[i]
            wanted = []
            for v in row:
                around = [x[w] for w in links[v] if w in x]
                wanted.append(sum(around) / len(around) if around else x[v])
            _place(row, wanted, x, width)
    return x


def _place(row: list, wanted: list[float], x: dict, width: dict) -> None:
    """Put the nodes of `row` (in order) as near their wanted x as they can be without
    overlapping: a left-to-right pass pushing right, then a right-to-left pass pushing left,
    averaged."""
    forward = []
    limit = float("-inf")
    for v, w in zip(row, wanted):
        position = max(w, limit + width[v] / 2)
        forward.append(position)
        limit = position + width[v] / 2 + NODE_GAP
    backward = [0.0] * len(row)
    limit = float("inf")
    for k in range(len(row) - 1, -1, -1):
        v = row[k]
        position = min(wanted[k], limit - width[v] / 2)
        backward[k] = position
        limit = position - width[v] / 2 - NODE_GAP
    # the average of two non-overlapping placements does not overlap either
    for v, a, b in zip(row, forward, backward):
        x[v] = (a + b) / 2


__all__ = ["layout", "Layout", "LAYER_HEIGHT"]
