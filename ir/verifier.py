"""The module verifier: structural and semantic checks of a whole HLO module.

`verify_module(module)` raises the first problem; `verify_module(module, collect=True)` returns
every problem as a list of messages (empty when the module is valid). Checks:

- the entry computation exists and is the only one marked ENTRY; no computation calls itself,
  directly or through others (HLO has no recursion);
- per computation: instruction names are unique; the root is one of its instructions; parameter
  numbers are 0..n-1, each once; operands are instructions defined earlier in the same computation
  (SSA order); called computations exist;
- per instruction: the result shape is compatible with what the op allows (`check_shape`: operand
  counts, operand shapes and attributes, called computations' signatures: reducers, comparators,
  while condition/body, conditional branches, ...); the sharding fits the shape and the module's
  `num_partitions` devices (`HloSharding.validate`; an outfeed's sharding describes its data).

The shape check is a function of the opcode, the result and operand shapes, the attributes other
than `metadata` and `frontend_attributes`, and the called computations, which are the module's
throughout: an instruction equal in all of these to one that passed passes too, unchecked (the
layers of a model repeat the same few instructions thousands of times). Constants, whose check
reads the literal, are always checked.

Messages read `computation main, instruction add.3: result shape f32[4] is incompatible with
inferred f32[8]`; a raised error about one instruction names it in its `instruction` attribute
(the parser then adds the instruction's place in the text: `parse_module(..., verify=True)`).
"""
from __future__ import annotations

from collections import Counter

from gspmdc.errors import GspmdcError, UnsupportedError, VerificationError

from .annotation_shape import annotated_shape
from .module import Computation, Instruction, Module
from .shape_inference import check_shape


class _Problems:
    """Collects messages, or raises at the first one when not collecting."""

    def __init__(self, collect: bool):
        self.collect = collect
        self.messages: list[str] = []

    def add(self, message: str, error: type[GspmdcError] = VerificationError,
            instruction: Instruction | None = None) -> None:
        """Record `message`, or raise it (as `error`, naming the `instruction` it is about)."""
        if not self.collect:
            problem = error(message)
            problem.instruction = instruction
            raise problem
        self.messages.append(message)


def verify_module(module: Module, collect: bool = False) -> list[str] | None:
    """Verify `module`; raise VerificationError (UnsupportedError for an opcode gspmdc has no rule
    for) at the first problem, or with `collect=True` return the list of all problems."""
    problems = _Problems(collect)
    _verify_entry(module, problems)
    _verify_call_graph(module, problems)
    passed: set[tuple] = set()
    for comp in module.computations.values():
        _verify_computation(module, comp, problems, passed)
    return problems.messages if collect else None


def _verify_entry(module: Module, problems: _Problems) -> None:
    if module.entry_name not in module.computations:
        problems.add(f"module {module.name}: entry computation {module.entry_name} does not exist")
    for comp in module.computations.values():
        if comp.is_entry and comp.name != module.entry_name:
            problems.add(f"computation {comp.name} is marked ENTRY, but the entry is "
                         f"{module.entry_name}")


def _callees(module: Module, comp: Computation) -> list[str]:
    return [name for inst in comp.instructions for name in inst.called_computation_names()
            if name in module.computations]


def _verify_call_graph(module: Module, problems: _Problems) -> None:
    """Report each cycle of the call graph once (depth-first search with an explicit stack)."""
    state: dict[str, str] = {}  # name -> "active" while on the DFS path, "done" afterwards
    for root in module.computations:
        if root in state:
            continue
        path, stack = [root], [iter(_callees(module, module.computations[root]))]
        state[root] = "active"
        while stack:
            callee = next(stack[-1], None)
            if callee is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(callee) == "active":
                cycle = path[path.index(callee):] + [callee]
                problems.add(f"computation {callee}: recursive call chain {' -> '.join(cycle)}")
            elif callee not in state:
                state[callee] = "active"
                path.append(callee)
                stack.append(iter(_callees(module, module.computations[callee])))


def _verify_computation(module: Module, comp: Computation, problems: _Problems,
                        passed: set[tuple]) -> None:
    where = f"computation {comp.name}"
    names = Counter(inst.name for inst in comp.instructions)
    for name in sorted(n for n, count in names.items() if count > 1):
        problems.add(f"{where}: instruction name {name} is defined more than once")
    members = {id(inst) for inst in comp.instructions}
    if comp.root is None:
        problems.add(f"{where}: no root instruction")
    elif id(comp.root) not in members:
        problems.add(f"{where}: root {comp.root.name} is not an instruction of the computation")
    _verify_parameters(comp, problems)
    defined: set[int] = set()
    for inst in comp.instructions:
        _verify_instruction(module, comp, inst, members, defined, problems, passed)
        defined.add(id(inst))


def _verify_parameters(comp: Computation, problems: _Problems) -> None:
    """Parameter numbers are 0..n-1, each once (a raised problem names the first parameter
    in the way: the second use of a number, or the first number out of range)."""
    where = f"computation {comp.name}"
    params = [p for p in comp.instructions if p.opcode == "parameter"]
    numbers = [p.parameter_number for p in params]
    if any(not isinstance(n, int) for n in numbers):
        problems.add(f"{where}: a parameter instruction has no parameter number")
        return
    for n in sorted(n for n, count in Counter(numbers).items() if count > 1):
        second = [p for p in params if p.parameter_number == n][1]
        problems.add(f"{where}: parameter number {n} is used more than once", instruction=second)
    distinct = sorted(set(numbers))
    if distinct != list(range(len(distinct))):
        outside = next(p for p in params if not 0 <= p.parameter_number < len(distinct))
        problems.add(f"{where}: parameter numbers {distinct} are not 0..n-1", instruction=outside)


def _verify_instruction(module: Module, comp: Computation, inst: Instruction,
                        members: set[int], defined: set[int], problems: _Problems,
                        passed: set[tuple]) -> None:
    """Check `inst`; `passed` holds the shape-check keys (`_shape_key`) that passed so far."""
    where = f"computation {comp.name}, instruction {inst.name}"
    structural = True
    for i, operand in enumerate(inst.operands):
        if id(operand) in defined:
            continue
        structural = False
        if id(operand) in members:
            problems.add(f"{where}: operand {i} ({operand.name}) is used before its definition",
                         instruction=inst)
        else:
            problems.add(f"{where}: operand {i} ({operand.name}) is not an instruction of the "
                         "computation", instruction=inst)
    if any(operand.shape is None for operand in inst.operands):
        structural = False  # the operand's own missing shape is reported where it is defined
    for name in inst.called_computation_names():
        if name not in module.computations:
            structural = False
            problems.add(f"{where}: calls unknown computation {name}", instruction=inst)
    if inst.shape is None:
        problems.add(f"{where}: no result shape", instruction=inst)
        return
    if structural:
        key = _shape_key(inst)
        if key is None or key not in passed:
            try:
                check_shape(inst, module)
            except UnsupportedError as e:
                problems.add(f"computation {comp.name}, {e}", UnsupportedError, inst)
            except VerificationError as e:
                problems.add(f"computation {comp.name}, {e}", instruction=inst)
            else:
                if key is not None:
                    passed.add(key)
    if inst.sharding is not None:
        try:
            inst.sharding.validate(annotated_shape(inst), module.num_partitions)
        except (GspmdcError, ValueError) as e:
            problems.add(f"{where}: invalid sharding: {e}", instruction=inst)


#: attributes the shape rules never read
_NOT_SHAPE_ATTRIBUTES = frozenset({"metadata", "frontend_attributes"})


def _shape_key(inst: Instruction) -> tuple | None:
    """What `check_shape` reads of `inst` (opcode, result and operand shapes, attributes but
    metadata and frontend attributes), or None when that is not a hashable value or the check
    also reads a literal."""
    if inst.literal is not None:
        return None
    key = (inst.opcode, inst.shape, tuple([o.shape for o in inst.operands]),
           tuple([item for item in inst.attrs.items() if item[0] not in _NOT_SHAPE_ATTRIBUTES]))
    try:
        hash(key)
    except TypeError:
        return None
    return key
