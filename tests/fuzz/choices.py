"""Random shapes, element types and operands shared by the op generators."""
from __future__ import annotations

from math import prod

from .program import MAX_ELEMENTS, Comp
from .source import Source
from .values import MAX_BOUND, Arr, Value

RANKS = [(1, 3), (2, 4), (0, 1), (3, 2), (4, 1)]


def dim(src: Source, lo: int = 1, hi: int = 16) -> int:
    """A dimension size, small ones more likely."""
    return src.integer(lo, min(hi, 8)) if src.boolean(0.7) or hi <= 8 else src.integer(lo, hi)


def dims(src: Source, rank: int | None = None, *, lo: int = 1,
         max_elements: int = MAX_ELEMENTS) -> tuple[int, ...]:
    rank = src.weighted(RANKS) if rank is None else rank
    out = [dim(src, lo) for _ in range(rank)]
    while prod(out) > max_elements:
        i = out.index(max(out))
        out[i] = max(lo, out[i] // 2)
    return tuple(out)


def float_type(src: Source) -> str:
    return src.weighted([("f32", 12), ("bf16", 1), ("f64", 1), ("f16", 1)])


SIGNED = ("s32", "s8", "s16", "s64")


def int_type(src: Source) -> str:
    return src.weighted([("s32", 10), ("u32", 2), ("s8", 1), ("u8", 1), ("s64", 1),
                         ("s16", 1), ("u16", 1), ("u64", 1)])


def element_type(src: Source, kind: str) -> str:
    if kind == "float":
        return float_type(src)
    if kind == "int":
        return int_type(src)
    if kind == "signed":
        return src.choice(SIGNED)
    if kind == "pred":
        return "pred"
    return src.choice(["c64", "c128"])


def new_shape(src: Source, kind: str = "float", rank: int | None = None) -> Arr:
    return Arr(element_type(src, kind), dims(src, rank))


def is_kind(v: Value, kind: str) -> bool:
    t = v.shape.dtype if not v.is_tuple else None
    return t is not None and ((kind == "float" and v.arr.is_float) or
                              (kind == "int" and v.arr.is_int) or
                              (kind == "signed" and t in SIGNED) or
                              (kind == "pred" and t == "pred") or
                              (kind == "complex" and v.arr.is_complex))


def kind_of(shape: Arr) -> str:
    if shape.is_float:
        return "float"
    if shape.is_int:
        return "int"
    if shape.is_complex:
        return "complex"
    return "pred"


def operand(c: Comp, kind: str, *, exact: bool = False, max_bound: float = MAX_BOUND,
            min_rank: int = 0, max_rank: int = 4, min_size: int = 1) -> Value:
    """An operand of element kind `kind` ("float", "int", "pred", "complex"): from the pool or
    a new parameter/constant of a random shape."""
    def accept(v: Value) -> bool:
        return (is_kind(v, kind) and (v.exact or not exact) and v.bound <= max_bound and
                min_rank <= v.arr.rank <= max_rank and v.arr.size >= min_size)
    found = c.pick(accept)
    if found is not None and c.src.boolean(0.85):
        return found
    rank = c.src.integer(min_rank, max_rank) if max_rank < 4 or min_rank > 0 else None
    shape = Arr(element_type(c.src, kind) if kind != "complex" else "c64", dims(c.src, rank))
    while shape.size < min_size:
        shape = shape.with_dims(tuple(d + 1 for d in shape.dims))
    if kind == "complex":
        return c.need(shape) if c.kind == "entry" else make_complex(c, shape)
    return c.need(shape, exact=exact, max_bound=max_bound, fresh=True)


def make_complex(c: Comp, shape: Arr) -> Value:
    part = "f32" if shape.dtype == "c64" else "f64"
    re = c.need(shape.with_dtype(part))
    im = c.need(shape.with_dtype(part))
    return c.emit("complex", shape, "complex", [re, im], exact=re.exact and im.exact,
                  bound=re.bound + im.bound)


def abs_plus(c: Comp, x: Value, one: float = 1.0) -> Value:
    """|x| + one: an operand bounded away from zero (a guard for log, sqrt, divide, power)."""
    a = c.emit("abs", x.shape, "abs", [x], exact=x.exact, bound=x.bound)
    k = c.constant_scalar_like(x.arr, one)
    return c.emit("add", x.shape, "add", [a, k], exact=x.exact, bound=x.bound + one)
