"""Helpers shared by the per-opcode shape rules (`shape_rules_*.py`).

A shape rule is `fn(inst, module) -> Shape`, registered in the catalogue's `SHAPE_RULES`
(`ir/ops.py`, which also holds each opcode's operand count, checked before the rule runs). It
reads the operand shapes and typed attributes of `inst`, validates them against the HLO semantics
of the opcode, and returns the result shape. Where the result cannot be derived from operands and
attributes (reshape, iota, convert, ...), the rule validates the instruction's given shape
(`inst.shape`, None when the text omitted it) and returns it.

Rules raise `ShapeRuleError` (`fail`) with a message that does not name the instruction;
`infer_shape` adds the name. A check is written `if <problem>: fail(f"...")`, so that its message
is formatted only when it fails: the verifier runs every rule on every instruction. Derived
shapes never carry layouts.
"""
from __future__ import annotations

from typing import NoReturn

from gspmdc.errors import VerificationError

from . import dtypes
from .attributes import ComputationRef, Ident, Window
from .module import Computation, Instruction, Module
from .shapes import ArrayShape, Shape, TupleShape, compatible


class ShapeRuleError(VerificationError):
    """A rule's complaint about one instruction (message without the instruction name)."""


def fail(message: str) -> NoReturn:
    raise ShapeRuleError(message)


# ---- operands and the given shape -------------------------------------------------------------

def operand_shape(inst: Instruction, i: int) -> Shape:
    shape = inst.operands[i].shape
    if shape is None:
        fail(f"operand {i} ({inst.operands[i].name}) has no shape")
    return shape


def operand_array(inst: Instruction, i: int) -> ArrayShape:
    """Operand i's shape, which must be an array (not a tuple, not a token)."""
    shape = operand_shape(inst, i)
    if not (isinstance(shape, ArrayShape) and not shape.is_token):
        fail(f"operand {i} must be an array, found {shape}")
    return shape


def operand_scalar(inst: Instruction, i: int) -> ArrayShape:
    shape = operand_array(inst, i)
    if shape.rank != 0:
        fail(f"operand {i} must be a scalar, found {shape}")
    return shape


def operand_token(inst: Instruction, i: int) -> ArrayShape:
    shape = operand_shape(inst, i)
    if not (isinstance(shape, ArrayShape) and shape.is_token):
        fail(f"operand {i} must be a token, found {shape}")
    return shape


def given_shape(inst: Instruction) -> Shape:
    """The result shape written in the text; rules for ops whose result is not inferable need it."""
    if inst.shape is None:
        fail(f"{inst.opcode} requires an explicit result shape")
    return inst.shape.without_layout()


def given_array(inst: Instruction) -> ArrayShape:
    shape = given_shape(inst)
    if not (isinstance(shape, ArrayShape) and not shape.is_token):
        fail(f"result shape must be an array, found {shape}")
    return shape


def given_tuple(inst: Instruction, size: int | None = None) -> TupleShape:
    shape = given_shape(inst)
    if not isinstance(shape, TupleShape):
        fail(f"result shape must be a tuple, found {shape}")
    if size is not None:
        if len(shape.elements) != size:
            fail(f"result shape must be a {size}-tuple, found {shape}")
    return shape


def given_element_type(inst: Instruction) -> str | None:
    """The element type of a given array result shape (the `preferred_element_type` of dot and
    convolution), or None when the shape was omitted."""
    if isinstance(inst.shape, ArrayShape):
        return inst.shape.element_type
    return None


def strip(shape: Shape) -> Shape:
    return shape.without_layout()


def tuple_or_single(shapes: list[Shape]) -> Shape:
    """The result of a variadic op: the single shape for one value, else the tuple of them."""
    return shapes[0] if len(shapes) == 1 else TupleShape(tuple(shapes))


# ---- attributes ---------------------------------------------------------------------------------

_MISSING = object()


def attr_value(inst: Instruction, name: str, default=_MISSING):
    if name in inst.attrs:
        return inst.attrs[name]
    if default is _MISSING:
        fail(f"missing attribute {name}")
    return default


def attr_int(inst: Instruction, name: str, default=_MISSING) -> int:
    value = attr_value(inst, name, default)
    if not (isinstance(value, int) and not isinstance(value, bool)):
        fail(f"attribute {name} must be an integer, found {value!r}")
    return value


def attr_ints(inst: Instruction, name: str, default=_MISSING) -> tuple[int, ...]:
    value = attr_value(inst, name, default)
    if not (isinstance(value, tuple)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        fail(f"attribute {name} must be a list of integers, found {value!r}")
    return value


def attr_bool(inst: Instruction, name: str, default: bool = False) -> bool:
    value = attr_value(inst, name, default)
    if not isinstance(value, bool):
        fail(f"attribute {name} must be true or false, found {value!r}")
    return value


def attr_ident(inst: Instruction, name: str, allowed: frozenset[str], default=_MISSING) -> str:
    """A bare-word attribute from `allowed`; `default` (unchecked) when absent and given."""
    if name not in inst.attrs and default is not _MISSING:
        return default
    value = attr_value(inst, name)
    if not (isinstance(value, (Ident, str)) and str(value) in allowed):
        fail(f"attribute {name} must be one of {', '.join(sorted(allowed))}, found {value!r}")
    return str(value)


def check_dimension_list(dims: tuple[int, ...], rank: int, what: str, *,
                         increasing: bool = False) -> None:
    """Dimension numbers must be unique and in [0, rank) (and strictly increasing if asked)."""
    for d in dims:
        if not 0 <= d < rank:
            fail(f"{what} {d} is out of range for rank {rank}")
    if len(set(dims)) != len(dims):
        fail(f"{what} {list(dims)} has duplicates")
    if increasing:
        if list(dims) != sorted(dims):
            fail(f"{what} {list(dims)} must be sorted")


# ---- element types ------------------------------------------------------------------------------

def complex_component(t: str) -> str:
    return {"c64": "f32", "c128": "f64"}[t]


def same_type_ignoring_fp_precision(a: str, b: str) -> bool:
    """XLA's reducer checks accept a floating type where another floating type is declared."""
    return a == b or (dtypes.is_float(a) and dtypes.is_float(b))


def require_same_element_type(shapes: list[ArrayShape], what: str) -> str:
    types = {s.element_type for s in shapes}
    if len(types) != 1:
        fail(f"{what} must have one element type, found "
             + ", ".join(str(s) for s in shapes))
    return shapes[0].element_type


# ---- called computations ------------------------------------------------------------------------

def called(inst: Instruction, module: Module, attr: str) -> Computation:
    """The computation an attribute (`to_apply=`, `body=`, ...) refers to."""
    ref = attr_value(inst, attr)
    if not isinstance(ref, ComputationRef):
        fail(f"attribute {attr} must name a computation, found {ref!r}")
    if ref.name not in module.computations:
        fail(f"{attr} refers to unknown computation {ref.name}")
    return module.computations[ref.name]


def called_list(inst: Instruction, module: Module, attr: str) -> list[Computation]:
    refs = attr_value(inst, attr)
    if not (isinstance(refs, tuple) and all(isinstance(r, ComputationRef) for r in refs)):
        fail(f"attribute {attr} must list computations, found {refs!r}")
    for r in refs:
        if r.name not in module.computations:
            fail(f"{attr} refers to unknown computation {r.name}")
    return [module.computations[r.name] for r in refs]


def signature(comp: Computation) -> tuple[list[Shape], Shape]:
    """(parameter shapes by parameter number, root shape) of a computation."""
    if not (comp.root is not None and comp.root.shape is not None):
        fail(f"computation {comp.name} has no root shape")
    params = [i for i in comp.instructions if i.opcode == "parameter"]
    if not all(isinstance(p.parameter_number, int) and p.shape is not None for p in params):
        fail(f"computation {comp.name} has a parameter without number or shape")
    return [p.shape for p in comp.parameters], comp.root.shape


def check_call_signature(comp: Computation, args: list[Shape], what: str) -> Shape:
    """`comp` must take parameters compatible with `args`; returns its root shape."""
    params, result = signature(comp)
    if len(params) != len(args):
        fail(f"{what} {comp.name} takes {len(params)} parameters, but {len(args)} are passed")
    for i, (p, a) in enumerate(zip(params, args)):
        if not compatible(p, a):
            fail(f"{what} {comp.name} parameter {i} has shape {p}, but the argument is {a}")
    return result.without_layout()


def check_reducer(comp: Computation, accumulator_types: list[str], input_types: list[str],
                  what: str) -> None:
    """A reducer of N values: 2N scalar parameters (N accumulators, then N inputs) returning the N
    accumulators (a scalar when N == 1, else an N-tuple). Floating precision may differ (XLA)."""
    n = len(accumulator_types)
    params, result = signature(comp)
    if len(params) != 2 * n:
        fail(f"{what} {comp.name} must take {2 * n} scalar parameters, found {len(params)}")
    results = list(result.elements) if result.is_tuple else [result]
    if len(results) != n:
        fail(f"{what} {comp.name} must return {n} scalars, returns {result}")
    declared = list(accumulator_types) + list(input_types)
    for i, (p, t) in enumerate(zip(params, declared)):
        if not (isinstance(p, ArrayShape) and p.rank == 0 and not p.is_token
                and same_type_ignoring_fp_precision(p.element_type, t)):
            fail(f"{what} {comp.name} parameter {i} must be a {t}[] scalar, found {p}")
    for i, (r, t) in enumerate(zip(results, accumulator_types)):
        if not (isinstance(r, ArrayShape) and r.rank == 0 and not r.is_token
                and same_type_ignoring_fp_precision(r.element_type, t)):
            fail(f"{what} {comp.name} result {i} must be a {t}[] scalar, found {r}")


def check_scalar_function(comp: Computation, param_types: list[str], what: str) -> ArrayShape:
    """A computation of scalars with the given parameter types returning one scalar."""
    params, result = signature(comp)
    if len(params) != len(param_types):
        fail(f"{what} {comp.name} must take {len(param_types)} scalar parameters, "
             f"found {len(params)}")
    for i, (p, t) in enumerate(zip(params, param_types)):
        if not (isinstance(p, ArrayShape) and p.rank == 0 and p.element_type == t):
            fail(f"{what} {comp.name} parameter {i} must be a {t}[] scalar, found {p}")
    if not (isinstance(result, ArrayShape) and result.rank == 0 and not result.is_token):
        fail(f"{what} {comp.name} must return a scalar, returns {result}")
    return result.without_layout()


# ---- windows ------------------------------------------------------------------------------------

def window_output_dims(window, dims: tuple[int, ...], what: str) -> tuple[int, ...]:
    """Output size per dim of a window (`window={...}`) slid over `dims` (XLA's StridedBound):

    dilated base  = (size - 1) * base_dilation + 1 (0 for an empty dim), padded by low + high;
    dilated window = (window - 1) * window_dilation + 1;
    output = 0 if the window exceeds the padded base, else (padded - dilated window) // stride + 1.
    """
    if not isinstance(window, Window):
        fail(f"{what} needs a window={{size=...}} attribute, found {window!r}")
    if len(window.dims) != len(dims):
        fail(f"{what} window has {len(window.dims)} dims, the operand has {len(dims)}")
    out = []
    for k, (w, size) in enumerate(zip(window.dims, dims)):
        if not (w.size >= 1 and w.stride >= 1 and w.base_dilation >= 1 and w.window_dilation >= 1):
            fail(f"{what} window dimension {k} has a non-positive size, stride or dilation")
        base = (size - 1) * w.base_dilation + 1 if size > 0 else 0
        padded = base + w.padding_low + w.padding_high
        extent = (w.size - 1) * w.window_dilation + 1
        out.append(0 if extent > padded else (padded - extent) // w.stride + 1)
    return tuple(out)
