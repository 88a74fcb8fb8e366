"""Shape rules of elementwise ops and element-type conversions.

HLO has no implicit broadcasting: the array operands of an elementwise op have identical dims and
(except where noted) identical element types. The result has the operands' dims; its element type
is the operands' except for `compare`/`is-finite` (pred), `abs`/`real`/`imag` of complex (the
component type), `complex` (the complex type of its float operands) and the conversions, whose
result type is given.
"""
from __future__ import annotations

from . import dtypes
from .module import Instruction, Module
from .ops import (
    CATALOGUE, ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, SHAPE_RULES, TYPED_ELEMENTWISE, ResultType,
)
from .shape_rules_common import (
    attr_ident, attr_int, complex_component, fail, given_array, operand_array,
    require_same_element_type, strip,
)
from .shapes import ArrayShape, Shape

_COMPARISON_DIRECTIONS = frozenset({"EQ", "NE", "LT", "LE", "GT", "GE"})
_COMPARISON_TYPES = frozenset({"FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED"})


def _same_dims(shapes: list[ArrayShape], what: str) -> None:
    if len({s.dims for s in shapes}) != 1:
        fail(f"{what} must have identical dimensions, found " + ", ".join(map(str, shapes)))


def _typed(inst: Instruction, x: ArrayShape) -> ArrayShape:
    """The operand type check and result of a typed elementwise op (`ops.ElementTypes`)."""
    types = CATALOGUE[inst.opcode].types
    wanted = f"a {types.operands.value} operand" if len(inst.operands) == 1 \
        else f"{types.operands.value} operands"
    if not types.operands.accepts(x.element_type):
        fail(f"{inst.opcode} needs {wanted}, found {x}")
    if types.result is ResultType.PRED:
        return x.with_element_type("pred")
    if types.result is ResultType.COMPONENT and dtypes.is_complex(x.element_type):
        return x.with_element_type(complex_component(x.element_type))
    return strip(x)


@SHAPE_RULES.register(*(TYPED_ELEMENTWISE & ELEMENTWISE_UNARY))
def unary(inst: Instruction, module: Module) -> Shape:
    """Same dims as the operand; the element type as the catalogue says (`is-finite` gives pred,
    `abs`/`real`/`imag` of complex the component type)."""
    return _typed(inst, operand_array(inst, 0))


@SHAPE_RULES.register(*(TYPED_ELEMENTWISE & ELEMENTWISE_BINARY))
def binary(inst: Instruction, module: Module) -> Shape:
    """Operands of identical shape; the result is that shape."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _same_dims([a, b], "operands")
    require_same_element_type([a, b], "operands")
    return _typed(inst, a)


@SHAPE_RULES.register("reduce-precision")
def reduce_precision(inst: Instruction, module: Module) -> Shape:
    """A floating operand's shape; `exponent_bits` >= 1 and `mantissa_bits` >= 0 (XLA)."""
    x = operand_array(inst, 0)
    if not dtypes.is_float(x.element_type):
        fail(f"reduce-precision needs a floating operand, found {x}")
    if not attr_int(inst, "exponent_bits") >= 1:
        fail(f"reduce-precision exponent_bits must be at least 1, found "
             f"{inst.attrs['exponent_bits']}")
    if not attr_int(inst, "mantissa_bits") >= 0:
        fail(f"reduce-precision mantissa_bits must not be negative, found "
             f"{inst.attrs['mantissa_bits']}")
    return strip(x)


@SHAPE_RULES.register("complex")
def complex_(inst: Instruction, module: Module) -> Shape:
    """complex(real f32[...], imag f32[...]) -> c64[...] (f64 -> c128)."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _same_dims([a, b], "operands")
    t = require_same_element_type([a, b], "operands")
    if t not in ("f32", "f64"):
        fail(f"complex needs f32 or f64 operands, found {a}")
    return a.with_element_type("c64" if t == "f32" else "c128")


@SHAPE_RULES.register("compare")
def compare(inst: Instruction, module: Module) -> Shape:
    """compare(a, b), direction=D -> pred with the operands' dims."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _same_dims([a, b], "operands")
    require_same_element_type([a, b], "operands")
    attr_ident(inst, "direction", _COMPARISON_DIRECTIONS)
    attr_ident(inst, "type", _COMPARISON_TYPES, None)
    return a.with_element_type("pred")


@SHAPE_RULES.register("select")
def select(inst: Instruction, module: Module) -> Shape:
    """select(pred, on_true, on_false): all three have the same dims (current XLA has no scalar
    predicate form)."""
    p, t, f = (operand_array(inst, i) for i in range(3))
    if p.element_type != "pred":
        fail(f"select predicate must be pred, found {p}")
    _same_dims([t, f], "select branches")
    require_same_element_type([t, f], "select branches")
    if p.dims != t.dims:
        fail(f"select predicate {p} does not match the branches {t}")
    return strip(t)


@SHAPE_RULES.register("clamp")
def clamp(inst: Instruction, module: Module) -> Shape:
    """clamp(min, x, max): min and max are scalars or have x's dims; one element type."""
    lo, x, hi = (operand_array(inst, i) for i in range(3))
    require_same_element_type([lo, x, hi], "clamp operands")
    for bound in (lo, hi):
        if not (bound.rank == 0 or bound.dims == x.dims):
            fail(f"clamp bound {bound} must be a scalar or match the operand {x}")
    return strip(x)


@SHAPE_RULES.register("convert")
def convert(inst: Instruction, module: Module) -> Shape:
    """Given result shape: the operand's dims, any element type (complex -> real is not allowed)."""
    x, out = operand_array(inst, 0), given_array(inst)
    if out.dims != x.dims:
        fail(f"convert result {out} must have the operand's dims {x}")
    if (dtypes.is_complex(x.element_type) and not dtypes.is_complex(out.element_type)):
        fail(f"convert from complex {x} to real {out} is not allowed (use real/imag)")
    return out


@SHAPE_RULES.register("stochastic-convert")
def stochastic_convert(inst: Instruction, module: Module) -> Shape:
    """stochastic-convert(x, random) -> given signed integer type with x's dims: x floating,
    `random` unsigned of x's bit width with x's dims (the conversions XLA implements)."""
    x, random, out = operand_array(inst, 0), operand_array(inst, 1), given_array(inst)
    if not dtypes.is_float(x.element_type):
        fail(f"stochastic-convert needs a floating operand, found {x}")
    if not (dtypes.is_unsigned(random.element_type)
            and dtypes.bit_width(random.element_type) == dtypes.bit_width(x.element_type)):
        fail(f"stochastic-convert random bits must be unsigned of the operand's width, found "
             f"{random} for {x}")
    _same_dims([x, random], "operands")
    if not (dtypes.is_signed(out.element_type) and out.dims == x.dims):
        fail(f"stochastic-convert result {out} must be a signed integer array with the operand's "
             f"dims {x}")
    return out


@SHAPE_RULES.register("bitcast-convert")
def bitcast_convert(inst: Instruction, module: Module) -> Shape:
    """Reinterpret bits. Equal widths keep the dims; a narrower result type appends a minor dim of
    size (in width / out width); a wider one consumes a minor dim of size (out width / in width)."""
    x, out = operand_array(inst, 0), given_array(inst)
    w_in, w_out = dtypes.byte_width(x.element_type), dtypes.byte_width(out.element_type)
    if w_in == w_out:
        expected = x.dims
    elif w_in > w_out:
        expected = x.dims + (w_in // w_out,)
    else:
        if not (x.rank >= 1 and x.dims[-1] == w_out // w_in):
            fail(f"bitcast-convert from {x} to the wider {out.element_type} needs a minor "
                 f"dimension of size {w_out // w_in}")
        expected = x.dims[:-1]
    if out.dims != expected:
        fail(f"bitcast-convert from {x} must give "
             f"{ArrayShape(out.element_type, expected)}, found {out}")
    return out
