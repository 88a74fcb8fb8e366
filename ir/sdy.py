"""Shardy's sharding attributes as IR values: the `xla.sdy.*` frontend attributes of a JAX dump.

JAX prints a jitted function in *Shardy form*: HLO text whose module carries named meshes and whose
instructions carry Shardy shardings as frontend attributes (next to the equivalent `sharding=`):

    HloModule jit_f, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}
    x = f32[16,64] parameter(0), sharding={...},
        frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}, {}]>"}

A Shardy sharding names mesh axes per tensor dimension, major to minor (`TensorSharding`):

* `{"x", "y"}` closed: the dimension is split along x then y and nothing else may be added;
  `{"x", ?}` open: propagation may split it further; `{}` / `{?}` unsplit, closed / open;
* `"x":(2)4` a sub-axis: the axis x reshaped to `[2, 4, size/8]`, its middle part;
* `p1` after a dimension: its user priority (0 is the first round, 1 the next, ...);
* `replicated={...}` axes that must stay replicated; `unreduced={...}` axes over which each device
  holds a partial sum.

Axes a sharding does not name replicate the tensor. The values here are immutable and printable
back to the exact attribute text (`sdy_text.py` parses and prints them); `sdy_hlo.py` converts a
`TensorSharding` to and from an `HloSharding` over its mesh.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Union

from gspmdc.errors import ShardingError

from . import custom_call_targets as targets
from .mesh import Mesh

#: frontend-attribute keys and custom-call targets of the Shardy round-trip form
MESHES = "xla.sdy.meshes"
SHARDING = "xla.sdy.sharding"
SHARDING_RULE = "xla.sdy.sharding_rule"
IN_SHARDINGS = "xla.sdy.in_shardings"
OUT_SHARDINGS = "xla.sdy.out_shardings"
MANUAL_AXES = "xla.sdy.manual_axes"
SHARDING_GROUP_ID = "xla.sdy.sharding_group_id"
ALLOWED_DIRECTION = "xla.sdy.allowed_direction"
HAS_UNREDUCED_AXES = "xla.sdy.has_unreduced_axes"
#: Shardy's custom-call targets (their strings live in `custom_call_targets.py`)
FUNC_RESULT_SHARDING = targets.SDY_FUNC_RESULT_SHARDING
SHARDING_GROUP = targets.SDY_SHARDING_GROUP
PROPAGATION_BARRIER = targets.SDY_PROPAGATION_BARRIER
GLOBAL_TO_LOCAL = targets.SDY_GLOBAL_TO_LOCAL
LOCAL_TO_GLOBAL = targets.SDY_LOCAL_TO_GLOBAL
MANUAL_BODY_PREFIXES = ("xla.sdy.manual_computation_body",
                        "xla.sdy.inlinable_manual_computation_body")
PREFIX = "xla.sdy."


@dataclass(frozen=True, slots=True)
class MaximalMesh:
    """`#sdy.mesh<[], device_ids=[d]>`: a mesh of one device (Shardy's maximal sharding)."""

    device: int


SdyMesh = Union[Mesh, MaximalMesh]


@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis (`size is None`) or the sub-axis `"name":(pre_size)size`: the axis of size n
    reshaped to `[pre_size, size, n // (pre_size * size)]`, its middle dimension."""

    name: str
    pre_size: int = 1
    size: int | None = None

    def length(self, mesh: Mesh) -> int:
        """How many ways this (sub-)axis splits a dimension."""
        return mesh.axis_size(self.name) if self.size is None else self.size

    def span(self, mesh: Mesh) -> tuple[int, int]:
        """`[lo, hi)` in the axis's own index space measured from its major end in multiples:
        the sub-axis covers pre-sizes lo..hi (full axis: 1..n)."""
        return self.pre_size, self.pre_size * self.length(mesh)

    def text(self) -> str:
        quoted = '"' + self.name + '"'
        return quoted if self.size is None else f"{quoted}:({self.pre_size}){self.size}"


@dataclass(frozen=True, slots=True)
class DimSharding:
    """The axes splitting one tensor dimension, major to minor; `closed` when propagation may not
    add any; `priority` the user priority (None: the default, 0)."""

    axes: tuple[AxisRef, ...] = ()
    closed: bool = True
    priority: int | None = None

    def text(self) -> str:
        items = [a.text() for a in self.axes] + ([] if self.closed else ["?"])
        return "{" + ", ".join(items) + "}" + ("" if self.priority is None else f"p{self.priority}")


@dataclass(frozen=True, slots=True)
class TensorSharding:
    """A Shardy tensor sharding: a mesh (its name in the module's `xla.sdy.meshes`, or the mesh
    itself when written inline), one `DimSharding` per dimension, explicitly replicated and
    unreduced axes."""

    mesh: str | Mesh | MaximalMesh
    dims: tuple[DimSharding, ...]
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()

    def body_text(self) -> str:
        """`@mesh, [{"x"}, {}], replicated={"y"}` (the inside of `<...>`)."""
        from .sdy_text import mesh_text
        mesh = "@" + self.mesh if isinstance(self.mesh, str) else mesh_text(self.mesh, inline=True)
        text = mesh + ", [" + ", ".join(d.text() for d in self.dims) + "]"
        if self.replicated:
            text += ", replicated={" + ", ".join(a.text() for a in self.replicated) + "}"
        if self.unreduced:
            text += ", unreduced={" + ", ".join(a.text() for a in self.unreduced) + "}"
        return text

    def used_axes(self) -> tuple[AxisRef, ...]:
        """Every axis this sharding names: dimension axes, then replicated, then unreduced."""
        return tuple(a for d in self.dims for a in d.axes) + self.replicated + self.unreduced

    def with_dims(self, dims) -> "TensorSharding":
        return TensorSharding(self.mesh, tuple(dims), self.replicated, self.unreduced)

    def is_fully_closed(self) -> bool:
        return all(d.closed for d in self.dims)

    def is_empty(self) -> bool:
        """Nothing split, nothing unreduced (replicated everywhere)."""
        return not any(d.axes for d in self.dims) and not self.unreduced


class SdyAttribute:
    """Base of the typed values a `frontend_attributes` list holds under `xla.sdy.*` keys;
    `kv_text()` is the value as written in the list (quoted, or a bare `{...}` for meshes)."""

    __slots__ = ()

    def text(self) -> str:
        raise NotImplementedError

    def kv_text(self) -> str:
        return '"' + self.text().replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, slots=True)
class Sharding(SdyAttribute):
    """`#sdy.sharding<...>`: the sharding of a single value (parameters carry this form)."""

    sharding: TensorSharding

    def text(self) -> str:
        return "#sdy.sharding<" + self.sharding.body_text() + ">"

    @property
    def shardings(self) -> tuple[TensorSharding, ...]:
        return (self.sharding,)


@dataclass(frozen=True, slots=True)
class ShardingPerValue(SdyAttribute):
    """`#sdy.sharding_per_value<[<...>, ...]>`: one sharding per array leaf of the value."""

    shardings: tuple[TensorSharding, ...]

    def text(self) -> str:
        return "#sdy.sharding_per_value<[" + \
            ", ".join("<" + s.body_text() + ">" for s in self.shardings) + "]>"


@dataclass(frozen=True, slots=True)
class ManualAxes(SdyAttribute):
    """`#sdy<manual_axes{"x", "y"}>`: the axes a manual computation (shard_map) is manual over."""

    axes: tuple[str, ...]

    def text(self) -> str:
        return "#sdy<manual_axes{" + ", ".join(f'"{a}"' for a in self.axes) + "}>"


@dataclass(frozen=True, slots=True)
class ShardingGroupId(SdyAttribute):
    """`"0 : i64"`: the sharding group a `xla.sdy.ShardingGroup` custom-call puts its operand in."""

    group: int

    def text(self) -> str:
        return f"{self.group} : i64"


@dataclass(frozen=True, slots=True)
class PropagationDirection(SdyAttribute):
    """`#sdy<propagation_direction FORWARD>`: the direction a propagation barrier lets through."""

    direction: str      # NONE, FORWARD, BACKWARD or BOTH

    def text(self) -> str:
        return f"#sdy<propagation_direction {self.direction}>"


@dataclass(frozen=True, slots=True)
class Flag(SdyAttribute):
    """A boolean attribute written `"true"` (`xla.sdy.has_unreduced_axes`)."""

    value: bool

    def text(self) -> str:
        return "true" if self.value else "false"


@dataclass(frozen=True, slots=True)
class OpShardingRule(SdyAttribute):
    """`#sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}>`: an
    operation's factors. Each mapping lists, per tensor dimension, the factor indices it is made
    of (major to minor); factor kinds are index tuples; `custom` marks a user-written rule."""

    factor_sizes: tuple[int, ...]
    operands: tuple[tuple[tuple[int, ...], ...], ...]
    results: tuple[tuple[tuple[int, ...], ...], ...]
    reduction: tuple[int, ...] = ()
    need_replication: tuple[int, ...] = ()
    permutation: tuple[int, ...] = ()
    blocked_propagation: tuple[int, ...] = ()
    custom: bool = False

    def text(self) -> str:
        from .sdy_text import rule_text
        return rule_text(self)


@dataclass(frozen=True, slots=True)
class Meshes(SdyAttribute):
    """The module's `xla.sdy.meshes={mesh = #sdy.mesh<...>, ...}`: named meshes in order."""

    meshes: tuple[tuple[str, SdyMesh], ...]

    def text(self) -> str:
        from .sdy_text import mesh_text
        return "{" + ", ".join(f"{_mesh_key(n)} = {mesh_text(m)}" for n, m in self.meshes) + "}"

    def kv_text(self) -> str:
        return self.text()

    def get(self, name: str) -> SdyMesh | None:
        return dict(self.meshes).get(name)


def _mesh_key(name: str) -> str:
    return name if name.replace("_", "a").isalnum() and not name[0].isdigit() else f'"{name}"'


def resolve_mesh(sharding: TensorSharding, meshes: Meshes | None) -> SdyMesh:
    """The mesh a sharding refers to (ShardingError when the name is not declared)."""
    if not isinstance(sharding.mesh, str):
        return sharding.mesh
    mesh = meshes.get(sharding.mesh) if meshes is not None else None
    if mesh is None:
        known = [n for n, _ in meshes.meshes] if meshes is not None else []
        raise ShardingError(f"unknown mesh @{sharding.mesh} (the module declares {known or 'none'}"
                            f" in {MESHES})")
    return mesh


def validate(sharding: TensorSharding, mesh: SdyMesh, rank: int) -> None:
    """Check a sharding against its mesh and the tensor rank: known axes, sub-axes that divide
    their axis (and are smaller than it), no axis used twice or overlapping another."""
    if len(sharding.dims) != rank:
        raise ShardingError(f"sharding {sharding.body_text()} has {len(sharding.dims)} dimensions "
                            f"for a rank-{rank} value")
    if isinstance(mesh, MaximalMesh):
        if sharding.used_axes():
            raise ShardingError(f"sharding {sharding.body_text()} names axes of a maximal mesh")
        return
    seen: list[AxisRef] = []
    for axis in sharding.used_axes():
        if axis.name not in mesh.axis_names:
            raise ShardingError(f"unknown axis \"{axis.name}\" in {sharding.body_text()} (mesh "
                                f"axes {list(mesh.axis_names)})")
        n = mesh.axis_size(axis.name)
        if axis.size is not None:
            if axis.size < 1 or axis.pre_size < 1 or n % (axis.pre_size * axis.size) or \
                    axis.size == n:
                raise ShardingError(f"sub-axis {axis.text()} does not divide axis "
                                    f"\"{axis.name}\" of size {n} (or is the whole axis)")
        for other in seen:
            if overlaps(axis, other, mesh):
                raise ShardingError(f"axis {axis.text()} is used twice (or overlaps "
                                    f"{other.text()}) in {sharding.body_text()}")
        seen.append(axis)


def overlaps(a: AxisRef, b: AxisRef, mesh: Mesh) -> bool:
    """Whether two (sub-)axes share devices along the same mesh axis."""
    if a.name != b.name:
        return False
    (alo, ahi), (blo, bhi) = a.span(mesh), b.span(mesh)
    return alo < bhi and blo < ahi


def sharded_size(axes, mesh: Mesh) -> int:
    """The number of pieces a list of (sub-)axes cuts a dimension into."""
    return prod(a.length(mesh) for a in axes)


def frontend(inst) -> dict:
    """The `xla.sdy.*` items of an instruction's frontend attributes (empty when none)."""
    kv = inst.attrs.get("frontend_attributes")
    if kv is None:
        return {}
    return {k: v for k, v in kv.items if k.startswith(PREFIX)}


def module_meshes(module) -> Meshes | None:
    """The module's `xla.sdy.meshes`, or None for a module not in Shardy form."""
    kv = module.attrs.get("frontend_attributes")
    if kv is None or not hasattr(kv, "get"):
        return None
    meshes = kv.get(MESHES)
    return meshes if isinstance(meshes, Meshes) else None


def instruction_shardings(inst) -> tuple[TensorSharding, ...] | None:
    """The Shardy shardings of an instruction's array leaves (`xla.sdy.sharding`), or None."""
    value = frontend(inst).get(SHARDING)
    return None if value is None else value.shardings


__all__ = [
    "MaximalMesh", "AxisRef", "DimSharding", "TensorSharding", "SdyAttribute", "Sharding",
    "ShardingPerValue", "ManualAxes", "ShardingGroupId", "PropagationDirection", "Flag",
    "OpShardingRule", "Meshes", "resolve_mesh", "validate", "overlaps", "sharded_size", "frontend",
    "module_meshes", "instruction_shardings",
]
