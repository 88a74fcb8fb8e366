"""Indexing: gather and scatter with random dimension numbers (explicit batch dims included;
variadic scatter), sort (one to three operands, along any dim), topk and the TopK custom-call.

Indices are integers from the program (random inputs stay inside the dims they index, computed
ones need not: gather and dynamic-slice clamp, scatter skips out-of-bounds updates). Sort keys
and top-k inputs are exact, so the order is the same however the program is partitioned;
a multi-operand sort is stable (equal keys keep their order), and scatter combines with add,
maximum or minimum, never by overwriting (whose result with duplicate indices is unspecified)."""
from __future__ import annotations

from math import prod

from . import choices
from .ops_reduce import reducer
from .program import MAX_ELEMENTS, Comp
from .values import FLOATS, MAX_BOUND, Arr, Tup, Value


def _lst(xs) -> str:
    return "{" + ",".join(map(str, xs)) + "}"


def _index_type(src) -> str:
    return src.weighted([("s32", 5), ("s64", 1), ("u32", 1)])


def _dimension_numbers(src, operand: tuple[int, ...]):
    """Random (batching dims, start/scatter map, collapsed/inserted dims, window sizes) for an
    operand of dims `operand`."""
    rank = len(operand)
    order = src.permutation(list(range(rank)))
    batching = sorted(order[:1]) if rank >= 2 and src.boolean(0.25) else []
    rest = [d for d in order if d not in batching]
    mapped = rest[:src.integer(1, min(2, len(rest)))]
    collapsed = sorted(d for d in mapped if src.boolean(0.6))
    sizes = []
    for d in range(rank):
        if d in batching or d in collapsed:
            sizes.append(1)
        elif d in mapped:
            sizes.append(src.integer(1, operand[d]))
        else:
            sizes.append(operand[d] if src.boolean(0.6) else src.integer(1, operand[d]))
    return batching, mapped, collapsed, sizes


def _index_shape(src, operand: tuple[int, ...], batching: list[int], mapped: list[int]):
    """Indices dims: batch dims (one per operand batching dim, with its size, plus free ones)
    and the index vector at `index_vector_dim` (left implicit when it would be a trailing 1)."""
    free = [choices.dim(src, hi=6) for _ in range(src.integer(0 if batching else 1, 2))]
    batch = [("free", s) for s in free] + [("batching", b) for b in batching]
    batch = src.permutation(batch)
    batch_sizes = [s if kind == "free" else operand[s] for kind, s in batch]
    vector = len(mapped)
    ivd = src.integer(0, len(batch)) if src.boolean(0.3) else len(batch)
    implicit = vector == 1 and ivd == len(batch) and src.boolean(0.3)
    dims = list(batch_sizes)
    if not implicit:
        dims.insert(ivd, vector)
    # indices dims (not counting the index vector) of each operand batching dim, in order
    positions = [i for i, (kind, _) in enumerate(batch) if kind == "batching"]
    batching_index_dims = [p if implicit or p < ivd else p + 1 for p in positions]
    by_operand = [batch[p][1] for p in positions]
    paired = sorted(zip(by_operand, batching_index_dims))
    return tuple(dims), ivd, batch_sizes, [b for b, _ in paired], [i for _, i in paired]


def gather(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 4), ("int", 2), ("pred", 1)])
    x = choices.operand(c, kind, min_rank=1, max_rank=3)
    batching, mapped, collapsed, sizes = _dimension_numbers(src, x.arr.dims)
    idx_dims, ivd, batch_sizes, operand_batching, index_batching = \
        _index_shape(src, x.arr.dims, batching, mapped)
    indices = c.need(Arr(_index_type(src), idx_dims), exact=True)
    offsets = [d for d in range(x.arr.rank) if d not in collapsed and d not in batching]
    out_rank = len(batch_sizes) + len(offsets)
    offset_dims = sorted(src.permutation(list(range(out_rank)))[:len(offsets)])
    out, batch_iter, off_iter = [], iter(batch_sizes), iter(offsets)
    for k in range(out_rank):
        out.append(sizes[next(off_iter)] if k in offset_dims else next(batch_iter))
    if prod(out) > MAX_ELEMENTS:
        return None
    attrs = (f"offset_dims={_lst(offset_dims)}, collapsed_slice_dims={_lst(collapsed)}, "
             f"start_index_map={_lst(mapped)}, index_vector_dim={ivd}, "
             f"slice_sizes={_lst(sizes)}")
    if operand_batching:
        attrs += (f", operand_batching_dims={_lst(operand_batching)}, "
                  f"start_indices_batching_dims={_lst(index_batching)}")
    if src.boolean(0.1):
        attrs += ", indices_are_sorted=true"
    return c.emit("gather", x.arr.with_dims(out), "gather", [x, indices], attrs, exact=x.exact,
                  bound=x.bound)


def scatter(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 4), ("int", 2)])
    x = choices.operand(c, kind, min_rank=1, max_rank=3, max_bound=MAX_BOUND)
    batching, mapped, inserted, sizes = _dimension_numbers(src, x.arr.dims)
    idx_dims, ivd, batch_sizes, operand_batching, index_batching = \
        _index_shape(src, x.arr.dims, batching, mapped)
    windows = [d for d in range(x.arr.rank) if d not in inserted and d not in batching]
    upd_rank = len(batch_sizes) + len(windows)
    window_dims = sorted(src.permutation(list(range(upd_rank)))[:len(windows)])
    upd, batch_iter, win_iter = [], iter(batch_sizes), iter(windows)
    for k in range(upd_rank):
        upd.append(sizes[next(win_iter)] if k in window_dims else next(batch_iter))
    if prod(upd) > MAX_ELEMENTS:
        return None
    indices = c.need(Arr(_index_type(src), idx_dims), exact=True)
    op = src.choice(["add", "maximum", "minimum"])
    t = x.arr.dtype
    count = 2 if src.boolean(0.25) else 1
    operands = [x] + [c.need(x.arr, max_bound=MAX_BOUND) for _ in range(count - 1)]
    updates = [c.need(x.arr.with_dims(upd), max_bound=10.0) for _ in range(count)]
    if count == 1:
        combiner = reducer(c, op, t)
        shape = x.arr
    else:
        combiner = c.mb.helper(f"scatter2_{op}_{t}", lambda name: (
            f"{name} {{\n  a0 = {t}[] parameter(0)\n  a1 = {t}[] parameter(1)\n"
            f"  b0 = {t}[] parameter(2)\n  b1 = {t}[] parameter(3)\n"
            f"  r0 = {t}[] {op}(a0, b0)\n  r1 = {t}[] {op}(a1, b1)\n"
            f"  ROOT r = ({t}[], {t}[]) tuple(r0, r1)\n}}\n"))
        shape = Tup((x.arr, x.arr))
    attrs = (f"update_window_dims={_lst(window_dims)}, inserted_window_dims={_lst(inserted)}, "
             f"scatter_dims_to_operand_dims={_lst(mapped)}, index_vector_dim={ivd}")
    if operand_batching:
        attrs += (f", input_batching_dims={_lst(operand_batching)}, "
                  f"scatter_indices_batching_dims={_lst(index_batching)}")
    attrs += f", to_apply={combiner}"
    exact = all(v.exact for v in operands + updates) and (t not in FLOATS or op != "add")
    terms = prod(upd)
    bound = max(v.bound for v in operands) + terms * max(u.bound for u in updates) \
        if op == "add" else max(v.bound for v in operands + updates)
    if t in FLOATS and bound > MAX_BOUND:
        return None
    value = c.emit("scatter", shape, "scatter", [*operands, indices, *updates], attrs,
                   exact=exact, bound=bound, keep=count == 1,
                   parts=[Value("", x.arr, exact, bound)] * count)
    return value if count == 1 else c.unpack(value)[-1]


def _comparator(c: Comp, types: list[str], direction: str, total: bool) -> str:
    def build(name: str) -> str:
        lines = []
        for i, t in enumerate(types):
            lines.append(f"  p{i}.lhs = {t}[] parameter({2 * i})")
            lines.append(f"  p{i}.rhs = {t}[] parameter({2 * i + 1})")
        kind = ", type=TOTALORDER" if total else ""
        lines.append(f"  ROOT r = pred[] compare(p0.lhs, p0.rhs), direction={direction}{kind}")
        return f"{name} {{\n" + "\n".join(lines) + "\n}\n"
    key = f"compare_{'_'.join(types)}_{direction}{'_total' if total else ''}"
    return c.mb.helper(key, build)


def sort(c: Comp) -> Value | None:
    src = c.src
    kind = src.choice(["float", "int"])
    keys = choices.operand(c, kind, exact=True, min_rank=1)
    count = src.weighted([(1, 3), (2, 3), (3, 1)])
    others = [c.need(keys.arr.with_dtype(choices.element_type(src, src.choice(["float", "int"]))))
              for _ in range(count - 1)]
    operands = [keys] + others
    d = src.integer(0, keys.arr.rank - 1)
    direction = src.choice(["LT", "GT"])
    total = kind == "float" and src.boolean(0.3)
    comparator = _comparator(c, [o.arr.dtype for o in operands], direction, total)
    stable = count > 1 or src.boolean(0.5)
    attrs = f"dimensions={{{d}}}, " + ("is_stable=true, " if stable else "") + \
        f"to_apply={comparator}"
    if count == 1:
        return c.emit("sort", keys.arr, "sort", operands, attrs, exact=keys.exact,
                      bound=keys.bound)
    shape = Tup(tuple(o.arr for o in operands))
    value = c.emit("sort", shape, "sort", operands, attrs, parts=operands, keep=False)
    return c.unpack(value)[-1]


def topk(c: Comp) -> Value | None:
    src = c.src
    x = choices.operand(c, src.choice(["float", "float", "int"]), exact=True, min_rank=1,
                        max_rank=2)
    n = x.arr.dims[-1]
    k = src.integer(1, n)
    out = x.arr.with_dims(x.arr.dims[:-1] + (k,))
    shape = Tup((out, out.with_dtype("s32")))
    index_bound = float(n)
    parts = [Value("", out, True, x.bound), Value("", out.with_dtype("s32"), True, index_bound)]
    if x.arr.is_float and src.boolean(0.4):
        value = c.emit("custom-call", shape, "custom-call", [x], 'custom_call_target="TopK"',
                       parts=parts, keep=False)
    else:
        largest = src.choice(["true", "false"])
        value = c.emit("topk", shape, "topk", [x], f"k={k}, largest={largest}", parts=parts,
                       keep=False)
    return c.unpack(value)[-1]


GENERATORS = [(gather, 4), (scatter, 4), (sort, 3), (topk, 2)]
