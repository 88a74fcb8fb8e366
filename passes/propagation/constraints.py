"""Refining constraints with unspecified dims
(docs/design/propagation.md#constraints-and-shard-groups; XLA's InferUnspecifiedDimsFrom*).

A sharding constraint with `unspecified_dims` fixes the tiling of its other dims and leaves these
open. At levels >= 1 the constraint takes a neighbour's sharding (its operand forward, each user
backward, each shard-group member), keeps only its tiling on the unspecified dims, and merges it
into the annotation when the two are compatible. The constraint stays fixed otherwise.

Next to a manual boundary (the constraint's only user is an `SPMDFullToShardShape` /
`SPMDShardToFullShape` with the same unspecified dims) the constraint and the boundary are refined
together: the pair has an *auto-side* sharding (full shape) and a *manual-side* one (the same
tiling with the specified dims' tiles turned into the manual subgroup). Neighbours on either side
are translated to the auto side, merged there, and both shardings are rewritten.
"""
from __future__ import annotations

from math import prod

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.custom_call_targets import (
    BARRIER_FROM, BARRIER_TO, FULL_TO_SHARD, SHARD_TO_FULL, target_of,
)
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import is_spatially_partitioned, merge_if_compatible

from . import manual_pair as pair
from .backward_rules import from_user
from .context import Context, Proposal
from .preprocess import unspecified_dims

Refinement = list[tuple[Instruction, Proposal]]
_RULE = "unspecified dims"


def _refine(current: HloSharding, neighbour: HloSharding | None,
            unspecified: tuple[int, ...]) -> HloSharding | None:
    """`current` merged with `neighbour`'s tiling on the unspecified dims, or None."""
    if neighbour is None or not neighbour.is_tiled or current.is_tuple or current.is_manual:
        return None
    return merge_if_compatible(algebra.replicate_all_except(neighbour, unspecified), current)


# ---- auto side <-> manual side -------------------------------------------------------------

def manual_side(auto: HloSharding, unspecified: tuple[int, ...]) -> HloSharding:
    """The specified dims' tiles of an auto-side sharding become the manual subgroup."""
    if not auto.is_tiled or auto.subgroup_types not in ((), ("replicated",)):
        return auto
    rank, ta = auto.data_rank, auto.tile_assignment
    specified = [d for d in range(rank) if d not in unspecified]
    kept = [d for d in range(rank) if d in unspecified]
    dims = [auto.tile_counts[d] if d in unspecified else 1 for d in range(rank)]
    dims.append(prod(auto.tile_counts[d] for d in specified))
    dims += list(ta.dims[rank:])
    moved = ta.transpose(kept + specified + list(range(rank, ta.ndim))).reshape(dims)
    return HloSharding.tiled(moved, ("manual",) + auto.subgroup_types)


def auto_side(manual: HloSharding, unspecified: tuple[int, ...],
              template: HloSharding) -> HloSharding | None:
    """Inverse of `manual_side`: the manual subgroup split back into the specified dims' tiles of
    `template` (an auto-side sharding of the same boundary); None when the sizes disagree."""
    if not manual.is_tiled or not manual.has_manual_subgroup or not template.is_tiled:
        return None
    rank = manual.data_rank
    specified = [d for d in range(rank) if d not in unspecified]
    kept = [d for d in range(rank) if d in unspecified]
    tiles = [template.tile_counts[d] for d in specified]
    if prod(tiles) != manual.subgroup_size("manual") or \
            any(manual.tile_counts[d] != 1 for d in specified):
        return None
    rest = [t for t in manual.subgroup_types if t != "manual"]
    split = manual.tile_assignment.reshape(
        [manual.tile_counts[d] for d in kept] + tiles + [manual.subgroup_size(t) for t in rest])
    order = [kept.index(d) if d in unspecified else len(kept) + specified.index(d)
             for d in range(rank)]
    order += list(range(len(kept) + len(tiles), split.ndim))
    return HloSharding.tiled(split.transpose(order), rest)


# ---- the boundary pair ---------------------------------------------------------------------

def _boundary_after(ctx: Context, inst: Instruction, unspecified: tuple[int, ...]):
    """The manual boundary that is `inst`'s only user, None if there is none, False when there is
    one whose unspecified dims differ (then nothing may be refined)."""
    users = ctx.graph.users[inst]
    if len(users) != 1 or target_of(users[0]) not in (FULL_TO_SHARD, SHARD_TO_FULL):
        return None
    return users[0] if unspecified_dims(users[0]) == unspecified else False


def _pair(inst: Instruction, boundary: Instruction) -> tuple[Instruction, Instruction]:
    """(auto-side, manual-side) members of a constraint + boundary pair."""
    return (inst, boundary) if target_of(boundary) == FULL_TO_SHARD else (boundary, inst)


def _refine_pair(inst: Instruction, boundary: Instruction, unspecified: tuple[int, ...],
                 neighbours: list[tuple[Instruction, HloSharding | None, bool]]) -> Refinement:
    """Merge each `(source, sharding, is_manual_side)` neighbour into the pair's auto side."""
    auto, manual = _pair(inst, boundary)
    current, sources = auto.sharding, []
    for source, sharding, on_manual_side in neighbours:
        if on_manual_side and sharding is not None:
            sharding = auto_side(sharding, unspecified, current) or \
                pair.auto_side(sharding, auto.sharding, manual.sharding)
        refined = _refine(current, sharding, unspecified)
        if refined is not None:
            current, sources = refined, sources + [source]
    if not sources:
        return []
    value = manual_side(current, unspecified)
    if _manual_groups_differ(value, manual.sharding):
        # JAX's form of a partially manual region: the manual part is the pair's own
        value = pair.manual_side(current, auto.sharding, manual.sharding)
        if value is None:
            return []
    out = []
    for member, value in ((auto, current), (manual, value)):
        if value != member.sharding:
            out.append((member, Proposal(value, _RULE, tuple(sources))))
    return out


def _manual_groups_differ(a: HloSharding, b: HloSharding) -> bool:
    """Whether two manual-side shardings keep different devices apart (b partially manual)."""
    if not (b.is_tiled and b.has_manual_subgroup):
        return False
    if not (a.is_tiled and a.has_manual_subgroup):
        return True
    return _groups(a) != _groups(b)


def _groups(sharding: HloSharding) -> frozenset:
    table = sharding.tile_assignment.coordinates()[:, sharding.subgroup_dim("manual")]
    groups: dict[int, set] = {}
    for device, group in enumerate(table.tolist()):
        groups.setdefault(group, set()).add(device)
    return frozenset(frozenset(g) for g in groups.values())


# ---- the three directions ------------------------------------------------------------------

def from_operand(ctx: Context, inst: Instruction, unspecified: tuple[int, ...]) -> Refinement:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding) or not op.sharding.is_tiled:
        return []
    boundary = _boundary_after(ctx, inst, unspecified)
    if boundary is False:
        return []
    if boundary is not None:
        on_manual_side = target_of(boundary) == SHARD_TO_FULL
        return _refine_pair(inst, boundary, unspecified, [(op, op.sharding, on_manual_side)])
    refined = _refine(inst.sharding, op.sharding, unspecified)
    return [] if refined is None else [(inst, Proposal(refined, _RULE, (op,)))]


def from_users(ctx: Context, inst: Instruction, unspecified: tuple[int, ...]) -> Refinement:
    boundary = _boundary_after(ctx, inst, unspecified)
    if boundary is False:
        return []
    if boundary is not None:
        on_manual_side = target_of(boundary) == FULL_TO_SHARD
        neighbours = []
        for user in ctx.graph.users[boundary]:
            candidate = from_user(ctx, boundary, user)
            if candidate is not None and not candidate.is_tile_maximal:
                neighbours.append((user, candidate, on_manual_side))
        return _refine_pair(inst, boundary, unspecified, neighbours)
    current, sources = inst.sharding, []
    for user in ctx.graph.users[inst]:
        candidate = from_user(ctx, inst, user)
        if candidate is None or candidate.is_tile_maximal:
            continue
        refined = _refine(current, candidate, unspecified)
        if refined is not None:
            current, sources = refined, sources + [user]
    return [(inst, Proposal(current, _RULE, tuple(sources)))] if sources else []


def from_group(ctx: Context, inst: Instruction, unspecified: tuple[int, ...],
               members: list[Instruction]) -> Refinement:
    if target_of(inst) == BARRIER_TO:
        return []
    current, sources = inst.sharding, []
    for member in members:
        if member is inst or target_of(member) == BARRIER_FROM:
            continue
        refined = _refine(current, member.sharding, unspecified)
        if refined is not None:
            current, sources = refined, sources + [member]
    return [(inst, Proposal(current, _RULE, tuple(sources)))] if sources else []


def boundary_after(ctx: Context, inst: Instruction, unspecified: tuple[int, ...]) -> Instruction | None:
    """The manual boundary refined together with `inst`, if any."""
    boundary = _boundary_after(ctx, inst, unspecified)
    return boundary or None
