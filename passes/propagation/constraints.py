"""Refining constraints with unspecified dims (§3.9; XLA's InferUnspecifiedDimsFrom*).

A sharding constraint with `unspecified_dims` fixes the tiling of its other dims and leaves these
open. At levels >= 1 the constraint takes a neighbour's sharding (its operand forward, each user
backward, each shard-group member), keeps only its tiling on the unspecified dims, and merges it
into the annotation when the two are compatible. The constraint stays fixed otherwise.
"""
from __future__ import annotations

from gspmdc.ir import sharding_ops as ops
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding

from .backward_rules import from_user
from .context import Context, Proposal
from .opclass import BARRIER_FROM, BARRIER_TO, target
from .sharding_algebra import is_spatially_partitioned, merge_if_compatible


def _refine(current: HloSharding, neighbour: HloSharding | None,
            unspecified: tuple[int, ...]) -> HloSharding | None:
    if neighbour is None or not neighbour.is_tiled or current.is_tuple or current.is_manual:
        return None
    keep = ops.replicate_all_except(neighbour, unspecified)
    return merge_if_compatible(keep, current)


def from_operand(ctx: Context, inst: Instruction, unspecified: tuple[int, ...]) -> Proposal | None:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding):
        return None
    refined = _refine(inst.sharding, op.sharding, unspecified)
    return None if refined is None else Proposal(refined, "unspecified dims", (op,))


def from_users(ctx: Context, inst: Instruction, unspecified: tuple[int, ...]) -> Proposal | None:
    current, sources = inst.sharding, []
    for user in ctx.graph.users[inst]:
        candidate = from_user(ctx, inst, user)
        if candidate is None or candidate.is_tile_maximal:
            continue
        refined = _refine(current, candidate, unspecified)
        if refined is not None:
            current = refined
            sources.append(user)
    return Proposal(current, "unspecified dims", tuple(sources)) if sources else None


def from_group(ctx: Context, inst: Instruction, unspecified: tuple[int, ...],
               members: list[Instruction]) -> Proposal | None:
    if target(inst) == BARRIER_TO:
        return None
    current, sources = inst.sharding, []
    for member in members:
        if member is inst or target(member) == BARRIER_FROM:
            continue
        refined = _refine(current, member.sharding, unspecified)
        if refined is not None:
            current = refined
            sources.append(member)
    return Proposal(current, "unspecified dims", tuple(sources)) if sources else None
