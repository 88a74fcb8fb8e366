"""Projecting dimension shardings onto an op's factors and back.

Propagation through an op works on *factor shardings*: for every operand and result, the axes
sharding each factor of the op's rule. Projecting a dimension `(i j)` of sizes `i=2, j=4` sharded
`{"x", "y"}` over mesh `x=4, y=2` gives factor i the sub-axis `"x":(1)2` and factor j `"x":(2)2,
"y"`: axes are handed to the factors major to minor, an axis split where a factor is full. Axes
that do not fit a non-minor-most factor (a size not dividing it) are kept as *overflow* and block
that factor. Projecting back concatenates the factors' axes per dimension (merging sub-axes that
meet at a factor boundary) up to the first factor not fully sharded (the rest would need a strided
view).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sdy import AxisRef, DimSharding, TensorSharding

from .axes import add_or_merge, axis, length, prefix_of

__all__ = ["FactorSharding", "TensorFactors", "project", "project_back", "is_strict_prefix",
           "is_prefix"]


@dataclass
class FactorSharding:
    """The axes sharding one factor of one tensor; `closed` when they may not grow."""

    axes: list[AxisRef] = field(default_factory=list)
    closed: bool = False
    minor_most: bool = False
    overflow: list[AxisRef] = field(default_factory=list)


@dataclass
class TensorFactors:
    """One operand's or result's factor shardings (by factor index), replicated and unreduced
    axes."""

    factors: dict[int, FactorSharding]
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()

    def expand(self, factor: int, axes: list[AxisRef], mesh: Mesh) -> bool:
        """Grow the factor's axes to `axes` when the current ones are a strict prefix of them."""
        sharding = self.factors.get(factor)
        if sharding is None or not is_strict_prefix(sharding.axes, axes, mesh):
            return False
        sharding.axes = list(axes)
        return True


def is_prefix(first, second, mesh: Mesh) -> str:
    """'equal', 'strict' (first is a strict prefix of second) or 'no'."""
    if not first:
        return "equal" if not second else "strict"
    if len(first) > len(second):
        return "no"
    if any(a != b for a, b in zip(first[:-1], second)):
        return "no"
    if len(first) == len(second) and first[-1] == second[-1]:
        return "equal"
    return "strict" if prefix_of(first[-1], second[len(first) - 1], mesh) else "no"


def is_strict_prefix(first, second, mesh: Mesh) -> bool:
    return is_prefix(first, second, mesh) == "strict"


def _pieces(axes, mesh: Mesh) -> list[list]:
    """Mutable [name, pre-size, size] of each axis, to split as factors consume them."""
    return [[a.name, a.pre_size, length(a, mesh)] for a in axes]


def project(sharding: TensorSharding | None, mapping, sizes, mesh: Mesh,
            closed_if_missing: bool = False) -> TensorFactors:
    """The factor shardings of one tensor whose dimensions are made of the factors in `mapping`
    (per dimension, factor indices major to minor); no sharding is an open empty one (closed
    with `closed_if_missing`)."""
    factors: dict[int, FactorSharding] = {}
    for dim, dim_factors in enumerate(mapping):
        dim_sharding = sharding.dims[dim] if sharding is not None else None
        closed = dim_sharding.closed if dim_sharding is not None else closed_if_missing
        pieces = _pieces(dim_sharding.axes if dim_sharding is not None else (), mesh)
        overflowed = False
        for k, f in enumerate(dim_factors):
            fs = factors.setdefault(f, FactorSharding())
            fs.minor_most = k == len(dim_factors) - 1
            if overflowed:
                fs.closed = True
                break
            fs.closed = closed
            remaining = sizes[f]
            if fs.minor_most:
                for name, pre, size in pieces:
                    add_or_merge(fs.axes, axis(name, pre, size, mesh), mesh)
                break
            while pieces:
                name, pre, size = pieces[0]
                g = _gcd(remaining, size)
                if size != 1 and g == 1:
                    break
                if size > g:
                    fs.axes.append(axis(name, pre, g, mesh))
                    pieces[0] = [name, pre * g, size // g]
                    remaining //= g
                else:
                    fs.axes.append(axis(name, pre, size, mesh))
                    remaining //= size
                    pieces.pop(0)
            if remaining > 1 and pieces:
                overflowed = True
                for name, pre, size in pieces:
                    add_or_merge(fs.overflow, axis(name, pre, size, mesh), mesh)
                pieces = []
    if sharding is None:
        return TensorFactors(factors)
    return TensorFactors(factors, sharding.replicated, sharding.unreduced)


def project_back(tensor: TensorFactors, mapping, sizes, mesh_name: str,
                 mesh: Mesh) -> TensorSharding:
    """The tensor sharding the factor shardings give (a dimension stops at its first factor
    that is not fully sharded; it is closed if any of its factors is)."""
    dims = []
    for dim_factors in mapping:
        closed = False
        axes: list[AxisRef] = []
        for f in dim_factors:
            fs = tensor.factors[f]
            closed |= fs.closed
            sharded = 1
            for k, a in enumerate(fs.axes):
                sharded *= length(a, mesh)
                if k == 0:
                    add_or_merge(axes, a, mesh)
                else:
                    axes.append(a)
            if fs.overflow:
                for k, a in enumerate(fs.overflow):
                    if k == 0:
                        add_or_merge(axes, a, mesh)
                    else:
                        axes.append(a)
                break
            if sharded < sizes[f]:
                break
        dims.append(DimSharding(tuple(axes), closed))
    return TensorSharding(mesh_name, tuple(dims), tuple(tensor.replicated),
                         tuple(tensor.unreduced))


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
