"""Shardy's propagation loops over a `Graph`: user priorities, op priorities, one strategy.

* **User priorities.** Dimension shardings written with a priority above 0 are held back
  (closed, empty, their axes explicitly replicated) while the lower priorities propagate through
  the whole module; priority by priority they are restored and propagated in turn.
* **Op priorities.** Each user-priority round is five propagation rounds over an op schedule:
  (0) only pass-through ops (elementwise, reshape, transpose, data-flow edges; dynamic slices
  forward only) whose operands have no other use, (1) those ops whatever their uses, (2) every op
  but only along pass-through factors, broadcasts only backward, (3) every op and factor,
  broadcasts only backward, (4) everything.
* **One round** visits every op in walk order with a worklist: propagating through an op (its
  factor shardings, `factor_propagation.py`) updates operands and results whose sharding grows,
  and the ops defining and using them are visited again (last notified, first visited). The
  function results are joined to the returned values before and after the round. A value in a
  sharding group passes every update to the group's other members.

`propagate(graph, meshes, options)` runs all of it; slots are updated in place and each keeps the
history of its sharding (`Change`s) for `explain`.
"""
from __future__ import annotations

from gspmdc.ir.sdy import DimSharding, MaximalMesh, Meshes, TensorSharding

from .factor_propagation import BACKWARD, BOTH, FORWARD, NONE, intersection, propagate as solve
from .factor_propagation import union
from .graph import Change, EdgeOp, Graph, RuleOp, View
from .options import ShardyOptions
from .projection import project, project_back

__all__ = ["propagate"]

# ---------------------------------------------------------------------------------- op priorities

def _by_uses(op, single_use: bool) -> str:
    if not single_use or isinstance(op, EdgeOp):
        return BOTH
    busy = any(v.slot.uses > 1 and v.dims for v in op.operands)
    return NONE if busy else BOTH


def _pass_through(op, factor, single_use):
    if isinstance(op, EdgeOp) or op.pass_through:
        return _by_uses(op, single_use)
    if op.forward_only:
        return intersection(_by_uses(op, single_use), FORWARD)
    return NONE


def _pass_through_factors(op, factor):
    if isinstance(op, RuleOp):
        rule = op.rule
        if factor in rule.reduction or factor in rule.need_replication or \
                factor in rule.permutation:
            return NONE
        if op.broadcast:
            return BACKWARD
    return BOTH


def _any_but_broadcast_forward(op, factor):
    return BACKWARD if isinstance(op, RuleOp) and op.broadcast else BOTH


_SCHEDULE = (
    lambda op, f: _pass_through(op, f, True),
    lambda op, f: _pass_through(op, f, False),
    _pass_through_factors,
    _any_but_broadcast_forward,
    lambda op, f: BOTH,
)


def _direction(stage: int | None):
    """The direction function of op-priority `stage` (None: every op, both ways)."""
    def direction(op, factor):
        if isinstance(op, RuleOp) and op.allowed is not None:
            return op.allowed
        if stage is None:
            return BOTH
        result = NONE
        for rule in _SCHEDULE[:stage + 1]:
            result = union(result, rule(op, factor))
        return result
    return direction


# ---------------------------------------------------------------------------------- one round

class _Worklist:
    """MLIR's greedy-driver worklist: last pushed, first popped; an op already queued keeps its
    place."""

    def __init__(self, ops):
        self.items = list(reversed(ops))
        self.queued = {id(op) for op in ops}

    def push(self, op) -> None:
        if id(op) not in self.queued:
            self.queued.add(id(op))
            self.items.append(op)

    def pop(self):
        op = self.items.pop()
        self.queued.discard(id(op))
        return op

    def __bool__(self) -> bool:
        return bool(self.items)


class _Round:
    def __init__(self, graph: Graph, meshes: Meshes, strategy: str, stage, options):
        self.graph, self.meshes, self.strategy = graph, meshes, strategy
        self.direction, self.stage, self.options = _direction(stage), stage, options
        self.worklist: _Worklist | None = None

    def run(self) -> None:
        self.func_results()
        self.worklist = _Worklist(self.graph.order)
        while self.worklist:
            op = self.worklist.pop()
            self.apply(op, op.operands, op.results, op.rule,
                       elementwise=getattr(op, "elementwise", False))
        self.worklist = None
        self.func_results()

    def func_results(self) -> None:
        from .factor_rules import identity_rule
        for result in self.graph.func_results:
            owner = View(result.slot)
            rule = identity_rule(result.slot.dims)
            self.apply(None, [result.returned], [owner], rule, elementwise=False,
                       is_func_result=True)

    def mesh_of(self, shardings):
        names = {s.mesh for s in shardings if s is not None}
        if len(names) != 1:
            return None, None
        name = names.pop()
        mesh = self.meshes.get(name) if isinstance(name, str) else name
        if mesh is None or isinstance(mesh, MaximalMesh):
            return None, None
        return name, mesh

    def apply(self, op, operands, results, rule, elementwise, is_func_result=False):
        views = operands + results
        shardings = [v.get() for v in views]
        name, mesh = self.mesh_of(shardings)
        if mesh is None:
            return
        ops_in = [project(s, m, rule.factor_sizes, mesh) for s, m in
                  zip(shardings[:len(operands)], rule.operands)]
        ops_out = [project(s, m, rule.factor_sizes, mesh) for s, m in
                   zip(shardings[len(operands):], rule.results)]
        direction = (lambda f: BOTH) if op is None else (lambda f: self.direction(op, f))
        changed_in, changed_out = solve(ops_in, ops_out, rule, direction, mesh, self.strategy,
                                        elementwise, self.options.conservative)
        sources = _sources(views, shardings)
        for k, view in enumerate(operands):
            if changed_in[k]:
                how = "backward" if is_func_result or isinstance(op, RuleOp) else "control flow"
                self.update(view, shardings[k], project_back(
                    ops_in[k], rule.operands[k], rule.factor_sizes, name, mesh), op,
                    Change(None, how, _rule_name(op), sources), notify=not is_func_result)
        for k, view in enumerate(results):
            if changed_out[k]:
                how = "forward" if is_func_result or isinstance(op, RuleOp) else "control flow"
                self.update(view, shardings[len(operands) + k], project_back(
                    ops_out[k], rule.results[k], rule.factor_sizes, name, mesh), op,
                    Change(None, how, _rule_name(op), sources), notify=not is_func_result,
                    is_func_result=is_func_result)

    def update(self, view: View, old, new: TensorSharding, op, change: Change, notify: bool,
               is_func_result: bool = False) -> None:
        if (old is None and _empty(new)) or new == old:
            return
        slot = view.slot
        slot.sharding = view.with_new(new)
        sources = tuple(s for s in change.sources if s[0] is not slot)
        slot.history.append(Change(slot.sharding, change.how, change.rule, sources, self.stage))
        if is_func_result:
            return
        if notify and self.worklist is not None:
            self.notify(slot, op)
        for member in slot.group or ():
            if member is not slot:
                member.sharding = slot.sharding
                member.history.append(Change(member.sharding, "shard group", "sharding group",
                                             ((slot, len(slot.history) - 1),), self.stage))
                if notify and self.worklist is not None:
                    self.notify(member, op)

    def notify(self, slot, current) -> None:
        if slot.definer is not None and slot.definer is not current:
            self.worklist.push(slot.definer)
        for user in reversed(slot.users):
            if user is not current:
                self.worklist.push(user)


def _sources(views, shardings) -> tuple:
    """The op's sharded tensors as (slot, version), the most sharded first."""
    sharded = [(v.slot, s) for v, s in zip(views, shardings) if s is not None]
    sharded.sort(key=lambda vs: -sum(len(d.axes) for d in vs[1].dims))
    return tuple((slot, max(len(slot.history) - 1, 0)) for slot, _ in sharded)


def _rule_name(op) -> str:
    if op is None:
        return "the entry's result sharding"
    if isinstance(op, RuleOp):
        return op.instruction.opcode
    return "data-flow edge"


def _empty(sharding: TensorSharding) -> bool:
    return not sharding.replicated and not sharding.unreduced and \
        not any(d.axes for d in sharding.dims)


# ---------------------------------------------------------------------------------- priorities

def _held_back(sharding: TensorSharding, meshes: Meshes) -> TensorSharding:
    dims, replicated = [], list(sharding.replicated)
    for d in sharding.dims:
        if not d.priority:
            dims.append(DimSharding(d.axes, d.closed))
        else:
            replicated += d.axes
            dims.append(DimSharding((), True))
    mesh = meshes.get(sharding.mesh) if isinstance(sharding.mesh, str) else sharding.mesh
    if replicated and mesh is not None and not isinstance(mesh, MaximalMesh):
        names = mesh.axis_names
        replicated.sort(key=lambda a: (names.index(a.name), a.pre_size))
    return TensorSharding(sharding.mesh, tuple(dims), tuple(replicated), sharding.unreduced)


def _restored(current: TensorSharding, original: TensorSharding, priority: int):
    dims, released = [], []
    for now, orig in zip(current.dims, original.dims):
        if (orig.priority or 0) == priority:
            dims.append(DimSharding(orig.axes, orig.closed))
            released += orig.axes
        else:
            dims.append(now)
    replicated = tuple(a for a in current.replicated if a not in released)
    return TensorSharding(current.mesh, tuple(dims), replicated, current.unreduced)


def _all_slots(graph: Graph):
    seen = set()
    for view in graph.views.values():
        if id(view.slot) not in seen:
            seen.add(id(view.slot))
            yield view.slot
    for manual in graph.manual:
        for slot in manual.in_slots:
            if id(slot) not in seen:
                seen.add(id(slot))
                yield slot
    for result in graph.func_results:
        yield result.slot


def _priority_slots(graph: Graph):
    """Slots whose priorities take part (not data-flow edge owners)."""
    return [s for s in _all_slots(graph) if not isinstance(s.definer, EdgeOp)]


# ---------------------------------------------------------------------------------- entry point

def _sync_groups(graph: Graph) -> None:
    """Every member of a sharding group starts with the group's common sharding (members that
    conflict were given open constraints by `prepare.open_conflicting_groups`)."""
    from .prepare import _common
    for members in graph.groups.values():
        unique = list(dict.fromkeys(members))
        for slot in unique:
            slot.group = unique
        common, _ = _common(unique)
        if common is not None:
            for slot in unique:
                if slot.sharding != common:
                    slot.sharding = common
                    slot.history.append(Change(common, "shard group", "sharding group"))


def propagate(graph: Graph, meshes: Meshes, options: ShardyOptions = ShardyOptions()) -> None:
    """Run Shardy's propagation over `graph` (slots updated in place)."""
    _sync_groups(graph)
    held = _initial_priorities_for(graph, meshes)
    _op_priority_rounds(graph, meshes, options)
    for priority, references in held:
        for slot, original in references:
            slot.sharding = _restored(slot.sharding, original, priority)
        _op_priority_rounds(graph, meshes, options)


def _initial_priorities_for(graph: Graph, meshes: Meshes):
    slots = [s for s in _priority_slots(graph) if s.sharding is not None]
    by_priority: dict[int, list] = {}
    for slot in slots:
        original = slot.sharding
        for p in {d.priority for d in original.dims if d.priority}:
            by_priority.setdefault(p, []).append((slot, original))
        slot.sharding = _held_back(original, meshes)
    return sorted(by_priority.items())


def _op_priority_rounds(graph: Graph, meshes: Meshes, options: ShardyOptions) -> None:
    stages = range(len(_SCHEDULE)) if options.op_priorities else [None]
    strategies = {"aggressive": ["aggressive"], "basic": ["basic"],
                  "basic-then-aggressive": ["basic", "aggressive"]}[options.strategy]
    for stage in stages:
        for strategy in strategies:
            _Round(graph, meshes, strategy, stage, options).run()
