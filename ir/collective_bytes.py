"""Bytes each partition sends and receives in one execution of a collective.

The model is the ring algorithm's (XLA's cost estimates use it too), with `b` the bytes of the
partition's operands and `G` the size of its group (`gspmdc.ir.collective_groups`):

| collective          | sent = received per partition                          |
|---------------------|--------------------------------------------------------|
| all-gather          | `(G-1) b`                                              |
| all-reduce          | `2 (G-1) b / G` (reduce-scatter, all-gather by chunks) |
| reduce-scatter      | `(G-1) b / G`                                          |
| all-to-all          | `(G-1) b / G`                                          |
| collective-permute  | sent `b` by a source with another target; received `b` |
|                     | by a target with another source                        |
| collective-broadcast| a chain from the group's first member: sent `b` by     |
|                     | every member but the last, received `b` by every       |
|                     | member but the first                                   |

Divisions round down to whole bytes. A group of one moves nothing. The bytes an MPI library
really moves depend on the algorithm it picks; this is the measure `gspmdc cost` predicts and
`gspmdc run --profile` counts, execution by execution.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from . import dtypes
from .collective_groups import participant_groups, permute_pairs
from .module import Instruction


@dataclass(frozen=True)
class CollectiveBytes:
    """One execution of a collective on `num_partitions` partitions: the partitions' groups (a
    collective-permute's pairs as groups of two, a partition that keeps its own value a group of
    one), the group size, and the bytes each partition sends and receives."""

    opcode: str
    groups: tuple[tuple[int, ...], ...]
    group_size: int
    operand_bytes: int
    sent: tuple[int, ...]
    received: tuple[int, ...]


def collective_bytes(inst: Instruction, num_partitions: int) -> CollectiveBytes:
    """The bytes of one execution of `inst`, a collective of the opcode catalogue
    (`gspmdc.ir.ops.COLLECTIVES`; see the module docstring)."""
    b = sum(_bytes(o.shape) for o in inst.operands)
    if inst.opcode == "collective-permute":
        pairs = permute_pairs(inst, num_partitions)
        sent = [0] * num_partitions
        received = [0] * num_partitions
        for source, target in pairs:
            if source != target:
                sent[source] += b
                received[target] += b
        return CollectiveBytes(inst.opcode, tuple(pairs), 2 if any(s != t for s, t in pairs)
                               else 1, b, tuple(sent), tuple(received))
    groups = participant_groups(inst, num_partitions)
    g = len(groups[0])
    if inst.opcode == "collective-broadcast":
        sent = [0] * num_partitions
        received = [0] * num_partitions
        for group in groups:
            for position, partition in enumerate(group):
                sent[partition] = b if position < g - 1 else 0
                received[partition] = b if position > 0 else 0
        return CollectiveBytes(inst.opcode, tuple(tuple(group) for group in groups), g, b,
                               tuple(sent), tuple(received))
    per_partition = _ring_bytes(inst.opcode, b, g)
    return CollectiveBytes(inst.opcode, tuple(tuple(group) for group in groups), g, b,
                           (per_partition,) * num_partitions, (per_partition,) * num_partitions)


def _ring_bytes(opcode: str, b: int, g: int) -> int:
    if opcode == "all-gather":
        return (g - 1) * b
    if opcode == "all-reduce":
        return 2 * (g - 1) * b // g
    return (g - 1) * b // g


def _bytes(shape) -> int:
    return sum(prod(leaf.dims) * dtypes.byte_width(leaf.element_type) for leaf in shape.leaves())


__all__ = ["CollectiveBytes", "collective_bytes"]
