"""Data movement: broadcast, reshape, bitcast, transpose, slice, concatenate, pad, reverse,
iota, constant, dynamic-slice, dynamic-update-slice, get-dimension-size, tuples."""
from __future__ import annotations

from math import prod

from . import choices
from .program import MAX_ELEMENTS, Comp
from .values import Arr, Tup, Value


def any_operand(c: Comp, *, min_rank: int = 0, max_rank: int = 4) -> Value:
    kind = c.src.weighted([("float", 6), ("int", 2), ("pred", 1), ("complex", 1)])
    return choices.operand(c, kind, min_rank=min_rank, max_rank=max_rank)


def broadcast(c: Comp) -> Value | None:
    src = c.src
    x = any_operand(c, max_rank=3)
    rank = x.arr.rank + src.integer(0 if x.arr.rank else 1, 2)
    if rank > 4:
        return None
    kept = sorted(src.permutation(list(range(rank)))[:x.arr.rank])
    out = [0] * rank
    for d, k in zip(x.arr.dims, kept):
        out[k] = d
    for k in range(rank):
        if k not in kept:
            out[k] = choices.dim(src)
    if prod(out) > MAX_ELEMENTS:
        return None
    return c.emit("broadcast", x.arr.with_dims(out), "broadcast", [x],
                  f"dimensions={{{','.join(map(str, kept))}}}", exact=x.exact, bound=x.bound)


def _factorizations(size: int) -> list[int]:
    return [k for k in range(1, size + 1) if size % k == 0]


def reshape_dims(src, dims: tuple[int, ...]) -> tuple[int, ...]:
    """A different shape of the same size: merge neighbours, split a dim, add or drop 1s, or
    refactor the whole size."""
    kind = src.choice(["merge", "split", "unit", "refactor"])
    out = list(dims)
    if kind == "merge" and len(out) >= 2:
        i = src.integer(0, len(out) - 2)
        out[i:i + 2] = [out[i] * out[i + 1]]
    elif kind == "split" and out:
        i = src.integer(0, len(out) - 1)
        k = src.choice(_factorizations(out[i]))
        out[i:i + 1] = [k, out[i] // k]
    elif kind == "unit":
        if 1 in out and src.boolean():
            out.remove(1)
        elif len(out) < 4:
            out.insert(src.integer(0, len(out)), 1)
    else:
        size, out = prod(dims), []
        while size > 1 and len(out) < 3:
            k = src.choice(_factorizations(size)[1:])
            out.append(k)
            size //= k
        if size > 1:
            out.append(size)
    return tuple(out[:4]) if prod(out[:4]) == prod(dims) else tuple(dims)


def reshape(c: Comp) -> Value | None:
    x = any_operand(c)
    out = reshape_dims(c.src, x.arr.dims)
    opcode = "bitcast" if c.src.boolean(0.1) else "reshape"
    return c.emit(opcode, x.arr.with_dims(out), opcode, [x], exact=x.exact, bound=x.bound)


def transpose(c: Comp) -> Value | None:
    x = any_operand(c, min_rank=1)
    perm = c.src.permutation(list(range(x.arr.rank)))
    return c.emit("transpose", x.arr.with_dims([x.arr.dims[p] for p in perm]), "transpose", [x],
                  f"dimensions={{{','.join(map(str, perm))}}}", exact=x.exact, bound=x.bound)


def slice_(c: Comp) -> Value | None:
    src = c.src
    x = any_operand(c, min_rank=1)
    parts, out = [], []
    for d in x.arr.dims:
        start = src.integer(0, d - 1) if src.boolean(0.7) else 0
        limit = src.integer(start + 1, d) if src.boolean(0.7) else d
        stride = src.weighted([(1, 5), (2, 2), (3, 1)])
        parts.append(f"[{start}:{limit}" + (f":{stride}]" if stride > 1 else "]"))
        out.append(-(-(limit - start) // stride))
    return c.emit("slice", x.arr.with_dims(out), "slice", [x],
                  "slice={" + ", ".join(parts) + "}", exact=x.exact, bound=x.bound)


def concatenate(c: Comp) -> Value | None:
    src = c.src
    x = any_operand(c, min_rank=1)
    d = src.integer(0, x.arr.rank - 1)
    operands = [x]
    for _ in range(src.integer(1, 3)):
        size = x.arr.dims[d] if src.boolean(0.4) else choices.dim(src, hi=8)
        dims = list(x.arr.dims)
        dims[d] = size
        operands.append(c.need(x.arr.with_dims(dims)))
    if src.boolean(0.3):
        operands.append(x)          # the same value twice
    total = sum(o.arr.dims[d] for o in operands)
    out = list(x.arr.dims)
    out[d] = total
    if prod(out) > MAX_ELEMENTS:
        return None
    return c.emit("concatenate", x.arr.with_dims(out), "concatenate", operands,
                  f"dimensions={{{d}}}", exact=all(o.exact for o in operands),
                  bound=max(o.bound for o in operands))


def pad(c: Comp) -> Value | None:
    src = c.src
    x = any_operand(c, min_rank=1)
    value = c.need(x.arr.with_dims(()))
    parts, out = [], []
    for d in x.arr.dims:
        interior = src.weighted([(0, 6), (1, 2), (2, 1)])
        span = d + (d - 1) * interior
        lo = src.integer(-(span - 1), 4) if src.boolean(0.3) else src.integer(0, 3)
        hi = src.integer(-(span - 1 + min(lo, 0)), 4) if src.boolean(0.3) else src.integer(0, 3)
        size = span + lo + hi
        if size < 1:
            hi += 1 - size
            size = 1
        parts.append(f"{lo}_{hi}" + (f"_{interior}" if interior else ""))
        out.append(size)
    if prod(out) > MAX_ELEMENTS:
        return None
    return c.emit("pad", x.arr.with_dims(out), "pad", [x, value], "padding=" + "x".join(parts),
                  exact=x.exact and value.exact, bound=max(x.bound, value.bound))


def reverse(c: Comp) -> Value | None:
    x = any_operand(c, min_rank=1)
    dims = c.src.subset(list(range(x.arr.rank))) or [0]
    return c.emit("reverse", x.arr, "reverse", [x], f"dimensions={{{','.join(map(str, dims))}}}",
                  exact=x.exact, bound=x.bound)


def iota(c: Comp) -> Value | None:
    src = c.src
    shape = Arr(src.weighted([("s32", 3), ("f32", 3), ("u32", 1), ("bf16", 1)]),
                choices.dims(src, src.integer(1, 3)))
    d = src.integer(0, shape.rank - 1)
    bound = float(max(shape.dims))
    return c.emit("iota", shape, "iota", [], f"iota_dimension={d}", bound=bound)


def constant(c: Comp) -> Value | None:
    kind = c.src.weighted([("float", 3), ("int", 2), ("pred", 1)])
    return c.constant(choices.new_shape(c.src, kind, c.src.integer(0, 2)))


def _start_indices(c: Comp, count: int) -> list[Value]:
    """Scalar start indices: constants (in or out of range: they are clamped), integer
    parameters or scalars computed in the program."""
    out = []
    t = c.src.weighted([("s32", 4), ("u32", 1), ("s64", 1)])
    for _ in range(count):
        found = c.pick(lambda v: v.shape == Arr(t, ()))
        if found is not None and c.src.boolean(0.4):
            out.append(found)
        elif c.kind == "entry" and c.src.boolean(0.5):
            out.append(c.param(Arr(t, ())))
        else:
            out.append(c.scalar(t, c.src.choice([0, 1, 2, 7, 100] +
                                                ([-3] if t[0] == "s" else []))))
    return out


def dynamic_slice(c: Comp) -> Value | None:
    src = c.src
    x = any_operand(c, min_rank=1)
    sizes = [src.integer(1, d) for d in x.arr.dims]
    starts = _start_indices(c, x.arr.rank)
    return c.emit("dynamic-slice", x.arr.with_dims(sizes), "dynamic-slice", [x, *starts],
                  f"dynamic_slice_sizes={{{','.join(map(str, sizes))}}}", exact=x.exact,
                  bound=x.bound)


def dynamic_update_slice(c: Comp) -> Value | None:
    src = c.src
    x = any_operand(c, min_rank=1)
    sizes = [src.integer(1, d) for d in x.arr.dims]
    update = c.need(x.arr.with_dims(sizes))
    starts = _start_indices(c, x.arr.rank)
    return c.emit("dynamic-update-slice", x.arr, "dynamic-update-slice", [x, update, *starts],
                  exact=x.exact and update.exact, bound=max(x.bound, update.bound))


def get_dimension_size(c: Comp) -> Value | None:
    x = any_operand(c, min_rank=1)
    d = c.src.integer(0, x.arr.rank - 1)
    size = c.emit("get-dimension-size", Arr("s32", ()), "get-dimension-size", [x],
                  f"dimensions={{{d}}}", bound=float(x.arr.dims[d]))
    return size


def tuple_(c: Comp) -> Value | None:
    """A tuple of two or three values (nested now and then), and some elements read back."""
    src = c.src
    members = [any_operand(c) for _ in range(src.integer(2, 3))]
    inner = c.pick(tuples=True) if src.boolean(0.3) else None
    if inner is not None:
        members.append(inner)
    t = c.emit("tuple", Tup(tuple(m.shape for m in members)), "tuple", members, parts=members)
    picked = src.subset(list(range(len(members)))) or [0]
    arrays = [i for i in picked if not members[i].is_tuple]
    return c.unpack(t, arrays)[-1] if arrays else t


GENERATORS = [
    (broadcast, 3), (reshape, 3), (transpose, 3), (slice_, 3), (concatenate, 2), (pad, 2),
    (reverse, 1), (iota, 1), (constant, 1), (dynamic_slice, 2), (dynamic_update_slice, 2),
    (get_dimension_size, 1), (tuple_, 1),
]
