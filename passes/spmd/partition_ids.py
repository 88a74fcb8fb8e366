"""Per-partition values from `partition-id`: table lookups
(docs/design/partitioning.md#partition-id-tables).

All per-partition behaviour of the SPMD program comes from small constant tables indexed by
device id, read with

    table = s32[N] constant({...})
    slot  = s32[1] dynamic-slice(table, partition-id), dynamic_slice_sizes={1}
    value = s32[] reshape(slot)

A table whose entries are all equal is emitted as a scalar constant. Tables are built with
vectorised numpy from a `Tiling` (offsets `ordinal * shard_size`, partial indices),
so nothing here loops over devices. Lookups are cached per builder, so a computation reads each
table once.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape

from .builder import Builder
from .tiling import Tiling


class PartitionTables:
    """Lookups of per-device tables for the computation `builder` appends to."""

    def __init__(self, builder: Builder, num_devices: int):
        self.builder = builder
        self.num_devices = num_devices
        self._pid: Instruction | None = None
        self._cache: dict[tuple, Instruction] = {}

    def partition_id(self) -> Instruction:
        """The computation's `u32[] partition-id()` (created on first use)."""
        if self._pid is None:
            with self.builder.scope(None):
                self._pid = self.builder.add("partition-id", ArrayShape("u32", ()))
        return self._pid

    def lookup(self, table: np.ndarray, name: str = "table") -> Instruction:
        """`s32[]` holding `table[partition-id]`."""
        table = np.asarray(table, dtype=np.int32)
        if table.shape != (self.num_devices,):
            raise ValueError(f"partition table of shape {table.shape} for {self.num_devices} "
                             "devices")
        key = ("lookup", table.tobytes())
        if key in self._cache:
            return self._cache[key]
        b = self.builder
        with b.scope(None):
            if (table == table[0]).all():
                value = b.constant(int(table[0]), "s32", name=f"{name}.value")
            else:
                constant = b.constant(table, "s32", name=name)
                slot = b.dynamic_slice(constant, [self.partition_id()], [1])
                value = b.reshape(slot, ())
        self._cache[key] = value
        return value

    def zero(self) -> Instruction:
        return self.lookup(np.zeros(self.num_devices, dtype=np.int32), "zero")

    def offsets(self, tiling: Tiling, dims: Sequence[int]) -> list[Instruction]:
        """Per data dim, the padded offset of this partition's tile (`ordinal * shard`)."""
        table = tiling.offsets(dims)
        return [self.lookup(table[:, d], f"offset.{d}") for d in range(tiling.rank)]

    def partial_index(self, tiling: Tiling) -> Instruction:
        return self.lookup(tiling.coordinates()[:, tiling.rank], "partial")

    def device_is(self, device: int) -> Instruction:
        """`pred[]`: whether this partition is `device`."""
        b = self.builder
        key = ("device_is", device)
        if key not in self._cache:
            with b.scope(None):
                k = b.constant(device, "u32")
                self._cache[key] = b.compare(self.partition_id(), k, "EQ")
        return self._cache[key]


__all__ = ["PartitionTables"]
