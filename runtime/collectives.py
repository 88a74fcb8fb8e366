"""Collective communication: the backend interface, the group rules and the group semantics.

The collective kernels (`kernels/collective_ops.py`) hand every all-reduce, all-gather,
reduce-scatter, all-to-all and collective-permute to the `CollectiveBackend` of the evaluation. A
backend object is *one partition's endpoint*: it knows its own partition id and the number of
partitions, and each method returns this partition's result. Backends:

- `SinglePartitionBackend` (here): one partition, every group has one member.
- a local multi-partition backend and an MPI backend (elsewhere) implement the same interface.

Everything a backend needs besides moving bytes is shared, so all backends agree exactly:
`participant_groups` / `permute_pairs` (`gspmdc.ir.collective_groups`, which the cost model reads
too) decide who talks to whom (HLO group modes, one replica), and the pure functions `fold`,
`gather_concat`, `scatter_block`, `split_blocks` compute a result from the operands of a group
*in group order* (what XLA's operation semantics specify).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir.collective_groups import group_of, participant_groups, permute_pairs, permute_source
from gspmdc.ir.module import Instruction


@dataclass(frozen=True)
class Reduction:
    """The reducer of an all-reduce or reduce-scatter.

    `combine(a, b)` applies the instruction's `to_apply` computation elementwise to two arrays of the
    operand's shape and dtype. `ufunc` is the numpy ufunc the computation equals (`np.add`,
    `np.multiply`, `np.maximum`, `np.minimum`, `np.bitwise_and/or/xor`) when it is exactly that op of
    its two parameters, else None; MPI backends use it to pick a native reduction.
    """

    combine: Callable[[np.ndarray, np.ndarray], np.ndarray]
    ufunc: np.ufunc | None = None


class Pending:
    """A collective a backend started and finishes later: `result()` completes it (once) and
    gives its value. The interpreter keeps it until the value's first use, so independent
    instructions run while the communication proceeds."""

    __slots__ = ("_finish", "_value")

    def __init__(self, finish: Callable[[], object]):
        self._finish = finish
        self._value = None

    def result(self):
        if self._finish is not None:
            self._value, self._finish = self._finish(), None
        return self._value

    def then(self, fn: Callable[[object], object]) -> "Pending":
        """A pending value `fn(result())`."""
        return Pending(lambda: fn(self.result()))


class CollectiveBackend(ABC):
    """One partition's endpoint for the collective ops of an SPMD program.

    Every method is called by all partitions of the program in the same order (the SPMD property);
    operands are numpy arrays of this partition, results are fresh or immutable arrays of the
    instruction's (per-operand) result shape and dtype, or a `Pending` giving them (the backend
    started the communication and finishes it when the value is needed: every partition starts
    them in the same order and may finish them in any order). `inst` is the collective
    instruction: use it for its attributes (via `participant_groups` / `permute_pairs`) and as a
    stable identity (e.g. its `channel_id` for message tags); do not evaluate anything else from it.
    """

    @property
    @abstractmethod
    def num_partitions(self) -> int:
        """The number of partitions of the program this endpoint belongs to."""

    @abstractmethod
    def partition_id(self) -> int:
        """This partition's id in `[0, num_partitions)`: the value of `partition-id`."""

    @abstractmethod
    def all_reduce(self, inst: Instruction, operands: Sequence[np.ndarray],
                   reduction: Reduction) -> list[np.ndarray]:
        """Each operand reduced elementwise across this partition's group (group order)."""

    @abstractmethod
    def all_gather(self, inst: Instruction, operands: Sequence[np.ndarray],
                   dim: int) -> list[np.ndarray]:
        """Each operand concatenated along `dim` over the group members, in group order."""

    @abstractmethod
    def reduce_scatter(self, inst: Instruction, operands: Sequence[np.ndarray], dim: int,
                       reduction: Reduction) -> list[np.ndarray]:
        """Each operand reduced across the group, then block `j` (of `G` equal blocks along `dim`)
        for the member at position `j` of the group."""

    @abstractmethod
    def all_to_all(self, inst: Instruction, operands: Sequence[np.ndarray],
                   dim: int | None) -> list[np.ndarray]:
        """Array form (`dim` given): each operand split along `dim` into `G` blocks; member `k`
        receives block `k` of every member, concatenated along `dim` in group order.
        Tuple form (`dim` None, `G` operands): member `k` receives operand `k` of every member."""

    @abstractmethod
    def collective_permute(self, inst: Instruction, operand: np.ndarray) -> np.ndarray:
        """The operand of this partition's source in `permute_pairs(inst, ...)`, or zeros of the
        operand's shape when this partition is no pair's target."""


def fold(values: Sequence[np.ndarray], reduction: Reduction) -> np.ndarray:
    """`reduction` applied left to right over the group's values (deterministic on every member)."""
    result = values[0]
    for value in values[1:]:
        result = reduction.combine(result, value)
    return result


def gather_concat(values: Sequence[np.ndarray], dim: int) -> np.ndarray:
    """All-gather of one operand: the group's values concatenated along `dim` in group order."""
    return values[0] if len(values) == 1 else np.concatenate(values, axis=dim)


def split_blocks(value: np.ndarray, dim: int, count: int) -> list[np.ndarray]:
    """`value` split along `dim` into `count` equal blocks (the divisibility XLA requires)."""
    if value.shape[dim] % count:
        raise GspmdcError(f"dimension {dim} of size {value.shape[dim]} does not split into "
                          f"{count} equal blocks")
    return np.split(value, count, axis=dim)


def scatter_block(value: np.ndarray, dim: int, index: int, count: int) -> np.ndarray:
    """Block `index` of `count` equal blocks of `value` along `dim` (reduce-scatter's share)."""
    return split_blocks(value, dim, count)[index]


class SinglePartitionBackend(CollectiveBackend):
    """The backend of a single-partition evaluation: every group is the partition alone, so
    all-reduce, all-gather, reduce-scatter and all-to-all return their operands, and a
    collective-permute copies only for a `(0, 0)` pair and gives zeros otherwise."""

    @property
    def num_partitions(self) -> int:
        return 1

    def partition_id(self) -> int:
        return 0

    def _group_size(self, inst: Instruction) -> int:
        group, _ = group_of(inst, participant_groups(inst, 1), 0)
        return len(group)

    def all_reduce(self, inst, operands, reduction):
        self._group_size(inst)
        return [fold([x], reduction) for x in operands]

    def all_gather(self, inst, operands, dim):
        self._group_size(inst)
        return [gather_concat([x], dim) for x in operands]

    def reduce_scatter(self, inst, operands, dim, reduction):
        self._group_size(inst)
        return [scatter_block(fold([x], reduction), dim, 0, 1) for x in operands]

    def all_to_all(self, inst, operands, dim):
        self._group_size(inst)
        if dim is None:
            if len(operands) != 1:
                raise GspmdcError(f"all-to-all {inst.name}: the tuple form needs one operand per "
                                  f"group member (1), got {len(operands)}")
            return list(operands)
        return [gather_concat(split_blocks(x, dim, 1), dim) for x in operands]

    def collective_permute(self, inst, operand):
        source = permute_source(permute_pairs(inst, 1), 0)
        return operand if source == 0 else np.zeros_like(operand)
