"""Shape rules of elementwise ops and element-type conversions.

HLO has no implicit broadcasting: the array operands of an elementwise op have identical dims and
(except where noted) identical element types. The result has the operands' dims; its element type
is the operands' except for `compare`/`is-finite` (pred), `abs`/`real`/`imag` of complex (the
component type) and `complex` (the complex type of its float operands).
"""
from __future__ import annotations

from . import dtypes
from .module import Instruction, Module
from .shape_rules_common import (
    attr_ident, complex_component, given_array, is_integral_or_pred, is_numeric, operand_array,
    require, require_same_element_type, shape_rule, strip,
)
from .shapes import ArrayShape, Shape


def _float_or_complex(t: str) -> bool:
    return dtypes.is_float(t) or dtypes.is_complex(t)


def _signed_or_float(t: str) -> bool:
    return dtypes.is_signed(t) or dtypes.is_float(t) or dtypes.is_complex(t)


#: unary op -> (predicate on the operand element type, its description)
_UNARY_TYPES = {
    "negate": (is_numeric, "numeric"),
    "abs": (_signed_or_float, "signed, floating or complex"),
    "sign": (_signed_or_float, "signed, floating or complex"),
    "not": (is_integral_or_pred, "integral or pred"),
    "popcnt": (dtypes.is_integer, "integral"),
    "count-leading-zeros": (dtypes.is_integer, "integral"),
    "floor": (dtypes.is_float, "floating"),
    "ceil": (dtypes.is_float, "floating"),
    "round-nearest-afz": (dtypes.is_float, "floating"),
    "round-nearest-even": (dtypes.is_float, "floating"),
    "reduce-precision": (dtypes.is_float, "floating"),
    "is-finite": (dtypes.is_float, "floating"),
    "erf": (dtypes.is_float, "floating"),
    "real": (_float_or_complex, "floating or complex"),
    "imag": (_float_or_complex, "floating or complex"),
    **{op: (_float_or_complex, "floating or complex") for op in (
        "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt", "rsqrt", "cbrt",
        "tanh", "logistic", "sine", "cosine", "tan")},
}

#: binary op -> (predicate on the operand element type, its description)
_BINARY_TYPES = {
    **{op: (is_numeric, "numeric") for op in (
        "add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum")},
    "atan2": (_float_or_complex, "floating or complex"),
    "and": (is_integral_or_pred, "integral or pred"),
    "or": (is_integral_or_pred, "integral or pred"),
    "xor": (is_integral_or_pred, "integral or pred"),
    "shift-left": (dtypes.is_integer, "integral"),
    "shift-right-arithmetic": (dtypes.is_integer, "integral"),
    "shift-right-logical": (dtypes.is_integer, "integral"),
}

_COMPARISON_DIRECTIONS = frozenset({"EQ", "NE", "LT", "LE", "GT", "GE"})
_COMPARISON_TYPES = frozenset({"FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED"})


def _same_dims(shapes: list[ArrayShape], what: str) -> None:
    require(len({s.dims for s in shapes}) == 1,
            f"{what} must have identical dimensions, found " + ", ".join(map(str, shapes)))


@shape_rule(*_UNARY_TYPES, operands=1)
def unary(inst: Instruction, module: Module) -> Shape:
    """Same shape as the operand; `is-finite` gives pred, `abs`/`real`/`imag` of complex give the
    component type."""
    x = operand_array(inst, 0)
    accepts, description = _UNARY_TYPES[inst.opcode]
    require(accepts(x.element_type),
            f"{inst.opcode} needs a {description} operand, found {x}")
    if inst.opcode == "is-finite":
        return x.with_element_type("pred")
    if inst.opcode in ("abs", "real", "imag") and dtypes.is_complex(x.element_type):
        return x.with_element_type(complex_component(x.element_type))
    return strip(x)


@shape_rule(*_BINARY_TYPES, operands=2)
def binary(inst: Instruction, module: Module) -> Shape:
    """Operands of identical shape; the result is that shape."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _same_dims([a, b], "operands")
    t = require_same_element_type([a, b], "operands")
    accepts, description = _BINARY_TYPES[inst.opcode]
    require(accepts(t), f"{inst.opcode} needs {description} operands, found {a}")
    return strip(a)


@shape_rule("complex", operands=2)
def complex_(inst: Instruction, module: Module) -> Shape:
    """complex(real f32[...], imag f32[...]) -> c64[...] (f64 -> c128)."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _same_dims([a, b], "operands")
    t = require_same_element_type([a, b], "operands")
    require(t in ("f32", "f64"), f"complex needs f32 or f64 operands, found {a}")
    return a.with_element_type("c64" if t == "f32" else "c128")


@shape_rule("compare", operands=2)
def compare(inst: Instruction, module: Module) -> Shape:
    """compare(a, b), direction=D -> pred with the operands' dims."""
    a, b = operand_array(inst, 0), operand_array(inst, 1)
    _same_dims([a, b], "operands")
    require_same_element_type([a, b], "operands")
    attr_ident(inst, "direction", _COMPARISON_DIRECTIONS)
    attr_ident(inst, "type", _COMPARISON_TYPES, None)
    return a.with_element_type("pred")


@shape_rule("select", operands=3)
def select(inst: Instruction, module: Module) -> Shape:
    """select(pred, on_true, on_false): all three have the same dims (current XLA has no scalar
    predicate form)."""
    p, t, f = (operand_array(inst, i) for i in range(3))
    require(p.element_type == "pred", f"select predicate must be pred, found {p}")
    _same_dims([t, f], "select branches")
    require_same_element_type([t, f], "select branches")
    require(p.dims == t.dims, f"select predicate {p} does not match the branches {t}")
    return strip(t)


@shape_rule("clamp", operands=3)
def clamp(inst: Instruction, module: Module) -> Shape:
    """clamp(min, x, max): min and max are scalars or have x's dims; one element type."""
    lo, x, hi = (operand_array(inst, i) for i in range(3))
    require_same_element_type([lo, x, hi], "clamp operands")
    for bound in (lo, hi):
        require(bound.rank == 0 or bound.dims == x.dims,
                f"clamp bound {bound} must be a scalar or match the operand {x}")
    return strip(x)


@shape_rule("convert", operands=1)
def convert(inst: Instruction, module: Module) -> Shape:
    """Given result shape: the operand's dims, any element type (complex -> real is not allowed)."""
    x, out = operand_array(inst, 0), given_array(inst)
    require(out.dims == x.dims, f"convert result {out} must have the operand's dims {x}")
    require(not (dtypes.is_complex(x.element_type) and not dtypes.is_complex(out.element_type)),
            f"convert from complex {x} to real {out} is not allowed (use real/imag)")
    return out


@shape_rule("bitcast-convert", operands=1)
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
        require(x.rank >= 1 and x.dims[-1] == w_out // w_in,
                f"bitcast-convert from {x} to the wider {out.element_type} needs a minor "
                f"dimension of size {w_out // w_in}")
        expected = x.dims[:-1]
    require(out.dims == expected, f"bitcast-convert from {x} must give "
            f"{ArrayShape(out.element_type, expected)}, found {out}")
    return out
