"""Backward rules: the sharding an instruction should have so that one of its users needs no
resharding (docs/design/propagation.md#backward-rules, XLA's GetShardingFromUser). The catalogue's
`BACKWARD_RULES` maps the *user's*
opcode to a rule `(ctx, inst, user) -> candidate or None`; opcodes without an entry (custom-calls
among them) use `default_rule` (the user's sharding when the shapes match). `from_user` applies the checks common to every user (level
participation, the user must be sharded) and dispatches.
"""
from __future__ import annotations

from typing import Callable

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import BACKWARD_RULES
from gspmdc.ir.shapes import TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import (
    find_common_sharding, for_shape, is_more_specific, is_spatially_partitioned,
    merge_if_compatible, partially_replicate_on_dims, propagate_through_reshape, transpose,
)

from .context import Context
from .contraction import convolution_dims, dot_dims, operand_candidate
from .indexing import (
    along, gather_view, indices_from_result, merge_parallel_and_passthrough, operand_from_result,
    result_from_indices, scatter_operand_count, scatter_view,
)
from .opclass import passes_at_level

BackwardRule = Callable[[Context, Instruction, Instruction], "HloSharding | None"]

#: `from_user`'s default for `current`: the instruction's own sharding
_OWN = object()

#: the level at which lookahead reads user shardings (XLA passes INT64_MAX)
_ANY_LEVEL = 1 << 30


def _user_sharding(user: Instruction) -> HloSharding:
    return for_shape(user.sharding, user.shape)


def _operand_leaf(user: Instruction, index: int) -> HloSharding:
    """The user's sharding of output `index` (its whole sharding for array-shaped users)."""
    s = _user_sharding(user)
    return s.subsharding(user.shape, (index,)) if isinstance(user.shape, TupleShape) else s


def shapes_match(a, b) -> bool:
    """Same dims and nesting, ignoring element types and layouts."""
    if isinstance(a, TupleShape) or isinstance(b, TupleShape):
        return isinstance(a, TupleShape) and isinstance(b, TupleShape) and \
            len(a.elements) == len(b.elements) and \
            all(shapes_match(x, y) for x, y in zip(a.elements, b.elements))
    return a.dims == b.dims


@BACKWARD_RULES.register("broadcast")
def _broadcast(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """The user's sharding with broadcast-created dims replicated and removed (non-SPMD: only
    when those dims are not tiled)."""
    s = user.sharding
    if not s.is_tiled:
        return s
    created = [d for d in range(user.shape.rank) if d not in user.attrs["dimensions"]]
    if not ctx.is_spmd and any(s.tile_counts[d] > 1 for d in created):
        return None
    return algebra.remove_dims(algebra.partially_replicate_on_dims(s, created), created)


@BACKWARD_RULES.register("concatenate")
def _concatenate(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """The user's sharding (levels >= 1). Non-SPMD mode with a tiled concat dim gives each operand
    the devices its slice of the result lives on."""
    if ctx.level == 0:
        return None
    s = user.sharding
    dim = user.attrs["dimensions"][0]
    if not s.is_tiled or s.tile_counts[dim] == 1 or ctx.is_spmd:
        return s
    start = 0
    for op in user.operands:
        if op is inst:
            break
        start += op.shape.dims[dim]
    shard = -(-user.shape.dims[dim] // s.tile_counts[dim])
    lo, hi = start // shard, -(-(start + inst.shape.dims[dim]) // shard)
    array = s.tile_assignment.array
    index = [slice(None)] * array.ndim
    index[dim] = slice(lo, hi)
    piece = array[tuple(index)]
    if piece.size == 1:
        return HloSharding.maximal(int(piece.ravel()[0]))
    from gspmdc.ir.tile_assignment import TileAssignment
    return HloSharding.tiled(TileAssignment.from_array(piece), s.subgroup_types)


@BACKWARD_RULES.register("convolution")
def _convolution(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """Only dot-like convolutions (no genuine spatial dims) pass shardings to their operands."""
    dims = ctx.graph.derived("convolution", user, convolution_dims)
    if dims.conv_spatial:
        return None
    return _contraction_operand(user, inst, dims)


@BACKWARD_RULES.register("dot")
def _dot(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return _contraction_operand(user, inst, ctx.graph.derived("dot", user, dot_dims))


def _contraction_operand(user: Instruction, inst: Instruction, dims) -> HloSharding:
    k = user.operands.index(inst)
    other = user.operands[1 - k]
    return operand_candidate(dims, k, user.sharding, other.sharding, inst.shape.rank,
                             other.shape.rank, user.shape.rank)


@BACKWARD_RULES.register("dynamic-slice", "dynamic-update-slice")
def _dynamic_slice(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """Levels >= 1: the base of an update takes the user's sharding; the sliced value takes it with
    the sliced dims replicated; start indices get nothing."""
    if ctx.level == 0:
        return None
    s = user.sharding
    if s.is_replicated:
        return s
    if user.opcode == "dynamic-update-slice" and inst is user.operands[0]:
        return s
    sliced_value = user.operands[1 if user.opcode == "dynamic-update-slice" else 0]
    if inst is not sliced_value:
        return None
    sliced = tuple(d for d in range(user.shape.rank) if user.shape.dims[d] != inst.shape.dims[d])
    return partially_replicate_on_dims(s, sliced)


@BACKWARD_RULES.register("reduce-window")
def _reduce_window(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    inputs = user.operands[:len(user.operands) // 2]
    if inst not in inputs:
        return None
    return _operand_leaf(user, inputs.index(inst))


@BACKWARD_RULES.register("reshape")
def _reshape(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return propagate_through_reshape(user.sharding, user.shape.dims, inst.shape.dims)


@BACKWARD_RULES.register("pad")
def _pad(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return user.sharding if inst is user.operands[0] else None


@BACKWARD_RULES.register("slice")
def _slice(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return user.sharding


@BACKWARD_RULES.register("transpose")
def _transpose(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    dims = user.attrs["dimensions"]
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return transpose(user.sharding, tuple(inverse))


@BACKWARD_RULES.register("reverse")
def _reverse(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return algebra.reverse(user.sharding, user.attrs["dimensions"])


@BACKWARD_RULES.register("tuple")
def _tuple(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """The element sharding at the operand's position (the most specific if it appears twice)."""
    best = None
    for i, op in enumerate(user.operands):
        if op is inst:
            sub = _operand_leaf(user, i)
            if best is None or is_more_specific(sub, best):
                best = sub
    return best


@BACKWARD_RULES.register("get-tuple-element")
def _get_tuple_element(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return tuple_with_element(inst, user, inst.sharding)


def tuple_with_element(inst: Instruction, user: Instruction,
                       current: HloSharding | None) -> HloSharding | None:
    """A tuple sharding for the operand of get-tuple-element `user`: `current` (the operand's
    sharding; None: all data dims replicated, keeping manual subgroups) with the leaves at the
    user's index replaced by the user's sharding."""
    shape = inst.shape
    index = user.attrs["index"]
    start = sum(sum(1 for _ in e.leaves()) for e in shape.elements[:index])
    user_leaves = list(_user_sharding(user).leaves())
    if not user_leaves:
        return None
    if current is not None:
        leaves = list(for_shape(current, shape).elements)
    else:
        leaves = [algebra.replicate_all_data_dims(user_leaves[0], leaf.rank) if user_leaves[0].is_tiled
                  else (user_leaves[0] if user_leaves[0].is_manual else HloSharding.replicate())
                  for leaf in shape.leaves()]
    leaves[start:start + len(user_leaves)] = user_leaves
    return HloSharding.tuple(leaves)


@BACKWARD_RULES.register("reduce")
def _reduce(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """The user's (leaf) sharding with size-1 tile dims re-inserted at the reduced positions,
    merged with the other inputs' shardings where compatible."""
    if inst.shape.rank == 0:
        return None
    inputs = user.operands[:len(user.operands) // 2]
    if inst not in inputs:
        return None
    s = _operand_leaf(user, inputs.index(inst))
    if s.is_tiled:
        dims = user.attrs["dimensions"]
        counts = iter(s.tile_counts)
        tiles = [1 if d in dims else next(counts) for d in range(inst.shape.rank)]
        ta = s.tile_assignment
        s = HloSharding.tiled(ta.reshape(tiles + list(ta.dims[s.data_rank:])), s.subgroup_types)
    for op in inputs:
        if op is not inst and op.sharding is not None and not s.is_manual:
            merged = merge_if_compatible(op.sharding, s)
            if merged is not None:
                s = merged
    return s


@BACKWARD_RULES.register("sort")
def _sort(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    return _operand_leaf(user, user.operands.index(inst))


@BACKWARD_RULES.register("outfeed")
def _outfeed(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """Operand 0 takes the outfeed's sharding for the data (the first part of its tuple)."""
    if inst is not user.operands[0]:
        return None
    s = user.sharding
    if not s.is_tuple:
        return s
    count = sum(1 for _ in inst.shape.leaves())
    leaves = s.elements[:count]
    return HloSharding.tuple(leaves) if isinstance(inst.shape, TupleShape) else leaves[0]


@BACKWARD_RULES.register("gather")
def _gather(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """Indices: result batch dims -> index dims. Operand (SPMD): parallel dims and passthrough
    dims mapped back, merged."""
    view = ctx.graph.derived("gather", user, gather_view)
    operand, indices = user.operands
    s = user.sharding
    if inst is indices:
        return indices_from_result(s, view, indices.shape.rank)
    if not ctx.is_spmd or inst is not operand:
        return None
    if not s.is_tiled:
        return s
    pairs = view.explicit_parallel() + view.implicit_parallel(indices, ctx.graph)
    parallel = None
    if pairs:
        out = [view.result_dim_of_index_dim(i) for _, i in pairs]
        parallel = along(s, out, [o for o, _ in pairs], operand.shape.rank)
    return merge_parallel_and_passthrough(parallel, operand_from_result(s, view))


@BACKWARD_RULES.register("scatter")
def _scatter(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """Operands: the user's (leaf) sharding. Indices: the common sharding implied by the sharded
    updates. Updates: from the output's parallel and passthrough dims (SPMD), merged with the one
    implied by the indices."""
    n = scatter_operand_count(user)
    operands, indices, updates = user.operands[:n], user.operands[n], user.operands[n + 1:]
    view = ctx.graph.derived("scatter", user, scatter_view)
    if inst in operands:
        return _operand_leaf(user, operands.index(inst))
    if inst is indices:
        sharded = [u.sharding for u in updates if is_spatially_partitioned(u.sharding)]
        if not sharded:
            return None
        return find_common_sharding([indices_from_result(u, view, indices.shape.rank)
                                     for u in sharded])
    k = updates.index(inst)
    from_indices = result_from_indices(indices.sharding, view, indices.shape.rank) \
        if is_spatially_partitioned(indices.sharding) else HloSharding.replicate()
    if ctx.is_spmd:
        out = _operand_leaf(user, k)
        from_output = None
        if out.is_tiled:
            pairs = view.explicit_parallel() + view.implicit_parallel(indices, ctx.graph)
            parallel = None
            if pairs:
                parallel = along(out, [o for o, _ in pairs],
                                 [view.result_dim_of_index_dim(i) for _, i in pairs],
                                 view.result_rank)
            from_output = merge_parallel_and_passthrough(parallel, _update_from_output(out, view))
        elif out.is_replicated:
            from_output = out
        if from_output is not None:
            merged = merge_if_compatible(from_indices, from_output) \
                if from_output.is_tiled and from_indices.is_tiled else None
            from_output = merged if merged is not None else from_output
            if not from_output.is_tile_maximal:
                return from_output
    return None if from_indices.is_tile_maximal else from_indices


def _update_from_output(s: HloSharding, view) -> HloSharding | None:
    """Operand passthrough dims -> update window dims; None when nothing passes through."""
    pairs = view.operand_passthrough()
    out = algebra.propagate_along_dims(s, [o for o, _ in pairs], [r for _, r in pairs],
                                   view.result_rank)
    return None if out.is_tile_maximal else out


def default_rule(ctx: Context, inst: Instruction, user: Instruction) -> HloSharding | None:
    """Shape-preserving users (elementwise ops, copies, while loops, ...): the user's sharding."""
    return user.sharding if shapes_match(inst.shape, user.shape) else None


BACKWARD_RULES.set_default(default_rule)


def from_user(ctx: Context, inst: Instruction, user: Instruction,
              current: HloSharding | None | object = _OWN) -> HloSharding | None:
    """XLA's GetShardingFromUser: the sharding `inst` should have for `user`, or None.
    `current`: the sharding `inst` has at this point of its update from its users when that is
    not yet `inst.sharding` (XLA updates the instruction after each user, so a get-tuple-element
    user replaces its element in the tuple sharding the earlier users already improved)."""
    if not passes_at_level(user, ctx.level, ctx.graph) or not is_spatially_partitioned(user.sharding):
        return None
    if user.opcode == "get-tuple-element" and current is not _OWN:
        candidate = tuple_with_element(inst, user, current)
    else:
        candidate = BACKWARD_RULES.lookup(user.opcode)(ctx, inst, user)
    return None if candidate is None else for_shape(candidate, inst.shape)


def lookahead_sharding(ctx: Context, inst: Instruction) -> HloSharding | None:
    """XLA's LookaheadUserSharding: follow a chain of single users to the first sharded one and
    pull its sharding back to `inst` (intermediate instructions are sharded temporarily)."""
    users = ctx.graph.users
    if len(users[inst]) != 1:
        return None
    chain = [inst, users[inst][0]]
    while chain[-1].sharding is None:
        next_users = users[chain[-1]]
        if len(next_users) != 1:
            return None
        chain.append(next_users[0])
    any_level = Context(ctx.graph, ctx.options, _ANY_LEVEL)
    touched: list[Instruction] = []
    sharding = None
    try:
        for i in range(len(chain) - 1, 0, -1):
            sharding = from_user(any_level, chain[i - 1], chain[i])
            if sharding is None or i == 1:
                break
            chain[i - 1].sharding = sharding
            touched.append(chain[i - 1])
    finally:
        for t in touched:
            t.sharding = None
    return sharding


__all__ = ["from_user", "lookahead_sharding"]
