"""Program inputs and outputs as `.npz` files, and random inputs that are valid for a program.

Conventions (shared by `gspmdc eval` and `gspmdc run`): inputs are keyed `arg0`, `arg1`, ... by entry
parameter number; outputs are keyed `out0`, `out1`, ..., one per element of a tuple root (a non-tuple
root gives `out0` alone). Output files are written atomically: a temporary file in the target
directory, renamed into place once complete, so a failed run never leaves a partial file.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from gspmdc.errors import GspmdcError, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from . import spill

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


def describe_value(value: np.ndarray) -> str:
    """A one-value summary for printing an output: `f32[2, 3] [[...]]` (numpy's abbreviated
    form, at most 8 elements shown in full)."""
    text = f"{dtypes.element_type_of(value.dtype)}{list(value.shape)}"
    if value.size == 0:
        return text + " (empty)"
    with np.printoptions(precision=6, threshold=8, edgeitems=3, linewidth=100):
        return text + " " + np.array2string(value.astype(np.float64) if value.dtype.kind == "V"
                                             else value, separator=", ")


def write_npz_atomic(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` atomically (no partial file on failure)."""
    from gspmdc.atomic import atomic_output
    with atomic_output(path) as f:
        np.savez(f, **arrays)


#: random inputs are drawn in blocks of this many elements (see `random_inputs`)
RANDOM_BLOCK = 1 << 20


def random_inputs(module: Module, seed: int) -> list:
    """Random entry arguments that keep the program meaningful: floats uniform in [-1, 1) (drawn
    as f32, then converted; complex: real and imaginary parts alike); integers uniform in
    [0, bound) where bound is the smallest size of a dimension the value (after index-preserving
    ops) indexes, or 8 when it is not used as an index; predicates fair coins. Tuple parameters get
    a tuple of such arrays.

    Array leaf `j` (parameters by number, tuple leaves in order) is drawn in row-major blocks of
    `RANDOM_BLOCK` elements, block `k` from its own generator `default_rng([seed, j, k])`: the
    values do not depend on how the work is split, the blocks are drawn by a thread per core, and
    arrays too large for memory are written block by block into file-backed arrays
    (`runtime/spill.py`)."""
    bounds = _index_bounds(module.entry, module)
    leaves = []

    def draw(param: Instruction, shape: Shape):
        if isinstance(shape, TupleShape):
            return tuple(draw(param, e) for e in shape.elements)
        if shape.is_token:
            raise UnsupportedError(f"parameter {param.name} has shape {param.shape}; random "
                                   "inputs exist only for arrays and tuples of arrays")
        out = spill.zeros(shape.dims, dtypes.numpy_dtype(shape.element_type))
        leaves.append((out.reshape(-1), shape.element_type, bounds.get(param, 8)))
        return out

    values = [draw(p, p.shape) for p in module.entry.parameters]
    blocks = [(seed, j, k) for j, (flat, _, _) in enumerate(leaves)
              for k in range(-(-flat.size // RANDOM_BLOCK))]
    fill = functools.partial(_fill_block, leaves)
    if len(blocks) > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(fill, blocks))
    else:
        list(map(fill, blocks))
    return values


def _fill_block(leaves: list, block: tuple[int, int, int]) -> None:
    """Draw block `k` of leaf `j` (see `random_inputs`)."""
    seed, j, k = block
    flat, element_type, bound = leaves[j]
    out = flat[k * RANDOM_BLOCK:(k + 1) * RANDOM_BLOCK]
    rng = np.random.default_rng(block)
    if element_type == "pred":
        out[...] = rng.integers(0, 2, size=out.size, dtype=np.uint8)
    elif dtypes.is_integer(element_type):
        out[...] = rng.integers(0, max(bound, 1), size=out.size)
    elif dtypes.is_complex(element_type):
        out.real, out.imag = _uniform(rng, out.size), _uniform(rng, out.size)
    elif out.dtype == np.float32:
        _uniform(rng, out.size, out)
    else:
        out[...] = _uniform(rng, out.size)


def _uniform(rng: np.random.Generator, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """`size` f32 values uniform in [-1, 1) (into `out` when given)."""
    out = rng.random(size, dtype=np.float32, out=out)
    out *= 2
    out -= 1
    return out


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
