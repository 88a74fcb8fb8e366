"""Shape rules of values, tuples and data movement: parameter, constant, iota, tuple,
get-tuple-element, copy, broadcast, reshape, transpose, bitcast, concatenate, slice, dynamic-slice,
dynamic-update-slice, pad, reverse, get-dimension-size and the pass-through markers (domain,
add-dependency, opt-barrier).
"""
from __future__ import annotations

from . import dtypes
from .attributes import Literal, PadDim, SliceDim
from .module import Instruction, Module
from .ops import SHAPE_RULES
from .shape_rules_common import (
    attr_int, attr_ints, attr_value, check_dimension_list, fail, given_array, given_shape,
    operand_array, operand_scalar, operand_shape, operand_token, require_same_element_type, strip,
)
from .shapes import ArrayShape, Shape, TupleShape


@SHAPE_RULES.register("parameter")
def parameter(inst: Instruction, module: Module) -> Shape:
    """The shape is declared, never inferred."""
    return given_shape(inst)


@SHAPE_RULES.register("constant")
def constant(inst: Instruction, module: Module) -> Shape:
    """The declared shape, which the literal (unless elided) must fill exactly."""
    out = given_shape(inst)
    if inst.literal is not None:
        _check_literal(inst.literal, out)
    return out


def _check_literal(literal: Literal, shape: Shape) -> None:
    if literal.elided:
        return
    if isinstance(shape, TupleShape):
        if not (literal.elements is not None and len(literal.elements) == len(shape.elements)):
            fail(f"literal does not have the tuple structure of {shape}")
        for element, element_shape in zip(literal.elements, shape.elements):
            _check_literal(element, element_shape)
        return
    if shape.is_token:
        fail("a constant cannot be a token")
    value = literal.value
    if not (value is not None and value.shape == shape.dims
            and value.dtype == dtypes.numpy_dtype(shape.element_type)):
        fail(f"literal of shape {getattr(value, 'shape', None)} and type "
             f"{getattr(value, 'dtype', None)} does not fill {shape}")


@SHAPE_RULES.register("iota")
def iota(inst: Instruction, module: Module) -> Shape:
    """Given non-scalar array shape; iota_dimension must be one of its dimensions."""
    out = given_array(inst)
    if not out.rank >= 1:
        fail("iota needs a result of rank >= 1")
    d = attr_int(inst, "iota_dimension")
    if not 0 <= d < out.rank:
        fail(f"iota_dimension {d} is out of range for {out}")
    return out


@SHAPE_RULES.register("tuple")
def tuple_(inst: Instruction, module: Module) -> Shape:
    return TupleShape(tuple(strip(operand_shape(inst, i)) for i in range(len(inst.operands))))


@SHAPE_RULES.register("get-tuple-element")
def get_tuple_element(inst: Instruction, module: Module) -> Shape:
    t = operand_shape(inst, 0)
    if not isinstance(t, TupleShape):
        fail(f"get-tuple-element needs a tuple operand, found {t}")
    index = attr_int(inst, "index")
    if not 0 <= index < len(t.elements):
        fail(f"index {index} is out of range for {t}")
    return strip(t.elements[index])


@SHAPE_RULES.register("copy", "domain", "opt-barrier")
def same_as_operand(inst: Instruction, module: Module) -> Shape:
    """The operand's shape (arrays or tuples)."""
    return strip(operand_shape(inst, 0))


@SHAPE_RULES.register("add-dependency")
def add_dependency(inst: Instruction, module: Module) -> Shape:
    """add-dependency(value, token): the value, ordered after the token."""
    operand_token(inst, 1)
    return strip(operand_shape(inst, 0))


@SHAPE_RULES.register("get-dimension-size")
def get_dimension_size(inst: Instruction, module: Module) -> Shape:
    x = operand_array(inst, 0)
    (d,) = _single_dimension(inst)
    if not 0 <= d < x.rank:
        fail(f"dimension {d} is out of range for {x}")
    return ArrayShape("s32", ())


def _single_dimension(inst: Instruction) -> tuple[int]:
    dims = attr_ints(inst, "dimensions")
    if len(dims) != 1:
        fail(f"{inst.opcode} needs exactly one dimension, found {list(dims)}")
    return dims


@SHAPE_RULES.register("broadcast")
def broadcast(inst: Instruction, module: Module) -> Shape:
    """Given result shape; operand dim i becomes result dim dimensions[i] (same size)."""
    x, out = operand_array(inst, 0), given_array(inst)
    dims = attr_ints(inst, "dimensions")
    if len(dims) != x.rank:
        fail(f"broadcast dimensions {list(dims)} must have one entry per operand dim of {x}")
    check_dimension_list(dims, out.rank, "broadcast dimension")
    if out.element_type != x.element_type:
        fail(f"broadcast result {out} must keep the element type of {x}")
    for i, d in enumerate(dims):
        if out.dims[d] != x.dims[i]:
            fail(f"broadcast maps operand dim {i} (size {x.dims[i]}) to result dim {d} "
                 f"(size {out.dims[d]})")
    return out


@SHAPE_RULES.register("reshape")
def reshape(inst: Instruction, module: Module) -> Shape:
    """Given result shape with the operand's element type and element count."""
    x, out = operand_array(inst, 0), given_array(inst)
    if out.element_type != x.element_type:
        fail(f"reshape result {out} must keep the element type of {x}")
    if out.num_elements != x.num_elements:
        fail(f"reshape from {x} to {out} changes the element count")
    return out


@SHAPE_RULES.register("bitcast")
def bitcast(inst: Instruction, module: Module) -> Shape:
    """Given result shape with the operand's byte size (a reinterpretation of the buffer)."""
    x, out = operand_array(inst, 0), given_array(inst)
    if out.byte_size != x.byte_size:
        fail(f"bitcast from {x} to {out} changes the byte size")
    return out


@SHAPE_RULES.register("transpose")
def transpose(inst: Instruction, module: Module) -> Shape:
    """Result dim i = operand dim dimensions[i]."""
    x = operand_array(inst, 0)
    perm = attr_ints(inst, "dimensions")
    if sorted(perm) != list(range(x.rank)):
        fail(f"transpose dimensions {list(perm)} are not a permutation of the dims of {x}")
    return x.with_dims(x.dims[p] for p in perm)


@SHAPE_RULES.register("reverse")
def reverse(inst: Instruction, module: Module) -> Shape:
    x = operand_array(inst, 0)
    check_dimension_list(attr_ints(inst, "dimensions"), x.rank, "reverse dimension")
    return strip(x)


@SHAPE_RULES.register("concatenate")
def concatenate(inst: Instruction, module: Module) -> Shape:
    """Operands equal in every dim but `dimensions={d}`; the result's d is their sum."""
    xs = [operand_array(inst, i) for i in range(len(inst.operands))]
    require_same_element_type(xs, "concatenate operands")
    (d,) = _single_dimension(inst)
    first = xs[0]
    if not 0 <= d < first.rank:
        fail(f"concatenate dimension {d} is out of range for {first}")
    for x in xs[1:]:
        if not (x.rank == first.rank
                and all(a == b for k, (a, b) in enumerate(zip(x.dims, first.dims)) if k != d)):
            fail(f"concatenate operands {first} and {x} differ outside dimension {d}")
    dims = list(first.dims)
    dims[d] = sum(x.dims[d] for x in xs)
    return first.with_dims(dims)


@SHAPE_RULES.register("slice")
def slice_(inst: Instruction, module: Module) -> Shape:
    """Per dim `[start:limit:stride]`, 0 <= start <= limit <= size: ceil((limit - start) / stride)
    elements."""
    x = operand_array(inst, 0)
    spec = attr_value(inst, "slice")
    if not (isinstance(spec, tuple) and all(isinstance(s, SliceDim) for s in spec)):
        fail(f"attribute slice must be a list of [start:limit:stride], found {spec!r}")
    if len(spec) != x.rank:
        fail(f"slice has {len(spec)} entries for the rank-{x.rank} {x}")
    dims = []
    for k, (s, size) in enumerate(zip(spec, x.dims)):
        if not (0 <= s.start <= s.limit <= size and s.stride >= 1):
            fail(f"slice [{s.start}:{s.limit}:{s.stride}] is invalid for dimension {k} "
                 f"of size {size}")
        dims.append(-(-(s.limit - s.start) // s.stride))
    return x.with_dims(dims)


def _start_indices(inst: Instruction, first: int, rank: int) -> None:
    """Operands first.. are `rank` integral scalars of one type (the start index per dim)."""
    count = len(inst.operands) - first
    if count != rank:
        fail(f"{inst.opcode} needs {rank} start indices, found {count}")
    indices = [operand_scalar(inst, i) for i in range(first, len(inst.operands))]
    for s in indices:
        if not dtypes.is_integer(s.element_type):
            fail(f"start index {s} must be integral")
    if indices:
        require_same_element_type(indices, "start indices")


@SHAPE_RULES.register("dynamic-slice")
def dynamic_slice(inst: Instruction, module: Module) -> Shape:
    """dynamic-slice(x, i0, ..., i{r-1}), dynamic_slice_sizes=S -> x's type with dims S."""
    x = operand_array(inst, 0)
    _start_indices(inst, 1, x.rank)
    sizes = attr_ints(inst, "dynamic_slice_sizes")
    if len(sizes) != x.rank:
        fail(f"dynamic_slice_sizes {list(sizes)} must have one entry per dim of {x}")
    for k, (s, d) in enumerate(zip(sizes, x.dims)):
        if not 0 <= s <= d:
            fail(f"dynamic slice size {s} exceeds dimension {k} of {x}")
    return x.with_dims(sizes)


@SHAPE_RULES.register("dynamic-update-slice")
def dynamic_update_slice(inst: Instruction, module: Module) -> Shape:
    """dynamic-update-slice(x, update, i0, ...): the update fits in x; the result is x's shape."""
    x, update = operand_array(inst, 0), operand_array(inst, 1)
    require_same_element_type([x, update], "operand and update")
    if not (update.rank == x.rank and all(u <= d for u, d in zip(update.dims, x.dims))):
        fail(f"update {update} does not fit in the operand {x}")
    _start_indices(inst, 2, x.rank)
    return strip(x)


@SHAPE_RULES.register("pad")
def pad(inst: Instruction, module: Module) -> Shape:
    """Per dim `low_high_interior`: low + size + (size-1)*interior + high (low/high may be
    negative, interior may not; the result may not be negative)."""
    x, value = operand_array(inst, 0), operand_scalar(inst, 1)
    require_same_element_type([x, value], "operand and padding value")
    spec = attr_value(inst, "padding")
    if not (isinstance(spec, tuple) and all(isinstance(p, PadDim) for p in spec)):
        fail(f"attribute padding must be low_high[_interior] per dim, found {spec!r}")
    if len(spec) != x.rank:
        fail(f"padding has {len(spec)} entries for the rank-{x.rank} {x}")
    dims = []
    for k, (p, size) in enumerate(zip(spec, x.dims)):
        if not p.interior >= 0:
            fail(f"negative interior padding {p.interior} in dimension {k}")
        out = p.low + p.high + size + max(size - 1, 0) * p.interior
        if not out >= 0:
            fail(f"padding {p.low}_{p.high}_{p.interior} makes dimension {k} "
                 f"of size {size} negative")
        dims.append(out)
    return x.with_dims(dims)
