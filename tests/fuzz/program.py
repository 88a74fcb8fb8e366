"""The program under construction: computations of instruction lines, the values they define,
helper computations (reducers, comparators), and the module text.

Each line exists in two forms: the program's own, and the *reference* form, which differs only
inside manual regions (there the reference computes the same values on global shapes, with the
region's boundaries as copies): `ModuleBuilder.text(reference=True)` is a program with the same
outputs that `run --check` and the reference interpreter can evaluate on one device.
"""
from __future__ import annotations

from typing import Callable, Sequence

from . import shardings
from .source import Source
from .values import COMPLEX, FLOATS, INTS, MAX_BOUND, Arr, Shape, Tup, Value, fact

#: `sharding=AUTO`: annotate with a random sharding now and then, as a user annotates a few ops
AUTO = "auto"
#: annotation probability per instruction kind: entry parameters, entry ops, ops in callees
ANNOTATE = {"param": 0.6, "entry": 0.25, "callee": 0.06}
MAX_PARAMS = 6
#: the largest array the generator makes (elements) and its largest dim
MAX_ELEMENTS = 1024
MAX_DIM = 16


class TooLarge(Exception):
    """An op would make an array beyond MAX_DIM / MAX_ELEMENTS: the generator drops it."""


class Comp:
    """A computation being generated: its lines and the values usable as operands (arrays in
    `pool`, tuples in `tuples`, newest last). `depth` counts the computations around it (the
    entry is 0); `kind` is "entry" or "callee"."""

    def __init__(self, mb: "ModuleBuilder", name: str, kind: str, depth: int = 0):
        self.mb, self.name, self.kind, self.depth = mb, name, kind, depth
        self.lines: list[tuple[str, str]] = []
        self.pool: list[Value] = []
        self.tuples: list[Value] = []
        self.params: list[Value] = []
        self.used: set[str] = set()
        self.root: Value | None = None

    @property
    def src(self) -> Source:
        return self.mb.src

    @property
    def n(self) -> int:
        return self.mb.n

    # ---- emitting --------------------------------------------------------------------------

    def annotation(self, shape: Shape, sharding: str | None, key: str) -> str | None:
        if sharding != AUTO:
            return sharding
        if self.src.boolean(ANNOTATE[key]):
            return shardings.sharding(self.src, shape, self.n)
        return None

    def emit(self, stem: str, shape: Shape, opcode: str, operands: Sequence[Value] = (),
             attrs: str = "", *, exact: bool = True, bound: float = 1.0,
             sharding: str | None = AUTO, parts: Sequence[Value] = (), payload: str | None = None,
             full: Arr | None = None, ref_opcode: str | None = None,
             ref_attrs: str | None = None, keep: bool = True) -> Value:
        """Append `name = shape opcode(operands or payload), attrs, sharding=...` and return its
        value (added to the pool unless `keep` is False). `full`: the instruction is in a manual
        region and this is its global shape; the reference line then uses `full`,
        `ref_opcode`/`ref_attrs` if given, and no sharding."""
        _check_size(shape)
        name = self.mb.fresh(stem)
        inner = payload if payload is not None else ", ".join(o.name for o in operands)
        if full is not None:
            sharding = "{manual}"
        annotation = self.annotation(shape, sharding, "entry" if self.kind == "entry" else "callee")
        line = f"  {name} = {shape.text()} {opcode}({inner})" + (f", {attrs}" if attrs else "") + \
            (f", sharding={annotation}" if annotation else "")
        ref = line
        if full is not None or ref_opcode is not None:
            r_attrs = attrs if ref_attrs is None else ref_attrs
            r_sharding = f", sharding={annotation}" if annotation and full is None else ""
            ref = f"  {name} = {(full or shape).text()} {ref_opcode or opcode}({inner})" + \
                (f", {r_attrs}" if r_attrs else "") + r_sharding
        self.lines.append((line, ref))
        self.used.update(o.name for o in operands)
        self.mb.count += 1
        value = Value(name, shape, exact, bound, full, tuple(parts))
        if keep:
            (self.tuples if isinstance(shape, Tup) else self.pool).append(value)
        return value

    def param(self, shape: Shape, *, exact: bool = True, bound: float = 1.0,
              sharding: str | None = AUTO, parts: Sequence[Value] = ()) -> Value:
        _check_size(shape)
        number = len(self.params)
        name = self.mb.fresh("param" if self.kind == "entry" else "p")
        if sharding == AUTO:
            sharding = self.annotation(shape, AUTO, "param") if self.kind == "entry" else None
        line = f"  {name} = {shape.text()} parameter({number})" + \
            (f", sharding={sharding}" if sharding else "")
        self.lines.append((line, line))
        self.mb.count += 1
        value = Value(name, shape, exact, bound, None, tuple(parts))
        self.params.append(value)
        (self.tuples if isinstance(shape, Tup) else self.pool).append(value)
        return value

    def unpack(self, tup: Value, indices: Sequence[int] | None = None) -> list[Value]:
        """get-tuple-element of the given (default: every) element of a tuple value."""
        assert isinstance(tup.shape, Tup)
        out = []
        for i in range(len(tup.shape.elements)) if indices is None else indices:
            element = tup.shape.elements[i]
            part = tup.parts[i] if i < len(tup.parts) else fact(element)
            out.append(self.emit("get-tuple-element", element, "get-tuple-element", [tup],
                                 f"index={i}", exact=part.exact, bound=part.bound,
                                 parts=part.parts))
        return out

    # ---- choosing operands -----------------------------------------------------------------

    def pick(self, accept: Callable[[Value], bool] = lambda v: True,
             tuples: bool = False) -> Value | None:
        """A value from the pool (tuples: from the tuple values) that `accept`s, newest first
        (shrinks to the newest), or None."""
        found = [v for v in reversed(self.tuples if tuples else self.pool)
                 if not v.manual and accept(v)]
        return self.src.choice(found) if found else None

    def need(self, shape: Arr, *, exact: bool = False, max_bound: float = MAX_BOUND,
             fresh: bool = False) -> Value:
        """A value of exactly `shape`: from the pool (unless `fresh`), a new entry parameter, or
        a constant (`exact`: an exact one; `max_bound`: bounded by it)."""
        if not fresh:
            found = self.pick(lambda v: v.shape == shape and (v.exact or not exact)
                              and v.bound <= max_bound)
            if found is not None and self.src.boolean(0.6):
                return found
        if self.kind == "entry" and len(self.params) < MAX_PARAMS and self.src.boolean(0.7):
            return self.param(shape, bound=min(1.0, max_bound) if shape.is_float else 1.0)
        return self.constant(shape, max_bound=max_bound)

    def scalar(self, dtype: str, value) -> Value:
        return self.emit("constant", Arr(dtype, ()), "constant", payload=literal(dtype, value),
                         bound=abs(value) if not isinstance(value, bool) else 1.0,
                         sharding=None, keep=False)

    def constant_scalar_like(self, shape: Arr, value) -> Value:
        """`value` broadcast to `shape` (a scalar constant when `shape` is a scalar)."""
        scalar = self.scalar(shape.dtype, value)
        if shape.rank == 0:
            self.pool.append(scalar)
            return scalar
        return self.emit("broadcast", shape, "broadcast", [scalar], "dimensions={}",
                         bound=scalar.bound, sharding=None, keep=False)

    def constant(self, shape: Arr, *, max_bound: float = MAX_BOUND) -> Value:
        """A constant of `shape`: a literal for small arrays, a broadcast scalar otherwise."""
        src = self.src
        values = constant_choices(shape.dtype, max_bound)
        if shape.rank == 0:
            return self.emit("constant", shape, "constant",
                             payload=literal(shape.dtype, src.choice(values)),
                             bound=_bound(values), sharding=None)
        if shape.size <= 8 and src.boolean(0.5):
            flat = [src.choice(values) for _ in range(shape.size)]
            return self.emit("constant", shape, "constant",
                             payload=array_literal(shape.dtype, shape.dims, flat),
                             bound=_bound(flat), sharding=None)
        scalar = self.scalar(shape.dtype, src.choice(values))
        return self.emit("broadcast", shape, "broadcast", [scalar], "dimensions={}",
                         bound=scalar.bound)

    def finish(self, root: Value, sharding: str | None = None) -> None:
        """Make `root` the root: mark its line ROOT (re-emitting a copy when `root` is a
        parameter or not the last line), then hand the computation to the module."""
        last = self.lines[-1][0].split(" = ")[0].strip() if self.lines else None
        if last != root.name or root in self.params or sharding is not None:
            root = self.emit("copy" if not root.is_tuple else "tuple", root.shape,
                             "copy" if not root.is_tuple else "tuple",
                             [root] if not root.is_tuple else self.unpack(root),
                             exact=root.exact, bound=root.bound, parts=root.parts,
                             sharding=sharding, full=root.full)
        main, ref = self.lines[-1]
        self.lines[-1] = ("  ROOT " + main.lstrip(), "  ROOT " + ref.lstrip())
        self.root = root
        self.mb.finished.append(self)

    def text(self, reference: bool = False) -> str:
        head = "ENTRY " if self.kind == "entry" else ""
        body = "\n".join(ref if reference else main for main, ref in self.lines)
        return f"{head}{self.name} {{\n{body}\n}}\n"


def _check_size(shape: Shape) -> None:
    for leaf in shape.leaves():
        if leaf.size > MAX_ELEMENTS or any(d > MAX_DIM for d in leaf.dims):
            raise TooLarge(shape.text())


class ModuleBuilder:
    """The module: helper computations (one per kind and type), finished computations in the
    order they were finished (callees first), the instruction count and budget."""

    def __init__(self, src: Source, n: int, max_instructions: int, name: str = "fuzz"):
        self.src, self.n, self.max_instructions, self.name = src, n, max_instructions, name
        self.helpers: dict[str, tuple[str, str]] = {}
        self.finished: list[Comp] = []
        self.count = 0
        self._names: dict[str, int] = {}

    @property
    def budget(self) -> int:
        return self.max_instructions - self.count

    def fresh(self, stem: str) -> str:
        k = self._names.get(stem, 0)
        self._names[stem] = k + 1
        return f"{stem}.{k}"

    def helper(self, key: str, build: Callable[[str], str]) -> str:
        """The helper computation `key` (built once by `build(name) -> text`); its name."""
        if key not in self.helpers:
            name = self.fresh(key.split(":")[0])
            self.helpers[key] = (name, build(name))
        return self.helpers[key][0]

    def callee(self, parent: Comp, stem: str) -> Comp:
        return Comp(self, self.fresh(stem), "callee", parent.depth + 1)

    def text(self, reference: bool = False) -> str:
        head = f"HloModule {self.name}, num_partitions={self.n}\n\n"
        blocks = [text for _, text in self.helpers.values()]
        blocks += [c.text(reference) for c in self.finished]
        return head + "\n".join(blocks)


# ---- literals ------------------------------------------------------------------------------

def constant_choices(dtype: str, max_bound: float = MAX_BOUND) -> list:
    """Literal values for constants of `dtype` (the simplest first), within `max_bound`."""
    if dtype == "pred":
        return [True, False]
    if dtype in INTS:
        values = [1, 0, 2, 3, 5, 7]
        return values + ([-1, -3] if dtype.startswith("s") else [])
    if dtype in FLOATS:
        return [v for v in [0.5, 1.0, 0.0, -0.25, 2.0, -1.5, 0.75] if abs(v) <= max_bound] or [0.0]
    if dtype in COMPLEX:
        return [complex(0.5, 0), complex(1, -1), complex(0, 0.25)]
    raise ValueError(f"no constants of type {dtype}")


def _bound(values) -> float:
    return max((abs(v) for v in values), default=0.0)


def literal(dtype: str, value) -> str:
    if dtype == "pred":
        return "true" if value else "false"
    if dtype in INTS:
        return str(int(value))
    if dtype in COMPLEX:
        return f"({value.real!r}, {value.imag!r})"
    return repr(float(value))


def array_literal(dtype: str, dims: tuple[int, ...], flat: list) -> str:
    if not dims:
        return literal(dtype, flat[0])
    step = len(flat) // dims[0] if dims[0] else 0
    return "{" + ", ".join(array_literal(dtype, dims[1:], flat[i * step:(i + 1) * step])
                           for i in range(dims[0])) + "}"
