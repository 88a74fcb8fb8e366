"""What rules see: the propagation state at one aggressiveness level, and `Proposal`, the value a
rule hands back to the driver.

Rules are pure functions of the current shardings. A forward rule builds its answer with an
`Accumulator` (start from the instruction's sharding, improve it with candidates in XLA's order,
recording which neighbours contributed); a backward rule returns the candidate one user implies.
A forward rule's candidates come from its operands and the graph, never from the instruction's
own sharding (the accumulator alone reads that), unless its result says `settled=False`: that is
what makes a `settled` proposal settled (docs/design/propagation.md#the-driver).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import for_shape, leaf_count

from .graph import ModuleGraph
from .improve import improved_sharding


@dataclass(frozen=True)
class Options:
    """The pass options that rules depend on (see `ShardingPropagation` for all of them)."""

    is_spmd: bool = True
    to_output: bool = False
    to_parameters: bool = False
    execution_threads: tuple[str, ...] | None = None


@dataclass
class Proposal:
    """A rule's answer: the instruction's new sharding, the rule, the neighbours it came from."""

    sharding: HloSharding
    rule: str
    sources: tuple[Instruction, ...] = ()
    #: a forward rule's answer that asking it again, with the same operands and this answer as
    #: the instruction's sharding, leaves unchanged: one candidate taken from no sharding at all
    #: (docs/design/propagation.md#the-driver)
    settled: bool = False


@dataclass
class Context:
    graph: ModuleGraph
    options: Options
    level: int = 0
    #: the options' `is_spmd` (a field: asked on every visit)
    is_spmd: bool = field(init=False)
    #: partial shardings may merge (SPMD, levels >= 1); asked on nearly every rule visit
    may_combine: bool = field(init=False)

    def __post_init__(self):
        self.is_spmd = self.options.is_spmd
        self.may_combine = self.is_spmd and self.level > 0

    def single_consumer(self, inst: Instruction) -> bool:
        """Exactly one user that is not the computation root: resharding is paid once anyway, so
        forward rules may replace a tiling aggressively (a fact of the graph, found once)."""
        return self.graph.derived("single consumer", inst, _single_consumer, self.graph)

    def accumulate(self, inst: Instruction) -> "Accumulator":
        return Accumulator(self, inst)


def _single_consumer(inst: Instruction, graph: ModuleGraph) -> bool:
    return graph.non_root_users(inst) == 1


class Accumulator:
    """A running sharding for `inst`, improved step by step (XLA's MaybeImproveInstructionSharding
    applied to the instruction in turn), starting from its current one."""

    __slots__ = ("ctx", "inst", "value", "sources", "settled")

    def __init__(self, ctx: Context, inst: Instruction):
        self.ctx = ctx
        self.inst = inst
        self.value: HloSharding | None = inst.sharding
        self.sources: list[Instruction] = []
        #: the value is the one candidate taken, as it was given, when there was no value
        self.settled = False

    def improve(self, candidate: HloSharding | None, source: Instruction | None = None, *,
                aggressive: bool = False) -> bool:
        if candidate is None:
            return False
        new = improved_sharding(candidate, self.value, self.inst.shape,
                                may_combine=self.ctx.may_combine, aggressive=aggressive)
        if new is None:
            return False
        self._take(new, source, new == candidate)
        return True

    def improve_leaf(self, index: int, candidate: HloSharding, source: Instruction | None = None) -> bool:
        """Improve only tuple element `index` (XLA's MaybeImproveInstructionSubSharding; for an
        array-shaped instruction, index 0 is the whole value)."""
        shape = self.inst.shape
        if not isinstance(shape, TupleShape):
            return self.improve(candidate, source)
        start = sum(leaf_count(e) for e in shape.elements[:index])
        sub_shape = shape.elements[index]
        count = leaf_count(sub_shape)
        current = None
        if self.value is not None:
            leaves = self.value.elements[start:start + count]
            current = leaves[0] if not isinstance(sub_shape, TupleShape) else HloSharding.tuple(leaves)
        new = improved_sharding(candidate, current, sub_shape, may_combine=self.ctx.may_combine)
        if new is None:
            return False
        base = self.value if self.value is not None else \
            for_shape(HloSharding.replicate(), shape)
        leaves = list(base.elements)
        leaves[start:start + count] = list(new.elements) if new.is_tuple else [new]
        self._take(HloSharding.tuple(leaves), source, new == candidate)
        return True

    def set(self, value: HloSharding, source: Instruction | None = None) -> None:
        self._take(for_shape(value, self.inst.shape), source, False)

    def _take(self, value: HloSharding, source: Instruction | None, exact: bool) -> None:
        """Take `value`; `exact`: it is the candidate as the rule gave it (for the leaf
        improved: the candidate itself, not merged into or reshaped from anything)."""
        self.settled = exact and self.value is None
        self.value = value
        if source is not None and source not in self.sources:
            self.sources.append(source)

    def result(self, rule: str, settled: bool = True) -> Proposal | None:
        """The proposal, if the value changed; `settled=False`: a rule whose candidates read
        the instruction's own sharding, whose proposal is never settled."""
        if self.value is None or self.value is self.inst.sharding or self.value == self.inst.sharding:
            return None
        return Proposal(self.value, rule, tuple(self.sources), settled and self.settled)
