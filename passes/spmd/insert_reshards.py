"""The insert-reshards pass: decide each instruction's partitioning strategy and make every
resharding explicit in the (still global) IR.

Equal pure instructions with equal shardings (same opcode, operands and attributes) are merged
first: one value, planned once for all its users. For each instruction `h` of the entry
computation, in program order, the op rule's plan (`op_rules.py`) names the sharding each
operand needs and the sharding `h`'s local computation produces. Plans are chosen looking one
op ahead: when some candidate computes `h` in another sharding than its annotation, each is
priced with the reshards `h`'s users will ask for (their plans for `h` in its annotation,
`PlanContext.result_needs`), read from the annotation or straight from the computed result
where that moves fewer bytes, and from the summed form of a partial result where users read
that (`result_chain`: one all-reduce for all of them); a tuple of arrays read only by
get-tuple-elements is priced with what the readers of each element read it in (an element
nobody reads, `{unknown}` in those needs, stays as computed: `seen_by_users`), and so is a
value a `tuple` read only so passes on (`_needs_of`; its reshard to its annotation stays
unread until a reader of the element reads it). The summed form is made only where the reads
through it move fewer bytes than without it (`summed_first`). A candidate computing `h`
replicated is priced less what the plans of the users computed again whole from it then save,
and less what the other users' plans (priced with their own users' needs) save reading it from
its replicated form (`_users_recomputed`, `_replicated_saving`;
docs/design/partitioning.md#users-computed-again-whole). The pass then

- inserts a reshard node before `h` for every operand whose sharding differs from the needed one;
- sets `h.sharding` to the produced sharding, and when that differs from `h`'s annotation inserts
  a reshard node after `h` that users see instead (partial sums of dots and reduces appear here as
  shardings with an `unreduced` subgroup, resolved by that reshard).

A reshard node is `custom-call(x), custom_call_target="Sharding", sharding=<target>` — XLA's own
annotation op, which means "this value, laid out as <target>" and evaluates as the identity, so
the module stays an ordinary, executable, re-parseable HLO module with global shapes. Its
`metadata` records why it exists: `op_type="reshard"`, `op_name` (the instruction that needs it),
`spmd_value` (the value resharded), `spmd_role` (which operand, or the result), `spmd_from` /
`spmd_to` (the two shardings) and `spmd_reason` (the strategy that asked for it).

Reshards are shared: users needing the same value in the same sharding use one node; a value
resharded back to a sharding it had is taken from before the reshard; tuples are resharded leaf by
leaf (get-tuple-element, reshard, tuple). Values are had without communication where they can
be:
- a constant or an `iota` needed in another sharding is computed again in it (no bytes), a
  `broadcast` too when that moves fewer bytes (from its operand resharded to the tiling of the
  kept dims: a broadcast of a replicated value moves none); the rules' costs count these
  reshards as free (`recomputed_for_free`);
- a value on one device that every partition computes whole (a pure op of replicated values,
  or a reshard onto that device, whose plan gathers the value on every device) reaches another
  device, or all of them, through a copy; a value resharded so onto one device is had
  replicated from that copy by its other users (any tiling sliced from it);
- any other pure array op (not a contraction) whose operands are had replicated without
  communication is computed again whole, then sliced to the sharding needed; an element of a
  tuple-shaped one (a sort's, a topk's) too, from the op computed again whole;
- a reshard node is resharded from its source where that moves fewer bytes;
- an instruction reading one value in several shardings makes first the read after which all
  of them, each from the cheapest of the value and the reads made before, move the fewest
  bytes (`reshard_order.py`: gathering first and slicing the tiles from the whole value where
  that beats gathering from the tiles);
- a value's replicated reshard that a live instruction reads gives it whole to any pure op
  computed again from it;
- a tiled value that a user not planned yet reads whole (replicated, or onto one device) is
  gathered first for a tiling the instruction being planned reads, the tiling sliced from it,
  where that moves fewer bytes than the tiling and the later gather; so is one whose later
  users' plans save more bytes with the whole value made than the gather moves beyond the
  tiling (`_gathered_first`);
- an instruction with an operand on one device runs on that device when its rule's plan for
  that moves fewer bytes than the plan for its own sharding;
- a reshard of an operand that the plans of the operand's users not planned yet would save
  bytes by reading (`_credit`), or that gives such a user whole (computed again from it), is
  priced at the bytes they do not save: the choice is a joint one over the value's users
  (XLA's reshard cache makes one reshard per value and sharding).
A reshard made only for a dead instruction (one whose value does not reach the root; it is
planned like any other and removed with its reshards after partitioning) is no shared node: a
live user taking it pays its bytes (`_unpaid`), and a value is computed again from it only
where that moves no more bytes than the user's own reshard.
Finally a reshard of a reshard nobody else uses is replaced by one direct reshard when that
moves no more bytes (e.g. all-reduce + slice becomes one reduce-scatter), and unused reshard
nodes are removed.

Preconditions: shardings valid for `num_partitions` devices; unsharded instructions are treated
as `{replicated}`. Manual values are never resharded (`op_rules_manual.py`).
The entry computation is rewritten first, then every control-flow callee (`call_graph.py`:
while bodies and conditions, branches, called computations; one per call site) with the
parameter and root shardings its call site planned; other computations it calls (reducers,
comparators) are used unchanged.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

from gspmdc.errors import ShardingError
from gspmdc.ir.annotation_shape import annotated_shape
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.custom_call_targets import SHARDING
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext
from gspmdc.passes.propagation.provenance import record_partitioner_sharding

from .builder import Builder, NameUniquer
from .call_graph import control_flow_callees, unshare_callees
from .cleanup import eliminate_common_subexpressions, live_operands
from .op_rules import (
    NOT_EVERYWHERE, NOT_RECOMPUTED, OpPlan, PlanContext, broadcast_first, free_target,
    maximal_for, read_as, recomputed_for_free, replicated_for, result_chain, seen_by_users,
    summed_first,
)
from .op_rules_control import boundary_shardings
from .kernel_reversal import reverse_tiled_kernels
from .merge_pad_slice import merge_pad_slices
from .op_rules_data import broadcast_operand_sharding, is_splat
from .partition_rules import rule_for
from .reshard_nodes import is_inserted_reshard, reshard_metadata
from .reshard_order import first_made
from .reshard_plan import plan_reshard


@dataclass(frozen=True)
class InsertReshards(ModulePass):
    """Choose each instruction's strategy and make every reshard an explicit node."""

    name = "insert-reshards"
    accepts = frozenset({Stage.GLOBAL, Stage.PROPAGATED})
    produces = Stage.RESHARDED

    def apply(self, ctx: PassContext, module: Module) -> Module:
        unshare_callees(module)
        _partition(module, module.entry, {}, None, ctx.num_partitions)
        module.attrs["num_partitions"] = ctx.num_partitions
        return module


def _partition(module: Module, comp: Computation, arrivals: dict[Instruction, HloSharding],
               root_sharding: HloSharding | None, num_partitions: int) -> None:
    """Rewrite `comp`, then its control-flow callees with the boundary shardings their call
    sites planned (`op_rules_control.boundary_shardings`)."""
    prepare_computation(comp, num_partitions)
    _Rewriter(module, comp, num_partitions, arrivals, root_sharding).run()
    for inst in comp.instructions:
        for name in control_flow_callees(inst):
            callee = module.computations[name]
            params, root = boundary_shardings(inst, callee)
            parameters = sorted(callee.parameters, key=lambda p: p.parameter_number)
            for parameter, sharding in zip(parameters, params):
                # loop state: one sharding throughout; other callees reshard a parameter
                # inside when its own annotation differs from the operand's
                if inst.opcode == "while" or parameter.sharding is None:
                    parameter.sharding = sharding
            _partition(module, callee, dict(zip(parameters, params)), root, num_partitions)


def prepare_computation(comp: Computation, num_partitions: int) -> None:
    """Give unsharded instructions `{replicated}` (tuple-shaped: per leaf), turn
    `{unknown}` into `{replicated}`, drop shard groups (propagation hints, not layouts),
    validate every sharding against its shape and `num_partitions` (ShardingError naming the
    instruction), give users outside a manual region their own `{replicated}` copy of a
    `{manual}` constant (`_replicated_constants`), merge equal pure instructions with equal
    shardings (not those `NOT_EVERYWHERE` names), merge each slice of a pad on a tiled dim
    into one pad (`merge_pad_slices`), and give convolutions reversing a tiled kernel a
    `reverse` of it instead (`reverse_tiled_kernels`)."""
    for inst in comp.instructions:
        sharding = inst.sharding
        if sharding is not None and (sharding.shard_group is not None or
                                     sharding.kind == "tuple"):
            inst.sharding = sharding = sharding.with_shard_group(None)
        if sharding is None:
            inst.sharding = replicated_for(inst.shape)
        elif sharding.kind == "tuple" and any(e.kind == "unknown" for e in sharding.elements):
            inst.sharding = HloSharding.tuple(
                [HloSharding.replicate() if e.kind == "unknown" else e
                 for e in sharding.elements])
        elif sharding.kind == "unknown":
            inst.sharding = replicated_for(inst.shape)
        elif sharding.kind != "tuple" and isinstance(inst.shape, TupleShape):
            inst.sharding = HloSharding.tuple(sharding.leaf_shardings(inst.shape))
        try:
            inst.sharding.validate(annotated_shape(inst), num_partitions)
        except ShardingError as e:
            raise ShardingError(f"instruction {inst.name}: {e}") from None
    _replicated_constants(comp)
    eliminate_common_subexpressions(comp, annotated=NOT_EVERYWHERE)
    merge_pad_slices(comp)
    reverse_tiled_kernels(comp)


def _replicated_constants(comp: Computation) -> None:
    """A `{manual}` constant (as XLA's CSE leaves one shared by a manual region and an
    ordinary op) holds the same literal on every device, i.e. its replicated value: each user
    whose sharding has no manual part gets a `{replicated}` copy of it in its place (XLA's
    partitioner takes such a value as replicated too). Any other manual value used outside a
    manual region stays an error (its per-device data has no global meaning)."""
    if not any(i.opcode == "constant" and i.sharding.kind == "manual" for i in comp.instructions):
        return
    users = comp.users()
    names = NameUniquer(i.name for i in comp.instructions)
    instructions = []
    for inst in comp.instructions:
        instructions.append(inst)
        outside = [u for u in users[inst] if not u.sharding.has_manual_leaf]
        if inst.opcode != "constant" or inst.sharding.kind != "manual" or not outside:
            continue
        copy = Instruction(names(f"{inst.name}.replicated"), "constant", inst.shape,
                           attrs=dict(inst.attrs), sharding=HloSharding.replicate(),
                           literal=inst.literal)
        instructions.append(copy)
        for user in outside:
            user.operands = [copy if o is inst else o for o in user.operands]
    comp.instructions = instructions


class _Rewriter:
    def __init__(self, module: Module, comp: Computation, num_partitions: int,
                 arrivals: dict[Instruction, HloSharding] | None = None,
                 root_sharding: HloSharding | None = None):
        self.module = module
        self.comp = comp
        self.arrivals = arrivals or {}
        self.root_sharding = root_sharding
        #: a result's reshard to its annotation whose one user is not planned yet, with the
        #: result's sharding (that user's plans pay its bytes only where they read it)
        self.unread: dict[Instruction, HloSharding] = {}
        self.ctx = PlanContext(num_partitions, module.computations, self._result_needs,
                               self._had, self.unread, self._broadcast, self._credit,
                               self._users_recomputed, self._unread_elements)
        self.builder = Builder(NameUniquer(i.name for i in comp.instructions))
        self.cache: dict[tuple[int, HloSharding], Instruction] = {}
        #: per value (by id), the shardings `cache` holds a reshard of it to
        self.resharded_to: dict[int, set[HloSharding]] = {}
        self.created: set[Instruction] = set()
        #: values on one device (`{maximal device=k}`) that every partition computes whole
        #: (`_computed_everywhere`)
        self.everywhere: set[Instruction] = set()
        #: the reshard nodes some instruction reads as an operand (made whatever else happens)
        self.read: set[Instruction] = set()
        #: those of them a live instruction (one whose value reaches the root) reads: their
        #: bytes are paid in the final program (`_cheaper_sibling`)
        self.read_live: set[Instruction] = set()
        #: the nodes made for a dead operand (of a dead instruction, or a tuple element no one
        #: reads) that no live instruction reads yet, directly or through a node made from
        #: them: removed with their readers, so their bytes are paid only by a live user
        #: taking them (`_unpaid`)
        self.made_for_dead: set[Instruction] = set()
        #: what users see of an instruction planned so far (its reshard to its annotation)
        self.replacement: dict[Instruction, Instruction] = {}
        #: the instructions whose values reach the root, with the operands they pass on
        #: (a tuple's elements no get-tuple-element reads are dead: `live_operands`)
        self.live_operands = live_operands(comp)
        self.live = set(self.live_operands)
        #: the users of each instruction whose values reach the root (dead ones, e.g. an
        #: annotation's copy nothing reads, are removed later and need nothing)
        self.users = {inst: [u for u in users if u in self.live]
                      for inst, users in comp.users().items()}
        #: the instruction being planned and its annotation (`_result_needs`)
        self.planning: tuple[Instruction, HloSharding] | None = None
        self.looking_ahead = False
        #: whether a plan made while looking ahead went without needs it asked for
        self.needs_missed = False
        #: plans made while looking ahead, with the operands (and their shardings) they saw
        self.ahead: dict[Instruction, tuple[tuple, OpPlan]] = {}
        #: instructions planned so far
        self.planned: set[Instruction] = set()
        #: plans of users of an operand of the instruction being planned (`_wanted`), with
        #: the operands they saw
        self.sibling_plans: dict[Instruction, tuple[tuple, OpPlan]] = {}
        #: a value and a sharding its reshard to is taken as made while the later users'
        #: plans are priced with it (`_credit`)
        self.assumed: tuple[Instruction, HloSharding] | None = None
        #: whether a later user is being planned to price it for the instruction being
        #: planned (`_pricing`: no credits nor siblings' plans of its own, no plans kept)
        self.crediting = False
        #: per (value, sharding, later user), the bytes that user's plan saves when the
        #: value's reshard to that sharding is made, while one instruction is planned
        self.savings: dict[tuple, tuple[float, float]] = {}
        #: per instruction and the sharding it is planned in, `_users_recomputed`'s answer
        #: while it is planned
        self.recomputed_users: dict[tuple[Instruction, HloSharding], float] = {}

    def run(self) -> None:
        comp, b = self.comp, self.builder
        replacement = self.replacement
        for inst in comp.instructions:
            inst.operands = [replacement.get(o, o) for o in inst.operands]
            desired = inst.sharding
            self.planning = (inst, desired)
            self.savings.clear()
            self.recomputed_users.clear()
            if inst in self.arrivals:
                plan = OpPlan((), self.arrivals[inst], "parameter of a partitioned callee: "
                                                       "it arrives as its call site passes it")
            else:
                plan = self._planned_ahead(inst) or self._plan(inst)
            live = self.live_operands.get(inst, ())
            for i in self._operand_order(inst, plan.operands, live):
                operand, need = inst.operands[i], plan.operands[i]
                if operand.sharding is not need and operand.sharding != need:
                    made = len(b.instructions)
                    inst.operands[i] = self.reshard(operand, need, inst, f"operand {i}",
                                                    plan.reason)
                    self.read.add(inst.operands[i])
                    if i in live:
                        self._read_by_live(inst.operands[i])
                    else:
                        self.made_for_dead.update(b.instructions[made:])
            if self.unread and not self._passes_on(inst):
                for operand in inst.operands:
                    self.unread.pop(_element_value(operand), None)
            inst.sharding = plan.result
            b.append(inst)
            self.planned.add(inst)
            if self._computed_everywhere(inst):
                self.everywhere.add(inst)
            if plan.result is desired or plan.result == desired:
                continue            # what users see is then the annotation: nothing to make
            if desired is not None:
                record_partitioner_sharding(inst, comp.name, desired)
            seen = seen_by_users(inst.shape, desired, plan.result, self.ctx.known_needs(inst))
            if plan.result is not seen and plan.result != seen:
                replacement[inst] = node = self._reshard_result(inst, plan, seen)
                if self._read_by_one_user(inst, node):
                    self.unread[node] = node.operands[0].sharding
        root = replacement.get(comp.root, comp.root)
        if self.root_sharding is not None and root.sharding != self.root_sharding:
            root = self.reshard(root, self.root_sharding, comp.root, "result",
                                "a callee's root takes the sharding its call site planned")
        comp.instructions = b.instructions
        comp.root = root
        _collapse_chains(comp, self.ctx.num_devices, self.everywhere)
        _remove_dead(comp, self.created)

    def reshard(self, value: Instruction, target: HloSharding, user: Instruction, role: str,
                reason: str, look_through: bool = True) -> Instruction:
        """`value` laid out as `target` (a shared reshard node, or an earlier value). An
        element of a `tuple` (one this pass resharded, or the program's own, whose operands
        are resharded to its elements' shardings by then) is that element's own value
        (looked through like any reshard node: it is no result chain); a reshard node is
        resharded from its source when that moves fewer bytes (unless not to
        `look_through`: a result's `result_chain`), its source itself when it has
        `target`."""
        if value.opcode == "get-tuple-element" and value.operands[0].opcode == "tuple":
            value = _element_value(value)
            look_through = True
        if is_inserted_reshard(value):
            source = value.operands[0]
            if source.sharding == target:
                return source
            if look_through and self.ctx.cost(value.shape, source.sharding, target) < \
                    self.ctx.cost(value.shape, value.sharding, target) + \
                    (self.ctx.cost(value.shape, source.sharding, value.sharding)
                     if value in self.unread else 0.0):
                return self.reshard(source, target, user, role, reason)
        key = (id(value), target)
        if key in self.cache:
            return self.cache[key]
        sibling = self._cheaper_sibling(value, target)
        if sibling is not None:
            return self.reshard(sibling, target, user, role, reason)
        gathered = self._gathered_everywhere(value) if free_target(target) else None
        if gathered is not None and \
                not self._worth([gathered], self.ctx.cost(value.shape, value.sharding, target)):
            gathered = None
        if value in self.everywhere and target != value.sharding:
            node = self.reshard(self._as_replicated(value), target, user, role, reason)
        elif gathered is not None:
            node = self.reshard(gathered, target, user, role, reason)
        elif isinstance(value.shape, TupleShape):
            node = self._reshard_tuple(value, target, user, role, reason)
        elif (recomputed := self._recompute(value, target, user, role, reason)) is not None:
            node = recomputed
        elif (recomputed := self._recompute_replicated(value, target, user, role,
                                                        reason)) is not None:
            node = recomputed
        elif (whole := self._gathered_first(value, target)) is not None:
            gathered = self.reshard(value, whole, user, role,
                                    f"{reason} (gathered first: a later user reads it whole)")
            if gathered in self.everywhere:
                gathered = self._as_replicated(gathered)
            node = self.reshard(gathered, target, user, role, reason)
        elif broadcast_first(value.sharding, target) or self._broadcast_later(value, target):
            whole = self.reshard(value, HloSharding.replicate(), user, role, reason)
            node = self.reshard(whole, target, user, role, reason)
        else:
            metadata = reshard_metadata(value, value.sharding, target, user, role, reason)
            node = self.builder.add("custom-call", value.shape, [value],
                                    {"custom_call_target": SHARDING,
                                     "metadata": metadata},
                                    name=f"{value.name}.reshard", sharding=target)
        self.created.add(node)
        self.cache[key] = node
        self.resharded_to.setdefault(id(value), set()).add(target)
        if self._computed_everywhere(node):
            self.everywhere.add(node)
        return node

    def _operand_order(self, inst: Instruction, needs: tuple[HloSharding, ...],
                       live: frozenset[int]) -> list[int]:
        """The positions of `inst`'s operands in the order their reshards are made: operand
        order, except that where `inst` reads one array value live in several shardings
        other than its own, the positions reading it in the one made first
        (`reshard_order.first_made`) come first; the others are then made from the cheapest
        of the value and the reshards made before them (`_cheaper_sibling`;
        docs/design/partitioning.md#several-reads-of-one-value)."""
        operands = inst.operands
        count = min(len(operands), len(needs))
        if count < 2:
            return list(range(count))   # one operand or none: no value read twice
        reads: dict[Instruction, list[HloSharding]] = {}
        for i in range(count):
            operand, need = operands[i], needs[i]
            if i in live and need is not operand.sharding and need != operand.sharding:
                reads.setdefault(operand, []).append(need)
        first = set()
        for value, wanted in reads.items():
            if len(wanted) < 2:
                continue
            wanted = list(dict.fromkeys(wanted))
            sharding = value.sharding
            if len(wanted) < 2 or isinstance(value.shape, TupleShape) or \
                    sharding.has_unreduced or sharding.has_manual_leaf:
                continue
            held = frozenset([s for s, node in self._reshards_of(value)
                              if node in self.read_live and is_inserted_reshard(node)])
            k = first_made(value.shape, sharding, held, wanted, self.ctx.cost, self.ctx.total)
            if k:
                first.add((value, wanted[k]))
        if not first:
            return list(range(count))
        return sorted(range(count), key=lambda i: (inst.operands[i], needs[i]) not in first)

    def _read_by_live(self, node: Instruction) -> None:
        """Record that a live instruction reads `node`: its bytes, and those of the nodes it
        was made from, are paid in the final program."""
        if node in self.read_live:
            return
        self.read_live.add(node)
        if not self.made_for_dead:
            return
        stack = [node]
        while stack:
            made = stack.pop()
            self.made_for_dead.discard(made)
            stack += [o for o in made.operands if o in self.created and o not in self.read_live]

    def _unpaid(self, node: Instruction) -> float:
        """Bytes per device the final program sends only if a live user takes `node`: the
        reshards among it and the nodes it was made from (not yet read by a live instruction)
        that were made for dead operands only (`made_for_dead`; a dead instruction is removed
        with its reshards, so what they move is paid only by a live user taking them)."""
        total, stack, seen = 0.0, [node], set()
        while stack:
            made = stack.pop()
            if made in seen or made not in self.created or made in self.read_live:
                continue
            seen.add(made)
            if made in self.made_for_dead and is_inserted_reshard(made):
                total += self.ctx.cost(made.shape, made.operands[0].sharding, made.sharding)
            stack += made.operands
        return total

    def _worth(self, nodes: list[Instruction], budget: float) -> bool:
        """Whether taking `nodes` instead of a reshard moving `budget` bytes per device pays:
        they move no more bytes than that reshard (`_unpaid`: nothing, where a live
        instruction reads them already), and give the value whole (for later users too)."""
        return sum([self._unpaid(node) for node in nodes]) <= budget

    def _broadcast_later(self, value: Instruction, target: HloSharding) -> bool:
        """Whether `value`, on one device, goes to another device `target` through its
        broadcast to every partition because a user not planned yet reads it on more than one
        device (its broadcast is made anyway, and the other device takes the value from it
        without communication: XLA's reshard of a single-device value replicates it first)
        instead of by a send of its own; or because the plans of the users not planned yet
        save more bytes when they can read that broadcast (`_saved`: e.g. one running on the
        value's device and broadcasting its result reads the value whole instead) than the
        broadcast sends beyond the send (the joint choice over the value's users, as for
        `_credit`)."""
        sharding = value.sharding
        if sharding.kind != "maximal" or target.kind != "maximal" or \
                isinstance(value.shape, TupleShape):
            return False
        if any(need.is_replicated or broadcast_first(sharding, need)
               for need in self._wanted(value)):
            return True
        later = self._later_users(value)
        if not later or self.looking_ahead or self.crediting or self.planning is None:
            return False
        replicated = HloSharding.replicate()
        extra = self.ctx.cost(value.shape, sharding, replicated) - \
            self.ctx.cost(value.shape, sharding, target)
        return sum([self._saved(user, value, replicated) for user in later]) > extra

    def _gathered_first(self, value: Instruction, target: HloSharding) -> HloSharding | None:
        """The sharding in which a user of the tiled array `value` not planned yet reads it
        whole (replicated, or onto one device: its plan gathers the value on every device),
        when gathering it first and slicing `target`, a tiling, from the whole value moves
        fewer bytes than resharding to `target` and gathering after, from the cheapest of the
        value and its reshards (`reshard_order.first_made`, as for one instruction's reads).
        XLA's reshard cache holds the replicated value a reshard to one device goes through,
        and any later tiling is sliced from it; the later user then takes the gathered node
        made here (docs/design/partitioning.md#several-reads-of-one-value). None otherwise,
        and for the result of the instruction being planned (its users see it resharded)."""
        sharding = value.sharding
        if not (target.kind == sharding.kind == "tiled" and free_target(target) and
                free_target(sharding)) or isinstance(value.shape, TupleShape) or \
                len(self.users.get(value, ())) < 2 or self.planning is None or \
                self.planning[0] is value:
            return None
        whole = min([need for need in self._wanted(value)
                     if need.is_replicated or need.kind == "maximal"],
                    key=lambda s: (not s.is_replicated, s.to_text(False)), default=None)
        held = frozenset([s for s, node in self._reshards_of(value)
                          if node in self.read_live and is_inserted_reshard(node)])
        replicated = HloSharding.replicate()
        if whole is None:
            return replicated if self._saves_gathered(value, target, held) else None
        needs = [target, replicated]
        if first_made(value.shape, sharding, held, needs, self.ctx.cost, self.ctx.total) != 1:
            return None
        return whole

    def _saves_gathered(self, value: Instruction, target: HloSharding, held: frozenset) -> bool:
        """Whether gathering the tiled array `value` whole and slicing `target` from it moves
        fewer bytes from the busiest device, less what the plans of its users not planned yet
        save reading the whole value (`_saved`: none of them reads it whole as planned now, but
        one may run on it for less, e.g. a `dynamic-slice` that otherwise sums masked windows
        of its tiles), than resharding to `target` alone, each from the cheapest of the value
        and its reshards `held` (the joint choice over the value's users, as for `_credit`:
        XLA's reshard to a tiling goes through the replicated value where it has no direct
        technique, and its cache gives that value to the later users)."""
        if self.looking_ahead or self.crediting:
            return False
        later = self._later_users(value)
        if not later:
            return False
        replicated = HloSharding.replicate()
        made = [value.sharding, *held]
        direct = min([self.ctx.cost(value.shape, s, target) for s in made])
        gathered = min([self.ctx.cost(value.shape, s, replicated) for s in made])
        saved = sum([self._saved(user, value, replicated) for user in later])
        return gathered - saved < direct

    def _cheaper_sibling(self, value: Instruction, target: HloSharding) -> Instruction | None:
        """A reshard node of the array `value` that an instruction reads already (made for
        another user, so its bytes are paid) from which `target` moves fewer bytes than from
        `value` itself (e.g. replicated from a tiling held twice, instead of from the finer
        tiling: XLA's reshard cache), or None. Not for partial values (their summed form is
        the `result_chain`)."""
        if isinstance(value.shape, TupleShape) or value.sharding.has_unreduced or \
                value.sharding.has_manual_leaf:
            return None
        best, cost = None, self.ctx.cost(value.shape, value.sharding, target)
        for held, node in self._reshards_of(value):
            if node not in self.read_live or not is_inserted_reshard(node) or \
                    held.has_unreduced or held.has_manual_leaf:
                continue
            moved = self.ctx.cost(value.shape, held, target)
            if moved < cost:
                best, cost = node, moved
        return best

    def _reshard_result(self, inst: Instruction, plan: OpPlan,
                        desired: HloSharding) -> Instruction:
        """`inst`, computed in `plan.result`, resharded to its annotation `desired` (as its
        users see it: `seen_by_users`) for them; through the summed form of a partial result
        (`result_chain`) when some user's need reads that form and the reads through it move
        fewer bytes than without it (`summed_first`), each user then resharded from the
        cheapest one."""
        reason = _result_reason(inst, plan)
        chain = result_chain(plan.result, desired)
        value = inst
        needs = [read_as(inst.shape, need, desired) for need in self.ctx.known_needs(inst)]
        if summed_first(inst.shape, chain, needs, self.ctx.cost):
            value = self.reshard(inst, chain[1], inst, "result", reason)
        return self.reshard(value, desired, inst, "result", reason, look_through=False)

    def _read_by_one_user(self, inst: Instruction, node: Instruction) -> bool:
        """Whether `node`, the reshard of the array `inst` to its annotation, has one user, not
        planned yet, that may read `inst` itself instead (partial values included: the user
        then sums them into what it reads; no manual values). `inst` a get-tuple-element of a
        `tuple` is its element's value there (`_element_value`: the reshard is made from
        that). A `tuple` that passes it on (`_passes_on`) leaves it unread for the readers of
        its get-tuple-elements."""
        return is_inserted_reshard(node) and \
            node.operands[0] in (inst, _element_value(inst)) and \
            len(self.users.get(inst, ())) == 1 and inst is not self.comp.root and \
            not isinstance(inst.shape, TupleShape) and not inst.sharding.has_manual_leaf

    def _result_needs(self, inst: Instruction) -> tuple[HloSharding, ...]:
        """The shardings the users of `inst`, the instruction being planned, will read it in:
        each user's plan for `inst` in its annotation (users are planned ahead, one level),
        and the annotation where `inst` is the root. Empty for any other instruction (and
        while looking ahead)."""
        if self.looking_ahead or self.planning is None or self.planning[0] is not inst:
            self.needs_missed = self.needs_missed or self.looking_ahead
            return ()
        desired = self.planning[1]
        if inst is not self.comp.root and isinstance(inst.shape, TupleShape) and \
                all(isinstance(e, ArrayShape) for e in inst.shape.elements) and \
                self.users[inst] and \
                all(u.opcode == "get-tuple-element" for u in self.users[inst]):
            return self._element_needs(inst, desired)
        needs = [desired] if inst is self.comp.root else []
        saved, inst.sharding = inst.sharding, desired
        self.looking_ahead = True
        try:
            for user in self.users[inst]:
                needs += self._needs_of(user, inst)
        finally:
            inst.sharding = saved
            self.looking_ahead = False
        return tuple(dict.fromkeys(needs))

    def _unread_elements(self, inst: Instruction) -> tuple[HloSharding, ...]:
        """`inst`'s annotation with each element no live instruction reads as `{unknown}`, as
        one need (`PlanContext.unread_elements`), where `inst` is a tuple-shaped op (not the
        root) of arrays that only get-tuple-elements read and some element has no reader:
        nothing reshards that element, whatever plan its users' needs would pick. Empty
        otherwise."""
        users = self.users.get(inst)
        if inst is self.comp.root or not users or not isinstance(inst.shape, TupleShape) or \
                not all(isinstance(e, ArrayShape) for e in inst.shape.elements) or \
                not all(u.opcode == "get-tuple-element" for u in users):
            return ()
        read = {u.attr("index") for u in users}
        leaves = list(inst.sharding.leaf_shardings(inst.shape))
        if len(read) == len(leaves):
            return ()
        return (HloSharding.tuple([leaf if i in read else HloSharding.unknown()
                                   for i, leaf in enumerate(leaves)]),)

    def _needs_of(self, user: Instruction, value: Instruction) -> list[HloSharding]:
        """The shardings `user`'s plan (made ahead, one level) reads `value` in. A `tuple`
        (not the root) that only get-tuple-elements read passes `value` on unchanged: its
        needs at a position holding `value` are those the get-tuple-elements of that element
        have it read in (`_element_reads`), as for `_element_needs`; insert-reshards reshards
        each reader's operand from `value`'s own nodes (a get-tuple-element of a tuple is
        looked through), and XLA's import folds such a pair away."""
        if self._passes_on(user):
            positions = {i for i, o in enumerate(user.operands)
                         if self.replacement.get(o, o) is value}
            readers = [e for e in self.users[user] if e.attr("index") in positions]
            if readers and {e.attr("index") for e in readers} == positions:
                needs = []
                for element in readers:
                    needs += self._element_reads(element)
                return needs
        return self._needs_of_plan(user, value)

    def _passes_on(self, inst: Instruction) -> bool:
        """Whether `inst` is a `tuple` (not the root) that only get-tuple-elements read: it
        passes its operands on unchanged (what reads them is the readers of those elements)."""
        return inst.opcode == "tuple" and inst is not self.comp.root and \
            bool(self.users.get(inst)) and \
            all([u.opcode == "get-tuple-element" for u in self.users[inst]])

    def _element_reads(self, element: Instruction) -> list[HloSharding]:
        """The shardings the get-tuple-element `element` of a tuple has the element read in:
        what its readers' plans (made ahead) read it in, and its sharding where it is the root.
        Where its own sharding differs from the tuple's, its result is resharded to it from
        the element's value, and each reader reshards from that node's source (the element's
        value, looked through) where that moves fewer bytes: the readers' needs are the
        element's."""
        needs = [element.sharding] if element is self.comp.root else []
        for reader in self.users[element]:
            needs += self._needs_of(reader, element)
        return needs

    def _needs_of_plan(self, user: Instruction, value: Instruction) -> list[HloSharding]:
        """The shardings `user`'s plan (made ahead, one level) reads `value` in (`needs_missed`
        is set where that plan went without needs it asked for, and stays set)."""
        user.operands = [self.replacement.get(o, o) for o in user.operands]
        plan = self._planned_ahead(user)
        if plan is None:
            missed, self.needs_missed = self.needs_missed, False
            plan = self._plan(user)
            if not self.needs_missed and not self.crediting:
                self.ahead[user] = (_plan_key(user), plan)
            self.needs_missed = self.needs_missed or missed
        return [need for operand, need in zip(user.operands, plan.operands) if operand is value]

    def _element_needs(self, inst: Instruction, desired: HloSharding
                       ) -> tuple[HloSharding, ...]:
        """`_result_needs` of a tuple of arrays only read by `get-tuple-element`s (a sort's, a
        scatter's): each element is read as its get-tuple-elements have it read
        (`_element_reads`: their readers' plans, the root's annotation); an element nobody
        reads as `{unknown}` (any sharding: nothing reshards it). One tuple per
        k-th need of the elements (an element with fewer needs repeats its last), so that each
        need is priced once."""
        leaves = list(desired.leaf_shardings(inst.shape))
        per_leaf: list[list[HloSharding]] = [[] for _ in leaves]
        self.looking_ahead = True
        try:
            for element in self.users[inst]:
                index = element.attr("index")
                per_leaf[index] += self._element_reads(element)
        finally:
            self.looking_ahead = False
        per_leaf = [list(dict.fromkeys(needs)) or [HloSharding.unknown()] for needs in per_leaf]
        return tuple(HloSharding.tuple([needs[min(k, len(needs) - 1)] for needs in per_leaf])
                     for k in range(max(len(needs) for needs in per_leaf)))

    def _had(self, value: Instruction, needs: tuple[HloSharding, ...]) -> frozenset:
        """The shardings `value` was already resharded to for earlier users, and, where the
        plans asked about (`needs`: theirs for `value`) reshard it otherwise, those its later
        users' plans read it in (`_wanted`): shared nodes, so a plan of the instruction being
        planned needing one of them moves no more bytes for it than is moved anyway. While a
        later user is priced with `value`'s replicated reshard assumed made (`_saved`), every
        array sharding the plans ask about is had too: sliced or copied from that node."""
        earlier = frozenset(self.resharded_to.get(id(value), ()))
        if self.made_for_dead:
            earlier = frozenset([held for held in earlier
                                 if self._unpaid(self.cache[(id(value), held)]) == 0])
        if self.assumed is not None and self.assumed[0] is value:
            earlier |= {self.assumed[1]}
            if _gives_whole(value.sharding, self.assumed[1]) and \
                    not isinstance(value.shape, TupleShape):
                earlier |= {need for need in needs if free_target(need)}
        if len(self.users.get(value, ())) < 2:
            return earlier
        sharding = value.sharding
        for need in needs:
            if need is not sharding and need != sharding and need not in earlier:
                break
        else:
            return earlier
        return earlier | self._wanted(value)

    def _credit(self, inst: Instruction, needs: Sequence[tuple[HloSharding, ...]],
                had: Sequence[frozenset]) -> tuple[tuple[tuple[HloSharding, float], ...], ...]:
        """Per operand of `inst` (`Signature.operand_credit`), the credits `_operand_credit`
        gives it, given the plans' needs of each operand (`needs`) and the shardings `_had`
        gives each (`had`); empty where none has any, while looking ahead and while a later
        user is planned for a credit."""
        if self.looking_ahead or self.crediting or self.planning is None:
            return ()
        credits = tuple([self._operand_credit(o, n, h)
                         for o, n, h in zip(inst.operands, needs, had)])
        return credits if any(credits) else ()

    def _operand_credit(self, value: Instruction, needs: tuple[HloSharding, ...],
                        had: frozenset) -> tuple[tuple[HloSharding, float], ...]:
        """For each sharding the plans of the live instruction being planned read its live
        operand `value` in (`needs`) that no shared node has yet (`had`), the share of that
        reshard the users of `value` not planned yet pay for: the bytes their plans (made
        ahead, `_saved`) save when they can read that node too (XLA's reshard cache gives
        every user of a value the one reshard to a sharding), over the reshard's bytes, at
        most 1. A plan reading it is then priced with the rest only: the choice is a joint
        one over the value's users (e.g. a `pad` whose halo exchange is cheaper alone, where
        gathering its operand makes a later `topk` of it free; a `dynamic-update-slice` whose
        operand a later convolution reads gathered). Asked for the operands of every op, as
        `had` is used (`PlanContext.signature`); empty for a value computed again for free
        and for one without later users."""
        if len(self.users.get(value, ())) < 2:
            return ()
        sharding = value.sharding
        needs = [need for need in dict.fromkeys(needs)
                 if need != sharding and need not in had and free_target(need)]
        if not needs or isinstance(value.shape, TupleShape) or not free_target(sharding):
            return ()
        planning = self.planning[0]
        operands = planning.operands
        if not any([operands[i] is value for i in self.live_operands.get(planning, ())
                    if i < len(operands)]):
            return ()
        later = self._later_users(value)
        if not later or recomputed_for_free(value):
            return ()
        credit = []
        for need in needs:
            moved = self.ctx.cost(value.shape, sharding, need)
            if moved == 0:
                continue
            saved = [self._savings(user, value, need) for user in later]
            busiest, total = sum([s[0] for s in saved]), sum([s[1] for s in saved])
            if busiest > 0 or total > 0:
                moved_total = self.ctx.total(value.shape, sharding, need)
                credit.append((need, (min(1.0, busiest / moved),
                                      min(1.0, total / moved_total) if moved_total else 0.0)))
        return tuple(credit)

    def _saved(self, user: Instruction, value: Instruction, need: HloSharding) -> float:
        """The bytes `user`'s plan saves on its busiest device (`_savings`)."""
        return self._savings(user, value, need)[0]

    def _savings(self, user: Instruction, value: Instruction,
                 need: HloSharding) -> tuple[float, float]:
        """The bytes `user`'s plan saves, on its busiest device and on all devices together
        (`total_of`), when `value`'s reshard to `need` is made for another user: planned ahead with its operands as they are now, and where that plan (made
        without its own users' needs) reads the node at all (`_reads_made`), or where the node
        gives `user` whole for free (`_recomputed_from`), planned again with and without it,
        priced with what its own users read it in (their plans made ahead: `_result_needs`,
        not kept); in the second case its result's reshards to those reads cost nothing with
        the node (each is computed again whole from it: `_recompute_replicated`)."""
        key = (id(value), need, user)
        if key in self.savings:
            return self.savings[key]
        user.operands = [self.replacement.get(o, o) for o in user.operands]
        self.looking_ahead = True
        self.assumed = (value, need)
        try:
            quick = self._plan(user)
        finally:
            self.assumed = None
            self.looking_ahead = False
        recomputed = self._recomputed_from(user, value, need)
        if not recomputed and not any([o is value and _reads_made(value.sharding, need, n)
                                       for o, n in zip(user.operands, quick.operands)]):
            self.savings[key] = (0.0, 0.0)  # its plan does not read the node even when made
        else:
            with self._pricing(user):
                if recomputed:
                    recomputed = self._read_whole_by_users(user)
                plan = self._plan(user)
                alone = self.ctx.plan_cost(user, plan), self.ctx.total_of(user, plan)
                self.assumed = (value, need)
                plan = self._plan(user)
                shared = self.ctx.plan_cost(user, plan), self.ctx.total_of(user, plan)
                if recomputed:
                    shared = (shared[0] - self.ctx.result_cost(user, plan),
                              shared[1] - self.ctx.result_cost(user, plan, totals=True))
            self.savings[key] = (max(0.0, alone[0] - shared[0]), max(0.0, alone[1] - shared[1]))
        return self.savings[key]

    @contextlib.contextmanager
    def _pricing(self, user: Instruction):
        """The bracket in which `user`, a user of the instruction being planned not planned
        yet, is priced as if it were being planned (`planning`: its plans are priced with what
        its own users read it in, `_result_needs`) for the instruction being planned
        (`crediting`: no credits, siblings' plans or users computed again of its own, no plan
        kept); the body may take a reshard as made (`assumed`). Afterwards `planning`,
        `crediting` and `assumed` are as they were, and the needs of `user`'s users, where
        only this asked for them, are forgotten (asked again when a plan of `user` next asks:
        `PlanContext.forget_needs`). Used by `_saved`, `_replicated_saving` and
        `_recomputed_cost`."""
        planning, crediting, assumed = self.planning, self.crediting, self.assumed
        self.planning = (user, user.sharding)
        known = self.ctx.known_needs(user)
        self.crediting = True
        try:
            yield
        finally:
            self.assumed = assumed
            self.crediting = crediting
            self.planning = planning
            if not known:
                self.ctx.forget_needs(user)

    def _users_recomputed(self, inst: Instruction) -> float:
        """The bytes the plans of the users of `inst`, the instruction being planned, cost
        beyond reading it (`_recomputed_cost`, with what their own users read them in:
        `_result_needs`) where `inst` computed replicated gives them whole for free
        (`_recomputed_from`): a plan computing
        `inst` replicated saves them (`Signature.users_recomputed`; e.g. an op whose replicated
        result a `reshape` reads, itself read whole by the root, where the reshape's halo
        exchange on the tiled result then needs a gather after it:
        docs/design/partitioning.md#users-computed-again-whole), and what the other users'
        plans save reading it from its replicated form (`_replicated_saving`). 0.0 while
        looking ahead and for any other instruction; asked per sharding `inst` is planned in
        (its annotation, or one device an operand lives on: `_plan`). Only users some reader
        may take whole are priced
        (`_may_be_read_whole`): a user all of whose readers want it tiled is read in its own
        tiling either way, and pricing its plan would cost a plan per user of every value."""
        if self.looking_ahead or self.crediting or self.planning is None or \
                self.planning[0] is not inst or isinstance(inst.shape, TupleShape):
            return 0.0
        key = (inst, inst.sharding)
        if key not in self.recomputed_users:
            replicated = HloSharding.replicate()
            self.recomputed_users[key] = sum(
                [self._recomputed_cost(user) if self._recomputed_from(user, inst, replicated)
                 else self._replicated_saving(user, inst)
                 for user in self._later_users(inst) if self._may_be_read_whole(user)])
        return self.recomputed_users[key]

    def _replicated_saving(self, user: Instruction, inst: Instruction) -> float:
        """The bytes `user` (not computed again whole from `inst`) saves when `inst`, the
        instruction being planned, is computed replicated: its plan priced with what its own
        users read it in (`_result_needs`), reading `inst` through its annotation, less the same
        plan with `inst`'s replicated form had (any sharding of it sliced or copied from that
        node, as insert-reshards reshards a result's reshard from its source), less the reads
        of `inst` its plan made ahead (one level, without its own users' needs) asks, which the
        candidates of `inst` price already. 0.0 where some of those users' needs are not
        known, and for a `tuple` that only passes `inst` on (its readers' reads are the
        needs `inst`'s candidates price), an op whose value depends on the partition, runs
        control flow or draws random numbers (`NOT_EVERYWHERE`), and a manual one."""
        if user.opcode in NOT_EVERYWHERE or self._passes_on(user) or \
                user.sharding.has_manual_leaf:
            return 0.0
        user.operands = [self.replacement.get(o, o) for o in user.operands]
        self.looking_ahead = True
        try:
            reads = sum([self.ctx.cost(inst.shape, inst.sharding, need)
                         for need in dict.fromkeys(self._needs_of(user, inst))])
        finally:
            self.looking_ahead = False
        with self._pricing(user):
            self.needs_missed = False
            alone = self.ctx.plan_cost(user, self._plan(user))
            if self.needs_missed:
                return 0.0
            self.assumed = (inst, HloSharding.replicate())
            shared = self.ctx.plan_cost(user, self._plan(user))
        return max(0.0, alone - shared - reads)

    def _may_be_read_whole(self, user: Instruction) -> bool:
        """Whether a reader of `user` may take it whole: `user` is the root, or a reader's own
        sharding is not an array tiling (replicated, on one device, a tuple's)."""
        if user is self.comp.root:
            return True
        return any([r.sharding is None or r.sharding.is_tuple or
                    r.sharding.kind in ("replicated", "maximal")
                    for r in self.users.get(user, ())])

    def _recomputed_cost(self, user: Instruction) -> float:
        """The bytes `user`'s plan sends itself and has its result moved to where its own users
        read it in (its operands' reshards are not counted: the plans of the instruction being
        planned price their result where `user` reads it already), or, for a `broadcast`, its
        operand's reshards to compute it again in each of those reads where that moves fewer
        bytes (`_recompute`); 0.0 where those reads are not all known and sliced from a value
        computed again whole (`_read_whole_by_users`)."""
        user.operands = [self.replacement.get(o, o) for o in user.operands]
        with self._pricing(user):
            if not self._read_whole_by_users(user):
                return 0.0
            plan = self._plan(user)
            cost = plan.cost + self.ctx.result_cost(user, plan)
            needs = self.ctx.known_needs(user)
            if user.opcode == "broadcast" and needs and cost > 0:
                operand, devices = user.operands[0], self.ctx.num_devices
                again = sum([self.ctx.cost(operand.shape, operand.sharding,
                                           need if need.kind == "maximal" else
                                           broadcast_operand_sharding(user, need, devices))
                             for need in dict.fromkeys(needs)])
                cost = min(cost, again)
            return cost

    def _read_whole_by_users(self, user: Instruction) -> bool:
        """Whether every sharding the users of `user` (being priced for a credit) read it in is
        one a value computed again whole is sliced to (`free_target`), each known: none of
        their plans made ahead went without needs of its own it asked for (a plan that would
        choose by those reads may read `user` otherwise once they are known)."""
        self.needs_missed = False
        needs = self.ctx.users_needs(user)
        return not self.needs_missed and all([free_target(n) for n in needs])

    def _recomputed_from(self, user: Instruction, value: Instruction,
                         need: HloSharding) -> bool:
        """Whether `value`'s replicated reshard (`need`), once made, gives `user` whole on every
        partition without communication: `user` is a pure array op (not a contraction) whose
        other operands are had replicated so (`_replicated_source`), which insert-reshards
        computes again whole for any user reading it in another sharding."""
        if not need.is_replicated or user.opcode in NOT_RECOMPUTED or \
                isinstance(user.shape, TupleShape) or user.sharding.has_manual_leaf or \
                user.sharding.has_unreduced:
            return False
        return all([o is value or self._replicated_source(o) is not None
                    for o in user.operands])

    def _broadcast(self, value: Instruction, had: frozenset) -> bool:
        """Whether `value`, on one device, is broadcast to every partition for a live user
        other than the instruction being planned (so a plan reads it whole, or sliced to any
        tiling, at no cost): some reshard of it off its device that a live instruction reads
        (each starts from its broadcast: `broadcast_first`), or a user not planned yet reading
        it replicated or tiled (among `had`, the shardings `_had` gives it: a reshard made
        first for a dead instruction counts where such a user reads it too). A broadcast made
        only for a dead instruction is removed with it and is not counted."""
        sharding = value.sharding
        earlier = self.resharded_to.get(id(value), ())
        later = self._wanted(value) if any([s in earlier for s in had]) else frozenset()
        if any([(s not in earlier or s in later) and
                (s.is_replicated or broadcast_first(sharding, s)) for s in had]):
            return True
        return any([node in self.read_live for held, node in self._reshards_of(value)
                    if held.kind != "maximal"])

    def _wanted(self, value: Instruction) -> frozenset:
        """The shardings the users of `value` not planned yet, other than the instruction
        being planned, read it in: their plans with their operands as they are now (made
        ahead, one level, and remembered while those operands stay the same). Empty while
        looking ahead, for a value computed again for free and for one with a single user."""
        if self.looking_ahead or self.crediting or self.planning is None:
            return frozenset()
        later = self._later_users(value)
        if not later or recomputed_for_free(value):
            return frozenset()
        wanted = set()
        self.looking_ahead = True
        try:
            for user in later:
                user.operands = [self.replacement.get(o, o) for o in user.operands]
                key = _plan_key(user)
                known = self.sibling_plans.get(user)
                if known is None or known[0] != key:
                    known = self.sibling_plans[user] = (key, self._planned_ahead(user)
                                                        or self._plan(user))
                wanted.update(need for operand, need in zip(user.operands, known[1].operands)
                              if operand is value and need != value.sharding)
        finally:
            self.looking_ahead = False
        return frozenset(wanted)

    def _later_users(self, value: Instruction) -> list[Instruction]:
        """The live users of `value` not planned yet (nor arriving as a call site passes
        them: `arrivals`), other than the instruction being planned: those whose plans a
        choice for the instruction being planned prices jointly with its own (`_wanted`,
        `_operand_credit`, `_users_recomputed`, `_broadcast_later`, `_saves_gathered`)."""
        planning = self.planning[0] if self.planning is not None else None
        return [u for u in self.users.get(value, ()) if u is not planning
                and u not in self.planned and u not in self.arrivals]

    def _planned_ahead(self, inst: Instruction) -> OpPlan | None:
        """The plan made for `inst` while looking ahead, if its operands are still the same
        values in the same shardings (and no needs of its own were missed then)."""
        ahead = self.ahead.get(inst)
        return ahead[1] if ahead is not None and ahead[0] == _plan_key(inst) else None

    def _plan(self, inst: Instruction) -> OpPlan:
        """The rule's plan for `inst`, or, when cheaper, the rule's plan for running `inst` on
        the device of one of its operands that lives on one device (its result then resharded
        to its annotation: e.g. a reduce of a value on one device reduces there and broadcasts
        the small result instead of broadcasting the large input)."""
        rule = rule_for(inst, self.module.computations)
        plan = rule.plan(inst, self.ctx)
        desired = inst.sharding
        if inst.opcode in NOT_EVERYWHERE or inst.opcode in ("tuple", "get-tuple-element") or \
                desired.unique_device is not None or desired.has_manual_leaf:
            return plan
        devices = [device for o in inst.operands
                   if (device := o.sharding.unique_device) is not None]
        if not devices:
            return plan
        devices = sorted(set(devices))
        cost = self.ctx.plan_cost(inst, plan)
        for device in devices:
            inst.sharding = maximal_for(inst.shape, device)
            try:
                alternative = rule.plan(inst, self.ctx)
            finally:
                inst.sharding = desired
            alternative_cost = self.ctx.plan_cost(inst, alternative)
            if alternative_cost < cost:
                plan, cost = alternative, alternative_cost
        return plan

    def _recompute_replicated(self, value: Instruction, target: HloSharding, user: Instruction,
                              role: str, reason: str) -> Instruction | None:
        """`value` computed again whole on every partition from replicated forms of its
        operands (not a contraction, whose whole work on every partition would cost more than
        the bytes it saves), when each is had without communication (a replicated value, the replicated
        value a reshard node was sliced from, a value on one device computed everywhere, a
        constant or an iota), then sliced to `target`: no bytes instead of a collective (as
        XLA's partitioned programs do for a tiled value of replicated inputs needed whole).
        None when `value` is not a pure, deterministic array op or an operand is not had so."""
        element = value.opcode == "get-tuple-element"
        if value.opcode in NOT_RECOMPUTED or \
                (value in self.created and not element) or \
                isinstance(value.shape, TupleShape) or not free_target(target) or \
                value.sharding.has_manual_leaf or not value.operands or \
                self.ctx.cost(value.shape, value.sharding, target) == 0:
            return None
        replicated = HloSharding.replicate()
        budget = self.ctx.cost(value.shape, value.sharding, target)
        if element:
            whole = self._recomputed_whole(value.operands[0], user, role, reason, budget)
            if whole is None:
                return None
            node = self.builder.add(value.opcode, value.shape, [whole], dict(value.attrs),
                                    name=f"{value.name}.recomputed", sharding=replicated)
        else:
            node = self._recomputed_whole(value, user, role, reason, budget)
            if node is None:
                return None
        self.created.add(node)
        if target == replicated:
            return node
        return self.reshard(node, target, user, role, reason)

    def _recomputed_whole(self, value: Instruction, user: Instruction, role: str,
                          reason: str, budget: float) -> Instruction | None:
        """`value` (an array or a tuple) computed again, replicated, from the replicated forms
        of its operands, each had without communication (`_replicated_source`); one node per
        value. None when `value` is not a pure op (not a contraction) of such operands, or
        when those forms are reshards made for dead users only that move `budget` bytes per
        device or more (`_worth`)."""
        key = (id(value), "whole")
        if key in self.cache:
            node = self.cache[key]
            return node if self._worth([node], budget) else None
        if value.opcode in NOT_RECOMPUTED or value in self.created or \
                value.sharding.has_manual_leaf or not value.operands:
            return None
        sources = [self._replicated_source(o) for o in value.operands]
        if any(source is None for source in sources) or not self._worth(sources, budget):
            return None
        replicated = HloSharding.replicate()
        sources = [self.reshard(o, replicated, user, f"{role} (recomputed)", reason)
                   if o.sharding != replicated else o for o in sources]
        node = self.builder.add(value.opcode, value.shape, sources, dict(value.attrs),
                                name=f"{value.name}.recomputed",
                                sharding=replicated_for(value.shape))
        self.created.add(node)
        self.cache[key] = node
        return node

    def _replicated_source(self, operand: Instruction) -> Instruction | None:
        """`operand`, or a value it is a reshard of, or a reshard of it that every partition
        holds whole (its replicated reshard a live instruction reads, or one onto a device),
        that gives its replicated form without communication, or `operand` computed again
        whole from such values (`recomputed_for_free` not `deep`: with the op computed again
        from it, the two levels the rules' costs count as free); None when there is none."""
        if operand.sharding.is_replicated:
            return operand
        if is_inserted_reshard(operand) and operand.operands[0].sharding.is_replicated:
            return operand.operands[0]
        if operand in self.everywhere:
            return self._as_replicated(operand)
        if recomputed_for_free(operand, deep=False):
            return operand
        whole = self.cache.get((id(operand), HloSharding.replicate()))
        if whole is not None and whole in self.read_live:
            return whole
        return self._gathered_everywhere(operand)

    def _gathered_everywhere(self, value: Instruction) -> Instruction | None:
        """The replicated form of `value` taken from a reshard of it that an instruction reads
        already and every partition holds whole (onto one device: its plan gathers the value
        on every device), the one whose bytes are least unpaid (`_unpaid`: one made for a
        dead user only is paid by taking it), or None. (A result's reshard to its annotation
        nobody reads is removed: taking the value from it would make it.)"""
        gathered = [node for _, node in self._reshards_of(value)
                    if node in self.everywhere and node in self.read]
        if not gathered:
            return None
        return self._as_replicated(min(gathered, key=self._unpaid))

    def _reshards_of(self, value: Instruction) -> list[tuple[HloSharding, Instruction]]:
        """(sharding, reshard node) of every reshard of `value` made so far, in the order of the
        shardings' text (so that a choice among them does not depend on the order they were
        made in)."""
        return [(held, self.cache[(id(value), held)])
                for held in sorted(self.resharded_to.get(id(value), ()),
                                   key=lambda s: s.to_text(False))]

    def _computed_everywhere(self, inst: Instruction) -> bool:
        """Whether `inst`, on one device, holds the whole value on every partition: partitions
        run an instruction on one device like any other, so a pure, deterministic op whose
        operands every partition holds whole (replicated or themselves computed everywhere)
        computes the same value everywhere, as does a reshard node onto one device from such a
        value (a copy) or from a value not on one device (its plan gives every device the
        whole value: `reshard_plan.py`). XLA's partitioner moves such values to another device
        or to all of them without a collective too."""
        sharding = inst.sharding
        if sharding.kind != "maximal" or isinstance(inst.shape, TupleShape):
            return False
        if is_inserted_reshard(inst):
            source = inst.operands[0].sharding
            return self._whole_everywhere(inst.operands[0]) or (
                source.kind != "maximal" and not source.has_manual_leaf)
        if inst.opcode in NOT_EVERYWHERE or inst in self.arrivals:
            return False
        return all(self._whole_everywhere(o) for o in inst.operands)

    def _whole_everywhere(self, value: Instruction) -> bool:
        return value in self.everywhere or (value.sharding is not None and
                                            value.sharding.is_replicated)

    def _as_replicated(self, value: Instruction) -> Instruction:
        """A `{replicated}` view of `value`, which every partition computes whole (a copy)."""
        key = (id(value), "everywhere")
        if key not in self.cache:
            metadata = reshard_metadata(value, value.sharding, HloSharding.replicate(), value,
                                        "result", "every partition computes this value whole")
            node = self.builder.add("copy", value.shape, [value], {"metadata": metadata},
                                    name=f"{value.name}.everywhere",
                                    sharding=HloSharding.replicate())
            self.created.add(node)
            self.cache[key] = node
        return self.cache[key]

    def _recompute(self, value: Instruction, target: HloSharding, user: Instruction, role: str,
                   reason: str) -> Instruction | None:
        """`value` computed again directly in `target` (a `free_target`) when that moves fewer
        bytes than resharding it: a constant (no bytes: a splat one shard-shaped, else whole
        and sliced locally), an iota (no bytes), a broadcast from its operand resharded to the
        tiling of the kept dims (or to the target's device): no bytes from a replicated
        operand (`recomputed_for_free`). None otherwise."""
        if value.opcode not in ("constant", "iota", "broadcast") or \
                isinstance(value.shape, TupleShape) or not free_target(target) or \
                value.sharding.has_manual_leaf or value.sharding.has_unreduced:
            return None
        direct = self.ctx.cost(value.shape, value.sharding, target)
        if direct == 0:
            return None
        operands = []
        sharding = target
        if value.opcode == "broadcast":
            # from the replicated form of the operand when it is had for free
            operand = self._replicated_source(value.operands[0]) or value.operands[0]
            need = target if target.kind == "maximal" else \
                broadcast_operand_sharding(value, target, self.ctx.num_devices)
            if self.ctx.cost(operand.shape, operand.sharding, need) + \
                    self._unpaid(operand) >= direct:
                return None
            operands.append(operand if operand.sharding == need else
                            self.reshard(operand, need, user, f"{role} (recomputed)", reason))
        elif value.opcode == "constant" and target.is_tiled and not is_splat(value):
            sharding = HloSharding.replicate()         # materialised whole, then sliced
        node = self.builder.add(value.opcode, value.shape, operands, dict(value.attrs),
                                name=f"{value.name}.recomputed", sharding=sharding)
        node.literal = value.literal
        if sharding != target:
            self.created.add(node)
            return self.reshard(node, target, user, role, reason)
        return node

    def _reshard_tuple(self, value, target, user, role, reason) -> Instruction:
        b = self.builder
        metadata = reshard_metadata(value, value.sharding, target, user, role, reason)
        elements = []
        for i, shape in enumerate(value.shape.elements):
            have = value.sharding.subsharding(value.shape, (i,))
            need = target.subsharding(value.shape, (i,))
            element = b.add("get-tuple-element", shape, [value],
                            {"index": i, "metadata": metadata}, name=f"{value.name}.{i}",
                            sharding=have)
            self.created.add(element)
            if have != need:
                element = self.reshard(element, need, user, f"{role} element {i}", reason)
            elements.append(element)
        node = b.add("tuple", value.shape, elements, {"metadata": metadata},
                     name=f"{value.name}.resharded", sharding=target)
        self.created.add(node)
        return node



def _reads_made(sharding: HloSharding, made: HloSharding, need: HloSharding) -> bool:
    """Whether a plan reading a value held in `sharding` in `need` reads it from its reshard
    to `made` without communication: the same sharding, a copy onto one device of a replicated
    node, any array sharding from a reshard onto one device that gives every partition the
    whole value (`_gives_whole`), or, for a value on one device whose
    reshard to `made` is its broadcast or goes through it (`broadcast_first`), any array
    sharding taken from that broadcast (`free_target`: itself, a tiling sliced from it, a copy
    onto another device)."""
    if need == made or (made.is_replicated and need.kind == "maximal"):
        return True
    if made.kind == "maximal" and _gives_whole(sharding, made):
        return free_target(need)
    return sharding.kind == "maximal" and (made.is_replicated or broadcast_first(sharding, made)) \
        and free_target(need)


def _gives_whole(sharding: HloSharding, made: HloSharding) -> bool:
    """Whether every partition holds the whole value from its reshard from `sharding` to
    `made`: a replicated one, or one onto a device from a value on no single device (the
    reshard plan gathers it on every device: `_computed_everywhere`); users read it then in
    any array sharding without communication (the replicated value, a tiling sliced from it,
    a copy onto a device)."""
    if not free_target(sharding):
        return False
    return made.is_replicated or (made.kind == "maximal" and sharding.kind != "maximal")


def _element_value(value: Instruction) -> Instruction:
    """`value`, or where it is a get-tuple-element of a `tuple`, that element's own value
    (looked through again while that is one too)."""
    while value.opcode == "get-tuple-element" and value.operands[0].opcode == "tuple":
        value = value.operands[0].operands[value.attr("index")]
    return value


def _plan_key(inst: Instruction) -> tuple:
    """What a plan of `inst` made ahead must still match: its sharding, its operands and
    theirs."""
    operands = inst.operands
    return (inst.sharding, tuple([id(o) for o in operands]),
            tuple([o.sharding for o in operands]))


def _result_reason(inst: Instruction, plan) -> str:
    if any(leaf.has_unreduced for leaf in plan.result.leaves()):
        dims = "contracting" if inst.opcode == "dot" else "reduced"
        return f"the local {inst.opcode} leaves partial results over its tiled {dims} dims " \
               f"({plan.reason})"
    return f"the local {inst.opcode} is laid out differently ({plan.reason})"


def _collapse_chains(comp: Computation, num_devices: int,
                     everywhere: set[Instruction]) -> None:
    """Replace `reshard(reshard(x))` whose inner node has no other use by one reshard of `x` when
    the direct plan moves no more bytes (from the busiest device, then from all). Only uses
    whose values reach the root count (`live_operands`): a tuple of reshard nodes whose
    get-tuple-element nobody reads any more, since its reader took the element's node itself,
    is removed with the program's dead code. A chain whose outer node lives on one device but
    is computed whole on every partition (in `everywhere`) only because its inner node is
    replicated stays: its users were planned on that, and the direct reshard would give the
    value to its device alone."""
    users = comp.users()
    live = live_operands(comp)
    for inst in comp.instructions:
        if not is_inserted_reshard(inst):
            continue
        inner = inst.operands[0]
        if not is_inserted_reshard(inner) or inner is comp.root or \
                [u for u in users[inner] if _reads_live(u, inner, live)] != [inst]:
            continue
        source = inner.operands[0]
        if inst in everywhere and source not in everywhere and not source.sharding.is_replicated:
            continue
        first = plan_reshard(inner.shape, source.sharding, inner.sharding, num_devices)
        second = plan_reshard(inst.shape, inner.sharding, inst.sharding, num_devices)
        direct = plan_reshard(inst.shape, source.sharding, inst.sharding, num_devices)
        if (direct.cost, direct.total) <= (first.cost + second.cost, first.total + second.total):
            inst.operands = [source]
            users[source].append(inst)
            users[inner] = []
            metadata = dict(inst.attr("metadata").items)
            metadata["spmd_value"] = source.name
            metadata["spmd_from"] = source.sharding.to_text(False)
            inst.attrs["metadata"] = KeyValueList(tuple(metadata.items()))


def _reads_live(user: Instruction, value: Instruction,
                live: dict[Instruction, frozenset[int]]) -> bool:
    """Whether `user` reads `value` at a position whose value reaches the root (`live`:
    `live_operands`)."""
    return any(user.operands[i] is value for i in live.get(user, ()))


def _remove_dead(comp: Computation, created: set[Instruction]) -> None:
    """Drop instructions this pass created that nothing uses any more."""
    while True:
        used = {o for i in comp.instructions for o in i.operands}
        dead = {i for i in comp.instructions
                if i in created and i is not comp.root and i not in used}
        if not dead:
            return
        comp.instructions = [i for i in comp.instructions if i not in dead]


__all__ = ["InsertReshards", "prepare_computation"]
