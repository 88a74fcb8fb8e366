"""Contractions: dot (batch, contracting and free dims in any order), convolution (any
dim_labels, windows with stride, padding, dilations, feature and batch groups), ragged-dot (its
three modes), fft (all four types), cholesky of a positive definite matrix, triangular-solve.

Sums change with the reduction order, so float results are inexact; operands are bounded so the
sums stay far from overflow."""
from __future__ import annotations

from math import prod

from . import choices
from .program import MAX_ELEMENTS, Comp
from .values import MAX_BOUND, Arr, Value


def _lst(xs) -> str:
    return "{" + ",".join(map(str, xs)) + "}"


def dot(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 5), ("int", 1)])
    lhs = choices.operand(c, kind, max_bound=100.0, min_rank=1)
    rank = lhs.arr.rank
    order = src.permutation(list(range(rank)))
    nb = src.integer(0, min(2, rank - 1)) if rank > 1 and src.boolean(0.4) else 0
    nc = src.integer(0, min(2, rank - nb)) if src.boolean(0.9) else 0
    batch, contracting, free = order[:nb], order[nb:nb + nc], sorted(order[nb + nc:])
    roles = [("b", d) for d in batch] + [("c", d) for d in contracting]
    extra = [choices.dim(src) for _ in range(src.integer(0, min(2, 4 - len(roles))))]
    roles += [("f", k) for k in range(len(extra))]
    layout = src.permutation(roles)
    sizes = [lhs.arr.dims[d] if role != "f" else extra[d] for role, d in layout]
    rhs = c.need(lhs.arr.with_dims(sizes), max_bound=100.0)
    rhs_batch = [layout.index(("b", d)) for d in batch]
    rhs_contracting = [layout.index(("c", d)) for d in contracting]
    rhs_free = [i for i, (role, _) in enumerate(layout) if role == "f"]
    out = [lhs.arr.dims[d] for d in batch] + [lhs.arr.dims[d] for d in free] + \
        [sizes[i] for i in rhs_free]
    if prod(out) > MAX_ELEMENTS or len(out) > 5:
        return None
    terms = prod(lhs.arr.dims[d] for d in contracting)
    bound = terms * lhs.bound * rhs.bound
    if kind == "float" and bound > MAX_BOUND:
        return None
    attrs = (f"lhs_batch_dims={_lst(batch)}, rhs_batch_dims={_lst(rhs_batch)}, " if batch else "") \
        + f"lhs_contracting_dims={_lst(contracting)}, rhs_contracting_dims={_lst(rhs_contracting)}"
    exact = lhs.exact and rhs.exact and (kind == "int" or terms == 1)
    return c.emit("dot", lhs.arr.with_dims(out), "dot", [lhs, rhs], attrs, exact=exact,
                  bound=bound if kind == "float" else float("inf"))


def convolution(c: Comp) -> Value | None:
    src = c.src
    spatial = src.weighted([(1, 3), (2, 3), (0, 1)])
    groups = src.weighted([("none", 6), ("feature", 2), ("batch", 1)])
    g = src.choice([2, 3]) if groups != "none" else 1
    batch = choices.dim(src, hi=4) * (g if groups == "batch" else 1)
    features = choices.dim(src, hi=4) * (g if groups == "feature" else 1)
    out_features = choices.dim(src, hi=3) * g
    in_spatial = [choices.dim(src, 2, 10) for _ in range(spatial)]
    window, sizes, out_spatial = [], [], []
    for d in in_spatial:
        lhs_dilate = src.weighted([(1, 5), (2, 1)])
        rhs_dilate = src.weighted([(1, 5), (2, 1)])
        stride = src.weighted([(1, 4), (2, 2), (3, 1)])
        lo, hi = src.integer(0, 2), src.integer(0, 2)
        if src.boolean(0.1):
            lo = -1
        dilated = (d - 1) * lhs_dilate + 1 + lo + hi
        k = src.integer(1, min(4, max(1, (dilated - 1) // rhs_dilate + 1)))
        span = (k - 1) * rhs_dilate + 1
        if dilated < span:
            return None
        out_spatial.append((dilated - span) // stride + 1)
        sizes.append(k)
        window.append((k, stride, lo, hi, lhs_dilate, rhs_dilate))
    names = [str(i) for i in range(spatial)]
    lhs_labels = src.permutation(["b", "f"] + names)
    rhs_labels = src.permutation(["i", "o"] + names)
    out_labels = src.permutation(["b", "f"] + names)
    lhs_size = {"b": batch, "f": features, **dict(zip(names, in_spatial))}
    rhs_size = {"i": features // (g if groups == "feature" else 1), "o": out_features,
                **dict(zip(names, sizes))}
    out_size = {"b": batch // (g if groups == "batch" else 1), "f": out_features,
                **dict(zip(names, out_spatial))}
    out_dims = [out_size[x] for x in out_labels]
    if prod(out_dims) > MAX_ELEMENTS:
        return None
    t = "f32" if src.boolean(0.9) else src.choice(["bf16", "f64"])
    lhs = c.need(Arr(t, tuple(lhs_size[x] for x in lhs_labels)), max_bound=4.0)
    rhs = c.need(Arr(t, tuple(rhs_size[x] for x in rhs_labels)), max_bound=4.0)
    terms = rhs_size["i"] * prod(sizes)
    bound = terms * lhs.bound * rhs.bound
    if bound > MAX_BOUND:
        return None
    attrs = []
    if spatial:
        fields = [f"size={'x'.join(str(w[0]) for w in window)}"]
        if any(w[1] != 1 for w in window):
            fields.append(f"stride={'x'.join(str(w[1]) for w in window)}")
        if any(w[2] or w[3] for w in window):
            fields.append(f"pad={'x'.join(f'{w[2]}_{w[3]}' for w in window)}")
        if any(w[4] != 1 for w in window):
            fields.append(f"lhs_dilate={'x'.join(str(w[4]) for w in window)}")
        if any(w[5] != 1 for w in window):
            fields.append(f"rhs_dilate={'x'.join(str(w[5]) for w in window)}")
        attrs.append("window={" + " ".join(fields) + "}")
    attrs.append(f"dim_labels={''.join(lhs_labels)}_{''.join(rhs_labels)}->{''.join(out_labels)}")
    if groups == "feature":
        attrs.append(f"feature_group_count={g}")
    elif groups == "batch":
        attrs.append(f"batch_group_count={g}")
    return c.emit("convolution", Arr(t, tuple(out_dims)), "convolution", [lhs, rhs],
                  ", ".join(attrs), exact=False, bound=bound)


def ragged_dot(c: Comp) -> Value | None:
    src = c.src
    mode = src.choice(["free", "contracting", "batch"])
    m, k, n, g = (choices.dim(src, hi=8) for _ in range(4))
    t = "f32"
    if mode == "free":
        lhs_s, rhs_s, out = (m, k), (g, k, n), (m, n)
        attrs = "lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, " \
                "rhs_group_dims={0}"
    elif mode == "contracting":
        lhs_s, rhs_s, out = (m, k), (k, n), (g, m, n)
        attrs = "lhs_contracting_dims={1}, rhs_contracting_dims={0}, lhs_ragged_dims={1}"
    else:
        b = choices.dim(src, hi=4)
        lhs_s, rhs_s, out = (b, m, k), (b, k, n), (b, m, n)
        attrs = "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, " \
                "rhs_contracting_dims={1}, lhs_ragged_dims={0}"
    lhs = c.need(Arr(t, lhs_s), max_bound=4.0)
    rhs = c.need(Arr(t, rhs_s), max_bound=4.0)
    sizes = c.need(Arr("s32", (g,)), exact=True)
    bound = k * lhs.bound * rhs.bound
    if bound > MAX_BOUND:
        return None
    return c.emit("ragged-dot", Arr(t, out), "ragged-dot", [lhs, rhs, sizes], attrs, exact=False,
                  bound=bound)


def fft(c: Comp) -> Value | None:
    src = c.src
    kind = src.choice(["FFT", "IFFT", "RFFT", "IRFFT"])
    length = [choices.dim(src, 2, 8) for _ in range(src.integer(1, 2))]
    lead = choices.dims(src, src.integer(0, 2), max_elements=16)
    if kind in ("FFT", "IFFT"):
        x = c.need(Arr("c64", lead + tuple(length)), max_bound=10.0) if c.kind == "entry" else \
            choices.make_complex(c, Arr("c64", lead + tuple(length)))
        out = x.arr
    elif kind == "RFFT":
        x = c.need(Arr("f32", lead + tuple(length)), max_bound=10.0)
        out = Arr("c64", lead + tuple(length[:-1]) + (length[-1] // 2 + 1,))
    else:
        shape = Arr("c64", lead + tuple(length[:-1]) + (length[-1] // 2 + 1,))
        x = c.need(shape, max_bound=10.0) if c.kind == "entry" else \
            choices.make_complex(c, shape)
        out = Arr("f32", lead + tuple(length))
    bound = prod(length) * x.bound
    if bound > MAX_BOUND:
        return None
    return c.emit("fft", out, "fft", [x], f"fft_type={kind}, fft_length={_lst(length)}",
                  exact=False, bound=bound)


def _identity_times(c: Comp, t: str, n: int, scale: float, lead: tuple[int, ...]) -> Value:
    flat = [scale if i == j else 0.0 for i in range(n) for j in range(n)]
    from .program import array_literal
    eye = c.emit("constant", Arr(t, (n, n)), "constant", payload=array_literal(t, (n, n), flat),
                 bound=scale, sharding=None, keep=False)
    if not lead:
        return eye
    k = len(lead)
    return c.emit("broadcast", Arr(t, lead + (n, n)), "broadcast", [eye],
                  f"dimensions={{{k},{k + 1}}}", bound=scale, keep=False)


def cholesky(c: Comp) -> Value | None:
    """cholesky(x·xᵀ + n·I): positive definite, so well conditioned."""
    src = c.src
    n = src.integer(1, 5)
    lead = choices.dims(src, src.integer(0, 1), max_elements=4)
    t = "f32" if src.boolean(0.8) else "f64"
    x = c.need(Arr(t, lead + (n, n)), max_bound=1.0)
    k = len(lead)
    batch = list(range(k))
    attrs = (f"lhs_batch_dims={_lst(batch)}, rhs_batch_dims={_lst(batch)}, " if batch else "") + \
        f"lhs_contracting_dims={{{k + 1}}}, rhs_contracting_dims={{{k + 1}}}"
    gram = c.emit("dot", x.arr, "dot", [x, x], attrs, exact=False, bound=n * x.bound ** 2)
    spd = c.emit("add", x.arr, "add", [gram, _identity_times(c, t, n, float(n), lead)],
                 exact=False, bound=gram.bound + n)
    lower = src.choice(["true", "false"])
    return c.emit("cholesky", x.arr, "cholesky", [spd], f"lower={lower}", exact=False,
                  bound=spd.bound)


def triangular_solve(c: Comp) -> Value | None:
    """A unit-diagonal (or diagonally dominant) triangular system: well conditioned."""
    src = c.src
    n = src.integer(1, 5)
    k = choices.dim(src, hi=6)
    lead = choices.dims(src, src.integer(0, 1), max_elements=4)
    t = "f32"
    left = src.boolean()
    a = c.need(Arr(t, lead + (n, n)), max_bound=1.0)
    unit = src.boolean(0.6)
    if not unit:
        a = c.emit("add", a.arr, "add", [a, _identity_times(c, t, n, float(n + 1), lead)],
                   exact=a.exact, bound=a.bound + n + 1)
    b = c.need(Arr(t, lead + ((n, k) if left else (k, n))), max_bound=4.0)
    attrs = f"left_side={'true' if left else 'false'}, lower={src.choice(['true', 'false'])}, " \
            f"unit_diagonal={'true' if unit else 'false'}, " \
            f"transpose_a={src.choice(['NO_TRANSPOSE', 'TRANSPOSE', 'ADJOINT'])}"
    bound = b.bound * 2 ** n
    return c.emit("triangular-solve", b.arr, "triangular-solve", [a, b], attrs, exact=False,
                  bound=bound)


GENERATORS = [
    (dot, 5), (convolution, 3), (ragged_dot, 1), (fft, 1), (cholesky, 1),
    (triangular_solve, 1),
]
