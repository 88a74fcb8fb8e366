"""The sharding graph of a module: choice nodes with their strategies, and the edges along which
values may need resharding.

Nodes (one strategy each is chosen):

- an *op* node per instruction that computes (its strategies from `strategies.StrategyTable`);
- a *parameter* node per array leaf of an entry parameter (its candidate shardings, or the
  user's pin);
- a *state* node per array leaf of a `while` loop's state: the while's result, its body's and
  condition's parameter and the loop-carried value all have one sharding (the partitioner's
  rule for loops), so the body, run many times, is solved once;
- a *branch result* node per array leaf of a `conditional`.

Values that only refer to other values follow them (aliases): `tuple`, `get-tuple-element`, a
branch's parameter (it arrives in its operand's sharding), and a `Sharding` annotation that is
not kept. Every instruction's result leaves are thus *refs* `(node, leaf)`.

Edges run from a ref to a node that needs it: an operand of an op node (the strategy's operand
sharding), the value entering a loop or leaving its body (the state node's sharding), a branch
root (the branch result node's). Their cost is the reshard planner's time between the two
shardings, times the executions of the computation the need lies in. Needs with one possible
sharding (a pinned output, a replicated branch selector) are *sinks*: a cost on the source's
strategies alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gspmdc.errors import UnsupportedError
from gspmdc.ir.custom_call_targets import SHARDING
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.passes.spmd.call_graph import control_flow_callees, partitioned_computations
from gspmdc.passes.spmd.traffic import execution_counts

from .strategies import Strategy, StrategyTable



@dataclass(frozen=True)
class Ref:
    """Result leaf `leaf` of node `node`."""

    node: int
    leaf: int


@dataclass
class Node:
    """One choice: `strategies` (their `results` are the node's result leaves), the leaf
    `shapes`, the executions per run of the computation it lies in, the instructions whose
    shardings it decides (`members`: (computation, instruction) names, each with the result
    leaves of this node it carries), and whether the user pinned it."""

    index: int
    kind: str
    name: str
    shapes: tuple[ArrayShape, ...]
    strategies: tuple[Strategy, ...]
    executions: int
    pinned: bool = False
    members: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)


@dataclass(frozen=True)
class Edge:
    """`source` is needed by node `target`: as its operand leaf `operand`, or (operand None) in
    the target's own result sharding, at instruction `where` (computation, name);
    `executions` per run."""

    source: Ref
    target: int
    operand: int | None
    shape: ArrayShape
    executions: int
    where: tuple[str, str]


@dataclass(frozen=True)
class Sink:
    """`source` is needed in sharding `sharding`, `executions` times per run (`why` says by
    whom)."""

    source: Ref
    sharding: HloSharding
    shape: ArrayShape
    executions: int
    why: str


@dataclass
class ShardingGraph:
    nodes: list[Node]
    edges: list[Edge]
    sinks: list[Sink]
    #: (computation, instruction) name -> its result leaves as refs
    refs: dict[tuple[str, str], list[Ref]]
    #: computations in program order (entry first) and the executions of each
    computations: list[Computation]
    executions: dict[str, int]
    #: loops without a static trip count (their bodies are counted as running once)
    unknown_trips: list[str]


def build_graph(module: Module, table: StrategyTable, pins: dict[tuple[str, str], HloSharding],
                output_pin: HloSharding | None) -> ShardingGraph:
    """The sharding graph of `module` (calls already inlined). `pins`: shardings the user fixed,
    by (computation, instruction); `output_pin`: the entry result's, if fixed."""
    return _Builder(module, table, pins, output_pin).build()


class _Builder:
    def __init__(self, module, table, pins, output_pin):
        self.module = module
        self.table = table
        self.pins = pins
        self.output_pin = output_pin
        self.nodes: list[Node] = []
        self.edges: list[Edge] = []
        self.sinks: list[Sink] = []
        self.refs: dict[tuple[str, str], list[Ref]] = {}
        self.unknown: list[str] = []
        #: the strategies of value nodes, shared by nodes of one kind, shape and pin
        self.value_strategies: dict[tuple, tuple[Strategy, ...]] = {}

    def build(self) -> ShardingGraph:
        module = self.module
        counts = execution_counts(module)
        comps = partitioned_computations(module)
        self.executions = {}
        for comp in comps:
            count = counts.get(comp.name)
            self.executions[comp.name] = 1 if count is None else max(count, 1)
        self.unknown = [c.name for c in comps if counts.get(c.name) is None]
        self._computation(module.entry, None)
        root = module.entry.root
        if self.output_pin is not None:
            leaves = list(root.shape.leaves())
            for ref, shape, sharding in zip(self.refs[(module.entry.name, root.name)], leaves,
                                            self.output_pin.leaf_shardings(root.shape)):
                self.sinks.append(Sink(ref, sharding, shape, 1, "the pinned output sharding"))
        return ShardingGraph(self.nodes, self.edges, self.sinks, self.refs, comps,
                             self.executions, self.unknown)

    # ---- nodes ------------------------------------------------------------------------------

    def _node(self, kind, name, shapes, strategies, executions, pinned=False) -> int:
        node = Node(len(self.nodes), kind, name, tuple(shapes), strategies, executions,
                    pinned)
        self.nodes.append(node)
        return node.index

    def _value_nodes(self, kind: str, name: str, shape, executions: int,
                     pin: HloSharding | None) -> list[Ref]:
        """One node per array leaf of `shape`, choosing among its candidate shardings."""
        refs = []
        pins = pin.leaf_shardings(shape) if pin is not None else None
        for k, leaf in enumerate(shape.leaves()):
            pin_k = pins[k] if pins is not None else None
            key = (kind, leaf, pin_k)
            strategies = self.value_strategies.get(key)
            if strategies is None:
                options = [pin_k] if pin_k is not None else self.table.candidates(leaf)
                strategies = self.value_strategies[key] = tuple(
                    Strategy((), (s,), 0.0, 0.0, 0.0, kind) for s in options)
            refs.append(Ref(self._node(kind, name, [leaf], strategies, executions,
                                       pins is not None), 0))
        return refs

    def _member(self, comp: Computation, inst: Instruction, refs: list[Ref]) -> None:
        self.refs[(comp.name, inst.name)] = refs
        by_node: dict[int, list[int]] = {}
        for ref in refs:
            by_node.setdefault(ref.node, []).append(ref.leaf)
        for node, leaves in by_node.items():
            self.nodes[node].members.append((comp.name, inst.name, tuple(leaves)))

    # ---- computations -----------------------------------------------------------------------

    def _computation(self, comp: Computation, parameters: list[list[Ref]] | None) -> None:
        executions = self.executions[comp.name]
        for inst in comp.instructions:
            refs = self._instruction(comp, inst, parameters, executions)
            self._member(comp, inst, refs)

    def _instruction(self, comp, inst, parameters, executions) -> list[Ref]:
        key = (comp.name, inst.name)
        opcode = inst.opcode
        if opcode == "parameter":
            if parameters is not None:
                return parameters[inst.parameter_number]
            return self._value_nodes("parameter", inst.name, inst.shape, 1, self.pins.get(key))
        if opcode == "tuple":
            return [r for o in inst.operands for r in self.refs[(comp.name, o.name)]]
        if opcode == "get-tuple-element":
            operand = inst.operands[0]
            start = sum(_leaf_count(e) for e in operand.shape.elements[:inst.attr("index")])
            return self.refs[(comp.name, operand.name)][start:start + _leaf_count(inst.shape)]
        if opcode == "custom-call" and inst.attr("custom_call_target") == SHARDING and \
                key not in self.pins:
            return self.refs[(comp.name, inst.operands[0].name)]
        if opcode == "while":
            return self._while(comp, inst, executions)
        if opcode == "conditional":
            return self._conditional(comp, inst, executions)
        if opcode == "call":
            raise UnsupportedError(f"{inst.name}: autoshard works on modules whose calls are "
                                   "inlined")
        strategies = self.table.strategies(inst, self.pins.get(key))
        node = self._node("op", inst.name, list(inst.shape.leaves()), strategies, executions,
                          key in self.pins)
        k = 0
        for operand in inst.operands:
            for ref, leaf in zip(self.refs[(comp.name, operand.name)], operand.shape.leaves()):
                self.edges.append(Edge(ref, node, k, leaf, executions, (comp.name, inst.name)))
                k += 1
        return [Ref(node, i) for i in range(_leaf_count(inst.shape))]

    def _while(self, comp, inst, executions) -> list[Ref]:
        body = self.module.computations[inst.attr("body").name]
        condition = self.module.computations[inst.attr("condition").name]
        state = self._value_nodes("loop state", inst.name, inst.shape, executions,
                                  self.pins.get((comp.name, inst.name)))
        operand = inst.operands[0]
        for ref, target, leaf in zip(self.refs[(comp.name, operand.name)], state,
                                     operand.shape.leaves()):
            self.edges.append(Edge(ref, target.node, None, leaf, executions,
                                   (comp.name, inst.name)))
        self._computation(condition, [state])
        self._computation(body, [state])
        body_executions = self.executions[body.name]
        for ref, target, leaf in zip(self.refs[(body.name, body.root.name)], state,
                                     body.root.shape.leaves()):
            self.edges.append(Edge(ref, target.node, None, leaf, body_executions,
                                   (body.name, body.root.name)))
        predicate = self.refs[(condition.name, condition.root.name)]
        for ref, leaf in zip(predicate, condition.root.shape.leaves()):
            self.sinks.append(Sink(ref, HloSharding.replicate(), leaf,
                                   self.executions[condition.name],
                                   f"the loop condition of {inst.name} (every partition takes "
                                   "the same trip count)"))
        return state

    def _conditional(self, comp, inst, executions) -> list[Ref]:
        results = self._value_nodes("branch result", inst.name, inst.shape, executions,
                                    self.pins.get((comp.name, inst.name)))
        selector = inst.operands[0]
        for ref, leaf in zip(self.refs[(comp.name, selector.name)], selector.shape.leaves()):
            self.sinks.append(Sink(ref, HloSharding.replicate(), leaf, executions,
                                   f"the branch selector of {inst.name} (every partition "
                                   "takes the same branch)"))
        for k, name in enumerate(control_flow_callees(inst)):
            branch = self.module.computations[name]
            operand = inst.operands[k + 1]
            self._computation(branch, [self.refs[(comp.name, operand.name)]])
            for ref, target, leaf in zip(self.refs[(branch.name, branch.root.name)], results,
                                         branch.root.shape.leaves()):
                self.edges.append(Edge(ref, target.node, None, leaf,
                                       self.executions[branch.name],
                                       (branch.name, branch.root.name)))
        return results


def _leaf_count(shape) -> int:
    if isinstance(shape, TupleShape):
        return sum(_leaf_count(e) for e in shape.elements)
    return 1


__all__ = ["Ref", "Node", "Edge", "Sink", "ShardingGraph", "build_graph"]
