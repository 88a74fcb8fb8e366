"""`dot` inside a partially manual region (docs/design/partitioning.md#manual-regions):
partitioned inside every manual group as an ordinary dot of the group's tiled values.

The dot's ordinary candidates are made for the *auto equivalents* of its shardings (the manual
dim read as replication, `manual_groups.auto_equivalent`); a candidate is kept when each of its
shardings has, for every tile, the same number of holders in every manual group
(`within_groups`): it is then that many devices' tiling inside each group, written back as a
partially manual sharding. Candidates leaving partial sums are not kept (their sum would be a
collective of its own), so every kept one is a local dot of the planned shards; the fallback,
every group's whole operands, is among them (the replicated candidate). Operands without a
manual leaf keep the auto sharding the candidate gives them.
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment

from .manual_groups import auto_equivalent, is_partially_manual, manual_groups
from .op_rules import OpPlan, PlanContext, Signature, has_manual_leaf
from .op_rules_dot import DotDims, dot_candidates


def dot_plans(inst: Instruction, ctx: PlanContext, fallback: OpPlan) -> OpPlan:
    """The cheapest local-dot candidate of the module docstring (`fallback` when none)."""
    sharding = inst.sharding
    if not is_partially_manual(sharding) or \
            any(has_manual_leaf(o.sharding) and not is_partially_manual(o.sharding)
                for o in inst.operands):
        return fallback
    groups = _groups(sharding)
    if any(has_manual_leaf(o.sharding) and _groups(o.sharding) != groups
           for o in inst.operands):
        return fallback
    signature = Signature.of(inst)._replace(
        sharding=auto_equivalent(sharding),
        operand_shardings=tuple(auto_equivalent(o.sharding) if has_manual_leaf(o.sharding)
                                else o.sharding for o in inst.operands))
    candidates = []
    for plan in dot_candidates(DotDims.of(inst), signature.without_metadata(),
                                ctx.num_devices):
        result = within_groups(plan.result, inst.shape.rank, groups, ctx.num_devices)
        needs = [within_groups(need, o.shape.rank, groups, ctx.num_devices)
                 if has_manual_leaf(o.sharding) else need
                 for need, o in zip(plan.operands, inst.operands)]
        if result is not None and all(need is not None for need in needs):
            candidates.append(OpPlan(tuple(needs), result, "partially manual region: " +
                                     plan.reason))
    return ctx.choose(inst, candidates + [fallback])


def _groups(sharding: HloSharding) -> list[frozenset[int]]:
    """The manual groups of a partially manual sharding, in its manual dim's order."""
    ta = sharding.tile_assignment
    array = np.moveaxis(ta.array.reshape(ta.dims), sharding.subgroup_dim("manual"), 0)
    return [frozenset(int(d) for d in row.ravel()) for row in array]


def within_groups(auto: HloSharding, rank: int, groups: list[frozenset[int]],
                  num_devices: int) -> HloSharding | None:
    """`auto` (an ordinary leaf sharding, no partial sums) as a partially manual sharding with
    the manual `groups` (in order), or None unless every tile has the same number of holders
    in every group."""
    if auto.kind not in ("tiled", "replicated") or auto.has_unreduced:
        return None
    array = algebra.device_array(auto, rank, num_devices)      # counts + (1, holders)
    counts, holders = array.shape[:rank], array.shape[-1]
    if holders % len(groups):
        return None
    per_group = holders // len(groups)
    group_of = {d: g for g, members in enumerate(groups) for d in members}
    out = np.empty(counts + (len(groups), per_group), dtype=np.int64)
    for index in np.ndindex(*counts):
        tile = array[index].ravel()
        for g in range(len(groups)):
            members = [int(d) for d in tile if group_of.get(int(d)) == g]
            if len(members) != per_group:
                return None
            out[index + (g,)] = members
    types = ("manual", "replicated") if per_group > 1 else ("manual",)
    if per_group == 1:
        out = out.reshape(counts + (len(groups),))
    return HloSharding.tiled(TileAssignment.from_array(out), types)


__all__ = ["dot_plans", "within_groups"]
