"""Property test: random small graphs (elementwise, broadcast, transpose, reshape, reduce, dot,
iota, slice, pad, concatenate, reverse) with random shardings (tiled on any dims, partially replicated, any
device order, replicated, single-device) on 2, 4 and 8 partitions, with uneven shapes, reproduce
the unpartitioned program when partitioned and run with garbage in every padding element."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_strategies import tiled_shardings
from spmd_partition_helpers import check_equivalent
from hlo_text import reducer

ADD = reducer("add") + reducer("max")


@st.composite
def shardings(draw, rank: int, n: int) -> str:
    """A random sharding text for a rank-`rank` array on `n` devices."""
    kind = draw(st.sampled_from(["tiled", "tiled", "tiled", "replicated", "maximal"]))
    if kind == "replicated" or rank == 0:
        return "{replicated}"
    if kind == "maximal":
        return f"{{maximal device={draw(st.integers(0, n - 1))}}}"
    return draw(tiled_shardings(rank, n))


@st.composite
def programs(draw):
    """(HLO text, number of partitions) of a random straight-line program."""
    n = draw(st.sampled_from([2, 4, 8]))
    lines: list[str] = []
    values: list[tuple[str, tuple[int, ...]]] = []
    params = 0

    def new_name(prefix):
        return f"{prefix}{len(lines)}"

    def annotate(dims):
        if draw(st.booleans()):
            return ", sharding=" + draw(shardings(len(dims), n))
        return ""

    def shape(dims):
        return f"f32[{','.join(map(str, dims))}]"

    def parameter(dims):
        nonlocal params
        name = new_name("p")
        lines.append(f"  {name} = {shape(dims)} parameter({params}), sharding="
                     f"{draw(shardings(len(dims), n))}")
        params += 1
        values.append((name, dims))
        return name

    size = st.integers(1, 9)
    parameter((draw(size), draw(size)))
    for _ in range(draw(st.integers(1, 5))):
        x, dims = draw(st.sampled_from(values))
        op = draw(st.sampled_from(["binary", "unary", "broadcast", "transpose", "reshape",
                                   "reduce", "dot", "iota", "slice", "pad", "concatenate",
                                   "reverse"]))
        name = new_name("v")
        if op == "binary":
            other = [v for v, d in values if d == dims and v != x]
            y = draw(st.sampled_from(other)) if other and draw(st.booleans()) \
                else parameter(dims)
            opcode = draw(st.sampled_from(["add", "multiply", "maximum", "subtract"]))
            out = dims
            lines.append(f"  {name} = {shape(out)} {opcode}({x}, {y}){annotate(out)}")
        elif op == "unary":
            opcode = draw(st.sampled_from(["negate", "tanh", "copy", "abs"]))
            out = dims
            lines.append(f"  {name} = {shape(out)} {opcode}({x}){annotate(out)}")
        elif op == "broadcast":
            if len(dims) >= 3:
                continue
            at = draw(st.integers(0, len(dims)))
            out = dims[:at] + (draw(size),) + dims[at:]
            kept = ",".join(str(d) for d in range(len(out)) if d != at)
            lines.append(f"  {name} = {shape(out)} broadcast({x}), dimensions={{{kept}}}"
                         f"{annotate(out)}")
        elif op == "transpose":
            perm = draw(st.permutations(list(range(len(dims)))))
            out = tuple(dims[p] for p in perm)
            lines.append(f"  {name} = {shape(out)} transpose({x}), "
                         f"dimensions={{{','.join(map(str, perm))}}}{annotate(out)}")
        elif op == "reshape":
            if len(dims) >= 2 and draw(st.booleans()):
                at = draw(st.integers(0, len(dims) - 2))
                out = dims[:at] + (dims[at] * dims[at + 1],) + dims[at + 2:]
            else:
                at = draw(st.integers(0, len(dims) - 1))
                divisors = [k for k in range(1, dims[at] + 1) if dims[at] % k == 0]
                k = draw(st.sampled_from(divisors))
                out = dims[:at] + (k, dims[at] // k) + dims[at + 1:]
            lines.append(f"  {name} = {shape(out)} reshape({x}){annotate(out)}")
        elif op == "reduce":
            if len(dims) < 2:
                continue
            d = draw(st.integers(0, len(dims) - 1))
            reducer, init = draw(st.sampled_from([("add", "0"), ("max", "-inf")]))
            out = dims[:d] + dims[d + 1:]
            lines.append(f"  {name}.init = f32[] constant({init})")
            lines.append(f"  {name} = {shape(out)} reduce({x}, {name}.init), dimensions={{{d}}}, "
                         f"to_apply={reducer}{annotate(out)}")
        elif op == "dot":
            if len(dims) != 2:
                continue
            k = draw(size)
            y = parameter((dims[1], k))
            out = (dims[0], k)
            lines.append(f"  {name} = {shape(out)} dot({x}, {y}), lhs_contracting_dims={{1}}, "
                         f"rhs_contracting_dims={{0}}{annotate(out)}")
        elif op == "slice":
            starts = [draw(st.integers(0, d - 1)) for d in dims]
            limits = [draw(st.integers(a + 1, d)) for a, d in zip(starts, dims)]
            out = tuple(b - a for a, b in zip(starts, limits))
            spec = ", ".join(f"[{a}:{b}]" for a, b in zip(starts, limits))
            lines.append(f"  {name} = {shape(out)} slice({x}), slice={{{spec}}}{annotate(out)}")
        elif op == "pad":
            pads = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in dims]
            out = tuple(d + lo + hi for d, (lo, hi) in zip(dims, pads))
            spec = "x".join(f"{lo}_{hi}" for lo, hi in pads)
            lines.append(f"  {name}.value = f32[] constant(0.5)")
            lines.append(f"  {name} = {shape(out)} pad({x}, {name}.value), padding={spec}"
                         f"{annotate(out)}")
        elif op == "concatenate":
            axis = draw(st.integers(0, len(dims) - 1))
            out = tuple(2 * d if k == axis else d for k, d in enumerate(dims))
            lines.append(f"  {name} = {shape(out)} concatenate({x}, {x}), dimensions={{{axis}}}"
                         f"{annotate(out)}")
        elif op == "reverse":
            axes = sorted(draw(st.sets(st.integers(0, len(dims) - 1), min_size=1)))
            out = dims
            lines.append(f"  {name} = {shape(out)} reverse({x}), "
                         f"dimensions={{{','.join(map(str, axes))}}}{annotate(out)}")
        else:
            out = dims
            axis = draw(st.integers(0, len(dims) - 1))
            lines.append(f"  {name}.iota = f32[{','.join(map(str, dims))}] iota(), "
                         f"iota_dimension={axis}{annotate(out)}")
            lines.append(f"  {name} = {shape(out)} add({x}, {name}.iota){annotate(out)}")
        values.append((name, out))
    root, root_dims = values[-1]
    lines.append(f"  ROOT root = {shape(root_dims)} copy({root}){annotate(root_dims)}")
    text = "HloModule random\n\n" + ADD + "\nENTRY main {\n" + "\n".join(lines) + "\n}\n"
    return text, n


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_partition_correctly(program):
    text, n = program
    check_equivalent(text, n, rtol=1e-4, atol=1e-4)
