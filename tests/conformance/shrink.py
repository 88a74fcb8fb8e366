"""Delta debugging over a module: the smallest entry computation that still shows a divergence.

    smaller = shrink(text, still_diverges, budget=150)

`still_diverges(text) -> bool` runs the candidate and says whether the divergence persists.
Starting from a valid module, the shrinker tries, in this order, until none applies or `budget`
candidates have been run:
- removing the dead code the module has;
- making an operand of the root the root;
- replacing an instruction of the entry by a new entry parameter of its shape (keeping the
  instruction's sharding annotation, if it had one), last instructions first;
- removing an entry parameter nothing uses;
- removing one sharding annotation.
After each change, what the change left dead (instructions and parameters, the others
renumbered) and computations nothing calls are removed, and so is all metadata. Dead code the
module had stays until removing it keeps the divergence: XLA's import leaves dead users of
parameters that can matter. A candidate gspmdc cannot re-parse and verify is skipped without
running it. Only the entry computation is reduced; called computations go with their callers.
"""
from __future__ import annotations

from typing import Callable

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Computation, Instruction, Module

#: module header attributes kept: the rest (entry_computation_layout, the propagation options XLA
#: writes back) would contradict a smaller entry signature or the case's own options
KEPT_HEADER = ("num_partitions",)


def _live(comp: Computation) -> set[str]:
    """Names of the instructions the root depends on."""
    live: set[str] = set()
    stack = [comp.root]
    while stack:
        inst = stack.pop()
        if inst.name not in live:
            live.add(inst.name)
            stack.extend(inst.operands)
    return live


def _apply(text: str, change) -> str:
    """`text` with `change(module)` applied, then what the change left dead removed: entry
    instructions (parameters too, the others renumbered) the root depended on before and no
    longer does, and computations nothing calls. Dead code the module had is kept (it may be
    what diverges; the `None` change removes it). The header attributes a smaller signature
    would contradict, and all metadata (meaningless to both compilers), are dropped."""
    module = api.parse(text, "<shrink>", verify=False)
    entry = module.entry
    already_dead = set() if change is None else \
        {i.name for i in entry.instructions} - _live(entry)
    if change is not None:
        change(module)
    keep = _live(entry) | already_dead
    entry.instructions = [i for i in entry.instructions if i.name in keep]
    for number, param in enumerate(entry.parameters):
        param.parameter_number = number
    called = {module.entry_name}
    pending = [module.entry_name]
    while pending:
        for inst in module.computations[pending.pop()].instructions:
            for name in inst.called_computation_names():
                if name not in called:
                    called.add(name)
                    pending.append(name)
    module.computations = {n: c for n, c in module.computations.items() if n in called}
    module.attrs = {k: v for k, v in module.attrs.items() if k in KEPT_HEADER}
    for _, inst in module.all_instructions():
        inst.attrs.pop("metadata", None)
        if inst.sharding is not None:
            inst.sharding = inst.sharding.with_metadata(())
    return api.to_text(module)


def _replace(comp: Computation, old: Instruction, new: Instruction) -> None:
    for inst in comp.instructions:
        inst.operands = [new if o is old else o for o in inst.operands]
    if comp.root is old:
        comp.root = new


def _candidates(text: str):
    """Changes making `text` smaller, most aggressive first (`None`: remove dead code)."""
    probe = api.parse(text, "<shrink>", verify=False)
    entry = probe.entry
    yield None
    for k in range(len(entry.root.operands)):
        def new_root(m: Module, k=k) -> None:
            m.entry.root = m.entry.root.operands[k]
        yield new_root
    names = [i.name for i in entry.instructions if i.opcode != "parameter"]
    for name in reversed(names):
        def to_parameter(m: Module, name=name) -> None:
            comp = m.entry
            old = comp.instruction(name)
            param = Instruction(f"{name}.p", "parameter", old.shape, sharding=old.sharding,
                                parameter_number=len(comp.parameters))
            comp.instructions.insert(0, param)
            _replace(comp, old, param)
        yield to_parameter
    used = {o.name for i in entry.instructions for o in i.operands} | {entry.root.name}
    for param in entry.parameters:
        if param.name not in used:
            def drop(m: Module, name=param.name) -> None:
                comp = m.entry
                comp.instructions.remove(comp.instruction(name))
            yield drop
    for comp in probe.computations.values():
        for inst in comp.instructions:
            if inst.sharding is not None:
                def unshard(m: Module, c=comp.name, name=inst.name) -> None:
                    m.computations[c].instruction(name).sharding = None
                yield unshard


def size(text: str) -> int:
    """Instructions in the module."""
    return sum(1 for _ in api.parse(text, "<shrink>", verify=False).all_instructions())


def shrink(text: str, still_diverges: Callable[[str], bool], budget: int = 150) -> str:
    """The smallest variant of `text` found for which `still_diverges` holds (see the module
    docstring); `text` itself when nothing smaller does."""
    current = text
    runs = 0
    progress = True
    while progress and runs < budget:
        progress = False
        for change in _candidates(current):
            if runs >= budget:
                break
            try:
                candidate = _apply(current, change)
                api.parse(candidate, "<shrink>")         # must re-parse and verify
            except (GspmdcError, KeyError, IndexError):
                continue
            if candidate == current:
                continue
            runs += 1
            if still_diverges(candidate):
                current = candidate
                progress = True
                break
    return current
