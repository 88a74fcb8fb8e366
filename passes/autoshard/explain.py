"""`explain` of a module written by `autoshard`: why an instruction has its sharding.

The record `annotate.py` leaves on the instruction gives the chosen sharding's modelled costs
and the shardings rejected for it, each with the change of the plan's modelled step time it
would make (its computation and communication parts), the instruction's bytes per device under
it, and whether it breaks the memory limit. A pinned instruction (its sharding given by the
user) has no record and is said to be pinned.
"""
from __future__ import annotations

from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Instruction, Module

from .annotate import header_summary, read_record, reshard_users


def is_autoshard_output(module: Module) -> bool:
    """Whether `module` was written by `autoshard` (its header carries the plan summary)."""
    return header_summary(module) is not None


def explain_choice(module: Module, name: str) -> list[str]:
    """Lines saying why instruction `name` (or `computation:name`) has its sharding in a module
    written by `autoshard`. GspmdcError for an unknown name or a malformed record."""
    inst = _find(module, name)
    sharding = inst.sharding.to_text(False) if inst.sharding is not None else "{replicated}"
    try:
        record = read_record(inst)
    except ValueError as e:
        raise GspmdcError(f"explain: {e}") from None
    lines = []
    placed = reshard_users(inst)
    if placed is not None:
        lines.append(f"{inst.name}  {sharding}  ← a reshard autoshard placed: "
                     f"{inst.operands[0].name} resharded once, {placed}")
    elif record is None:
        lines.append(f"{inst.name}  {sharding}  ← pinned: the user gave this sharding and "
                     "autoshard kept it")
    else:
        lines.append(f"{inst.name}  {sharding}  ← chosen by autoshard: compute "
                     f"{record.compute:.3g} s, communication {record.communication:.3g} s per "
                     f"run (its group of values), {record.bytes} bytes per device")
        if record.alternatives:
            lines.append("  rejected (change of the modelled step time were this value's group "
                         "alone to take it):")
            for alt in record.alternatives:
                over = "; over the memory limit" if alt.over_memory else ""
                lines.append(f"    {alt.sharding}  {alt.delta:+.3g} s (compute "
                             f"{alt.compute:+.3g} s, communication {alt.communication:+.3g} s), "
                             f"{alt.bytes} bytes per device{over}")
        else:
            lines.append("  no alternative: the partitioner can compute it in this sharding "
                         "only")
    lines.append(f"  plan: {header_summary(module)}")
    return lines


def _find(module: Module, name: str) -> Instruction:
    comp_name, _, inst_name = name.rpartition(":")
    comps = [module.computations[comp_name]] if comp_name in module.computations else \
        [module.entry] + [c for c in module.computations.values() if c is not module.entry]
    for comp in comps:
        for inst in comp.instructions:
            if inst.name == (inst_name if comp_name in module.computations else name):
                return inst
    raise GspmdcError(f"explain: no instruction named {name!r} in module {module.name!r}")


__all__ = ["explain_choice", "is_autoshard_output"]
