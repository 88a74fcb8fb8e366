"""Strategies: the ways the partitioner can compute one instruction, read from its own rule table.

A rule of `passes/spmd/op_rules*.py` answers, for an instruction with given result and operand
shardings, which candidate plans it knows (operand shardings its local form needs, the sharding
that local form produces, the bytes it sends itself) and keeps the cheapest. autoshard asks the
same rules, with a planning context that records every candidate instead of keeping one, for
*probes*: the instruction with

- each candidate result sharding (`candidates.mesh_shardings`) and replicated operands (the
  plans derived from the result: e.g. a dot's operands following its output);
- replicated result and each candidate sharding of one operand (the plans derived from it:
  the other operands aligned to it, a reduce keeping its input's tiling with partial sums);
- replicated result and two operands split along disjoint sets of mesh axes (what no single
  probe gives a rule: a gather from a table split along one axis by indices split along
  another, a dot of a row-split lhs and a column-split rhs).

Every plan recorded becomes strategies: its operand shardings, and as result the sharding the
local computation produces, or, when that holds partial sums, each candidate result the
reshard planner reaches from it by resolving them alone (one all-reduce or one
reduce-scatter). A pinned instruction (its sharding fixed by the user) has one result, reached
from each plan by whatever reshard the planner finds. The strategy set is therefore exactly
what insert-reshards can lower without resharding the operands or the result further; its
costs (`costs.CostModel`) are the local computation's modelled time and the time of the
collectives the plan itself needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gspmdc.errors import ShardingError, UnsupportedError
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.module import Instruction
from gspmdc.ir.printer import format_attribute
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.passes.spmd.op_rules import OpPlan, PlanContext
from gspmdc.passes.spmd.partition_rules import rule_for
from gspmdc.passes.spmd.reshard_plan import AllReduce, ReduceScatter
from gspmdc.passes.spmd.tiling import Tiling

from .candidates import mesh_axes, mesh_shardings
from .costs import CostModel

@dataclass(frozen=True)
class Strategy:
    """One way to compute an instruction: the sharding each operand leaf must have (`operands`,
    operand leaves flattened in order), the sharding of each result leaf (`results`), the
    modelled seconds of one execution of the local computation (`compute`) and of the
    collectives the strategy itself needs (`communication`, with their `bytes` per device),
    the rule's reason, and the bytes per device of a local result that is resolved into the
    final one (`scratch`: partial sums before their all-reduce or reduce-scatter)."""

    operands: tuple[HloSharding, ...]
    results: tuple[HloSharding, ...]
    compute: float
    communication: float
    bytes: float
    reason: str
    scratch: int = 0

    @property
    def seconds(self) -> float:
        return self.compute + self.communication


class _Recorder(PlanContext):
    """A planning context that records every candidate plan a rule considers."""

    def __init__(self, num_devices: int, computations: dict):
        super().__init__(num_devices, computations)
        self.plans: list[OpPlan] = []

    def memoized(self, key, plan: Callable[[], OpPlan]) -> OpPlan:
        return plan()

    def choose(self, inst, candidates, tie_break=None, totals=False) -> OpPlan:
        self.plans.extend(candidates)
        return candidates[0]


class StrategyTable:
    """Strategies of instructions on one mesh, computed once per distinct instruction form
    (opcode, shapes, attributes, pin): the repeated layers of a model share them."""

    def __init__(self, mesh: Mesh, costs: CostModel, computations: dict):
        self.mesh = mesh
        self.costs = costs
        self.computations = computations
        self._cache: dict = {}
        self._resolved: dict = {}

    def candidates(self, shape: ArrayShape) -> tuple[HloSharding, ...]:
        return mesh_shardings(self.mesh, shape)

    def strategies(self, inst: Instruction, pin: HloSharding | None) -> tuple[Strategy, ...]:
        """The strategies of `inst` (a result sharding `pin` when the user fixed one)."""
        key = _form(inst, pin)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._strategies(inst, pin)
        return found

    def _strategies(self, inst: Instruction, pin: HloSharding | None) -> tuple[Strategy, ...]:
        recorder = _Recorder(self.mesh.num_devices, self.computations)
        rule = rule_for(inst, self.computations)
        for result, operands in self._probes(inst, pin):
            probe = _probe(inst, result, operands)
            try:
                recorder.plans.append(rule.plan(probe, recorder))
            except ShardingError:
                continue            # a probe the rule cannot plan (an impossible pairing)
        plans = {(p.operands, p.result, p.cost): p for p in recorder.plans}
        best: dict[tuple, Strategy] = {}
        for plan in plans.values():
            for strategy in self._from_plan(inst, plan, pin):
                key = (strategy.operands, strategy.results)
                if key not in best or strategy.seconds < best[key].seconds:
                    best[key] = strategy
        if not best:
            raise UnsupportedError(f"{inst.name}: the partitioner has no strategy for "
                                   f"{inst.opcode} on mesh {self.mesh.to_text()}")
        return tuple(sorted(best.values(), key=lambda s: s.seconds))

    def _probes(self, inst: Instruction, pin: HloSharding | None):
        """(result sharding, operand shardings) pairs to ask the rule about."""
        replicated = HloSharding.replicate()
        results = [pin] if pin is not None else \
            [_whole(s, inst.shape) for s in self._leaf_candidates(inst.shape)]
        base = [_replicated(o.shape) for o in inst.operands]
        for result in results:
            yield result, base
        varying = [k for k, o in enumerate(inst.operands)
                   if isinstance(o.shape, ArrayShape) and o.shape.rank > 0]
        result = pin if pin is not None else _whole(replicated, inst.shape)
        axes = {k: mesh_axes(self.mesh, inst.operands[k].shape) for k in varying}
        for k in varying:
            for s in axes[k]:
                if s != replicated:
                    operands = list(base)
                    operands[k] = s
                    yield result, operands
        for i, a in enumerate(varying):
            for b in varying[i + 1:]:
                for sa, used_a in axes[a].items():
                    for sb, used_b in axes[b].items():
                        if used_a and used_b and not used_a & used_b:
                            operands = list(base)
                            operands[a], operands[b] = sa, sb
                            yield result, operands

    def _leaf_candidates(self, shape) -> tuple[HloSharding, ...]:
        """Candidates of the first leaf (instructions with tuple results shard all their
        leaves alike: a variadic reduce, a sort)."""
        leaf = next(shape.leaves(), None)
        if leaf is None:
            return (HloSharding.replicate(),)
        return self.candidates(leaf)

    def _from_plan(self, inst: Instruction, plan: OpPlan, pin: HloSharding | None):
        """The strategies of one recorded plan (see the module docstring)."""
        operands = tuple(leaf for o, need in zip(inst.operands, plan.operands)
                         for leaf in need.leaf_shardings(o.shape))
        result_leaves = list(inst.shape.leaves())
        local = tuple(plan.result.leaf_shardings(inst.shape))
        compute = self.costs.instruction_seconds(inst, operands, local)
        own_seconds, own_bytes = self.costs.own_traffic(plan.cost)
        if pin is not None:
            targets = [tuple(pin.leaf_shardings(inst.shape))]
        elif not any(leaf.has_unreduced for leaf in local):
            targets = [local]
        else:
            targets = self._resolutions(result_leaves, local)
        for target in targets:
            seconds, sent, scratch = own_seconds, own_bytes, 0
            for shape, have, want in zip(result_leaves, local, target):
                t, b = self.costs.reshard(shape, have, want)
                seconds, sent = seconds + t, sent + b
                if have != want:
                    scratch += have.shard_shape(shape).byte_size
            yield Strategy(operands, target, compute, seconds, sent, plan.reason, scratch)

    def _resolutions(self, shapes, local):
        """The results reachable from partial sums by resolving them alone: per leaf, every
        candidate the planner reaches with one all-reduce or one reduce-scatter (leaves of a
        tuple result are resolved alike: the first leaf's choice for all)."""
        first, have = shapes[0], local[0]
        key = (first.without_layout(), have)
        found = self._resolved.get(key)
        if found is None:
            n = self.mesh.num_devices
            tiling = Tiling(have, first.rank, n)
            found = self._resolved[key] = [
                want for want in self.candidates(first)
                if _may_resolve(tiling, Tiling(want, first.rank, n)) and
                _resolves(self.costs.plan(first, have, want).steps)]
        return [tuple([want] * len(shapes)) for want in found]


def _may_resolve(partial: Tiling, target: Tiling) -> bool:
    """Whether `target`'s tile counts are those of `partial`, or those with one dim's count
    multiplied by the number of partial values (the only results of an all-reduce or a
    reduce-scatter)."""
    grown = [d for d, (a, b) in enumerate(zip(partial.counts, target.counts)) if a != b]
    if not grown:
        return True
    d = grown[0]
    return len(grown) == 1 and target.counts[d] == partial.counts[d] * partial.unreduced


def _resolves(steps) -> bool:
    return len(steps) == 1 and isinstance(steps[0], (AllReduce, ReduceScatter))


def _form(inst: Instruction, pin: HloSharding | None) -> tuple:
    """What a rule's plans depend on: opcode, shapes, attributes (but metadata), the operands'
    opcodes (a constant operand is free to take whole), a constant's value, the pin."""
    attrs = tuple(format_attribute(k, v) for k, v in inst.attrs.items()
                  if k not in ("metadata", "frontend_attributes"))
    literal = id(inst) if inst.opcode == "constant" else None
    return (inst.opcode, str(inst.shape), tuple(str(o.shape) for o in inst.operands),
            tuple(o.opcode for o in inst.operands), attrs, literal, pin)


def _probe(inst: Instruction, result: HloSharding, operands) -> Instruction:
    """A copy of `inst` with the given result sharding, on copies of its operands with the
    given shardings (the module is never changed)."""
    stand_ins = [Instruction(o.name, o.opcode, o.shape, o.operands, o.attrs, sharding=s,
                             literal=o.literal, parameter_number=o.parameter_number)
                 for o, s in zip(inst.operands, operands)]
    return Instruction(inst.name, inst.opcode, inst.shape, stand_ins, inst.attrs,
                       sharding=result, literal=inst.literal,
                       parameter_number=inst.parameter_number)


def _replicated(shape) -> HloSharding:
    if isinstance(shape, TupleShape):
        return HloSharding.tuple([HloSharding.replicate()] * sum(1 for _ in shape.leaves()))
    return HloSharding.replicate()


def _whole(leaf: HloSharding, shape) -> HloSharding:
    """`leaf` for every leaf of `shape`."""
    if isinstance(shape, TupleShape):
        return HloSharding.tuple([leaf] * sum(1 for _ in shape.leaves()))
    return leaf


__all__ = ["Strategy", "StrategyTable"]
