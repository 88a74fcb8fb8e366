"""Reductions: reduce (one or several dims, every reducer with its identity), variadic reduce
(argmax / argmin with an index tie-break), reduce-window (strides, padding, dilations),
select-and-scatter, and the cross-replica all-reduce (one replica: an identity)."""
from __future__ import annotations

from math import prod

import numpy as np

from hlo_text import reducer as scalar_reducer

from . import choices
from .program import MAX_ELEMENTS, Comp
from .values import FLOATS, MAX_BOUND, Arr, Tup, Value

#: reducers by element kind: (op, exact for floats)
REDUCERS = {"float": [("add", False), ("maximum", True), ("minimum", True), ("multiply", False)],
            "int": [("add", True), ("maximum", True), ("minimum", True), ("multiply", True),
                    ("or", True), ("xor", True)],
            "pred": [("or", True), ("and", True)]}


def identity(op: str, t: str) -> str:
    """The literal of `op`'s identity element in type `t`."""
    if t == "pred":
        return "true" if op == "and" else "false"
    if op in ("add", "or", "xor"):
        return "0" if t not in FLOATS else "0.0"
    if op == "multiply":
        return "1" if t not in FLOATS else "1.0"
    if t in FLOATS:
        return "-inf" if op == "maximum" else "inf"
    info = np.iinfo(np.dtype({"s8": "int8", "u8": "uint8", "s16": "int16", "u16": "uint16",
                              "s32": "int32", "u32": "uint32", "s64": "int64",
                              "u64": "uint64"}[t]))
    return str(info.min if op == "maximum" else info.max)


def reducer(c: Comp, op: str, t: str) -> str:
    return c.mb.helper(f"{op}_{t}", lambda name: scalar_reducer(name, op, t))


def init_value(c: Comp, op: str, t: str) -> Value:
    return c.emit("constant", Arr(t, ()), "constant", payload=identity(op, t), sharding=None,
                  keep=False)


def _reduced_bound(op: str, x: Value, terms: int) -> float:
    if op == "add":
        return terms * x.bound
    if op == "multiply":
        return 1.0 if x.bound <= 1 else float("inf")
    return x.bound


def reduce(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 5), ("int", 2), ("pred", 1)])
    x = choices.operand(c, kind, min_rank=1, max_bound=MAX_BOUND)
    op, exact_float = src.choice(REDUCERS[kind])
    if op == "multiply" and kind == "float" and x.bound > 1:
        op, exact_float = "maximum", True
    dims = src.subset(list(range(x.arr.rank))) or [src.integer(0, x.arr.rank - 1)]
    if src.boolean(0.05):
        dims = []
    terms = prod(x.arr.dims[d] for d in dims)
    out = [s for d, s in enumerate(x.arr.dims) if d not in dims]
    bound = _reduced_bound(op, x, terms)
    if kind == "float" and bound > MAX_BOUND:
        return None
    init = init_value(c, op, x.arr.dtype)
    exact = x.exact and (kind != "float" or exact_float or terms <= 1)
    return c.emit("reduce", x.arr.with_dims(out), "reduce", [x, init],
                  f"dimensions={{{','.join(map(str, dims))}}}, "
                  f"to_apply={reducer(c, op, x.arr.dtype)}", exact=exact, bound=bound)


def _arg_reducer(c: Comp, t: str, direction: str) -> str:
    """(value, index) pairs: the larger (GT) or smaller (LT) value, the smaller index on ties."""
    def build(name: str) -> str:
        return (f"{name} {{\n  a = {t}[] parameter(0)\n  ai = s32[] parameter(1)\n"
                f"  b = {t}[] parameter(2)\n  bi = s32[] parameter(3)\n"
                f"  better = pred[] compare(a, b), direction={direction}\n"
                f"  same = pred[] compare(a, b), direction=EQ\n"
                f"  first = pred[] compare(ai, bi), direction=LT\n"
                f"  tie = pred[] and(same, first)\n"
                f"  keep = pred[] or(better, tie)\n"
                f"  v = {t}[] select(keep, a, b)\n  i = s32[] select(keep, ai, bi)\n"
                f"  ROOT r = ({t}[], s32[]) tuple(v, i)\n}}\n")
    return c.mb.helper(f"arg{direction.lower()}_{t}", build)


def arg_reduce(c: Comp) -> Value | None:
    """argmax / argmin along one dim: a variadic reduce of (values, iota)."""
    src = c.src
    kind = src.choice(["float", "int"])
    x = choices.operand(c, kind, exact=True, min_rank=1)
    d = src.integer(0, x.arr.rank - 1)
    t = x.arr.dtype
    index = c.emit("iota", Arr("s32", x.arr.dims), "iota", [], f"iota_dimension={d}",
                   bound=float(x.arr.dims[d]))
    direction = src.choice(["GT", "LT"])
    init = init_value(c, "maximum" if direction == "GT" else "minimum", t)
    zero = c.scalar("s32", 0)
    out = [s for k, s in enumerate(x.arr.dims) if k != d]
    shape = Tup((Arr(t, tuple(out)), Arr("s32", tuple(out))))
    r = c.emit("reduce", shape, "reduce", [x, index, init, zero],
               f"dimensions={{{d}}}, to_apply={_arg_reducer(c, t, direction)}",
               parts=[x, index], keep=False)
    values = c.unpack(r)
    return values[-1]


def _window(src, dims: tuple[int, ...], *, dilation: bool) -> tuple[str, list[int]] | None:
    fields = {"size": [], "stride": [], "pad": [], "lhs_dilate": [], "rhs_dilate": []}
    out = []
    for d in dims:
        base = src.weighted([(1, 6), (2, 1)]) if dilation else 1
        wd = src.weighted([(1, 6), (2, 1)]) if dilation else 1
        lo, hi = (src.integer(0, 2), src.integer(0, 2)) if src.boolean(0.5) else (0, 0)
        extent = (d - 1) * base + 1 + lo + hi
        k = src.integer(1, max(1, min(4, (extent - 1) // wd + 1)))
        span = (k - 1) * wd + 1
        if extent < span:
            return None
        stride = src.weighted([(1, 3), (2, 2), (3, 1)])
        out.append((extent - span) // stride + 1)
        fields["size"].append(str(k))
        fields["stride"].append(str(stride))
        fields["pad"].append(f"{lo}_{hi}")
        fields["lhs_dilate"].append(str(base))
        fields["rhs_dilate"].append(str(wd))
    parts = [f"size={'x'.join(fields['size'])}"]
    for name, default in (("stride", "1"), ("pad", "0_0"), ("lhs_dilate", "1"),
                          ("rhs_dilate", "1")):
        if any(v != default for v in fields[name]):
            parts.append(f"{name}={'x'.join(fields[name])}")
    return "window={" + " ".join(parts) + "}", out


def reduce_window(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 4), ("int", 1)])
    x = choices.operand(c, kind, min_rank=1, max_bound=MAX_BOUND)
    op, exact_float = src.choice(REDUCERS[kind][:3])
    window = _window(src, x.arr.dims, dilation=src.boolean(0.3))
    if window is None:
        return None
    attrs, out = window
    terms = 16
    bound = _reduced_bound(op, x, terms)
    if kind == "float" and bound > MAX_BOUND or prod(out) > MAX_ELEMENTS:
        return None
    init = init_value(c, op, x.arr.dtype)
    return c.emit("reduce-window", x.arr.with_dims(out), "reduce-window", [x, init],
                  f"{attrs}, to_apply={reducer(c, op, x.arr.dtype)}",
                  exact=x.exact and (kind != "float" or exact_float), bound=bound)


def select_and_scatter(c: Comp) -> Value | None:
    src = c.src
    x = choices.operand(c, "float", exact=True, min_rank=1, max_bound=MAX_BOUND)
    t = x.arr.dtype
    window = _window(src, x.arr.dims, dilation=False)
    if window is None:
        return None
    attrs, out = window
    source = c.need(Arr(t, tuple(out)), max_bound=10.0)
    init = init_value(c, "add", t)
    direction = src.choice(["GE", "GT", "LE"])
    select = c.mb.helper(f"select_{direction.lower()}_{t}", lambda name: (
        f"{name} {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
        f"  ROOT r = pred[] compare(a, b), direction={direction}\n}}\n"))
    return c.emit("select-and-scatter", x.arr, "select-and-scatter", [x, source, init],
                  f"{attrs}, select={select}, scatter={reducer(c, 'add', t)}", exact=False,
                  bound=source.bound * 16)


def cross_replica_all_reduce(c: Comp) -> Value | None:
    """An all-reduce over replicas (no channel id); gspmdc runs one replica: the identity."""
    kind = c.src.choice(["float", "int"])
    x = choices.operand(c, kind)
    op = c.src.choice(["add", "maximum"])
    return c.emit("all-reduce", x.arr, "all-reduce", [x],
                  f"replica_groups={{}}, to_apply={reducer(c, op, x.arr.dtype)}",
                  exact=x.exact, bound=x.bound)


GENERATORS = [
    (reduce, 5), (arg_reduce, 2), (reduce_window, 3), (select_and_scatter, 2),
    (cross_replica_all_reduce, 1),
]
