"""Explaining an SPMD module: why a collective (or any instruction the partitioner created) is
there, what it sends, and where the shardings it reconciles come from.

The partitioner records its reasons in instruction metadata (`insert_reshards.reshard_metadata`,
`pad_uneven.mask_padding`) and keeps the names and shardings of the original instructions, so
the explanation needs nothing but the module text:

    all-gather = f32[16,32] all-gather: 1 group of 2 devices, sends 1024 bytes per device
    why: dot runs replicated
      dot.3 needs its operand 1 w.1 as {replicated}; w.1 is {devices=[2,1]<=[2]}
      step 1/1: all-gather dim 0 over groups of 2
    where w.1's sharding comes from:
      w.1  {devices=[2,1]<=[2]}  ← user annotation

Bytes per device are the cost model's (`gspmdc.ir.cost`, docs/design/cost-model.md): exact, and
the same numbers the reshard planner and `gspmdc run --profile` give.
"""
from __future__ import annotations

from gspmdc.errors import GspmdcError
from gspmdc.ir.cost import instruction_traffic
from gspmdc.ir.custom_call_targets import SHARDING, target_of
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, TupleShape


def collective_result_bytes(inst: Instruction) -> int:
    """Bytes of the collective's result on one device (the measure XLA's reports use)."""
    if inst.opcode == "async-start" and isinstance(inst.shape, TupleShape):
        return inst.shape.elements[1].byte_size
    return inst.shape.byte_size


def _find(module: Module, name: str) -> tuple[Computation, Instruction]:
    for comp, inst in module.all_instructions():
        if inst.name == name:
            return comp, inst
    raise GspmdcError(f"module {module.name} has no instruction named {name!r}")


def describe_instruction(module: Module, inst: Instruction) -> str:
    """The first line of an explanation: the instruction and, for a collective, its groups and
    the bytes it sends (the cost model's)."""
    head = f"{inst.name} = {inst.shape} {inst.opcode}"
    n = module.num_partitions or 1
    traffic = instruction_traffic(inst, n, module.computations)
    if traffic is None:
        return head
    if traffic.kind == "collective-permute":
        pairs = inst.attr("source_target_pairs", ())
        moving = sum(1 for s, t in pairs if s != t)
        detail = f"{moving} of {len(pairs)} pairs move data"
    else:
        count = traffic.num_groups
        detail = f"{count} group{'s' if count != 1 else ''} of {traffic.group_size} devices"
    return f"{head}: {detail}, {traffic.describe()}"


def explain_collective(module: Module, name: str) -> list[str]:
    """Lines explaining instruction `name` of an SPMD module (see the module docstring): for a
    collective or other instruction the partitioner made, why it is there; for an instruction of
    the program, where its sharding comes from."""
    comp, inst = _find(module, name)
    lines = [describe_instruction(module, inst)]
    metadata = inst.attr("metadata")
    op_type = metadata.get("op_type") if metadata is not None else None
    if not _partitioner_made(inst):
        lines.append("an instruction of the program (not created by the partitioner)")
        if inst.sharding is not None:
            lines.append(f"where {inst.name}'s sharding comes from:")
            lines.extend("  " + line for line in sharding_origin(module, inst))
        return lines
    lines.append(f"why: {metadata.get('spmd_reason')}")
    value, user = metadata.get("spmd_value"), metadata.get("op_name")
    role = metadata.get("spmd_role")
    subject = _by_name(comp, user if role == "result" else value)
    before, after = (_named(module, metadata.get(k), subject) for k in ("spmd_from", "spmd_to"))
    if op_type == "reshard" and role == "result":
        lines.append(f"  the local {user} is {before}; {user} must be {after}")
    elif op_type == "reshard":
        lines.append(f"  {user} needs its {role} {value} as {after}; {value} is {before}")
    elif op_type != "pad-mask":
        lines.append(f"  part of the {op_type} of {user}")
    step = metadata.get("spmd_step")
    if step:
        lines.append(f"  step {step}")
    origin = _by_name(comp, value)
    if origin is None:
        return lines
    # a result reshard exists because of the producer's tiled operands; an operand reshard
    # because of the value's sharding and the user's
    sources = list(origin.operands) if role == "result" else [origin, _by_name(comp, user)]
    shown = set()
    for source in sources:
        source = _original(comp, source)
        if source is None or source.name in shown or source.sharding is None or \
                (role == "result" and not source.sharding.is_tiled):
            continue
        shown.add(source.name)
        lines.append(f"where {source.name}'s sharding comes from:")
        lines.extend("  " + line for line in sharding_origin(module, source))
    return lines


def _named(module: Module, text: str | None, inst: Instruction | None) -> str | None:
    """A sharding recorded as text, with the module's mesh axes when it has a mesh and the
    sharding is over it."""
    from gspmdc.ir.parser import parse_sharding
    from gspmdc.ir.sdy_hlo import named_text
    if text is None or inst is None or inst.shape.is_tuple:
        return text
    try:
        named = named_text(parse_sharding(text), inst.shape.rank, module)
    except GspmdcError:
        return text
    return text if named is None else named


def _original(comp: Computation, inst: Instruction | None) -> Instruction | None:
    """The program's own value behind `inst`: itself, or for an instruction the partitioner
    made (a collective, a mask), the value it was made for."""
    seen = set()
    while inst is not None and inst.name not in seen:
        seen.add(inst.name)
        if not _partitioner_made(inst):
            return inst
        inst = _by_name(comp, inst.attr("metadata").get("spmd_value"))
    return None


def _partitioner_made(inst: Instruction) -> bool:
    """Instructions the partitioner creates (reshards, padding masks, halo exchanges, prefix
    scans, windowed-einsum loops, ...) record their reason as `spmd_reason` metadata."""
    metadata = inst.attr("metadata")
    return metadata is not None and metadata.get("spmd_reason") is not None


def sharding_origin(module: Module, inst: Instruction) -> list[str]:
    """The origin chain of `inst`'s sharding: propagation's record when the module has one
    (`passes/propagation`), else the chain through operands with the same sharding."""
    from gspmdc.passes.propagation import explain
    try:
        return explain(module, inst.name)
    except GspmdcError:
        return _sharding_chain(inst)


def _by_name(comp: Computation, name) -> Instruction | None:
    for inst in comp.instructions:
        if inst.name == name:
            return inst
    return None


def _sharding_chain(inst: Instruction) -> list[str]:
    """From `inst` back through operands with the same sharding to where that sharding starts:
    an annotated parameter or constraint, or the instruction whose operands disagree."""
    lines = []
    seen = set()
    while inst is not None and inst not in seen:
        seen.add(inst)
        sharding = inst.sharding
        text = sharding.to_text() if sharding is not None else "none"
        line = f"{inst.name} = {inst.opcode}, sharding={text}"
        if inst.opcode == "parameter":
            lines.append(line + "  <- entry parameter annotation")
            break
        if target_of(inst) == SHARDING and \
                (inst.attr("metadata") is None or
                 inst.attr("metadata").get("op_type") != "reshard"):
            lines.append(line + "  <- sharding annotation")
            break
        same = [o for o in inst.operands if o.sharding is not None and sharding is not None and
                o.sharding == sharding and isinstance(o.shape, ArrayShape) and
                o.shape.rank == inst.shape.rank]
        if not same:
            lines.append(line + "  <- chosen here (its operands are sharded differently)")
            break
        lines.append(line)
        inst = same[0]
    return lines


__all__ = ["explain_collective", "describe_instruction", "sharding_origin",
           "collective_result_bytes"]
