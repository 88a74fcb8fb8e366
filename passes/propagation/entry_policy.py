"""The entry policy after the levels: which propagated shardings the entry root and parameters
keep (XLA's ShardingPropagation, end of its run).

Two steps, in this order:
1. Restore: where a per-output (per-parameter) flag list is given and an element's flag is false,
   the element gets back the sharding it had before propagation (a parameter without one loses
   its sharding).
2. Evenly: where propagation was allowed, a propagated sharding that does not divide every dim
   of its element evenly is replaced by `{replicated}`.

Both steps apply only where the flag list lines up with what it describes, exactly as XLA checks
it: the output list has one flag per root tuple element (a non-tuple root: one flag), the
parameter list one flag per parameter (or one per element of a single tuple parameter). A single
flag given for a tuple root with several elements, or for several parameters, means "allowed"
for propagation but takes no part in these two steps: the propagated shardings stay as they are,
even uneven ones (XLA behaves so when a client passes one flag, as jax does).
"""
from __future__ import annotations

from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import for_shape


def finalize_entry(entry, to_output: tuple[bool, ...], to_parameters: tuple[bool, ...],
                   saved_root: list[HloSharding | None],
                   saved_parameters: dict[int, HloSharding], settle) -> None:
    """Apply the entry policy to computation `entry` in place; `settle(inst, sharding)` sets a
    sharding (None: clears it) and records why. `saved_root` / `saved_parameters`: the root's
    element shardings and the parameters' shardings before propagation."""
    root = entry.root
    params = entry.parameters
    allowed_out, allowed_params = any(to_output), any(to_parameters)
    if allowed_out and root.sharding is not None and len(saved_root) == len(to_output):
        leaves = list(_elements(root))
        for i, saved in enumerate(saved_root):
            if not to_output[i] and saved is not None and i < len(leaves):
                leaves[i] = saved
        settle(root, _rebuild(root, leaves))
    if allowed_params:
        if len(to_parameters) == len(params):
            for p, ok in zip(params, to_parameters):
                if not ok:
                    settle(p, saved_parameters.get(p.parameter_number))
        elif _single_tuple_parameter(params, to_parameters) and len(saved_parameters) == 1 \
                and params[0].sharding is not None:
            p = params[0]
            leaves = list(p.sharding.elements)
            before = for_shape(saved_parameters[0], p.shape).elements
            for i, ok in enumerate(to_parameters):
                if not ok and before[i] is not None:
                    leaves[i] = before[i]
            settle(p, HloSharding.tuple(leaves))
    if allowed_out and root.sharding is not None:
        if isinstance(root.shape, TupleShape) and len(to_output) == len(root.shape.elements):
            leaves = list(root.sharding.elements)
            for i, ok in enumerate(to_output):
                if ok and not _even(root.shape.elements[i], leaves[i]):
                    leaves[i] = HloSharding.replicate()
            settle(root, HloSharding.tuple(leaves))
        elif not isinstance(root.shape, TupleShape) and not _even(root.shape, root.sharding):
            settle(root, HloSharding.replicate())
    if allowed_params:
        if len(to_parameters) == len(params):
            for p, ok in zip(params, to_parameters):
                if ok and p.sharding is not None and not _even(p.shape, p.sharding):
                    settle(p, HloSharding.replicate())
        elif _single_tuple_parameter(params, to_parameters) and params[0].sharding is not None:
            p = params[0]
            leaves = list(p.sharding.elements)
            for i, ok in enumerate(to_parameters):
                if ok and not _even(p.shape.elements[i], leaves[i]):
                    leaves[i] = HloSharding.replicate()
            settle(p, HloSharding.tuple(leaves))


def _single_tuple_parameter(params: list[Instruction], flags: tuple[bool, ...]) -> bool:
    return len(params) == 1 and isinstance(params[0].shape, TupleShape) and \
        len(params[0].shape.elements) == len(flags)


def _elements(inst: Instruction) -> tuple[HloSharding, ...]:
    """The root's sharding as a list of its tuple elements (one for a non-tuple root)."""
    s = inst.sharding
    return tuple(s.elements) if s.is_tuple else (s,)


def _rebuild(inst: Instruction, leaves: list[HloSharding]) -> HloSharding:
    return HloSharding.tuple(leaves) if inst.sharding.is_tuple else leaves[0]


def _even(shape: Shape, s: HloSharding) -> bool:
    """Every tiled dim divides evenly (tuples: every leaf)."""
    if s.is_tuple:
        return all(_even(leaf_shape, leaf) for leaf_shape, leaf in zip(shape.leaves(), s.elements))
    if not s.is_tiled or not isinstance(shape, ArrayShape):
        return True
    return all(d % t == 0 for d, t in zip(shape.dims, s.tile_counts))
