"""The two strategies that decide, for one op, which axes each factor gets.

**Basic.** For every factor, the *compatible major axes*: the longest axis list that every tensor
mapping the factor either already has, has a prefix of and is open to extend, or does not map
(operands first; in a one-way direction the other side may only confirm, not extend). It is then
cut before the first axis that conflicts: explicitly replicated or unreduced in a tensor of the
factor, already used by another factor of any tensor, or not fitting: a tensor that would have to
grow must have the factor open, without overflow, and either minor-most in its dimension or
divisible by the axes so far. Every tensor whose factor axes are a strict prefix of the result is
extended to it.

**Aggressive.** The compatible major axes per factor are computed without cutting for conflicts
across factors; factors are then ordered (the one whose source tensor is the largest first; for
elementwise ops the most sharded; then the source tensor's index, then the factor's) and each
tensor takes them in that order, cutting each against what that tensor holds at that moment: so
where two factors want the same axis the preferred one gets it instead of neither. Operands of
elementwise ops only take axes a result already has.

`propagate(operands, results, rule, direction, mesh, strategy, elementwise)` updates the factor
shardings in place and returns which operands and results changed.
"""
from __future__ import annotations

from typing import Callable

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sdy import AxisRef, OpShardingRule

from .axes import (
    axis, contains, length, prefix_of, prefix_without_overlaps, total_length,
)
from .projection import TensorFactors, is_prefix, is_strict_prefix

__all__ = ["propagate", "BOTH", "FORWARD", "BACKWARD", "NONE", "union", "intersection"]

NONE, FORWARD, BACKWARD, BOTH = "none", "forward", "backward", "both"


def union(a: str, b: str) -> str:
    if a == b or b == NONE:
        return a
    if a == NONE:
        return b
    return BOTH


def intersection(a: str, b: str) -> str:
    if a == b or b == BOTH:
        return a
    if a == BOTH:
        return b
    return NONE


def _merge_axes(old: list[AxisRef], new, can_expand: bool, mesh: Mesh):
    """The compatible major axes of two lists, and whether more may still be appended."""
    result: list[AxisRef] = []
    i = 0
    while i < len(old) and i < len(new):
        a, b = old[i], new[i]
        i += 1
        if a.name != b.name:
            return result, False
        if a == b:
            result.append(b)
            continue
        if prefix_of(b, a, mesh):
            result.append(b)
            if i < len(new):
                return result, False
            result.append(a) if False else None
            result[-1] = a
        elif prefix_of(a, b, mesh):
            if not can_expand or i < len(old):
                result.append(a)
                return result, False
            result.append(b)
        else:
            return result, False
    result += old[i:]
    if can_expand:
        result += new[i:]
    return result, can_expand


def compatible_major_axes(operands, results, factor: int, direction: str, mesh: Mesh):
    """The longest axis list compatible with every tensor's sharding of `factor` (ignoring
    conflicts); only the expanding side of a one-way direction may extend it."""
    if direction == NONE:
        return []
    first, second = (results, operands) if direction == BACKWARD else (operands, results)
    axes: list[AxisRef] = []
    can_expand = True
    for tensor in first:
        fs = tensor.factors.get(factor)
        if fs is not None:
            axes, can_expand = _merge_axes(axes, fs.axes, can_expand, mesh)
    if direction != BOTH:
        can_expand = False
    for tensor in second:
        fs = tensor.factors.get(factor)
        if fs is not None:
            axes, can_expand = _merge_axes(axes, fs.axes, can_expand, mesh)
    return axes


def _fits_across_factors(a: AxisRef, tensor: TensorFactors, factor: int, mesh: Mesh):
    """The longest prefix of `a` that no other factor of `tensor` uses (axes or overflow)."""
    for other, fs in tensor.factors.items():
        if other != factor:
            a = prefix_without_overlaps(a, fs.overflow, mesh)
            if a is None:
                return None
            a = prefix_without_overlaps(a, fs.axes, mesh)
            if a is None:
                return None
    return a


def _fits_within_factor(a: AxisRef, tensor: TensorFactors, factor: int, sharded: int,
                        size: int, mesh: Mesh):
    """The longest prefix of `a` that this tensor's sharding of `factor` can hold: not replicated
    nor unreduced, and either already there or addable (open, no overflow, and minor-most or
    divisible)."""
    fs = tensor.factors[factor]
    a = prefix_without_overlaps(a, tensor.replicated, mesh)
    if a is None:
        return None
    a = prefix_without_overlaps(a, tensor.unreduced, mesh)
    if a is None:
        return None
    if any(contains(have, a, mesh) for have in fs.axes):
        return a
    if not fs.closed and not fs.overflow:
        if fs.minor_most:
            return a
        if size % sharded == 0:
            n = length(a, mesh)
            g = _gcd(size // sharded, n)
            if g == n:
                return a
            if g != 1:
                return axis(a.name, a.pre_size, g, mesh)
    if fs.axes and prefix_of(fs.axes[-1], a, mesh):
        return fs.axes[-1]
    return None


def _truncate(axes: list[AxisRef], fit: Callable, mesh: Mesh, conservative: bool) -> list:
    """Keep axes while `fit(axis, sharded_so_far)` keeps them whole; stop at the first it cuts
    (keeping the cut prefix) or drops."""
    sharded = 1
    for k, a in enumerate(axes):
        new = fit(a, sharded)
        if new is None or (conservative and new.size is not None):
            return axes[:k]
        if new != a:
            return axes[:k] + [new]
        sharded *= length(new, mesh)
    return list(axes)


def _basic(operands, results, rule, direction_of, mesh, conservative):
    changed_operands = [False] * len(operands)
    changed_results = [False] * len(results)
    tensors = operands + results
    for factor, size in enumerate(rule.factor_sizes):
        axes = compatible_major_axes(operands, results, factor, direction_of(factor), mesh)

        def fit(a, sharded, factor=factor, size=size):
            for tensor in tensors:
                a = _fits_across_factors(a, tensor, factor, mesh)
                if a is None:
                    return None
                if factor in tensor.factors:
                    a = _fits_within_factor(a, tensor, factor, sharded, size, mesh)
                    if a is None:
                        return None
            return a

        axes = _truncate(axes, fit, mesh, conservative)
        for k, tensor in enumerate(operands):
            changed_operands[k] |= tensor.expand(factor, axes, mesh)
        for k, tensor in enumerate(results):
            changed_results[k] |= tensor.expand(factor, axes, mesh)
    return changed_operands, changed_results


def _aggressive(operands, results, rule, direction_of, mesh, conservative, elementwise):
    n_factors = len(rule.factor_sizes)
    per_factor = [compatible_major_axes(operands, results, f, direction_of(f), mesh)
                  for f in range(n_factors)]
    changed_operands = [False] * len(operands)
    changed_results = [False] * len(results)
    if not any(per_factor):
        return changed_operands, changed_results
    tensors = operands + results
    source = [(-1, -1)] * n_factors        # (tensor size, tensor index) of each factor's source
    for index, tensor in enumerate(tensors):
        tensor_size = 1
        for f in tensor.factors:
            tensor_size *= rule.factor_sizes[f]
        for f, fs in tensor.factors.items():
            if per_factor[f] and is_prefix(per_factor[f], fs.axes, mesh) != "no" and \
                    tensor_size > source[f][0]:
                source[f] = (tensor_size, index)

    def key(f):
        sharding = total_length(per_factor[f], mesh) if elementwise else 0
        return (-source[f][0], -sharding, source[f][1], f)

    order = sorted(range(n_factors), key=key)

    def new_axes(tensor, f):
        fs = tensor.factors.get(f)
        if fs is None:
            return []
        size = rule.factor_sizes[f]
        axes = _truncate(list(per_factor[f]),
                         lambda a, sharded: _fits_within_factor(a, tensor, f, sharded, size,
                                                                mesh), mesh, conservative)
        if not is_strict_prefix(fs.axes, axes, mesh):
            return []
        return _truncate(axes, lambda a, sharded: _fits_across_factors(a, tensor, f, mesh),
                         mesh, conservative)

    for k, tensor in enumerate(results):
        for f in order:
            axes = new_axes(tensor, f)
            if axes:
                changed_results[k] |= tensor.expand(f, axes, mesh)
    for k, tensor in enumerate(operands):
        for f in order:
            axes = new_axes(tensor, f)
            if not axes:
                continue
            if elementwise:
                for result in results:
                    fs = result.factors.get(f)
                    if fs is not None and is_strict_prefix(fs.axes, axes, mesh):
                        axes = list(fs.axes)
            changed_operands[k] |= tensor.expand(f, axes, mesh)
    return changed_operands, changed_results


def propagate(operands: list[TensorFactors], results: list[TensorFactors], rule: OpShardingRule,
              direction_of: Callable[[int], str], mesh: Mesh, strategy: str,
              elementwise: bool = False, conservative: bool = False):
    """Update the factor shardings of one op by `strategy` ('basic' or 'aggressive');
    `direction_of(factor)` says which way each factor may propagate. Returns (changed operand
    flags, changed result flags)."""
    blocked = set(rule.blocked_propagation)

    def direction(f):
        return NONE if f in blocked else direction_of(f)

    if strategy == "basic":
        return _basic(operands, results, rule, direction, mesh, conservative)
    return _aggressive(operands, results, rule, direction, mesh, conservative, elementwise)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
