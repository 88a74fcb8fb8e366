"""The IR: a module of computations of instructions, one-to-one with XLA's HLO text.

- `Instruction`: name, opcode, result shape, operands (other instructions of the same computation),
  typed attributes (see `attributes.py`), optional sharding; `parameter(i)` keeps `i` in
  `parameter_number`, `constant(...)` keeps its `Literal` in `literal`. Names are kept exactly as
  written (without the optional `%`).
- `Computation`: instructions in program order (operands always come first: SSA order) and a root.
- `Module`: name, header attributes (typed where gspmdc uses them, verbatim `RawAttr` otherwise),
  computations in text order, the entry computation.

The same IR holds the unpartitioned and the partitioned (SPMD) program. Instructions are mutable so
that passes can rewrite them; `Module.difference()` compares two modules structurally.
"""
from __future__ import annotations

from typing import Any, Iterator

from .attributes import COMPUTATION_ATTRIBUTES, Literal, called_computation_names
from .shapes import Shape


class Instruction:
    """One HLO instruction. `attrs` maps attribute names (XLA spelling) to typed values, in order."""

    __slots__ = ("name", "opcode", "shape", "operands", "attrs", "sharding", "literal",
                 "parameter_number")

    def __init__(self, name: str, opcode: str, shape: Shape, operands=(), attrs=None, *,
                 sharding=None, literal: Literal | None = None, parameter_number: int | None = None):
        self.name = name
        self.opcode = opcode
        self.shape = shape
        self.operands: list[Instruction] = list(operands)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.sharding = sharding
        self.literal = literal
        self.parameter_number = parameter_number

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def called_computation_names(self) -> list[str]:
        """The computations the instruction's attributes name, in attribute order (only the
        catalogue's computation attributes can name one)."""
        names: list[str] = []
        if COMPUTATION_ATTRIBUTES.isdisjoint(self.attrs):
            return names                # most instructions: one test, in C
        for key, value in self.attrs.items():
            if key in COMPUTATION_ATTRIBUTES:
                names.extend(called_computation_names(value))
        return names

    def branch_computation_names(self) -> list[str]:
        """A `conditional`'s branches, by the selector value that takes each: its
        `branch_computations` for an `s32[]` index, else `true_computation` (branch 0) then
        `false_computation` (branch 1) for a `pred[]` selector. Branch i reads operand i + 1."""
        if "branch_computations" in self.attrs:
            return [ref.name for ref in self.attrs["branch_computations"]]
        return [self.attrs["true_computation"].name, self.attrs["false_computation"].name]

    def __repr__(self) -> str:
        return f"<Instruction {self.name} = {self.shape} {self.opcode}(" + \
            ", ".join(o.name for o in self.operands) + ")>"


class Computation:
    """A named list of instructions in program order with one root."""

    __slots__ = ("name", "instructions", "root", "is_entry", "execution_thread")

    def __init__(self, name: str, instructions: list[Instruction], root: Instruction, *,
                 is_entry: bool = False, execution_thread: str | None = None):
        self.name = name
        self.instructions = instructions
        self.root = root
        self.is_entry = is_entry
        self.execution_thread = execution_thread

    @property
    def parameters(self) -> list[Instruction]:
        """Parameter instructions ordered by parameter number."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number)

    def instruction(self, name: str) -> Instruction:
        for inst in self.instructions:
            if inst.name == name:
                return inst
        raise KeyError(f"no instruction named {name!r} in computation {self.name!r}")

    def users(self) -> dict[Instruction, list[Instruction]]:
        """Map from each instruction to the instructions that use it (in program order)."""
        result: dict[Instruction, list[Instruction]] = {i: [] for i in self.instructions}
        for inst in self.instructions:
            for op in inst.operands:
                # users are appended in program order: `inst` can only be the last one so far
                # (an operand used twice), never needing a search of a long list
                users = result[op]
                if not users or users[-1] is not inst:
                    users.append(inst)
        return result

    def __repr__(self) -> str:
        return f"<Computation {self.name} ({len(self.instructions)} instructions)>"


class Module:
    """An HLO module: header attributes, computations (text order), an entry computation."""

    __slots__ = ("name", "attrs", "computations", "entry_name")

    def __init__(self, name: str, computations: list[Computation], entry_name: str,
                 attrs: dict[str, Any] | None = None):
        self.name = name
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.computations: dict[str, Computation] = {c.name: c for c in computations}
        self.entry_name = entry_name

    @property
    def entry(self) -> Computation:
        return self.computations[self.entry_name]

    @property
    def num_partitions(self) -> int | None:
        return self.attrs.get("num_partitions")

    def computation(self, name: str) -> Computation:
        try:
            return self.computations[name]
        except KeyError:
            raise KeyError(f"no computation named {name!r} in module {self.name!r}") from None

    def all_instructions(self) -> Iterator[tuple[Computation, Instruction]]:
        for comp in self.computations.values():
            for inst in comp.instructions:
                yield comp, inst

    def difference(self, other: "Module") -> str | None:
        """None when the two modules are structurally identical, else a description of the first
        difference (names, opcodes, shapes with layouts, operands by name, attributes, shardings,
        literals, header attributes)."""
        if self.name != other.name:
            return f"module name {self.name!r} != {other.name!r}"
        if self.attrs != other.attrs:
            return f"header attributes {self.attrs!r} != {other.attrs!r}"
        if self.entry_name != other.entry_name:
            return f"entry {self.entry_name!r} != {other.entry_name!r}"
        if list(self.computations) != list(other.computations):
            return f"computations {list(self.computations)} != {list(other.computations)}"
        for name, a in self.computations.items():
            b = other.computations[name]
            if a.execution_thread != b.execution_thread:
                return f"{name}: execution_thread {a.execution_thread!r} != {b.execution_thread!r}"
            if len(a.instructions) != len(b.instructions):
                return f"{name}: {len(a.instructions)} instructions != {len(b.instructions)}"
            if a.root.name != b.root.name:
                return f"{name}: root {a.root.name} != {b.root.name}"
            for x, y in zip(a.instructions, b.instructions):
                diff = _instruction_difference(x, y)
                if diff:
                    return f"{name}/{x.name}: {diff}"
        return None


def _instruction_difference(x: Instruction, y: Instruction) -> str | None:
    for field in ("name", "opcode", "shape", "parameter_number"):
        if getattr(x, field) != getattr(y, field):
            return f"{field} {getattr(x, field)!r} != {getattr(y, field)!r}"
    if [o.name for o in x.operands] != [o.name for o in y.operands]:
        return f"operands {[o.name for o in x.operands]} != {[o.name for o in y.operands]}"
    if x.attrs != y.attrs:
        return f"attributes {x.attrs!r} != {y.attrs!r}"
    if x.sharding != y.sharding:
        return f"sharding {x.sharding!r} != {y.sharding!r}"
    if x.literal != y.literal:
        return "literal differs"
    return None
