"""Program inputs and outputs as `.npz` files, and random inputs that are valid for a program.

Conventions (shared by `gspmdc eval` and `gspmdc run`): inputs are keyed `arg0`, `arg1`, ... by entry
parameter number; outputs are keyed `out0`, `out1`, ..., one per element of a tuple root (a non-tuple
root gives `out0` alone). Output files are written atomically: a temporary file in the target
directory, renamed into place once complete, so a failed run never leaves a partial file.
"""
from __future__ import annotations

import os

import numpy as np

from gspmdc.atomic import atomic_output
from gspmdc.errors import GspmdcError, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

#: operand positions that are indices into another operand, per opcode: (index operands, indexed
#: operand). Random integer inputs that flow into them are kept inside the indexed dimensions.
_INDEX_OPERANDS = {
    "gather": (lambda inst: [1], 0),
    "scatter": (lambda inst: [(len(inst.operands) - 1) // 2], 0),
    "dynamic-slice": (lambda inst: list(range(1, len(inst.operands))), 0),
    "dynamic-update-slice": (lambda inst: list(range(2, len(inst.operands))), 0),
}
#: ops through which an integer value keeps its role as an index
_INDEX_PRESERVING = frozenset({
    "reshape", "broadcast", "transpose", "copy", "convert", "slice", "concatenate", "bitcast",
    "get-tuple-element", "tuple", "dynamic-slice", "custom-call", "reverse", "pad", "clamp", "select",
    "add", "sort", "maximum", "minimum",
})


def leaf_keys(prefix: str, shape: Shape) -> list[tuple[str, ArrayShape]]:
    """The npz keys of a value's array leaves: `prefix` itself for an array, `prefix.i` (and
    `prefix.i.j`, ...) for the elements of a tuple, in pre-order."""
    if isinstance(shape, TupleShape):
        return [kv for i, e in enumerate(shape.elements) for kv in leaf_keys(f"{prefix}.{i}", e)]
    return [(prefix, shape)]


def read_inputs(path: str | os.PathLike, module: Module) -> list:
    """Load the entry arguments from an npz (`arg0`, `arg1`, ...; tuple parameters as `arg0.0`,
    `arg0.1`, ...) and check every array against its parameter's shape and dtype."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise GspmdcError(f"{path}: cannot read inputs: {e}") from None
    params = module.entry.parameters
    expected: set[str] = set()
    args = []
    with data:
        for p in params:
            leaves = {}
            for key, shape in leaf_keys(f"arg{p.parameter_number}", p.shape):
                expected.add(key)
                if key not in data.files:
                    raise GspmdcError(f"{path}: missing input {key!r} for parameter {p.name} "
                                      f"({p.shape}); the file has {sorted(data.files)}")
                leaves[key] = _as_leaf_value(data[key], shape, p, f"{path}:{key}")
            args.append(_assemble(f"arg{p.parameter_number}", p.shape, leaves))
        extra = sorted(set(data.files) - expected)
        if extra:
            raise GspmdcError(f"{path}: unexpected inputs {extra}; the entry computation takes "
                              f"{sorted(expected)}")
    return args


def _assemble(prefix: str, shape: Shape, leaves: dict[str, np.ndarray]):
    if isinstance(shape, TupleShape):
        return tuple(_assemble(f"{prefix}.{i}", e, leaves) for i, e in enumerate(shape.elements))
    return leaves[prefix]


def _as_leaf_value(array: np.ndarray, shape: ArrayShape, param: Instruction,
                   where: str) -> np.ndarray:
    if shape.is_token:
        raise UnsupportedError(f"{where}: parameter {param.name} is a token ({param.shape}); "
                               "tokens cannot be read from an npz file")
    if tuple(array.shape) != shape.dims:
        raise GspmdcError(f"{where}: shape {list(array.shape)} does not match parameter "
                          f"{param.name}: {shape}")
    want = dtypes.numpy_dtype(shape.element_type)
    if array.dtype != want:
        if array.dtype.kind == "V" and array.dtype.itemsize == want.itemsize:
            return array.view(want)  # bf16 stored as raw void bytes by some writers
        raise GspmdcError(f"{where}: dtype {array.dtype} does not match parameter "
                          f"{param.name}: {shape.element_type} ({want})")
    return array


def output_arrays(module: Module, value) -> dict[str, np.ndarray]:
    """Name the entry's result: `out0`, `out1`, ... one per element of a tuple root (nested tuple
    elements as `out0.0`, ...), or `out0` alone for an array root."""
    shape = module.entry.root.shape
    if not isinstance(shape, TupleShape):
        return {"out0": np.asarray(value)}
    arrays: dict[str, np.ndarray] = {}
    for i, (element_shape, element) in enumerate(zip(shape.elements, value)):
        _flatten(f"out{i}", element_shape, element, arrays)
    return arrays


def _flatten(prefix: str, shape: Shape, value, into: dict[str, np.ndarray]) -> None:
    if isinstance(shape, TupleShape):
        for i, (e, v) in enumerate(zip(shape.elements, value)):
            _flatten(f"{prefix}.{i}", e, v, into)
    else:
        into[prefix] = np.asarray(value)


def write_npz_atomic(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` atomically (no partial file on failure)."""
    with atomic_output(path) as f:
        np.savez(f, **arrays)


def random_inputs(module: Module, seed: int) -> list:
    """Random entry arguments that keep the program meaningful: floats ~ N(0, 1); integers uniform in
    [0, bound) where bound is the smallest size of a dimension the value (after index-preserving ops)
    indexes, or 8 when it is not used as an index; predicates fair coins. Tuple parameters get a
    tuple of such arrays."""
    rng = np.random.default_rng(seed)
    bounds = _index_bounds(module.entry, module)
    return [_random_value(rng, p, p.shape, bounds.get(p, 8)) for p in module.entry.parameters]


def _random_value(rng: np.random.Generator, param: Instruction, shape: Shape, bound: int):
    if isinstance(shape, TupleShape):
        return tuple(_random_value(rng, param, e, bound) for e in shape.elements)
    if shape.is_token:
        raise UnsupportedError(f"parameter {param.name} has shape {param.shape}; random inputs "
                               "exist only for arrays and tuples of arrays")
    return _random_array(rng, shape, bound)


def _random_array(rng: np.random.Generator, shape: ArrayShape, bound: int) -> np.ndarray:
    t = shape.element_type
    dtype = dtypes.numpy_dtype(t)
    if t == "pred":
        return rng.integers(0, 2, size=shape.dims).astype(np.bool_)
    if dtypes.is_integer(t):
        return rng.integers(0, max(bound, 1), size=shape.dims).astype(dtype)
    if dtypes.is_complex(t):
        real = rng.standard_normal(shape.dims, dtype=np.float32)
        return (real + 1j * rng.standard_normal(shape.dims, dtype=np.float32)).astype(dtype)
    return rng.standard_normal(shape.dims, dtype=np.float32).astype(dtype, copy=False)


def _index_bounds(comp: Computation, module: Module) -> dict[Instruction, int]:
    """For each instruction of `comp` whose value is used (through index-preserving ops) as an
    index, the smallest operand dimension size it indexes."""
    users = comp.users()
    bounds: dict[Instruction, int] = {}
    for inst in reversed(comp.instructions):
        bound = None
        for user in users[inst]:
            b = _bound_as_operand_of(user, inst)
            if b is None and user.opcode in _INDEX_PRESERVING:
                b = bounds.get(user)
            if b is not None:
                bound = b if bound is None else min(bound, b)
        if bound is not None:
            bounds[inst] = bound
    return bounds


def _bound_as_operand_of(user: Instruction, operand: Instruction) -> int | None:
    rule = _INDEX_OPERANDS.get(user.opcode)
    if rule is None:
        return None
    positions, indexed = rule
    if not any(user.operands[i] is operand for i in positions(user)):
        return None
    shape = user.operands[indexed].shape
    if not isinstance(shape, ArrayShape) or not shape.dims:
        return None
    return max(min(shape.dims), 1)
