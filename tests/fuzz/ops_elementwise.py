"""Elementwise ops: unary and binary tables (rules as data), compare, select, clamp, convert,
bitcast-convert, map, and chains of them.

A rule says which element kinds an op takes, whether its operands must be exact (ops that are
discontinuous or ill-conditioned), the largest operand bound it accepts, how to guard an operand
(`abs`: |x|; `abs+1`: |x| + 1, keeping log, sqrt, rsqrt, divide and power away from their
singular points) and the result's bound from the operands' bounds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .choices import abs_plus, operand
from .program import Comp
from .values import BITS, FLOATS, MAX_BOUND, Arr, Value

INF = math.inf


@dataclass(frozen=True)
class Unary:
    opcode: str
    kinds: tuple[str, ...]
    #: the operand must be exact (the op is discontinuous or its last bit is layout-sensitive)
    exact_only: bool = False
    #: the result is exact when the operand is (IEEE-exact or data-like ops)
    keeps_exact: bool = True
    max_bound: float = INF
    guard: str | None = None
    bound: Callable[[float], float] = lambda b: b
    attrs: str = ""
    #: the result's element type, when it differs from the operand's
    result: str | None = None


UNARY = [
    Unary("negate", ("float", "int", "complex")),
    Unary("abs", ("float", "signed")),
    Unary("copy", ("float", "int", "pred", "complex")),
    Unary("sign", ("float", "signed"), exact_only=True, bound=lambda b: 1.0),
    Unary("floor", ("float",), exact_only=True, bound=lambda b: b + 1),
    Unary("ceil", ("float",), exact_only=True, bound=lambda b: b + 1),
    Unary("round-nearest-afz", ("float",), exact_only=True, bound=lambda b: b + 1),
    Unary("round-nearest-even", ("float",), exact_only=True, bound=lambda b: b + 1),
    Unary("sine", ("float",), keeps_exact=False, bound=lambda b: 1.0),
    Unary("cosine", ("float",), keeps_exact=False, bound=lambda b: 1.0),
    Unary("tanh", ("float",), keeps_exact=False, bound=lambda b: 1.0),
    Unary("logistic", ("float",), keeps_exact=False, bound=lambda b: 1.0),
    Unary("erf", ("float",), keeps_exact=False, bound=lambda b: 1.0),
    Unary("exponential", ("float",), keeps_exact=False, max_bound=4.0, bound=math.exp),
    Unary("exponential-minus-one", ("float",), keeps_exact=False, max_bound=4.0,
          bound=math.exp),
    Unary("log", ("float",), keeps_exact=False, guard="abs+1", bound=lambda b: math.log(b + 2)),
    Unary("log-plus-one", ("float",), keeps_exact=False, guard="abs",
          bound=lambda b: math.log(b + 2)),
    Unary("sqrt", ("float",), guard="abs+1", bound=lambda b: math.sqrt(b + 1)),
    Unary("rsqrt", ("float",), keeps_exact=False, guard="abs+1", bound=lambda b: 1.0),
    Unary("cbrt", ("float",), exact_only=True, keeps_exact=False,
          bound=lambda b: max(1.0, b)),
    Unary("tan", ("float",), keeps_exact=False, max_bound=1.2, bound=lambda b: math.tan(b)),
    Unary("is-finite", ("float",), result="pred", bound=lambda b: 1.0),
    Unary("reduce-precision", ("float",), exact_only=True, bound=lambda b: 1.01 * b,
          attrs="exponent_bits=8, mantissa_bits=7"),
    Unary("reduce-precision", ("float",), exact_only=True, bound=lambda b: 1.01 * b,
          attrs="exponent_bits=5, mantissa_bits=2"),
    Unary("not", ("pred", "int"), bound=lambda b: INF),
    Unary("popcnt", ("int",), bound=lambda b: 64.0),
    Unary("count-leading-zeros", ("int",), bound=lambda b: 64.0),
    Unary("real", ("complex",), result="real"),
    Unary("imag", ("complex",), result="real"),
]


@dataclass(frozen=True)
class Binary:
    opcode: str
    kinds: tuple[str, ...]
    exact_only: bool = False
    #: guard of the second operand (`abs+1` keeps a divisor away from zero)
    guard_rhs: str | None = None
    guard_lhs: str | None = None
    max_rhs_bound: float = INF
    bound: Callable[[float, float], float] = lambda a, b: a + b


BINARY = [
    Binary("add", ("float", "int", "complex")),
    Binary("subtract", ("float", "int", "complex")),
    Binary("multiply", ("float", "int", "complex"), bound=lambda a, b: a * b),
    Binary("maximum", ("float", "int"), bound=max),
    Binary("minimum", ("float", "int"), bound=max),
    Binary("divide", ("float",), guard_rhs="abs+1", bound=lambda a, b: a),
    Binary("divide", ("int",), bound=lambda a, b: a),
    Binary("remainder", ("float",), guard_rhs="abs+1", exact_only=True, bound=lambda a, b: a),
    Binary("remainder", ("int",), bound=lambda a, b: a),
    Binary("power", ("float",), guard_lhs="abs+1", max_rhs_bound=2.5,
           bound=lambda a, b: (a + 1) ** b),
    Binary("power", ("int",), bound=lambda a, b: INF),
    Binary("atan2", ("float",), exact_only=True, bound=lambda a, b: math.pi),
    Binary("and", ("pred", "int"), bound=lambda a, b: INF),
    Binary("or", ("pred", "int"), bound=lambda a, b: INF),
    Binary("xor", ("pred", "int"), bound=lambda a, b: INF),
    Binary("shift-left", ("int",), bound=lambda a, b: INF),
    Binary("shift-right-arithmetic", ("int",), bound=lambda a, b: INF),
    Binary("shift-right-logical", ("int",), bound=lambda a, b: INF),
]

KIND_WEIGHTS = [("float", 6), ("int", 2), ("pred", 1), ("complex", 1)]


def _guarded(c: Comp, x: Value, guard: str | None) -> Value:
    if guard == "abs":
        return c.emit("abs", x.shape, "abs", [x], exact=x.exact, bound=x.bound)
    if guard == "abs+1":
        return abs_plus(c, x)
    return x


def _cap(bound: float) -> float:
    return bound if bound <= MAX_BOUND else INF


def unary(c: Comp) -> Value | None:
    src = c.src
    rule = src.choice(UNARY)
    kind = src.choice(list(rule.kinds))
    x = operand(c, kind, exact=rule.exact_only,
                max_bound=min(rule.max_bound, MAX_BOUND) if kind == "float" else INF)
    if x is None or (kind == "float" and x.bound > rule.max_bound):
        return None
    x = _guarded(c, x, rule.guard)
    shape = x.arr
    if rule.result == "pred":
        shape = shape.with_dtype("pred")
    elif rule.result == "real":
        shape = shape.with_dtype("f32" if shape.dtype == "c64" else "f64")
    exact = x.exact and rule.keeps_exact
    return c.emit(rule.opcode, shape, rule.opcode, [x], rule.attrs, exact=exact,
                  bound=_cap(rule.bound(x.bound)))


def binary(c: Comp) -> Value | None:
    src = c.src
    rule = src.choice(BINARY)
    kind = src.choice(list(rule.kinds))
    bounded = MAX_BOUND if kind == "float" else INF
    x = operand(c, kind, exact=rule.exact_only, max_bound=bounded)
    y = c.need(x.arr, exact=rule.exact_only,
               max_bound=min(rule.max_rhs_bound, bounded) if kind == "float" else INF)
    if kind == "float" and y.bound > rule.max_rhs_bound:
        return None
    x, y = _guarded(c, x, rule.guard_lhs), _guarded(c, y, rule.guard_rhs)
    bound = _cap(rule.bound(x.bound, y.bound))
    exact = x.exact and y.exact
    if kind == "float" and not exact and bound == INF:
        return None
    return c.emit(rule.opcode, x.shape, rule.opcode, [x, y], exact=exact, bound=bound)


def compare(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 3), ("int", 2), ("pred", 1)])
    x = operand(c, kind, exact=True)
    y = c.need(x.arr, exact=True)
    direction = src.choice(["LT", "GT", "EQ", "NE", "LE", "GE"])
    attrs = f"direction={direction}"
    if kind == "float" and src.boolean(0.3):
        attrs += ", type=TOTALORDER"
    elif kind == "int" and src.boolean(0.2):
        attrs += ", type=" + ("SIGNED" if x.arr.dtype.startswith("s") else "UNSIGNED")
    return c.emit("compare", x.arr.with_dtype("pred"), "compare", [x, y], attrs)


def predicate_for(c: Comp, dims: tuple[int, ...]) -> Value:
    """A pred value of `dims`: one from the pool, a new parameter or a fresh compare."""
    shape = Arr("pred", dims)
    found = c.pick(lambda v: v.shape == shape)
    if found is not None and c.src.boolean(0.6):
        return found
    if c.src.boolean(0.5) or c.kind != "entry":
        x = c.need(Arr("s32", dims), exact=True)
        k = c.constant_scalar_like(x.arr, c.src.choice([3, 1, 5]))
        return c.emit("compare", shape, "compare", [x, k], "direction=" +
                      c.src.choice(["LT", "GE", "NE"]))
    return c.need(shape)


def select(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 4), ("int", 2), ("pred", 1), ("complex", 1)])
    x = operand(c, kind)
    y = c.need(x.arr)
    p = predicate_for(c, x.arr.dims) if src.boolean(0.85) else c.need(Arr("pred", ()))
    if p.arr.rank == 0 and x.arr.rank > 0:
        p = c.emit("broadcast", Arr("pred", x.arr.dims), "broadcast", [p], "dimensions={}")
    return c.emit("select", x.arr, "select", [p, x, y], exact=x.exact and y.exact,
                  bound=max(x.bound, y.bound))


def clamp(c: Comp) -> Value | None:
    src = c.src
    kind = src.choice(["float", "int"])
    x = operand(c, kind)
    lo_shape = x.arr if src.boolean(0.4) else x.arr.with_dims(())
    lo = c.need(lo_shape)
    hi = c.need(lo_shape)
    return c.emit("clamp", x.arr, "clamp", [lo, x, hi], exact=x.exact and lo.exact and hi.exact,
                  bound=max(lo.bound, hi.bound, x.bound))


def convert(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 4), ("int", 3), ("pred", 1)])
    x = operand(c, kind, exact=True)
    target = src.weighted([("f32", 4), ("s32", 3), ("bf16", 1), ("f16", 1), ("f64", 1),
                           ("pred", 1), ("u8", 1), ("s64", 1), ("u32", 1), ("c64", 1)])
    if target == x.arr.dtype:
        return None
    bound = x.bound if target in FLOATS or target == "c64" else INF
    if target in ("bf16", "f16") and x.bound > 6e4:
        bound = INF
    if target == "pred":
        bound = 1.0
    return c.emit("convert", x.arr.with_dtype(target), "convert", [x], exact=True,
                  bound=_cap(bound))


BITCAST_PAIRS = {"f32": ["s32", "u32"], "s32": ["f32", "u32"], "u32": ["s32", "f32"],
                 "f16": ["s16", "u16", "bf16"], "bf16": ["s16", "f16"], "s16": ["f16", "u16"],
                 "f64": ["s64", "u64"], "s64": ["f64", "u64"], "u64": ["s64"],
                 "u16": ["s16"], "s8": ["u8"], "u8": ["s8"]}


def bitcast_convert(c: Comp) -> Value | None:
    src = c.src
    x = operand(c, src.choice(["float", "int"]), exact=True)
    targets = BITCAST_PAIRS.get(x.arr.dtype, [])
    if not targets:
        return None
    target = src.choice(targets)
    assert BITS[target] == BITS[x.arr.dtype]
    return c.emit("bitcast-convert", x.arr.with_dtype(target), "bitcast-convert", [x],
                  exact=True, bound=INF)


def map_op(c: Comp) -> Value | None:
    """`map` of a scalar computation of one or two parameters (a unary or binary rule)."""
    src = c.src
    x = operand(c, "float", max_bound=MAX_BOUND, min_rank=1)
    arity = src.choice([2, 1])
    t = x.arr.dtype
    if arity == 2:
        rule = src.choice([b for b in BINARY if "float" in b.kinds and not b.exact_only
                           and b.guard_lhs is None and b.guard_rhs is None])
        y = c.need(x.arr, max_bound=MAX_BOUND)
        body = f"  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n" \
               f"  ROOT r = {t}[] {rule.opcode}(a, b)"
        bound, operands = _cap(rule.bound(x.bound, y.bound)), [x, y]
        exact = x.exact and y.exact
    else:
        rule = src.choice([u for u in UNARY if "float" in u.kinds and u.guard is None
                           and not u.exact_only and u.result is None and u.max_bound == INF])
        body = f"  a = {t}[] parameter(0)\n  ROOT r = {t}[] {rule.opcode}(a)"
        bound, operands = _cap(rule.bound(x.bound)), [x]
        exact = x.exact and rule.keeps_exact
    if bound == INF:
        return None
    name = c.mb.helper(f"map_{rule.opcode}_{t}_{arity}", lambda n: f"{n} {{\n{body}\n}}\n")
    dimensions = ",".join(map(str, range(x.arr.rank)))
    return c.emit("map", x.arr, "map", operands, f"dimensions={{{dimensions}}}, to_apply={name}",
                  exact=exact, bound=bound)


def chain(c: Comp) -> Value | None:
    """A chain of two to four elementwise ops, each on the previous result."""
    last = None
    for _ in range(c.src.integer(2, 4)):
        if c.mb.budget <= 2:
            break
        last = c.src.choice([unary, binary, unary, select])(c) or last
    return last


GENERATORS = [
    (unary, 10), (binary, 7), (compare, 2), (select, 2), (clamp, 1), (convert, 2),
    (bitcast_convert, 1), (map_op, 1), (chain, 3),
]
