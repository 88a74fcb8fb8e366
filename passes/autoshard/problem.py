"""The optimisation problem of a sharding graph, after its simplification.

Simplification (what keeps large programs tractable): two nodes joined by an edge are *merged*
into one choice when their strategies correspond one to one through that edge, that is, the
source's sharding of the value takes distinct values over its strategies, the target's need of
it takes distinct values over its strategies, and the two sets are equal. An elementwise chain,
the broadcast feeding it, a parameter used by it, a `copy` or a `convert` all merge into one
choice; the value then never reshards along the merged edges (resharding before or after an
elementwise op moves the same bytes). Nodes whose strategies differ in more than the value
(a dot's strategies share operand shardings and differ in the other operand's) stay apart.

The problem, over *choices* (merged nodes), each choosing one of its strategies:

- `unary[c][a]`: seconds of choice c's strategy a: its nodes' computation and own
  communication times their executions, plus edges inside the choice and sinks;
- `pairs`: for an edge between two choices, the strategies of each side grouped by the
  sharding of the value (source) and by the need (target), and the seconds `cost[g][h]` of
  resharding from group g's sharding to group h's need (every edge between the same two
  groupings summed into one);
- `node_strategy(node, a)`: which strategy of a graph node choice strategy `a` means.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gspmdc.ir.sharding import HloSharding

from .costs import CostModel
from .graph import Edge, ShardingGraph
from .symmetry import identical_values


@dataclass
class Pair:
    """Reshard costs between choices `u` and `v`: `groups_u[a]` is the group of u's strategy a
    (by the value's sharding), `groups_v[b]` of v's (by the need), `cost[g, h]` seconds."""

    u: int
    v: int
    groups_u: np.ndarray
    groups_v: np.ndarray
    cost: np.ndarray


@dataclass
class Shared:
    """One value (from choice `u`) resharded for several users in other choices, charged once
    per distinct sharding the users need, as the partitioner reshards it: `groups_u[a]` is the
    group (the value's sharding) of u's strategy a, `cost[g, t]` the seconds of resharding group
    g's sharding to need t, and each user `(v, needs, pair)` gives the need of each of v's
    strategies (an index t) and the pair whose flow variables join u's groups to v's needs
    (None when one side has a single sharding); `need_groups` maps that pair's need groups to t."""

    u: int
    groups_u: np.ndarray
    cost: np.ndarray
    users: list[tuple[int, np.ndarray, int | None, np.ndarray | None]]

    def seconds(self, assignment: list[int]) -> float:
        needed = {int(needs[assignment[v]]) for v, needs, _, _ in self.users}
        g = self.groups_u[assignment[self.u]]
        return float(sum(self.cost[g, t] for t in needed))

    def scores(self, c: int, assignment: list[int], size: int) -> np.ndarray:
        """The seconds of this reshard for each strategy of choice `c`, the others fixed."""
        if c == self.u:
            needed = sorted({int(needs[assignment[v]]) for v, needs, _, _ in self.users})
            return self.cost[:, needed].sum(axis=1)[self.groups_u]
        g = self.groups_u[assignment[self.u]]
        others = {int(needs[assignment[v]]) for v, needs, _, _ in self.users if v != c}
        mine = [needs for v, needs, _, _ in self.users if v == c]
        base = sum(float(self.cost[g, t]) for t in others)
        out = np.full(size, base)
        for b in range(size):
            out[b] += sum(float(self.cost[g, t]) for t in {int(n[b]) for n in mine} - others)
        return out


@dataclass
class Problem:
    graph: ShardingGraph
    #: per graph node: its choice and the node strategy of each of the choice's strategies
    choice_of: list[int]
    strategy_map: list[np.ndarray]
    #: per choice: its graph nodes and the seconds of each strategy
    members: list[list[int]]
    unary: list[np.ndarray]
    pairs: list[Pair]
    #: per choice: the part of `unary` that is computation (the rest is communication)
    compute: list[np.ndarray]
    #: (u, v, groups of u, groups of v) -> index in `pairs`
    pair_keys: dict[tuple, int]
    #: values with several users in other choices, and per choice the shared ones touching it
    shared: list[Shared]
    shared_of: dict[int, list[Shared]]
    #: the edges' costs by form
    forms: EdgeForms
    #: bytes per device of result leaves under their node's strategies (`memory.ref_bytes`)
    byte_cache: dict = field(default_factory=dict)

    def shared_scores(self, c: int, assignment: list[int]) -> np.ndarray:
        """Seconds of the shared reshards touching choice c, per strategy of c (others
        fixed)."""
        out = np.zeros(self.size(c))
        for sh in self.shared_of.get(c, ()):
            out += sh.scores(c, assignment, self.size(c))
        return out

    @property
    def num_choices(self) -> int:
        return len(self.members)

    def size(self, choice: int) -> int:
        return len(self.unary[choice])

    def node_strategy(self, node: int, a: int) -> int:
        return int(self.strategy_map[node][a])

    def edge_terms(self, edge: Edge):
        """How `edge` enters the problem: `("choice", c, values, needs)` when both ends are in
        choice c (per strategy of c), `("pair", p, values, needs)` for pair p (per group), or
        `("source", c, values, need)` / `("target", c, value, needs)` when one side has a
        single sharding (per strategy of the other side's choice c)."""
        cu, cv = self.choice_of[edge.source.node], self.choice_of[edge.target]
        form = self.forms(edge)
        gu = form.value_group[self.strategy_map[edge.source.node]]
        gv = form.need_group[self.strategy_map[edge.target]]
        values = [form.values[g] for g in gu]
        needs = [form.needs[h] for h in gv]
        if cu == cv:
            return "choice", cu, values, needs
        vu, vv = form.values, form.needs
        if len(vu) == 1:
            return "target", cv, vu[0], needs
        if len(vv) == 1:
            return "source", cu, values, vv[0]
        return "pair", self.pair_keys.get((cu, cv, gu.tobytes(), gv.tobytes())), vu, vv

    def objective(self, assignment: list[int]) -> float:
        """Modelled seconds of an assignment (one strategy per choice)."""
        total = sum(float(self.unary[c][a]) for c, a in enumerate(assignment))
        for p in self.pairs:
            total += float(p.cost[p.groups_u[assignment[p.u]], p.groups_v[assignment[p.v]]])
        return total + sum(sh.seconds(assignment) for sh in self.shared)


def plan_cost(problem: Problem, costs: CostModel, assignment: list[int]) -> tuple[float, float]:
    """(modelled seconds, bytes each device sends) per run of an assignment, as the partitioner
    will do it: every node's chosen strategy (computation and own collectives) times its
    executions, and each value resharded once per distinct sharding its users need (the
    partitioner reuses one reshard for all the users needing the same sharding, where the
    integer program charges each use: its objective is an upper bound of this figure)."""
    graph = problem.graph
    chosen = [problem.node_strategy(i, assignment[problem.choice_of[i]])
              for i in range(len(graph.nodes))]
    seconds = sum(node.strategies[chosen[i]].seconds * node.executions
                  for i, node in enumerate(graph.nodes))
    sent = sum(node.strategies[chosen[i]].bytes * node.executions
               for i, node in enumerate(graph.nodes))
    reshards: dict[tuple, tuple] = {}
    for edge in graph.edges:
        value = _value(graph, edge, chosen[edge.source.node])
        need = _need(graph, edge, chosen[edge.target])
        reshards[(edge.source, need)] = (edge.shape, value, need, edge.executions)
    for sink in graph.sinks:
        node = graph.nodes[sink.source.node]
        value = node.strategies[chosen[sink.source.node]].results[sink.source.leaf]
        reshards[(sink.source, sink.sharding)] = (sink.shape, value, sink.sharding,
                                                  sink.executions)
    for shape, value, need, executions in reshards.values():
        t, b = costs.reshard(shape, value, need)
        seconds += t * executions
        sent += b * executions
    return seconds, sent


def _need(graph: ShardingGraph, edge: Edge, strategy: int) -> HloSharding:
    node = graph.nodes[edge.target]
    chosen = node.strategies[strategy]
    return chosen.results[0] if edge.operand is None else chosen.operands[edge.operand]


def _value(graph: ShardingGraph, edge: Edge, strategy: int) -> HloSharding:
    return graph.nodes[edge.source.node].strategies[strategy].results[edge.source.leaf]


@dataclass
class EdgeForm:
    """What an edge's costs depend on, in terms of its end nodes' own strategies: the group
    (index into `values`) of the value's sharding under each strategy of the source node, the
    group (index into `needs`) of the need under each strategy of the target node, and the
    reshard seconds of one execution from each value to each need (`seconds`, filled as
    asked; `full`, the whole matrix once asked)."""

    value_group: np.ndarray
    values: tuple[HloSharding, ...]
    need_group: np.ndarray
    needs: tuple[HloSharding, ...]
    shape: object
    seconds: dict
    full: np.ndarray | None = None

    def cost(self, costs: CostModel, g: int, h: int) -> float:
        found = self.seconds.get((g, h))
        if found is None:
            found = self.seconds[(g, h)] = costs.reshard(self.shape, self.values[g],
                                                         self.needs[h])[0]
        return found

    def matrix(self, costs: CostModel) -> np.ndarray:
        if self.full is None:
            self.full = np.array([[self.cost(costs, g, h) for h in range(len(self.needs))]
                                  for g in range(len(self.values))])
        return self.full


class EdgeForms:
    """The `EdgeForm` of every edge, computed once per form: (source node's strategies, leaf,
    target node's strategies, operand, shape). Nodes of the same instruction form share their
    strategy tuple, so the repeated layers of a model share their edges' costs."""

    def __init__(self, graph: ShardingGraph):
        self.graph = graph
        self._forms: dict[tuple, EdgeForm] = {}

    def __call__(self, edge: Edge) -> EdgeForm:
        graph = self.graph
        source, target = graph.nodes[edge.source.node], graph.nodes[edge.target]
        key = (id(source.strategies), edge.source.leaf, id(target.strategies), edge.operand,
               edge.shape)
        form = self._forms.get(key)
        if form is None:
            value_group, values = _groups([s.results[edge.source.leaf]
                                           for s in source.strategies])
            need_group, needs = _groups([_need(graph, edge, b)
                                         for b in range(len(target.strategies))])
            form = self._forms[key] = EdgeForm(value_group, tuple(values), need_group,
                                               tuple(needs), edge.shape, {})
        return form


def build_problem(graph: ShardingGraph, costs: CostModel, merge: bool = True,
                  tie: bool = True) -> Problem:
    """The problem of `graph`: simplified unless `merge` is False, structurally identical
    values sharing a choice unless `tie` is False (`symmetry.identical_values`)."""
    n = len(graph.nodes)
    parent = list(range(n))
    maps = [np.arange(len(node.strategies)) for node in graph.nodes]
    members = {i: [i] for i in range(n)}
    forms = EdgeForms(graph)

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(u, v, through):
        """Choice v into choice u; u's strategy A means v's strategy through[A]."""
        for node in members.pop(v):
            maps[node] = maps[node][through]
            parent[node] = u
            members[u].append(node)
        parent[v] = u

    def inverse(permutation):
        out = np.empty_like(permutation)
        out[permutation] = np.arange(len(permutation))
        return out

    if merge:
        for edge in graph.edges:
            u, v = root(edge.source.node), root(edge.target)
            if u == v:
                continue
            form = forms(edge)
            source, target = edge.source.node, edge.target
            if len(form.values) != len(maps[source]) or len(form.needs) != len(maps[target]) \
                    or set(form.values) != set(form.needs):
                continue
            need_index = {s: h for h, s in enumerate(form.needs)}
            value_to_need = np.array([need_index[s] for s in form.values])
            need_to_strategy = inverse(form.need_group)
            through = inverse(maps[target])[
                need_to_strategy[value_to_need[form.value_group[maps[source]]]]]
            join(u, v, through)
    if tie:
        for group in identical_values(graph):
            first = group[0]
            for other in group[1:]:
                u, v = root(first), root(other)
                if u != v and len(maps[first]) == len(maps[other]):
                    join(u, v, inverse(maps[other])[maps[first]])

    roots = sorted(members)
    index = {r: k for k, r in enumerate(roots)}
    choice_of = [index[root(i)] for i in range(n)]
    unary = [np.zeros(len(maps[r])) for r in roots]
    compute = [np.zeros(len(maps[r])) for r in roots]
    node_seconds: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, node in enumerate(graph.nodes):
        key = id(node.strategies)
        if key not in node_seconds:
            node_seconds[key] = (np.array([s.seconds for s in node.strategies]),
                                 np.array([s.compute for s in node.strategies]))
        seconds, computing = node_seconds[key]
        unary[choice_of[i]] += seconds[maps[i]] * node.executions
        compute[choice_of[i]] += computing[maps[i]] * node.executions
    pairs: dict[tuple, Pair] = {}

    pair_index: dict[tuple, int] = {}

    def pair(key, cu, cv, gu, gv, matrix) -> int:
        if key in pairs:
            pairs[key].cost = pairs[key].cost + matrix
        else:
            pairs[key] = Pair(cu, cv, gu, gv, matrix)
            pair_index[key] = len(pair_index)
        return pair_index[key]

    crossing: dict = {}
    for edge in graph.edges:
        cu, cv = choice_of[edge.source.node], choice_of[edge.target]
        form = forms(edge)
        gu = form.value_group[maps[edge.source.node]]
        gv = form.need_group[maps[edge.target]]
        if cu == cv:
            unary[cu] += np.array([form.cost(costs, int(g), int(h))
                                   for g, h in zip(gu, gv)]) * edge.executions
            continue
        vu, vv = form.values, form.needs
        matrix = form.matrix(costs) * edge.executions
        if matrix.any():
            crossing.setdefault((edge.source, edge.executions), []).append(
                (edge, cu, cv, gu, vu, gv, vv, matrix))
    shared_by_key: dict[tuple, Shared] = {}
    for (source, executions), users in crossing.items():
        if len(users) == 1:
            _, cu, cv, gu, vu, gv, vv, matrix = users[0]
            if len(vu) == 1:
                unary[cv] += matrix[0][gv]
            elif len(vv) == 1:
                unary[cu] += matrix[:, 0][gu]
            else:
                pair((cu, cv, gu.tobytes(), gv.tobytes()), cu, cv, gu, gv, matrix)
            continue
        edge, cu, _, gu, vu, _, _, _ = users[0]
        targets: dict[HloSharding, int] = {}
        for *_, vv, _ in users:
            for need in vv:
                targets.setdefault(need, len(targets))
        cost = np.array([[costs.reshard(edge.shape, a, t)[0] for t in targets] for a in vu]) * \
            executions
        readers = []
        for _, _, cv, _, _, gv, vv, _ in users:
            to_target = np.array([targets[need] for need in vv])
            p = None
            if len(vu) > 1 and len(vv) > 1:
                p = pair((cu, cv, gu.tobytes(), gv.tobytes()), cu, cv, gu, gv,
                         np.zeros((len(vu), len(vv))))
            readers.append((cv, to_target[gv], p, to_target))
        # values of tied choices read alike: one record, their costs summed
        key = (cu, gu.tobytes(), len(targets),
               tuple((cv, needs.tobytes(), p, to.tobytes()) for cv, needs, p, to in readers))
        if key in shared_by_key:
            shared_by_key[key].cost = shared_by_key[key].cost + cost
        else:
            shared_by_key[key] = Shared(cu, gu, cost, readers)
    shared = list(shared_by_key.values())
    for sink in graph.sinks:
        c = choice_of[sink.source.node]
        values = [graph.nodes[sink.source.node].strategies[int(a)].results[sink.source.leaf]
                  for a in maps[sink.source.node]]
        unary[c] += [costs.reshard(sink.shape, a, sink.sharding)[0] * sink.executions
                     for a in values]
    shared_of: dict[int, list[Shared]] = {}
    for sh in shared:
        for c in {sh.u} | {v for v, _, _, _ in sh.users}:
            shared_of.setdefault(c, []).append(sh)
    return Problem(graph, choice_of, maps, [members[r] for r in roots], unary,
                   list(pairs.values()), compute, {k: i for i, k in enumerate(pairs)}, shared,
                   shared_of, forms)


def _groups(values: list[HloSharding]) -> tuple[np.ndarray, list[HloSharding]]:
    """Group index of each value, and the distinct values in first-seen order."""
    distinct: dict[HloSharding, int] = {}
    groups = np.array([distinct.setdefault(s, len(distinct)) for s in values], dtype=np.int64)
    return groups, list(distinct)


__all__ = ["Pair", "Shared", "Problem", "build_problem", "plan_cost"]
