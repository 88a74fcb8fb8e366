"""The module as Shardy's propagation sees it: values with one sharding each, and the ops that
relate them.

Shardy propagates over MLIR values; HLO has tuples. Here every array leaf of every instruction is
a *slot* (its sharding, None when it has none), except that plumbing shares slots: `tuple` and
`get-tuple-element` leaves are their operands', a loop body's and condition's parameters are the
`while` result's (one *data-flow edge* per leaf joins the loop's operand, the body's root and that
slot), a branch's parameters are its operands', `xla.sdy.FuncResultSharding` is its operand.

Ops:

* `RuleOp`: an instruction with an op sharding rule (`factor_rules.py`), over its operand and
  result leaves;
* `EdgeOp`: a data-flow edge: sources -> one owner slot, an identity rule (while, conditional,
  optimization barrier, the two sides of a manual computation);
* function results: the entry's outputs, each a slot of its own joined to the returned value.

A `shard_map` (`xla.sdy.GlobalToLocalShape` -> call of the body -> `xla.sdy.LocalToGlobalShape`)
is a manual computation: its in-shardings are the slots of the body's parameters (inside the body
they are seen without the manual axes: `ManualView`), its out-shardings the slots of its results
(the edge from the body's root sees them without the manual axes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gspmdc.errors import UnsupportedError
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sdy import (
    ALLOWED_DIRECTION, FUNC_RESULT_SHARDING, GLOBAL_TO_LOCAL, IN_SHARDINGS, OUT_SHARDINGS,
    PROPAGATION_BARRIER, SHARDING_GROUP, SHARDING_GROUP_ID, DimSharding, OpShardingRule,
    TensorSharding, frontend, instruction_shardings,
)

from .factor_rules import identity_rule, is_elementwise, rule_of
from .lower import ManualCall, erase_axes, manual_calls, target

__all__ = ["Change", "Slot", "View", "ManualView", "RuleOp", "EdgeOp", "FuncResult", "Graph",
           "ManualComputation", "func_result_sharding", "func_result_call"]


@dataclass(frozen=True)
class Change:
    """One change of a slot's sharding: how (forward, backward, control flow, constraint, shard
    group, output), through which op, from which slots (each with the number of changes it had
    then), at which op-priority level."""

    sharding: TensorSharding
    how: str
    rule: str
    sources: tuple = ()
    level: int | None = None


class Slot:
    """One value's sharding; `dims` its global shape, `name` how explain names it."""

    __slots__ = ("sharding", "dims", "name", "users", "definer", "group", "instruction",
                 "leaf", "history", "uses")

    def __init__(self, dims, name: str, instruction: Instruction | None, leaf: int):
        self.sharding: TensorSharding | None = None
        self.dims = tuple(dims)
        self.name = name
        self.users: list = []           # ops reading this slot, in program order
        self.definer = None             # the op whose result (or edge owner) this slot is
        self.group: list[Slot] | None = None
        self.instruction = instruction
        self.leaf = leaf
        self.history: list[Change] = []  # how propagation changed the sharding, oldest first
        self.uses = 0                   # operand uses (for op-priority propagation)

    def __repr__(self) -> str:
        return f"<Slot {self.name}>"


class View:
    """How an op reads and writes a slot: directly."""

    __slots__ = ("slot",)

    def __init__(self, slot: Slot):
        self.slot = slot

    @property
    def dims(self):
        return self.slot.dims

    def get(self) -> TensorSharding | None:
        return self.slot.sharding

    def with_new(self, sharding: TensorSharding) -> TensorSharding:
        """The slot's sharding after this view is set to `sharding`."""
        return sharding


class ManualView(View):
    """A manual computation's in/out sharding seen without its manual axes (the body's
    parameters, and the result edge's view of the out-sharding); setting it keeps the manual axes
    major in every dimension."""

    __slots__ = ("manual", "local_dims")

    def __init__(self, slot: Slot, manual: tuple[str, ...], local_dims):
        super().__init__(slot)
        self.manual = manual
        self.local_dims = tuple(local_dims)

    @property
    def dims(self):
        return self.local_dims

    def get(self) -> TensorSharding | None:
        s = self.slot.sharding
        return None if s is None else erase_axes(s, self.manual)

    def with_new(self, sharding: TensorSharding) -> TensorSharding:
        outer = self.slot.sharding
        dims = []
        for old, new in zip(outer.dims, sharding.dims):
            manual = tuple(a for a in old.axes if a.name in self.manual)
            dims.append(DimSharding(manual + new.axes, new.closed, new.priority))
        return TensorSharding(sharding.mesh, tuple(dims), outer.replicated, outer.unreduced)


@dataclass(eq=False)
class RuleOp:
    """An instruction propagating through its op sharding rule."""

    instruction: Instruction
    rule: OpShardingRule
    operands: list[View]
    results: list[View]
    elementwise: bool
    pass_through: bool = False      # reshape, transpose, elementwise, offload: op priority 0
    forward_only: bool = False      # dynamic-slice, dynamic-update-slice at op priority 0
    broadcast: bool = False
    allowed: str | None = None      # a propagation barrier's direction

    @property
    def name(self) -> str:
        return self.instruction.name


@dataclass(eq=False)
class EdgeOp:
    """A data-flow edge: every source and the owner are sharded alike (identity rule)."""

    name: str
    sources: list[View]
    owner: View
    rule: OpShardingRule = field(init=False)

    def __post_init__(self):
        self.rule = identity_rule(self.owner.dims, len(self.sources), 1)

    @property
    def operands(self) -> list[View]:
        return self.sources

    @property
    def results(self) -> list[View]:
        return [self.owner]


@dataclass(eq=False)
class FuncResult:
    """An entry output: the returned value and the function's result sharding."""

    index: int
    returned: View
    slot: Slot


@dataclass(eq=False)
class ManualComputation:
    """A shard_map and the slots of its in- and out-shardings."""

    call: ManualCall
    in_slots: list[Slot]
    out_slots: list[Slot]


class Graph:
    """Slots and ops of a module (see the module docstring); `order` is the ops in Shardy's
    walk order (program order, a region's ops before the edges of the op owning it)."""

    def __init__(self, module: Module):
        self.module = module
        self.slots: dict[tuple[int, int], Slot] = {}          # (id(instruction), leaf) -> slot
        self.views: dict[tuple[int, int], View] = {}
        self.order: list = []
        self.func_results: list[FuncResult] = []
        self.manual: list[ManualComputation] = []
        self.groups: dict[int, list[Slot]] = {}
        self.constraints: list[RuleOp] = []
        self._build(module.entry)
        self._func_results(module.entry)
        self._count_uses()

    # ---- slots and views ------------------------------------------------------------------

    def view(self, inst: Instruction, leaf: int = 0) -> View:
        return self.views[(id(inst), leaf)]

    def leaves(self, inst: Instruction) -> list[View]:
        return [self.view(inst, k) for k in range(len(list(inst.shape.leaves())))]

    def _new_slots(self, inst: Instruction, initial=None) -> list[View]:
        leaves = list(inst.shape.leaves())
        views = []
        for k, leaf in enumerate(leaves):
            name = inst.name if len(leaves) == 1 else f"{inst.name}#{k}"
            slot = Slot(leaf.dims, name, inst, k)
            if initial is not None:
                slot.sharding = initial[k]
            self.slots[(id(inst), k)] = slot
            view = View(slot)
            self.views[(id(inst), k)] = view
            views.append(view)
        return views

    def _alias(self, inst: Instruction, views: list[View]) -> None:
        for k, view in enumerate(views):
            self.views[(id(inst), k)] = view

    # ---- building ---------------------------------------------------------------------------

    def _build(self, comp: Computation) -> None:
        instructions = comp.instructions
        k = 0
        while k < len(instructions):
            inst = instructions[k]
            k += 1
            if (id(inst), 0) in self.views:
                continue                # a parameter aliased by its caller, a manual computation
            if inst.opcode == "tuple":
                self._alias(inst, [v for o in inst.operands for v in self.leaves(o)])
            elif inst.opcode == "get-tuple-element":
                self._alias(inst, self._tuple_element(inst))
            elif target(inst) == FUNC_RESULT_SHARDING:
                self._alias(inst, self.leaves(inst.operands[0]))
            elif target(inst) == SHARDING_GROUP:
                group = frontend(inst)[SHARDING_GROUP_ID].group
                for view in self.leaves(inst.operands[0]):
                    self.groups.setdefault(group, []).append(view.slot)
                    view.slot.uses += 1
            elif inst.opcode == "while":
                self._while(inst)
            elif inst.opcode == "conditional":
                self._conditional(inst)
            elif inst.opcode in ("opt-barrier", "optimization-barrier"):
                results = self._new_slots(inst, self._initial(inst))
                for j, (source, owner) in enumerate(zip(self.leaves(inst.operands[0]), results)):
                    self._edge(f"{inst.name}#{j}", [source], owner)
            elif target(inst) == GLOBAL_TO_LOCAL:
                self._manual(inst, comp)
            elif inst.opcode == "call":
                raise UnsupportedError(f"{inst.name}: calls must be inlined before Shardy's "
                                       f"propagation (only manual computation bodies stay)")
            else:
                self._rule_op(inst)

    def _initial(self, inst: Instruction):
        """The instruction's Shardy shardings, or None."""
        return instruction_shardings(inst)

    def _tuple_element(self, inst: Instruction) -> list[View]:
        operand = inst.operands[0]
        index = inst.attrs["index"]
        elements = operand.shape.elements
        start = sum(len(list(e.leaves())) for e in elements[:index])
        count = len(list(elements[index].leaves()))
        return self.leaves(operand)[start:start + count]

    def _rule_op(self, inst: Instruction) -> None:
        results = self._new_slots(inst, self._initial(inst))
        rule = rule_of(inst, self.module)
        if rule is None:
            return
        operands = [v for o in inst.operands for v in self.leaves(o)]
        allowed = None
        if target(inst) == PROPAGATION_BARRIER:
            allowed = frontend(inst)[ALLOWED_DIRECTION].direction.lower()
        op = RuleOp(inst, rule, operands, results, is_elementwise(inst),
                    pass_through=is_elementwise(inst) or inst.opcode in ("reshape", "transpose")
                    or target(inst) in ("MoveToDevice", "MoveToHost"),
                    forward_only=inst.opcode in ("dynamic-slice", "dynamic-update-slice"),
                    broadcast=inst.opcode == "broadcast", allowed=allowed)
        for view in operands:
            view.slot.users.append(op)
        for view in results:
            view.slot.definer = op
        if target(inst) == "Sharding":
            self.constraints.append(op)
        self.order.append(op)

    def _edge(self, name: str, sources: list[View], owner: View) -> EdgeOp:
        edge = EdgeOp(name, sources, owner)
        for view in sources:
            view.slot.users.append(edge)
        owner.slot.definer = edge
        self.order.append(edge)
        return edge

    def _while(self, inst: Instruction) -> None:
        results = self._new_slots(inst, self._initial(inst))
        body = self.module.computation(inst.attrs["body"].name)
        condition = self.module.computation(inst.attrs["condition"].name)
        for comp in (condition, body):
            self._alias(comp.parameters[0], results)
        self._build(condition)
        self._build(body)
        operands = self.leaves(inst.operands[0])
        roots = self.leaves(body.root)
        for j, owner in enumerate(results):
            self._edge(f"{inst.name}#{j}", [operands[j], roots[j]], owner)

    def _conditional(self, inst: Instruction) -> None:
        results = self._new_slots(inst, self._initial(inst))
        branches = [self.module.computation(name) for name in inst.branch_computation_names()]
        for branch, operand in zip(branches, inst.operands[1:]):
            self._alias(branch.parameters[0], self.leaves(operand))
            self._build(branch)
        for j, owner in enumerate(results):
            self._edge(f"{inst.name}#{j}", [self.leaves(b.root)[j] for b in branches], owner)

    def _manual(self, g2l: Instruction, comp: Computation) -> None:
        mc = next(m for m in manual_calls(self.module, comp) if m.global_to_local is g2l)
        manual = mc.manual_axes
        in_shardings = frontend(g2l)[IN_SHARDINGS].shardings
        operands = [v for o in g2l.operands for v in self.leaves(o)]
        locals_ = list(g2l.shape.leaves())
        in_slots, param_views = [], []
        for j, (operand, sharding) in enumerate(zip(operands, in_shardings)):
            slot = Slot(operand.dims, f"{mc.call.name}.in{j}", g2l, j)
            slot.sharding = sharding
            in_slots.append(slot)
            param_views.append(ManualView(slot, manual, locals_[j].dims))
        self._alias(g2l, param_views)
        for param in mc.body.parameters:
            self._alias(param, [param_views[param.parameter_number]])
        for j, owner in enumerate(in_slots):
            self._edge(f"{mc.call.name}.in{j}", [operands[j]], View(owner))
        self._build(mc.body)
        roots = self.leaves(mc.body.root)
        self._alias(mc.call, roots)
        out_views = self._new_slots(mc.local_to_global,
                                    frontend(mc.local_to_global)[OUT_SHARDINGS].shardings)
        for j, view in enumerate(out_views):
            self._edge(f"{mc.call.name}.out{j}", [roots[j]],
                       ManualView(view.slot, manual, roots[j].dims))
        self.manual.append(ManualComputation(mc, in_slots, [v.slot for v in out_views]))

    def _func_results(self, entry: Computation) -> None:
        for j, view in enumerate(self.leaves(entry.root)):
            sharding = func_result_sharding(entry.root, j)
            call = func_result_call(entry.root, j)
            slot = Slot(view.dims, f"result {j}", call[0] if call else None, j)
            slot.sharding = sharding
            view.slot.uses += 1
            self.func_results.append(FuncResult(j, view, slot))

    def _count_uses(self) -> None:
        for op in self.order:
            for view in op.operands:
                view.slot.uses += 1


def func_result_call(root: Instruction, leaf: int):
    """The `xla.sdy.FuncResultSharding` custom-call returning the entry's output `leaf` (found
    through tuples) and the leaf of it that is returned, or None."""
    inst, k = root, leaf
    while inst.opcode in ("tuple", "get-tuple-element"):
        if inst.opcode == "tuple":
            for operand in inst.operands:
                n = len(list(operand.shape.leaves()))
                if k < n:
                    inst = operand
                    break
                k -= n
        else:
            operand = inst.operands[0]
            k += sum(len(list(e.leaves()))
                     for e in operand.shape.elements[:inst.attrs["index"]])
            inst = operand
    return (inst, k) if target(inst) == FUNC_RESULT_SHARDING else None


def func_result_sharding(root: Instruction, leaf: int) -> TensorSharding | None:
    """The sharding the entry's output `leaf` is returned with (`xla.sdy.FuncResultSharding`),
    or None."""
    found = func_result_call(root, leaf)
    return None if found is None else instruction_shardings(found[0])[found[1]]
