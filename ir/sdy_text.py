"""The text of Shardy's attributes: parse `xla.sdy.*` frontend-attribute values into `ir/sdy.py`
values and print them back.

    #sdy.mesh<["x"=2, "y"=4]>                       #sdy.mesh<["a"=4], device_ids=[3, 2, 1, 0]>
    #sdy.sharding<@mesh, [{"x", ?}p1, {}], replicated={"y"}, unreduced={"z"}>
    #sdy.sharding_per_value<[<@mesh, [{"x":(1)2}]>, <@mesh, []>]>
    #sdy<manual_axes{"x", "y"}>                     0 : i64   (a sharding group id)
    #sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}>

`read_frontend_value(key, raw)` reads one instruction attribute value as written in the HLO text
(a quoted string, escapes included) and `read_header_value(key, raw)` one of the module header's
`frontend_attributes`. Errors are `SdyTextError(message, offset)`, the offset counted in
the raw text so that the HLO parser can point at the exact character.
"""
from __future__ import annotations

import re

from gspmdc.errors import ShardingError

from .mesh import Mesh
from .sdy import (
    ALLOWED_DIRECTION, HAS_UNREDUCED_AXES, IN_SHARDINGS, MANUAL_AXES, MESHES, OUT_SHARDINGS,
    PREFIX, SHARDING, SHARDING_GROUP_ID, SHARDING_RULE, AxisRef, DimSharding, Flag, ManualAxes,
    MaximalMesh, Meshes, OpShardingRule, PropagationDirection, Sharding, ShardingGroupId,
    ShardingPerValue, TensorSharding,
)

__all__ = ["SdyTextError", "read_frontend_value", "read_header_value", "mesh_text",
           "rule_text", "KNOWN_KEYS"]


class SdyTextError(ValueError):
    """A problem `offset` characters into the raw attribute text."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.message, self.offset = message, offset


_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<int>-?\d+)|'
                    r'(?P<word>[A-Za-z_][\w.]*|@[\w.$-]+|#sdy(?:\.\w+)?)|(?P<arrow>->)|(?P<sym>\S))')
_DIRECTIONS = ("NONE", "FORWARD", "BACKWARD", "BOTH")


class _Cursor:
    """Tokens of an unescaped attribute value; `where[i]` maps its characters to raw offsets."""

    def __init__(self, text: str, where: list[int]):
        self.text, self.where, self.pos = text, where, 0

    def error(self, message: str, at: int | None = None) -> SdyTextError:
        at = self.pos if at is None else at
        return SdyTextError(message, self.where[min(at, len(self.where) - 1)])

    def peek(self) -> tuple[str, str, int]:
        """(kind, text, start) of the next token; kind '' at the end."""
        m = _TOKEN.match(self.text, self.pos)
        if m is None:
            return "", "", len(self.text)
        return m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)

    def next(self) -> tuple[str, str, int]:
        kind, value, start = self.peek()
        if kind:
            self.pos = start + len(value)
        return kind, value, start

    def expect(self, text: str) -> None:
        kind, value, start = self.peek()
        if value != text:
            raise self.error(f"expected '{text}', found {_found(kind, value)}", start)
        self.next()

    def accept(self, text: str) -> bool:
        if self.peek()[1] == text:
            self.next()
            return True
        return False

    def integer(self, what: str) -> int:
        kind, value, start = self.next()
        if kind != "int":
            raise self.error(f"expected {what}, found {_found(kind, value)}", start)
        return int(value)

    def string(self, what: str) -> str:
        kind, value, start = self.next()
        if kind != "str":
            raise self.error(f"expected {what} (a quoted name), found {_found(kind, value)}", start)
        return _unescape(value[1:-1])

    def end(self) -> None:
        kind, value, start = self.peek()
        if kind:
            raise self.error(f"unexpected {_found(kind, value)} after the attribute", start)

    def items(self, close: str, item) -> list:
        """`item` repeatedly, separated by commas, up to (and consuming) `close`."""
        values = []
        if self.accept(close):
            return values
        while True:
            values.append(item())
            if self.accept(close):
                return values
            self.expect(",")


def _found(kind: str, value: str) -> str:
    return "end of text" if not kind else f"'{value}'"


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", r"\1", body)


# ---------------------------------------------------------------------------------- grammar

def _mesh(c: _Cursor, inline: bool):
    """`#sdy.mesh<...>` (or `mesh<...>` inside a sharding) -> Mesh | MaximalMesh."""
    kind, value, start = c.next()
    if value != ("mesh" if inline else "#sdy.mesh"):
        raise c.error(f"expected a mesh, found {_found(kind, value)}", start)
    c.expect("<")
    c.expect("[")

    def axis():
        name = c.string("an axis name")
        c.expect("=")
        return name, c.integer("an axis size")

    axes = c.items("]", axis)
    devices = None
    if c.accept(","):
        kind, value, at = c.next()
        if value != "device_ids":
            raise c.error(f"expected 'device_ids', found {_found(kind, value)}", at)
        c.expect("=")
        c.expect("[")
        devices = c.items("]", lambda: c.integer("a device id"))
    c.expect(">")
    if not axes:
        if devices is None:
            return MaximalMesh(0)
        if len(devices) != 1:
            raise c.error(f"a mesh without axes has one device, got device_ids={devices}", start)
        return MaximalMesh(devices[0])
    try:
        return Mesh([a for a, _ in axes], [s for _, s in axes], devices)
    except ShardingError as e:
        raise c.error(f"invalid mesh: {e}", start) from None


def _axis_ref(c: _Cursor) -> AxisRef:
    name = c.string("an axis name")
    if not c.accept(":"):
        return AxisRef(name)
    c.expect("(")
    pre = c.integer("a sub-axis pre-size")
    c.expect(")")
    return AxisRef(name, pre, c.integer("a sub-axis size"))


def _dim(c: _Cursor) -> DimSharding:
    c.expect("{")
    axes, closed = [], True
    if not c.accept("}"):
        while True:
            if c.accept("?"):
                closed = False
                c.expect("}")
                break
            axes.append(_axis_ref(c))
            if c.accept("}"):
                break
            c.expect(",")
    priority = None
    kind, value, start = c.peek()
    if kind == "word" and re.fullmatch(r"p\d+", value):
        c.next()
        priority = int(value[1:])
    return DimSharding(tuple(axes), closed, priority)


def _tensor_sharding(c: _Cursor) -> TensorSharding:
    """The inside of `<...>`: `@mesh, [dims] (, replicated={...})? (, unreduced={...})?`."""
    kind, value, start = c.peek()
    if kind == "word" and value.startswith("@"):
        c.next()
        mesh = value[1:]
    elif value == "mesh":
        mesh = _mesh(c, inline=True)
    else:
        raise c.error(f"expected '@mesh_name' or an inline mesh, found {_found(kind, value)}",
                      start)
    c.expect(",")
    c.expect("[")
    dims = c.items("]", lambda: _dim(c))
    lists = {}
    while c.accept(","):
        kind, value, at = c.next()
        if value not in ("replicated", "unreduced") or value in lists:
            raise c.error(f"expected 'replicated=' or 'unreduced=', found {_found(kind, value)}",
                          at)
        c.expect("=")
        c.expect("{")
        lists[value] = tuple(c.items("}", lambda: _axis_ref(c)))
    return TensorSharding(mesh, tuple(dims), lists.get("replicated", ()),
                          lists.get("unreduced", ()))


def _sharding_attr(c: _Cursor):
    kind, value, start = c.next()
    if value == "#sdy.sharding":
        c.expect("<")
        sharding = _tensor_sharding(c)
        c.expect(">")
        return Sharding(sharding)
    if value == "#sdy.sharding_per_value":
        c.expect("<")
        c.expect("[")

        def one():
            c.expect("<")
            s = _tensor_sharding(c)
            c.expect(">")
            return s

        shardings = c.items("]", one)
        c.expect(">")
        return ShardingPerValue(tuple(shardings))
    raise c.error(f"expected #sdy.sharding<...> or #sdy.sharding_per_value<[...]>, found "
                  f"{_found(kind, value)}", start)


def _manual_axes(c: _Cursor) -> ManualAxes:
    c.expect("#sdy")
    c.expect("<")
    kind, value, start = c.next()
    if value != "manual_axes":
        raise c.error(f"expected 'manual_axes', found {_found(kind, value)}", start)
    c.expect("{")
    axes = c.items("}", lambda: c.string("an axis name"))
    c.expect(">")
    return ManualAxes(tuple(axes))


def _direction(c: _Cursor) -> PropagationDirection:
    c.expect("#sdy")
    c.expect("<")
    kind, value, start = c.next()
    if value != "propagation_direction":
        raise c.error(f"expected 'propagation_direction', found {_found(kind, value)}", start)
    kind, value, start = c.next()
    if value not in _DIRECTIONS:
        raise c.error(f"expected one of {', '.join(_DIRECTIONS)}, found {_found(kind, value)}",
                      start)
    c.expect(">")
    return PropagationDirection(value)


def _group_id(c: _Cursor) -> ShardingGroupId:
    group = c.integer("a sharding group id")
    if c.accept(":"):
        kind, value, start = c.next()
        if value != "i64":
            raise c.error(f"expected 'i64', found {_found(kind, value)}", start)
    return ShardingGroupId(group)


def _flag(c: _Cursor) -> Flag:
    kind, value, start = c.next()
    if value not in ("true", "false"):
        raise c.error(f"expected true or false, found {_found(kind, value)}", start)
    return Flag(value == "true")


def _rule(c: _Cursor) -> OpShardingRule:
    """`#sdy.op_sharding_rule<([i, j], [k])->([ij]) {i=2, j=4, k=8} reduction={k}, custom>`."""
    c.expect("#sdy.op_sharding_rule")
    c.expect("<")
    names: dict[str, int] = {}
    refs: list[tuple[str, int]] = []

    def dim():
        kind, value, start = c.next()
        if kind != "word" or not re.fullmatch(r"(?:[a-z](?:_\d+)?)+", value):
            raise c.error(f"expected factor names, found {_found(kind, value)}", start)
        factors = re.findall(r"[a-z](?:_\d+)?", value)
        for f in factors:
            refs.append((f, start))
        return tuple(factors)

    def tensors():
        c.expect("(")
        out = []

        def tensor():
            c.expect("[")
            return tuple(c.items("]", dim))

        out = c.items(")", tensor)
        return tuple(out)

    operands = tensors()
    c.expect("->")
    results = tensors()
    c.expect("{")

    def size():
        kind, value, start = c.next()
        if kind != "word":
            raise c.error(f"expected a factor name, found {_found(kind, value)}", start)
        c.expect("=")
        names[value] = len(names)
        return value, c.integer("a factor size")

    sizes = dict(c.items("}", size))
    for f, at in refs:
        if f not in sizes:
            raise c.error(f"factor '{f}' has no size", at)
    kinds = {}
    custom = False
    while c.accept(","):
        kind, value, at = c.next()
        if value == "custom":
            custom = True
            continue
        raise c.error(f"unexpected {_found(kind, value)}", at)
    while c.peek()[1] in ("reduction", "need_replication", "permutation", "blocked_propagation"):
        _, key, _ = c.next()
        c.expect("=")
        c.expect("{")
        kinds[key] = tuple(names[f] for f in c.items("}", lambda: _factor_name(c, sizes)))
        if c.accept(","):
            kind, value, at = c.next()
            if value != "custom":
                raise c.error(f"expected 'custom', found {_found(kind, value)}", at)
            custom = True
    c.expect(">")

    def mapping(tensors_):
        return tuple(tuple(tuple(names[f] for f in d) for d in t) for t in tensors_)

    return OpShardingRule(tuple(sizes.values()), mapping(operands), mapping(results),
                          kinds.get("reduction", ()), kinds.get("need_replication", ()),
                          kinds.get("permutation", ()), kinds.get("blocked_propagation", ()),
                          custom)


def _factor_name(c: _Cursor, sizes: dict) -> str:
    kind, value, start = c.next()
    if value not in sizes:
        raise c.error(f"expected a factor name, found {_found(kind, value)}", start)
    return value


#: instruction-level keys and the grammar of their values
_READERS = {
    SHARDING: _sharding_attr, IN_SHARDINGS: _sharding_attr, OUT_SHARDINGS: _sharding_attr,
    MANUAL_AXES: _manual_axes, SHARDING_GROUP_ID: _group_id, SHARDING_RULE: _rule,
    ALLOWED_DIRECTION: _direction, HAS_UNREDUCED_AXES: _flag,
}
KNOWN_KEYS = frozenset(_READERS) | {MESHES}


def _unquoted(raw: str) -> tuple[str, list[int]]:
    """The value of a quoted raw string with an offset map (unquoted index -> raw offset)."""
    if not raw.startswith('"'):
        return raw, list(range(len(raw) + 1))
    text, where, i = [], [], 1
    while i < len(raw) - 1:
        if raw[i] == "\\" and i + 1 < len(raw) - 1:
            text.append(raw[i + 1])
            where.append(i)
            i += 2
        else:
            text.append(raw[i])
            where.append(i)
            i += 1
    where.append(len(raw) - 1)
    return "".join(text), where


def read_frontend_value(key: str, raw: str):
    """The typed value of the instruction frontend attribute `key` written `raw` in the text;
    SdyTextError for an unknown `xla.sdy.*` key (at the key: a negative offset) or malformed
    text."""
    reader = _READERS.get(key)
    if reader is None:
        if key == MESHES:
            raise SdyTextError(f"{MESHES} belongs in the module header's frontend_attributes", 0)
        raise SdyTextError(f"unknown Shardy attribute '{key}' (known: "
                           f"{', '.join(sorted(KNOWN_KEYS))})", -len(key) - 1)
    text, where = _unquoted(raw)
    c = _Cursor(text, where)
    value = reader(c)
    c.end()
    return value


def _meshes(c: _Cursor) -> Meshes:
    c.expect("{")

    def entry():
        kind, value, start = c.next()
        if kind not in ("word", "str"):
            raise c.error(f"expected a mesh name, found {_found(kind, value)}", start)
        name = value[1:-1] if kind == "str" else value
        c.expect("=")
        return name, _mesh(c, inline=False)

    meshes = c.items("}", entry)
    names = [n for n, _ in meshes]
    if len(set(names)) != len(names):
        raise c.error(f"mesh names repeat in {names}", 0)
    return Meshes(tuple(meshes))


def read_header_value(key: str, raw: str) -> Meshes:
    """The typed value of the module header's frontend attribute `key`: `xla.sdy.meshes`
    (`{name = #sdy.mesh<...>, ...}`); any other `xla.sdy.*` key is an error."""
    if key != MESHES:
        raise SdyTextError(f"unknown Shardy module attribute '{key}' (known: {MESHES})",
                           -len(key) - 1)
    c = _Cursor(raw, list(range(len(raw) + 1)))
    meshes = _meshes(c)
    c.end()
    return meshes


# ---------------------------------------------------------------------------------- printing

def mesh_text(mesh, inline: bool = False) -> str:
    """`#sdy.mesh<["x"=2, "y"=4]>` (`mesh<...>` inline in a sharding)."""
    head = "mesh<" if inline else "#sdy.mesh<"
    if isinstance(mesh, MaximalMesh):
        return head + f"[], device_ids=[{mesh.device}]>"
    axes = ", ".join(f'"{n}"={s}' for n, s in zip(mesh.axis_names, mesh.axis_sizes))
    devices = "" if mesh.device_ids is None else \
        ", device_ids=[" + ", ".join(map(str, mesh.device_ids)) + "]"
    return head + "[" + axes + "]" + devices + ">"


def _factor_names(count: int) -> list[str]:
    letters = "ijklmnopqrstuvwxyz"
    return [letters[k] if k < len(letters) else f"z_{k - len(letters) + 1}" for k in range(count)]


def rule_text(rule: OpShardingRule) -> str:
    names = _factor_names(len(rule.factor_sizes))

    def tensors(mappings):
        return "(" + ", ".join("[" + ", ".join("".join(names[f] for f in d) for d in t) + "]"
                               for t in mappings) + ")"

    text = "#sdy.op_sharding_rule<" + tensors(rule.operands) + "->" + tensors(rule.results)
    text += " {" + ", ".join(f"{names[k]}={s}" for k, s in enumerate(rule.factor_sizes)) + "}"
    for key in ("reduction", "need_replication", "permutation", "blocked_propagation"):
        factors = getattr(rule, key)
        if factors:
            text += f" {key}={{" + ", ".join(names[f] for f in factors) + "}"
    return text + (", custom>" if rule.custom else ">")
