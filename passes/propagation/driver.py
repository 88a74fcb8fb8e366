"""The propagation driver (docs/design/propagation.md#the-driver): four aggressiveness levels, each
a fixpoint of three sweeps per
computation (shard groups, forward in post order, backward in reverse post order), run as a
worklist, then (after aligning `shard_as` groups) one more level-3 fixpoint, as XLA's does: it
visits every instruction again when the alignment changed shardings, else it resumes from level
3's worklist like levels 2 and 3.

Each sweep visits only instructions that are *dirty* for it: initially all, afterwards those whose
neighbours changed (XLA's `already_inferred_*` sets and `clear_cache`). A sweep walks its dirty
instructions in order (those dirtied during the sweep merged in from a heap); an instruction
dirtied ahead of the cursor is visited in the same sweep, one dirtied behind it waits for the
next iteration, exactly as in XLA's repeated sweeps, but the cost is proportional to the number
of visits, not to the module size times the number of iterations. A level ends when an iteration changes nothing. Levels 2 and 3 resume from
the previous level's worklist (`_fixpoint` without `restart`) rather than marking everything dirty.

Termination: every change strictly improves a sharding
(docs/design/propagation.md#improving-a-sharding), except where control flow copies a
sharding between tied instructions; an instruction changing more than `MAX_CHANGES` times in one
level means two rules disagree forever, and is reported as an error naming it.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from gspmdc.errors import GspmdcError
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.custom_call_targets import (
    BARRIER_FROM, BARRIER_TO, FULL_TO_SHARD, SHARD_TO_FULL, target_of,
)
from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.sharding import HloSharding

from . import constraints
from .context import Context, Options, Proposal
from .control_flow import follow_change, sync_all
from .entry_policy import finalize_entry
from .graph import ModuleGraph
from .inference import infer_from_group, infer_from_operands, infer_from_users
from .opclass import is_barrier
from .preprocess import CSE_PREVENTION, Prepared, insert_root_copy, preprocess
from .provenance import ANNOTATION, Provenance
from gspmdc.ir.sharding_algebra import find_common_sharding, for_shape
from .while_devices import assign_while_devices

MAX_CHANGES = 64
LEVELS = (0, 1, 2, 3)
_KINDS = ("group", "forward", "backward")


class PropagationError(GspmdcError):
    """Propagation cannot complete (conflicting device assignments, no fixpoint)."""


@dataclass(frozen=True)
class PropagationOptions:
    """XLA's ShardingPropagation options. `propagate_to_output` / `propagate_to_parameters`: one
    flag for all, or one per output tuple element / entry parameter."""

    is_spmd: bool = True
    propagate_to_output: tuple[bool, ...] = (False,)
    propagate_to_parameters: tuple[bool, ...] = (False,)
    cse_prevention_only: bool = False
    execution_threads: tuple[str, ...] | None = None
    record_origins: bool = True


class Driver:
    def __init__(self, module: Module, options: PropagationOptions):
        self.module = module
        self.options = options
        self.graph = ModuleGraph(module, options.execution_threads)
        self.provenance = Provenance()
        self.rule_options = Options(options.is_spmd, any(options.propagate_to_output),
                                    any(options.propagate_to_parameters),
                                    options.execution_threads)
        self.prep = Prepared()
        self.fixed: set[Instruction] = set()
        self.dirty: dict[str, dict[str, set[Instruction]]] = {}
        #: per sweep kind, the instructions whose sharding changed since that sweep last visited
        #: them (what a level that does not restart must visit again)
        self.stale: dict[str, set[Instruction]] = {kind: set() for kind in _KINDS}
        #: at a level that does not restart, the (sweep kind, computation) pairs whose first
        #: sweep of the level has run (before it, every instruction it has not passed is still
        #: to be visited at the level: `_count`)
        self.swept: set[tuple[str, str]] | None = None
        self.positions: dict[tuple[str, str], dict[Instruction, int]] = {}
        self.orders: dict[str, list[Instruction]] = {}
        self.active: tuple[str, str] | None = None
        self.cursor = -1
        self.heap: list[int] = []
        self.level = 0
        self.changes: dict[Instruction, int] = {}
        self.structural_change = False
        #: per instruction calling computations, their parameters (`_find_callee_parameters`)
        self.callee_parameters: dict[Instruction, list[Instruction]] = {}

    # ---- entry point ------------------------------------------------------------------------

    def run(self) -> bool:
        """Propagate in place; returns whether anything changed."""
        original = {i: i.sharding for c in self.module.computations.values() for i in c.instructions}
        for inst, s in original.items():
            if s is not None:
                self.provenance.record(self._key(inst), s, ANNOTATION)
        self.prep = preprocess(self.module, self.graph,
                               cse_prevention_only=self.options.cse_prevention_only)
        self.structural_change = bool(self.prep.converted or self.prep.removed)
        for key in self.prep.removed:
            self.provenance.forget(key)
        for inst, s in original.items():
            if s is not None and inst.sharding is None:
                self.provenance.forget(self._key(inst))
        for operand, constraint in self.prep.pushed:
            self._record(operand, "constraint", "Sharding", (constraint,))
        for inst in self.prep.unknown:
            self._record(inst, "{unknown} annotation, taken as replicated", "")
        for comp in self.graph.computations:
            for inst in comp.instructions:
                if inst.opcode == "while":
                    for changed, source in assign_while_devices(self.graph, inst):
                        self._record(changed, "control flow", "device of channel op", (source,))
        for member, source in sync_all(self.graph):
            self._record(member, "control flow", "tied through called computation", (source,))
        self._fix_provided()
        self._find_callee_parameters()
        for level in LEVELS:
            self._fixpoint(level, groups=True, restart=level < 2)
        if self.prep.shard_as:
            self._align_shard_as()
        # alignment changes shardings behind the worklist's back: then every instruction again
        self._fixpoint(LEVELS[-1], groups=True, restart=bool(self.prep.shard_as))
        self._remove_barriers()
        self._finalize_entry()
        if self.prep.cse_originals is not None:
            self._restore_for_cse()
        changed = self.structural_change
        for inst, s in original.items():
            if inst.sharding != s:
                changed = True
            elif inst in self.fixed and s is not None:
                inst.sharding = s          # keep the user's object (and its metadata)
        if self.options.record_origins:
            self.provenance.write_attributes(self.module)
        return changed

    # ---- set-up -----------------------------------------------------------------------------

    def _fix_provided(self) -> None:
        """Instructions with a sharding keep it, unless it was `{unknown}`; so do the entry
        root (unless `{unknown}`) and parameters unless propagation into them is allowed."""
        self.fixed = {i for c in self.graph.computations for i in c.instructions
                      if i.sharding is not None and i not in self.prep.unknown}
        entry = self.module.entry
        if self.rule_options.to_output:
            self.fixed.discard(entry.root)
        elif entry.root not in self.prep.unknown:
            if entry.root.opcode == "while":
                copy = insert_root_copy(self.module, self.graph)
                self.structural_change = True
                if copy.sharding is not None:
                    self._record(copy, "control flow", "copy of the root loop", (copy.operands[0],))
            self.fixed.add(entry.root)
        params = entry.parameters
        if self.rule_options.to_parameters:
            self.fixed.difference_update(params)
        else:
            self.fixed.update(params)

    # ---- the fixpoint -----------------------------------------------------------------------

    def _fixpoint(self, level: int, groups: bool, restart: bool = True) -> None:
        """Run `level` to its fixpoint. With `restart` every instruction starts dirty; without
        it, only those left dirty by the previous level, those that changed since their last
        visit of a sweep (`stale`: a change marks the neighbours, not the instruction's own
        sweeps; nor the backward sweep of the other operands of its users, whose rules read every
        operand) and those whose rules answer differently at `level` than at the level before
        (`_newly_enabled`, when `level` is a new one): every other instruction's last visit saw
        the same shardings and would give the same answer."""
        enables = level != self.level
        self.level = level
        self.changes = {}
        ctx = Context(self.graph, self.rule_options, level)
        members = set(self.prep.group_of)
        carried = self.dirty
        self.dirty = {"group": {}, "forward": {}, "backward": {}}
        for comp in self.graph.computations:
            order = self.graph.post_order(comp)
            if self.orders.get(comp.name) is not order:     # the graph changed: new positions
                self.positions[("forward", comp.name)] = {i: k for k, i in enumerate(order)}
                self.positions[("group", comp.name)] = self.positions[("forward", comp.name)]
                self.positions[("backward", comp.name)] = {i: len(order) - 1 - k
                                                           for k, i in enumerate(order)}
                self.orders[comp.name] = order
            if restart:
                self.dirty["forward"][comp.name] = set(order)
                self.dirty["backward"][comp.name] = set(order)
                if groups:
                    self.dirty["group"][comp.name] = {i for i in order if i in members}
            else:
                for kind in _KINDS:
                    self.dirty[kind][comp.name] = set(carried[kind].get(comp.name, ()))
        if not restart:
            for kind, inst in (self._newly_enabled(level) if enables else ()):
                self._mark(inst, kind)
            for kind in _KINDS:
                self._mark_all(self.stale[kind], kind)
        else:
            self.stale = {kind: set() for kind in _KINDS}
        self.swept = None if restart else set()
        while True:
            changed = False
            for comp in self.graph.computations:
                for kind in _KINDS:
                    changed |= self._sweep(ctx, comp.name, kind)
                    if self.swept is not None:
                        self.swept.add((kind, comp.name))
            if not changed:
                self.swept = None
                return

    def _newly_enabled(self, level: int):
        """(kind, instruction) pairs whose visit may answer differently at `level` (2 or 3) than
        at `level - 1`. Above level 1 the rules read the level only about broadcasts
        (`passes_at_level`; the broadcast forward rule from level 3): at level 2 a broadcast
        takes its users' sharding (backward) and its shard group's, and passes its own to its
        operand (the operand's backward visit); at level 3 it takes its operand's (forward)."""
        for comp in self.graph.computations:
            for inst in comp.instructions:
                if inst.opcode != "broadcast":
                    continue
                if level == 2:
                    yield "backward", inst
                    yield "group", inst
                    for op in inst.operands:
                        yield "backward", op
                yield "forward", inst

    def _sweep(self, ctx: Context, comp: str, kind: str) -> bool:
        dirty = self.dirty[kind].get(comp)
        if not dirty:
            return False
        order = self.orders[comp]
        positions = self.positions[(kind, comp)]
        # the positions dirty at the start, walked in order; `_mark` pushes onto `self.heap`
        # what is dirtied ahead of the cursor meanwhile (none of those: it is not dirty then)
        pending = sorted([positions[i] for i in dirty])
        heap = self.heap = []
        self.active, self.cursor = (kind, comp), -1
        changed = False
        last = len(order) - 1 if kind == "backward" else None
        pop, visit = heapq.heappop, self._visit
        k, count = 0, len(pending)
        try:
            while k < count or heap:
                if heap and (k == count or heap[0] < pending[k]):
                    p = pop(heap)
                else:
                    p = pending[k]
                    k += 1
                inst = order[p] if last is None else order[last - p]
                if inst not in dirty:
                    continue
                self.cursor = p
                if visit(ctx, inst, kind, dirty):
                    changed = True
        finally:
            self.active = None
        return changed

    def _visit(self, ctx: Context, inst: Instruction, kind: str, dirty: set[Instruction]) -> bool:
        self.stale[kind].discard(inst)
        if kind == "backward" and inst.opcode == "custom-call" and \
                target_of(inst) in (FULL_TO_SHARD, SHARD_TO_FULL):
            self._mark(inst.operands[0], "backward")
        if kind == "group" and inst not in self.prep.group_of:
            dirty.discard(inst)
            return False
        if inst in self.fixed:
            return self._refine_fixed(ctx, inst, kind, dirty)
        dirty.discard(inst)
        if kind == "group":
            proposal = infer_from_group(ctx, inst, self.prep.group_members(inst))
        elif kind == "forward":
            proposal = infer_from_operands(ctx, inst)
        else:
            proposal = infer_from_users(ctx, inst)
        if proposal is None:
            return False
        self._apply(inst, proposal, {"group": "shard group"}.get(kind, kind))
        if kind == "forward" and proposal.settled:
            # its forward sweep has seen its latest sharding: asked again, it proposes nothing
            self.stale["forward"].discard(inst)
        for changed, source in follow_change(self.graph, inst, self.fixed):
            self._count(changed)
            self._record(changed, "control flow", "tied through called computation", (source,),
                         self.level)
            self._clear_cache(changed)
        self._clear_cache(inst)
        return True

    def _refine_fixed(self, ctx: Context, inst: Instruction, kind: str,
                      dirty: set[Instruction]) -> bool:
        """A fixed instruction changes only by refining its unspecified dims (levels >= 1),
        together with the manual boundary that follows it, if any."""
        unspec = self.prep.unspecified.get(inst)
        if unspec is None or not ctx.may_combine:
            dirty.discard(inst)
            return False
        if kind == "group":
            refinement = constraints.from_group(ctx, inst, unspec, self.prep.group_members(inst))
        elif kind == "forward":
            refinement = constraints.from_operand(ctx, inst, unspec)
        else:
            refinement = constraints.from_users(ctx, inst, unspec)
        if not refinement:
            return False
        dirty.discard(inst)
        for member, proposal in refinement:
            self._apply(member, proposal, "refined")
        boundary = constraints.boundary_after(ctx, inst, unspec) if kind != "group" else None
        self._clear_cache(inst, users_of=boundary)
        return True

    # ---- bookkeeping ------------------------------------------------------------------------

    def _key(self, inst: Instruction) -> tuple[str, str]:
        return (self.graph.computation_of[inst].name, inst.name)

    def _record(self, inst: Instruction, how: str, rule: str, sources=(), level=None) -> None:
        key = self._key
        self.provenance.record(key(inst), inst.sharding, how, rule,
                               tuple([key(s) for s in sources]), level)

    def _count(self, inst: Instruction) -> None:
        for stale in self.stale.values():
            stale.add(inst)
        backward = self.stale["backward"]
        siblings = [o for user in self.graph.users.get(inst, ()) for o in user.operands]
        backward.update(siblings)               # `inst` among them: already stale
        if self.swept is not None:
            # the level's first sweeps visit every instruction (XLA's caches start empty): one
            # they have not passed yet sees this change
            for kind in _KINDS:
                self._mark_unswept([inst] + siblings if kind == "backward" else [inst], kind)
        count = self.changes.get(inst, 0) + 1
        self.changes[inst] = count
        if count > MAX_CHANGES:
            steps = self.provenance.history.get(self._key(inst), [])
            recent = ", ".join(s.sharding.to_text(False) for s in steps[-2:] if s.sharding)
            raise PropagationError(
                f"sharding propagation does not converge: {inst.name} changed {count} times at "
                f"level {self.level}, alternating between {recent}")

    def _mark_unswept(self, insts, kind: str) -> None:
        """Mark those of `insts` the first `kind` sweep of the level has not passed yet."""
        computation_of = self.graph.computation_of
        for inst in insts:
            comp = computation_of.get(inst)
            if comp is None or (kind, comp.name) in self.swept:
                continue
            if self.active == (kind, comp.name) and \
                    self.positions[self.active][inst] <= self.cursor:
                continue
            self._mark(inst, kind)

    def _apply(self, inst: Instruction, proposal: Proposal, how: str) -> None:
        inst.sharding = for_shape(proposal.sharding, inst.shape)
        self._count(inst)
        self._record(inst, how, proposal.rule, proposal.sources, self.level)

    def _mark(self, inst: Instruction, kind: str) -> None:
        self._mark_all((inst,), kind)

    def _mark_all(self, insts, kind: str) -> None:
        """Make `insts` dirty for the `kind` sweep of their computations (a shard-group sweep
        takes only group members); one dirtied ahead of the cursor of the running sweep is
        visited in that sweep."""
        sets = self.dirty.get(kind)
        if not sets:
            return
        computation_of = self.graph.computation_of
        members = self.prep.group_of if kind == "group" else None
        active = self.active
        last = dirty = positions = None
        for inst in insts:
            comp = computation_of.get(inst)
            if comp is None:
                continue
            if comp is not last:        # `insts` mostly share one computation
                last, dirty = comp, sets.get(comp.name)
                positions = self.positions[active] if active == (kind, comp.name) else None
            if dirty is None or inst in dirty or (members is not None and inst not in members):
                continue
            dirty.add(inst)
            if positions is not None:
                p = positions[inst]
                if p > self.cursor:
                    heapq.heappush(self.heap, p)

    def _clear_cache(self, inst: Instruction, users_of: Instruction | None = None) -> None:
        """XLA's clear_cache: operands are re-examined backward, users (of `users_of` when given:
        a manual boundary refined with `inst`) and the parameters of computations they call
        forward, shard-group members by the group sweep."""
        self._mark_all(inst.operands, "backward")
        users = self.graph.users.get(users_of or inst, ())
        self._mark_all(users, "forward")
        callee_parameters = self.callee_parameters
        for user in users:
            params = callee_parameters.get(user)
            if params:
                self._mark_all(params, "forward")
        members = self.prep.group_members(inst)
        if members:
            self._mark_all([m for m in members if m is not inst], "group")

    def _find_callee_parameters(self) -> None:
        """`callee_parameters`: the parameters of the computations each instruction calls (the
        instructions that call one: the graph is fixed while the levels run)."""
        computations = self.module.computations
        self.callee_parameters = {}
        for comp in computations.values():
            for inst in comp.instructions:
                names = inst.called_computation_names()
                if names:
                    self.callee_parameters[inst] = [param for name in names
                                                    for param in computations[name].parameters]

    # ---- after the levels -------------------------------------------------------------------

    def _align_shard_as(self) -> None:
        """Give every member of a shard_as group the group's common sharding."""
        for members in self.prep.shard_as.values():
            shardings = [m.sharding for m in members if m.sharding is not None]
            default = next((m.sharding for m in members if m.sharding is not None
                            and target_of(m) != BARRIER_FROM), HloSharding.replicate())
            common = find_common_sharding(shardings, default) if shardings else default
            for m in members:
                if target_of(m) == BARRIER_TO:
                    continue
                if m.sharding != common:
                    m.sharding = for_shape(common, m.shape)
                    self._record(m, "shard group", "shard_as alignment", tuple(
                        o for o in members if o is not m and o.sharding == common)[:1])
            for m in members:
                if target_of(m) == BARRIER_FROM and m.operands[0].sharding is None:
                    m.operands[0].sharding = m.sharding
                    self._record(m.operands[0], "shard group", "shard barrier relay", (m,))

    def _remove_barriers(self) -> None:
        """Remove the shard barriers, their users reading their operand instead; an operand
        without a sharding takes the barrier's (XLA replaces the barrier by its operand, which
        inherits the sharding it lacks), even an entry parameter."""
        for comp in self.graph.computations:
            for inst in list(comp.instructions):
                if is_barrier(inst):
                    operand = inst.operands[0]
                    if operand.sharding is None and inst.sharding is not None:
                        operand.sharding = inst.sharding
                        steps = self.provenance.history.get(self._key(inst), ())
                        sources = steps[-1].sources if steps else ()
                        self.provenance.record(
                            self._key(operand), operand.sharding, "barrier",
                            f"sharding of the removed barrier {inst.name}",
                            tuple(key for key, _ in sources), self.level)
                    self.provenance.forget(self._key(inst))
                    self.provenance.removed_barriers[self._key(inst)] = \
                        (target_of(inst), self._key(inst.operands[0]))
                    self.graph.remove(inst)
                    self.structural_change = True

    def _finalize_entry(self) -> None:
        """The entry policy (`entry_policy`): restore the root / parameter shardings propagation
        was not allowed to set, replicate uneven ones it set."""
        finalize_entry(self.module.entry, self.options.propagate_to_output,
                       self.options.propagate_to_parameters, self.prep.saved_root,
                       self.prep.saved_parameters, self._settle)

    def _settle(self, inst: Instruction, sharding: HloSharding | None) -> None:
        if inst.sharding == sharding:
            return
        inst.sharding = sharding
        if sharding is None:
            self.provenance.forget(self._key(inst))
        else:
            self._record(inst, "finalize", "entry output/parameter policy")

    def _restore_for_cse(self) -> None:
        """`cse_prevention_only`: keep propagated shardings only on broadcasts of scalars (marked
        as CSE prevention), restore every other original sharding."""
        originals = self.prep.cse_originals
        marker = KeyValueList((("op_name", CSE_PREVENTION),))
        for comp in self.graph.computations:
            for inst in comp.instructions:
                if inst.sharding is None:
                    continue
                if inst.opcode == "broadcast" and inst.operands[0].shape.rank == 0:
                    if inst not in originals:
                        inst.sharding = inst.sharding.with_metadata((marker,))
                    continue
                inst.sharding = originals.get(inst)
                if inst.sharding is None:
                    self.provenance.forget(self._key(inst))


def propagate_module(module: Module, options: PropagationOptions) -> Provenance:
    """Propagate in place; the origins of the shardings (also written into the module as
    `sharding_origin` attributes when `options.record_origins`)."""
    driver = Driver(module, options)
    driver.run()
    return driver.provenance
