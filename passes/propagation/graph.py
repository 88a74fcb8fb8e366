"""The module seen as a graph for propagation: users, the computation of each instruction, the
instruction calling each control-flow callee, and XLA's post order.

Computations are those of the requested execution threads, in module order (XLA's
`module->computations(execution_threads)`). The post order is XLA's `MakeInstructionPostOrder`: a
depth-first walk from every instruction without users, in instruction order, visiting operands
left to right.
"""
from __future__ import annotations

from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.ops import opcodes

#: opcodes whose called computations take part in propagation (XLA's computation_map)
CONTROL_FLOW = opcodes("while", "conditional", "call")
#: marks a fact `ModuleGraph.derived` has not computed yet (facts may be None or False)
_UNKNOWN = object()
_MAIN_THREAD = "main"


class ModuleGraph:
    """Read-only structure of a module (the pass rewrites shardings, not the graph)."""

    def __init__(self, module: Module, execution_threads: tuple[str, ...] | None = None):
        self.module = module
        self.computations: list[Computation] = [
            c for c in module.computations.values()
            if execution_threads is None or (c.execution_thread or _MAIN_THREAD) in execution_threads]
        self.computation_of: dict[Instruction, Computation] = {}
        self.users: dict[Instruction, list[Instruction]] = {}
        for comp in module.computations.values():
            for inst, users in comp.users().items():
                self.users[inst] = users
                self.computation_of[inst] = comp
        self.caller: dict[str, Instruction] = {}
        for comp in self.computations:
            for inst in comp.instructions:
                if inst.opcode in CONTROL_FLOW:
                    for name in self.called(inst):
                        self.caller[name] = inst
        self._callers: dict[str, list[Instruction]] | None = None
        self._post_orders: dict[str, list[Instruction]] = {}
        self._memo: dict[str, dict[Instruction, object]] = {}

    def called(self, inst: Instruction) -> list[str]:
        """Names of the computations a control-flow instruction calls (while: body, condition)."""
        if inst.opcode == "while":
            return [inst.attrs["body"].name, inst.attrs["condition"].name]
        if inst.opcode == "conditional":
            return inst.branch_computation_names()
        return inst.called_computation_names()

    def callers(self, name: str) -> list[Instruction]:
        """Every instruction calling computation `name`, whatever its opcode (XLA's call graph;
        the table is built on first use)."""
        if self._callers is None:
            self._callers = {}
            for comp in self.module.computations.values():
                for inst in comp.instructions:
                    for called in dict.fromkeys(inst.called_computation_names()):
                        self._callers.setdefault(called, []).append(inst)
        return self._callers.get(name, [])

    def computation(self, name: str) -> Computation:
        return self.module.computations[name]

    def is_callee(self, comp: Computation) -> bool:
        return comp.name in self.caller

    def non_root_users(self, inst: Instruction) -> int:
        root = self.computation_of[inst].root
        return sum(1 for u in self.users[inst] if u is not root)

    def derived(self, kind: str, inst: Instruction, compute, *args):
        """`compute(inst, *args)`, computed once per instruction and `kind` (dimension analyses
        of dots, convolutions, gathers...: they depend only on the fixed graph)."""
        table = self._memo.get(kind)
        if table is None:
            table = self._memo[kind] = {}
        # `get` rather than a KeyError: about half the questions are first ones (the facts of
        # every instruction, asked once each), and raising costs more than a lookup
        value = table.get(inst, _UNKNOWN)
        if value is _UNKNOWN:
            value = table[inst] = compute(inst, *args)
        return value

    def invalidate(self, comp: Computation) -> None:
        """Forget `comp`'s cached post order after its instruction list changed."""
        self._post_orders.pop(comp.name, None)

    def remove(self, inst: Instruction) -> None:
        """Delete `inst` from its computation, its users reading its operand 0 instead (how shard
        barriers disappear); a root is replaced by that operand."""
        comp = self.computation_of.pop(inst)
        operand = inst.operands[0]
        for user in self.users.pop(inst):
            user.operands = [operand if op is inst else op for op in user.operands]
            if user not in self.users[operand]:
                self.users[operand].append(user)
        self.users[operand] = [u for u in self.users[operand] if u is not inst]
        comp.instructions = [i for i in comp.instructions if i is not inst]
        if comp.root is inst:
            comp.root = operand
        self.invalidate(comp)

    def post_order(self, comp: Computation) -> list[Instruction]:
        order = self._post_orders.get(comp.name)
        if order is None:
            order = self._post_orders[comp.name] = _post_order(comp, self.users)
        return order


def _post_order(comp: Computation, users: dict[Instruction, list[Instruction]]) -> list[Instruction]:
    visited: dict[Instruction, bool] = {}   # False: on the stack, True: emitted
    order: list[Instruction] = []
    for start in comp.instructions:
        if users[start]:
            continue
        stack = [start]
        while stack:
            current = stack[-1]
            state = visited.get(current)
            if state is not None:
                stack.pop()
                if not state:
                    visited[current] = True
                    order.append(current)
                continue
            visited[current] = False
            stack.extend(reversed(current.operands))
    return order
