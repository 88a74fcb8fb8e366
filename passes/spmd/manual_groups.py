"""Manual groups of partially manual shardings: the device sets a shard_map's manual axes keep
apart.

A partially manual sharding (`last_tile_dims={manual, ...}`) splits the devices into manual
groups, one per position along its manual subgroup dim: different groups hold different
(per-device) data, and inside each group the value is an ordinary tiled value. Resharding such a
value is the ordinary resharding of its *auto equivalent* (the manual dim read as replication)
run inside every group at once: correct exactly when every collective of the plan stays inside
one manual group, which `check_within_groups` verifies on the emitted program.
"""
from __future__ import annotations

import numpy as np

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import ReplicaGroups
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import Shape, TupleShape
from gspmdc.ir.tile_assignment import TileAssignment


def is_partially_manual(sharding: HloSharding | None) -> bool:
    return sharding is not None and sharding.is_tiled and sharding.has_manual_subgroup


def auto_equivalent(sharding: HloSharding) -> HloSharding:
    """A partially manual leaf sharding with its manual subgroup turned into replication: the
    non-manual layout giving every device the same data tile."""
    types = tuple("replicated" if t == "manual" else t for t in sharding.subgroup_types)
    return HloSharding.tiled(sharding.tile_assignment, types)


def _by_group(sharding: HloSharding) -> np.ndarray:
    """The device array with the manual dim first, flattened to [manual group, member]."""
    ta = sharding.tile_assignment
    array = ta.array.reshape(ta.dims)
    return np.moveaxis(array, sharding.subgroup_dim("manual"), 0).reshape(ta.dims[
        sharding.subgroup_dim("manual")], -1)


def manual_groups(sharding: HloSharding) -> frozenset[frozenset[int]]:
    """The device sets of a partially manual sharding's manual groups."""
    return frozenset(frozenset(int(d) for d in row) for row in _by_group(sharding))


def whole_in_groups(sharding: HloSharding, shape: Shape) -> HloSharding:
    """The partially manual sharding of a value of `shape` with `sharding`'s manual groups and
    no data dim tiled: every device holds its group's whole value (a tuple: per leaf)."""
    if isinstance(shape, TupleShape):
        return HloSharding.tuple([whole_in_groups(sharding, leaf) for leaf in shape.leaves()])
    groups = _by_group(sharding)
    dims = (1,) * shape.rank + groups.shape
    return HloSharding.tiled(TileAssignment.from_array(groups.reshape(dims)),
                             ("manual", "replicated"))


def same_manual_groups(a: HloSharding, b: HloSharding) -> bool:
    return is_partially_manual(a) and is_partially_manual(b) and \
        manual_groups(a) == manual_groups(b)


def check_within_groups(instructions: list[Instruction], sharding: HloSharding,
                        what: str) -> None:
    """UnsupportedError unless every collective among `instructions` (the local program of
    a reshard of values with `sharding`'s manual groups) joins devices of one manual group."""
    group_of = {d: k for k, group in enumerate(manual_groups(sharding)) for d in group}
    for inst in instructions:
        pairs = inst.attrs.get("source_target_pairs")
        replica_groups = inst.attrs.get("replica_groups")
        if pairs is not None:
            groups = [tuple(pair) for pair in pairs]
        elif isinstance(replica_groups, ReplicaGroups):
            groups = list(replica_groups.groups) or [tuple(group_of)]
        else:
            continue
        if any(len({group_of.get(d, -1) for d in group}) != 1 for group in groups):
            raise UnsupportedError(
                f"{what}: resharding inside the partially manual region "
                f"{sharding.to_text(False)} would need {inst.opcode} across its manual groups")


__all__ = ["is_partially_manual", "auto_equivalent", "manual_groups", "whole_in_groups",
           "same_manual_groups", "check_within_groups"]
