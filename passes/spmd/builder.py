"""Building instructions for the partitioner's passes: unique names, shapes computed as they are
created, a metadata scope, and constructors for the handful of local ops the partitioner emits.

Each pass rebuilds a computation's instruction list in program order by appending to a `Builder`;
every constructor computes the result shape from its operands (HLO semantics) so the emitted IR
verifies. Collectives are emitted in XLA's partitioner form: `channel_id` (unique per module),
explicit `replica_groups` of partition ids and `use_global_device_ids=true` (printed in iota form
by the printer whenever they are one).
"""
from __future__ import annotations

import contextlib
from itertools import count
from typing import Iterable, Sequence

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir.attributes import (
    ComputationRef, Ident, KeyValueList, Literal, PadDim, ReplicaGroups, SliceDim,
)
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, Shape


class NameUniquer:
    """Hands out names not yet used in one computation: the hint itself, else `hint.N`."""

    def __init__(self, taken: Iterable[str] = ()):
        self.taken = set(taken)
        self.counter = count(1)

    def __call__(self, hint: str) -> str:
        name = hint
        while name in self.taken:
            name = f"{hint}.{next(self.counter)}"
        self.taken.add(name)
        return name


class Builder:
    """Appends instructions to `instructions` (program order). `scope(metadata)` attaches
    `metadata=` to everything created inside it."""

    def __init__(self, names: NameUniquer, instructions: list[Instruction] | None = None):
        self.names = names
        self.instructions: list[Instruction] = [] if instructions is None else instructions
        self._metadata: KeyValueList | None = None

    @contextlib.contextmanager
    def scope(self, metadata: KeyValueList | None):
        previous = self._metadata
        self._metadata = metadata
        try:
            yield
        finally:
            self._metadata = previous

    def add(self, opcode: str, shape: Shape, operands: Sequence[Instruction] = (),
            attrs: dict | None = None, *, name: str | None = None, sharding=None,
            literal: Literal | None = None, parameter_number: int | None = None) -> Instruction:
        attrs = dict(attrs or {})
        if self._metadata is not None and "metadata" not in attrs:
            attrs["metadata"] = self._metadata
        inst = Instruction(self.names(name or opcode), opcode, shape, operands, attrs,
                           sharding=sharding, literal=literal, parameter_number=parameter_number)
        self.instructions.append(inst)
        return inst

    def append(self, inst: Instruction) -> Instruction:
        """Append an existing instruction (its name must already be reserved)."""
        self.instructions.append(inst)
        return inst

    # ---- constants and scalars ----------------------------------------------------------------

    def constant(self, value, element_type: str, name: str = "constant") -> Instruction:
        array = np.asarray(value, dtype=dtypes.numpy_dtype(element_type))
        return self.add("constant", ArrayShape(element_type, array.shape), name=name,
                        literal=Literal(array))

    def zero(self, element_type: str) -> Instruction:
        return self.constant(False if element_type == "pred" else 0, element_type)

    def broadcast(self, x: Instruction, dims: Sequence[int], operand_dims: Sequence[int] = (),
                  name: str = "broadcast") -> Instruction:
        return self.add("broadcast", x.shape.with_dims(dims), [x],
                        {"dimensions": tuple(operand_dims)}, name=name)

    # ---- data movement ------------------------------------------------------------------------

    def reshape(self, x: Instruction, dims: Sequence[int]) -> Instruction:
        return self.add("reshape", x.shape.with_dims(dims), [x])

    def transpose(self, x: Instruction, perm: Sequence[int]) -> Instruction:
        dims = [x.shape.dims[p] for p in perm]
        return self.add("transpose", x.shape.with_dims(dims), [x], {"dimensions": tuple(perm)})

    def pad_high(self, x: Instruction, dims: Sequence[int]) -> Instruction:
        """Pad `x` at the high end of each dim up to `dims` (padding value 0: it is padding)."""
        if tuple(dims) == x.shape.dims:
            return x
        zero = self.zero(x.shape.element_type)
        padding = tuple(PadDim(0, int(n) - int(s)) for n, s in zip(dims, x.shape.dims))
        return self.add("pad", x.shape.with_dims(dims), [x, zero], {"padding": padding})

    def slice_to(self, x: Instruction, dims: Sequence[int]) -> Instruction:
        """The leading `dims` elements of each dim of `x`."""
        if tuple(dims) == x.shape.dims:
            return x
        return self.add("slice", x.shape.with_dims(dims), [x],
                        {"slice": tuple(SliceDim(0, int(n)) for n in dims)})

    def dynamic_slice(self, x: Instruction, starts: Sequence[Instruction],
                      sizes: Sequence[int]) -> Instruction:
        return self.add("dynamic-slice", x.shape.with_dims(sizes), [x, *starts],
                        {"dynamic_slice_sizes": tuple(int(s) for s in sizes)})

    # ---- elementwise --------------------------------------------------------------------------

    def binary(self, opcode: str, a: Instruction, b: Instruction) -> Instruction:
        return self.add(opcode, a.shape.with_dims(a.shape.dims), [a, b])

    def compare(self, a: Instruction, b: Instruction, direction: str) -> Instruction:
        shape = ArrayShape("pred", a.shape.dims)
        return self.add("compare", shape, [a, b], {"direction": Ident(direction)})

    def select(self, predicate: Instruction, on_true: Instruction,
               on_false: Instruction) -> Instruction:
        return self.add("select", on_true.shape.with_dims(on_true.shape.dims),
                        [predicate, on_true, on_false])

    def convert(self, x: Instruction, element_type: str) -> Instruction:
        if x.shape.element_type == element_type:
            return x
        return self.add("convert", ArrayShape(element_type, x.shape.dims), [x])

    def iota(self, element_type: str, dims: Sequence[int], dimension: int) -> Instruction:
        return self.add("iota", ArrayShape(element_type, tuple(dims)),
                        attrs={"iota_dimension": dimension})

    # ---- collectives --------------------------------------------------------------------------

    def _groups(self, groups: np.ndarray) -> ReplicaGroups:
        return ReplicaGroups.from_array(groups)

    def all_reduce(self, x: Instruction, groups: np.ndarray, reducer: str,
                   channel_id: int) -> Instruction:
        return self.add("all-reduce", x.shape.with_dims(x.shape.dims), [x], {
            "channel_id": channel_id, "replica_groups": self._groups(groups),
            "use_global_device_ids": True, "to_apply": ComputationRef(reducer)})

    def reduce_scatter(self, x: Instruction, dim: int, groups: np.ndarray, reducer: str,
                       channel_id: int) -> Instruction:
        dims = list(x.shape.dims)
        dims[dim] //= groups.shape[1]
        return self.add("reduce-scatter", x.shape.with_dims(dims), [x], {
            "channel_id": channel_id, "replica_groups": self._groups(groups),
            "use_global_device_ids": True, "dimensions": (dim,),
            "to_apply": ComputationRef(reducer)})

    def all_gather(self, x: Instruction, dim: int, groups: np.ndarray,
                   channel_id: int) -> Instruction:
        dims = list(x.shape.dims)
        dims[dim] *= groups.shape[1]
        return self.add("all-gather", x.shape.with_dims(dims), [x], {
            "channel_id": channel_id, "replica_groups": self._groups(groups),
            "dimensions": (dim,), "use_global_device_ids": True})

    def all_to_all(self, x: Instruction, dim: int, groups: np.ndarray,
                   channel_id: int) -> Instruction:
        return self.add("all-to-all", x.shape.with_dims(x.shape.dims), [x], {
            "channel_id": channel_id, "replica_groups": self._groups(groups),
            "dimensions": (dim,)})

    def collective_permute(self, x: Instruction, pairs: np.ndarray,
                           channel_id: int) -> Instruction:
        return self.add("collective-permute", x.shape.with_dims(x.shape.dims), [x], {
            "channel_id": channel_id,
            "source_target_pairs": tuple((int(s), int(t)) for s, t in pairs)})


def scalar_reducer(module: Module, opcode: str, element_type: str) -> str:
    """The name of a module computation `(x, y) -> opcode(x, y)` on `element_type` scalars,
    added on first use (under a name no other computation has)."""
    base = f"spmd.{opcode}.{element_type}"
    name, k = base, 0
    while name in module.computations:
        if _is_scalar_op(module.computations[name], opcode, element_type):
            return name
        k += 1
        name = f"{base}.{k}"
    shape = ArrayShape(element_type, ())
    x = Instruction("x", "parameter", shape, parameter_number=0)
    y = Instruction("y", "parameter", shape, parameter_number=1)
    root = Instruction("result", opcode, shape, [x, y])
    computations = list(module.computations.values())
    entry_at = [c.name for c in computations].index(module.entry_name)
    computations.insert(entry_at, Computation(name, [x, y, root], root))
    module.computations = {c.name: c for c in computations}
    return name


def add_computation(module: Module, hint: str, instructions: Sequence[Instruction],
                    root: Instruction) -> Computation:
    """A new computation of `module` (before the entry) under a name no other one has."""
    name, k = hint, 0
    while name in module.computations:
        k += 1
        name = f"{hint}.{k}"
    comp = Computation(name, list(instructions), root)
    computations = list(module.computations.values())
    at = [c.name for c in computations].index(module.entry_name)
    computations.insert(at, comp)
    module.computations = {c.name: c for c in computations}
    return comp


def _is_scalar_op(comp: Computation, opcode: str, element_type: str) -> bool:
    root, params = comp.root, comp.parameters
    return len(comp.instructions) == 3 and root.opcode == opcode and len(params) == 2 and \
        root.operands == params and root.shape == ArrayShape(element_type, ())


__all__ = ["NameUniquer", "Builder", "scalar_reducer", "add_computation"]
