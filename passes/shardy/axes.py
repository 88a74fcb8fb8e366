"""The algebra of mesh (sub-)axes that Shardy's propagation needs.

An axis reference covers the pre-sizes `[pre, next)` of its mesh axis (`next = pre * size`): the
full axis `"x"` of size 8 covers `[1, 8)`, `"x":(2)2` covers `[2, 4)`. Two references *overlap*
when these ranges intersect, one *contains* the other when its range includes the other's, and
one is a *prefix* of another when it contains nothing more major (same `pre`, smaller or equal
`next`). Sub-axes that cut an axis at pre-sizes that do not divide each other cannot *coexist*
(they would not describe one reshaping of the axis).
"""
from __future__ import annotations

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sdy import AxisRef

__all__ = [
    "axis", "length", "next_pre", "contains", "prefix_of", "overlaps", "can_coexist",
    "prefix_without_overlap", "prefix_without_overlaps", "can_merge", "add_or_merge",
    "total_length",
]


def axis(name: str, pre: int, size: int, mesh: Mesh) -> AxisRef:
    """The reference to the `size`-long piece of axis `name` after `pre`: the full axis when it
    covers all of it."""
    if pre == 1 and size == mesh.axis_size(name):
        return AxisRef(name)
    return AxisRef(name, pre, size)


def length(a: AxisRef, mesh: Mesh) -> int:
    return mesh.axis_size(a.name) if a.size is None else a.size


def next_pre(a: AxisRef, mesh: Mesh) -> int:
    return a.pre_size * length(a, mesh)


def total_length(axes, mesh: Mesh) -> int:
    result = 1
    for a in axes:
        result *= length(a, mesh)
    return result


def contains(a: AxisRef, b: AxisRef, mesh: Mesh) -> bool:
    return a.name == b.name and a.pre_size <= b.pre_size and next_pre(a, mesh) >= next_pre(b, mesh)


def prefix_of(a: AxisRef, b: AxisRef, mesh: Mesh) -> bool:
    """`a` is `b` or its major part."""
    return contains(b, a, mesh) and a.pre_size == b.pre_size


def overlaps(a: AxisRef, b: AxisRef, mesh: Mesh) -> bool:
    return a.name == b.name and a.pre_size < next_pre(b, mesh) and b.pre_size < next_pre(a, mesh)


def can_coexist(a: AxisRef, b: AxisRef, mesh: Mesh) -> bool:
    """Whether one reshaping of the axis has both `a` and `b` as (unions of) sub-axes."""
    if a.name != b.name:
        return True
    lo, hi = sorted((a.pre_size, b.pre_size))
    nlo, nhi = sorted((next_pre(a, mesh), next_pre(b, mesh)))
    if nlo > hi:
        return nlo % hi == 0 and hi % lo == 0 and nhi % nlo == 0
    return hi % nlo == 0


def prefix_without_overlap(a: AxisRef, b: AxisRef, mesh: Mesh) -> AxisRef | None:
    """The longest prefix of `a` not overlapping `b` (None when there is none, or when the two
    cannot coexist)."""
    if not can_coexist(a, b, mesh):
        return None
    if not overlaps(a, b, mesh):
        return a
    if a.pre_size >= b.pre_size:
        return None
    return axis(a.name, a.pre_size, b.pre_size // a.pre_size, mesh)


def prefix_without_overlaps(a: AxisRef, others, mesh: Mesh) -> AxisRef | None:
    result = a
    for other in others:
        result = prefix_without_overlap(result, other, mesh)
        if result is None:
            return None
    return result


def can_merge(a: AxisRef, b: AxisRef, mesh: Mesh) -> bool:
    """`b` continues sub-axis `a` (both proper sub-axes)."""
    return a.name == b.name and a.size is not None and b.size is not None and \
        next_pre(a, mesh) == b.pre_size


def add_or_merge(axes: list[AxisRef], a: AxisRef, mesh: Mesh) -> None:
    """Append `a`, merged into the last axis when it continues it."""
    if axes and can_merge(axes[-1], a, mesh):
        last = axes[-1]
        axes[-1] = axis(last.name, last.pre_size, last.size * a.size, mesh)
    else:
        axes.append(a)
