"""Who talks to whom in a collective of a program with one replica and N partitions: the groups of
partition ids (XLA's collective group modes) and a collective-permute's source-target pairs.

The runtime's backends move data with these groups and `ir/cost.py` counts the bytes with them
(for the reshard planner, `gspmdc explain`, `gspmdc cost` and `run --profile`), so all read a
collective the same way.
"""
from __future__ import annotations

from typing import Sequence

from gspmdc.errors import GspmdcError

from .module import Instruction
from .ops import opcodes

#: collectives without `use_global_device_ids`: with a `channel_id` their groups hold partition ids
CROSS_PARTITION_OPCODES = opcodes("all-to-all", "collective-broadcast")


def participant_groups(inst: Instruction, num_partitions: int) -> list[list[int]]:
    """The groups of partition ids (order significant) of an all-reduce, all-gather,
    reduce-scatter, all-to-all or collective-broadcast (or an async start of
    one) on `num_partitions` partitions of one replica (the group modes of XLA's
    `collective_op_group_mode`):

    - no `channel_id`: cross-replica; groups hold replica ids (only 0 exists), so every partition
      is a group of its own;
    - `channel_id` and `use_global_device_ids=true`, or a collective without that attribute
      (all-to-all, collective-broadcast) with `channel_id`: the groups hold
      partition ids (`{}` = one group of all partitions);
    - `channel_id` without `use_global_device_ids`: cross-replica-and-partition; the groups hold
      replica ids and each spans all partitions of its replicas, i.e. one group of everybody.

    Raises GspmdcError for ids out of range, duplicate ids, or groups of unequal sizes.
    """
    groups = _explicit_groups(inst)
    if inst.attr("channel_id") is None:
        _check_ids(inst, groups, 1, "replica")
        return [[p] for p in range(num_partitions)]
    if inst.attr("use_global_device_ids", False) or inst.opcode in CROSS_PARTITION_OPCODES:
        if not groups:
            return [list(range(num_partitions))]
        _check_ids(inst, groups, num_partitions, "partition")
        if len({len(g) for g in groups}) != 1:
            raise GspmdcError(f"{inst.opcode} {inst.name}: replica_groups have unequal sizes "
                              f"{[len(g) for g in groups]}")
        return groups
    _check_ids(inst, groups, 1, "replica")
    return [list(range(num_partitions))]


def group_of(inst: Instruction, groups: list[list[int]],
             partition_id: int) -> tuple[list[int], int]:
    """The group containing `partition_id` and the partition's position in it."""
    for group in groups:
        if partition_id in group:
            return group, group.index(partition_id)
    raise GspmdcError(f"{inst.opcode} {inst.name}: partition {partition_id} is in none of the "
                      f"groups {groups}")


def permute_pairs(inst: Instruction, num_partitions: int) -> list[tuple[int, int]]:
    """The (source, target) partition pairs of a collective-permute (or its async start).

    With `channel_id` the pairs name partitions. Without it the permute is cross-replica and the
    pairs name replicas; with one replica only `(0, 0)` can occur, meaning every partition keeps its
    own value. Each id may be a source at most once and a target at most once.
    """
    pairs = [(int(s), int(t)) for s, t in inst.attr("source_target_pairs", ())]
    cross_replica = inst.attr("channel_id") is None
    limit, kind = (1, "replica") if cross_replica else (num_partitions, "partition")
    _check_ids(inst, [[s] for s, _ in pairs], limit, kind)
    _check_ids(inst, [[t] for _, t in pairs], limit, kind)
    if cross_replica:
        return [(p, p) for p in range(num_partitions)] if pairs else []
    return pairs


def permute_source(pairs: Sequence[tuple[int, int]], partition_id: int) -> int | None:
    """The partition whose operand `partition_id` receives, or None (it receives zeros)."""
    for source, target in pairs:
        if target == partition_id:
            return source
    return None


def _explicit_groups(inst: Instruction) -> list[list[int]]:
    groups = inst.attr("replica_groups")
    if groups is None:
        return []
    return [list(g) for g in groups.groups]


def _check_ids(inst: Instruction, groups: list[list[int]], limit: int, kind: str) -> None:
    seen: set[int] = set()
    for group in groups:
        for i in group:
            if not 0 <= i < limit:
                what = "one replica" if kind == "replica" else f"{limit} partitions"
                raise GspmdcError(f"{inst.opcode} {inst.name}: {kind} id {i} in its groups does "
                                  f"not exist (the program runs on {what})")
            if i in seen:
                raise GspmdcError(f"{inst.opcode} {inst.name}: {kind} id {i} appears twice in its "
                                  "groups")
            seen.add(i)


__all__ = ["participant_groups", "group_of", "permute_pairs", "permute_source",
           "CROSS_PARTITION_OPCODES"]
