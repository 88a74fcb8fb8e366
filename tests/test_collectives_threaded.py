"""The collective kernels and the `CollectiveBackend` contract on several partitions: XLA's own
SPMD programs (`xla_spmd.hlo`, with all-reduce, all-gather, all-to-all, collective-permute and
while loops) run one interpreter per partition in threads, on a minimal test backend built only
from the shared group helpers, and must reproduce JAX's outputs."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module, parse_sharding
from gspmdc.runtime.collectives import (
    CollectiveBackend, fold, gather_concat, group_of, participant_groups, permute_pairs,
    permute_source, scatter_block, split_blocks,
)
from gspmdc.runtime.interpreter import evaluate

SHARED = Path(__file__).resolve().parents[2] / "shared"


class _Exchange:
    """Every partition posts a value and receives all partitions' values (two barrier phases)."""

    def __init__(self, n: int):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots: list = [None] * n

    def all_values(self, partition: int, value) -> list:
        self.slots[partition] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()
        return values


class _ThreadBackend(CollectiveBackend):
    def __init__(self, exchange: _Exchange, partition: int):
        self.exchange, self.partition = exchange, partition

    @property
    def num_partitions(self) -> int:
        return self.exchange.n

    def partition_id(self) -> int:
        return self.partition

    def _group(self, inst, operands):
        values = self.exchange.all_values(self.partition, list(operands))
        group, position = group_of(inst, participant_groups(inst, self.exchange.n), self.partition)
        return [values[m] for m in group], position

    def all_reduce(self, inst, operands, reduction):
        members, _ = self._group(inst, operands)
        return [fold([m[i] for m in members], reduction) for i in range(len(operands))]

    def all_gather(self, inst, operands, dim):
        members, _ = self._group(inst, operands)
        return [gather_concat([m[i] for m in members], dim) for i in range(len(operands))]

    def reduce_scatter(self, inst, operands, dim, reduction):
        members, k = self._group(inst, operands)
        return [scatter_block(fold([m[i] for m in members], reduction), dim, k, len(members))
                for i in range(len(operands))]

    def all_to_all(self, inst, operands, dim):
        members, k = self._group(inst, operands)
        if dim is None:
            return [m[k] for m in members]
        return [gather_concat([split_blocks(m[i], dim, len(members))[k] for m in members], dim)
                for i in range(len(operands))]

    def collective_permute(self, inst, operand):
        values = self.exchange.all_values(self.partition, operand)
        source = permute_source(permute_pairs(inst, self.exchange.n), self.partition)
        return np.zeros_like(operand) if source is None else values[source]


def _programs():
    folder = SHARED / "jax-programs"
    return sorted(p for p in folder.iterdir() if (p / "xla_spmd.hlo").is_file()) \
        if folder.is_dir() else []


def _shard(value, sharding, shape, partition, n, local_shape):
    offset = sharding.offset_table(shape, n)[partition]
    piece = value[tuple(slice(o, o + s) for o, s in zip(offset, local_shape.dims))]
    return np.pad(piece, [(0, s - k) for s, k in zip(local_shape.dims, piece.shape)])


def _unshard(pieces, sharding, shape, n):
    out = np.zeros(shape.dims, pieces[0].dtype)
    for offset, piece in zip(sharding.offset_table(shape, n), pieces):
        index = tuple(slice(o, min(o + s, d)) for o, s, d in zip(offset, piece.shape, shape.dims))
        out[index] = piece[tuple(slice(0, i.stop - i.start) for i in index)]
    return out


@pytest.mark.parametrize("folder", _programs(), ids=lambda p: p.name)
def test_xla_spmd_program_on_threaded_partitions(folder):
    program = parse_module((folder / "program.hlo").read_text())
    spmd = parse_module((folder / "xla_spmd.hlo").read_text())
    n = spmd.num_partitions
    reference = json.loads((folder / "reference.json").read_text())
    with np.load(folder / "inputs.npz") as inputs:
        args = [[_shard(inputs[f"arg{g.parameter_number}"], g.sharding, g.shape, p, n, s.shape)
                 for g, s in zip(program.entry.parameters, spmd.entry.parameters)]
                for p in range(n)]
    exchange = _Exchange(n)
    results, errors = [None] * n, []

    def run(p):
        try:
            results[p] = evaluate(spmd, args[p], backend=_ThreadBackend(exchange, p))
        except Exception as e:   # reported below; abort so that the other partitions stop waiting
            errors.append(e)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(p,)) for p in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    shape = program.entry.root.shape
    leaves = list(shape.elements) if shape.is_tuple else [shape]
    with np.load(folder / "outputs.npz") as expected:
        for k, (leaf, out) in enumerate(zip(leaves, reference["outputs"])):
            pieces = [r[k] if shape.is_tuple else r for r in results]
            value = _unshard(pieces, parse_sharding(out["hlo_sharding"]), leaf, n)
            np.testing.assert_allclose(value, expected[f"out{k}"], rtol=2e-5, atol=2e-5,
                                       err_msg=f"{folder.name} out{k}")
