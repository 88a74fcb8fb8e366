"""Forward rules: the sharding an instruction takes from its operands
(docs/design/propagation.md#forward-rules, XLA's
InferShardingFromOperands). The catalogue's `FORWARD_RULES` maps an opcode to its rule; opcodes
without an entry use `default_rule` (elementwise merging, else the representative operand). The driver has already
applied the checks common to every opcode (level participation, manual flow, whether the
instruction may be sharded at all) before a rule runs.

A rule returns a `Proposal` (the instruction's new sharding) or None.
"""
from __future__ import annotations

from typing import Callable

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.annotation_shape import result_sharding
from gspmdc.ir.custom_call_targets import BARRIER_FROM, BARRIER_TO, target_of
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import FORWARD_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import (
    for_shape, is_more_specific, is_spatially_partitioned, is_subtiling_or_equal, merge_sharding,
    partially_replicate_on_dims, propagate_through_reshape, single_tuple, transpose,
)

from .backward_rules import lookahead_sharding, shapes_match
from .context import Accumulator, Context, Proposal
from .contraction import (
    ContractionDims, conv_spatial_partitions, convolution_dims, dot_dims, is_kernel_small,
    lhs_aligned_output, output_candidate,
)
from .improve import improved_sharding
from .indexing import (
    IndexedOp, along, gather_view, operand_from_result, result_from_indices, result_from_operand,
    scatter_operand_count, scatter_view,
)
from .opclass import is_elementwise, representative_operand

ForwardRule = Callable[[Context, Instruction], "Proposal | None"]


def _partitioned(inst: Instruction) -> bool:
    return is_spatially_partitioned(inst.sharding)


def _follow(ctx: Context, inst: Instruction, source: Instruction, candidate: HloSharding,
            rule: str, aggressive: bool | None = None) -> Proposal | None:
    """Improve `inst` with one candidate coming from `source`."""
    acc = ctx.accumulate(inst)
    acc.improve(candidate, source,
                aggressive=ctx.single_consumer(inst) if aggressive is None else aggressive)
    return acc.result(rule)


# ---- structural ----------------------------------------------------------------------------

@FORWARD_RULES.register("get-tuple-element")
def _get_tuple_element(ctx: Context, inst: Instruction) -> Proposal | None:
    """The operand's sub-sharding at the index (a manual one is taken as is)."""
    op = inst.operands[0]
    if not _partitioned(op):
        return None
    sub = for_shape(op.sharding, op.shape).subsharding(op.shape, (inst.attrs["index"],))
    if sub.is_manual:
        acc = ctx.accumulate(inst)
        acc.set(sub, op)
        return acc.result("get-tuple-element")
    return _follow(ctx, inst, op, sub, "get-tuple-element")


@FORWARD_RULES.register("tuple")
def _tuple(ctx: Context, inst: Instruction) -> Proposal | None:
    """Leaf-wise: a leaf takes its operand's sharding when the tuple had none yet or when the
    operand's is more specific."""
    if not any(_partitioned(op) for op in inst.operands):
        return None
    had = inst.sharding is not None
    leaves = list(inst.sharding.elements) if had else \
        [HloSharding.replicate()] * sum(1 for _ in inst.shape.leaves())
    sources: list[Instruction] = []
    start = 0
    for op in inst.operands:
        op_sharding = result_sharding(op)
        op_leaves = list(for_shape(op_sharding, op.shape).leaves()) if op_sharding is not None else []
        for j, leaf in enumerate(op_leaves):
            if not had or is_more_specific(leaf, leaves[start + j]):
                leaves[start + j] = leaf
                if op not in sources:
                    sources.append(op)
        start += sum(1 for _ in op.shape.leaves())
    new = HloSharding.tuple(leaves)
    if had and new == inst.sharding:
        return None
    return Proposal(new, "tuple", tuple(sources))


@FORWARD_RULES.register("while")
def _while(ctx: Context, inst: Instruction) -> Proposal | None:
    """The loop operand's sharding merged into the loop's current one (a candidate that reads
    the loop's own sharding: never settled)."""
    op = inst.operands[0]
    if op.sharding is None:
        return None
    candidate = for_shape(op.sharding, op.shape)
    if inst.sharding is not None:
        _, candidate = merge_sharding(inst.sharding, candidate, ctx.may_combine)
    acc = ctx.accumulate(inst)
    acc.improve(candidate, op)
    return acc.result("while", settled=False)


@FORWARD_RULES.register("parameter")
def _parameter(ctx: Context, inst: Instruction) -> Proposal | None:
    """A branch or callee parameter follows the caller's corresponding operand."""
    comp = ctx.graph.computation_of[inst]
    caller = ctx.graph.caller.get(comp.name)
    if caller is None:
        return None
    if caller.opcode == "conditional":
        operand = caller.operands[caller.branch_computation_names().index(comp.name) + 1]
    elif caller.opcode == "call":
        operand = caller.operands[inst.parameter_number]
    else:
        return None
    if operand.sharding is None:
        return None
    acc = ctx.accumulate(inst)
    acc.improve(operand.sharding, operand)
    return acc.result("caller operand")


@FORWARD_RULES.register("custom-call")
def _custom_call(ctx: Context, inst: Instruction) -> Proposal | None:
    """Shard barriers: a barrier-from takes nothing from its operand, a barrier-to everything;
    pass-through calls follow operand 0."""
    name = target_of(inst)
    if name == BARRIER_FROM:
        return None
    op = inst.operands[0] if name == BARRIER_TO else representative_operand(inst)
    if op is None or not _partitioned(op):
        return None
    return _follow(ctx, inst, op, op.sharding, name or "custom-call")


# ---- layout-changing ops -------------------------------------------------------------------

@FORWARD_RULES.register("transpose")
def _transpose(ctx: Context, inst: Instruction) -> Proposal | None:
    op = inst.operands[0]
    if not _partitioned(op):
        return None
    return _follow(ctx, inst, op, transpose(op.sharding, tuple(inst.attrs["dimensions"])),
                   "transpose")


@FORWARD_RULES.register("reshape")
def _reshape(ctx: Context, inst: Instruction) -> Proposal | None:
    op = inst.operands[0]
    if not _partitioned(op):
        return None
    candidate = propagate_through_reshape(op.sharding, op.shape.dims, inst.shape.dims)
    return _follow(ctx, inst, op, candidate, "reshape")


@FORWARD_RULES.register("reverse")
def _reverse(ctx: Context, inst: Instruction) -> Proposal | None:
    op = inst.operands[0]
    if not _partitioned(op):
        return None
    return _follow(ctx, inst, op, algebra.reverse(op.sharding, inst.attrs["dimensions"]), "reverse")


@FORWARD_RULES.register("broadcast")
def _broadcast(ctx: Context, inst: Instruction) -> Proposal | None:
    """Level 3 only: operand dim k's tiles go to output dim `dimensions[k]`, new dims get 1."""
    op = inst.operands[0]
    s = op.sharding
    if ctx.level < 3 or not _partitioned(op) or not s.is_tiled:
        return None
    counts = [1] * inst.shape.rank
    for k, d in enumerate(inst.attrs["dimensions"]):
        counts[d] = s.tile_counts[k]
    ta = s.tile_assignment
    candidate = HloSharding.tiled(ta.reshape(counts + list(ta.dims[s.data_rank:])), s.subgroup_types)
    return _follow(ctx, inst, op, candidate, "broadcast")


@FORWARD_RULES.register("reduce")
def _reduce(ctx: Context, inst: Instruction) -> Proposal | None:
    """Per input: manual stays manual, replicated stays replicated, otherwise the reduced dims are
    replicated and removed (non-SPMD: reducing a sharded dim gives replicated). Every output of a
    variadic reduce gets the same sharding."""
    inputs = inst.operands[:len(inst.operands) // 2]
    dims = inst.attrs["dimensions"]
    acc = ctx.accumulate(inst)
    aggressive = ctx.single_consumer(inst)
    replicated = single_tuple(HloSharding.replicate(), inst.shape)
    for k, op in enumerate(inputs):
        s = op.sharding
        if not is_spatially_partitioned(s):
            continue
        if s.is_manual:
            acc.improve_leaf(k, s, op)
        elif s.is_replicated or (not ctx.is_spmd and any(s.tile_counts[d] > 1 for d in dims)):
            acc.improve(replicated, op, aggressive=aggressive)
        else:
            kept = partially_replicate_on_dims(s, tuple(dims))
            candidate = replicated if kept.is_replicated else \
                single_tuple(algebra.remove_dims(kept, dims), inst.shape)
            acc.improve(candidate, op, aggressive=aggressive)
    return acc.result("reduce")


@FORWARD_RULES.register("reduce-window")
def _reduce_window(ctx: Context, inst: Instruction) -> Proposal | None:
    """Each input's sharding (skipped with base or window dilation)."""
    if any(d.base_dilation > 1 or d.window_dilation > 1 for d in inst.attrs["window"].dims):
        return None
    acc = ctx.accumulate(inst)
    for op in inst.operands[:len(inst.operands) // 2]:
        if _partitioned(op):
            acc.improve(single_tuple(op.sharding, inst.shape), op,
                        aggressive=ctx.single_consumer(inst))
    return acc.result("reduce-window")


@FORWARD_RULES.register("select-and-scatter")
def _select_and_scatter(ctx: Context, inst: Instruction) -> Proposal | None:
    op = inst.operands[0]
    if not _partitioned(op) or any(d.base_dilation > 1 for d in inst.attrs["window"].dims):
        return None
    return _follow(ctx, inst, op, op.sharding, "select-and-scatter")


@FORWARD_RULES.register("sort")
def _sort(ctx: Context, inst: Instruction) -> Proposal | None:
    """The representative operand's sharding on every output; tiles on the sort dim move to the
    first other dim that can absorb them, else nothing propagates."""
    op = representative_operand(inst)
    if op is None or not _partitioned(op):
        return None
    s = op.sharding
    dim = inst.attrs["dimensions"][0]
    if s.is_tiled and s.tile_counts[dim] != 1:
        dims = op.shape.dims
        into = next((d for d in range(len(dims))
                     if d != dim and dims[d] % (s.tile_counts[dim] * s.tile_counts[d]) == 0), None)
        if into is None:
            return None
        s = algebra.move_and_merge(s, dim, into)
    return _follow(ctx, inst, op, single_tuple(s, inst.shape), "sort")


@FORWARD_RULES.register("concatenate")
def _concatenate(ctx: Context, inst: Instruction) -> Proposal | None:
    """The representative operand's sharding; at level 0 only for stacked layers (every operand a
    tiled reshape of a parameter or tuple element, not tiled on the concat dim)."""
    op = representative_operand(inst)
    if op is None or not _partitioned(op):
        return None
    if ctx.level == 0:
        dim = inst.attrs["dimensions"][0]
        for c in inst.operands:
            s = c.sharding
            if s is None or not s.is_tiled or s.num_tiles <= 1 or c.opcode != "reshape" or \
                    c.operands[0].opcode not in ("parameter", "get-tuple-element") or \
                    s.tile_counts[dim] > 1:
                return None
    return _follow(ctx, inst, op, op.sharding, "concatenate")


@FORWARD_RULES.register("dynamic-slice", "dynamic-update-slice")
def _dynamic_slice(ctx: Context, inst: Instruction) -> Proposal | None:
    """The sliced value's sharding (dynamic-slice operand, update of a dynamic-update-slice) with
    the sliced dims replicated; then a dynamic-update-slice's base (operand 0) improves on
    that in turn, as XLA tries both (a replicated update leaves the base's tiling to win)."""
    is_update = inst.opcode == "dynamic-update-slice"
    acc = ctx.accumulate(inst)
    sliced_value = inst.operands[1 if is_update else 0]
    aggressive = ctx.single_consumer(inst)
    if _partitioned(sliced_value):
        s = sliced_value.sharding
        if s.is_replicated:
            candidate = s
        else:
            sliced = tuple(d for d in range(inst.shape.rank)
                           if inst.shape.dims[d] != sliced_value.shape.dims[d])
            candidate = partially_replicate_on_dims(s, sliced)
        acc.improve(candidate, sliced_value, aggressive=aggressive)
    if is_update and _partitioned(inst.operands[0]):
        acc.improve(inst.operands[0].sharding, inst.operands[0])
    return acc.result(inst.opcode)


# ---- contractions --------------------------------------------------------------------------

def _contraction(ctx: Context, inst: Instruction, dims: ContractionDims, rule: str) -> Proposal | None:
    """XLA's InferDotShardingFromOperands: each sharded operand suggests an output sharding; with
    two, the one a lookahead user sharding sub-tiles (else the bigger operand's) is set first and
    the other merged into it. A candidate taken alone by an output without a sharding is settled
    (asked again, each operand's candidate is refused as it was, or equals the output's)."""
    operands = inst.operands
    fresh = inst.sharding is None
    improved: list[HloSharding | None] = []
    for k, op in enumerate(operands[:2]):
        if not _partitioned(op):
            improved.append(None)
            continue
        candidate = output_candidate(dims, k, op.sharding, op.shape.rank, inst.shape.rank)
        improved.append(improved_sharding(candidate, inst.sharding, inst.shape,
                                          may_combine=ctx.may_combine))
    first, second = improved
    if first is None and second is None:
        return None
    if second is None:
        return Proposal(first, rule, (operands[0],), fresh)
    if first is None:
        return Proposal(second, rule, (operands[1],), fresh)
    order = [(first, operands[0]), (second, operands[1])]
    decided = False
    look = lookahead_sharding(ctx, inst)
    if look is not None:
        first_sub = is_subtiling_or_equal(look, first, inst.shape.dims)
        second_sub = is_subtiling_or_equal(look, second, inst.shape.dims)
        if first_sub != second_sub:
            decided = True
            if second_sub:
                order.reverse()
    if not decided and operands[0].shape.byte_size < operands[1].shape.byte_size:
        order.reverse()
    (primary, primary_op), (secondary, secondary_op) = order
    merged = improved_sharding(secondary, primary, inst.shape, may_combine=ctx.may_combine)
    if merged is None:
        return Proposal(primary, rule, (primary_op,), fresh)
    return Proposal(merged, rule, (primary_op, secondary_op))


@FORWARD_RULES.register("dot")
def _dot(ctx: Context, inst: Instruction) -> Proposal | None:
    return _contraction(ctx, inst, ctx.graph.derived("dot", inst, dot_dims), "dot")


@FORWARD_RULES.register("convolution")
def _convolution(ctx: Context, inst: Instruction) -> Proposal | None:
    """Dot-like convolutions use the dot rule. Otherwise only the lhs drives the output: with a
    small kernel the output follows the lhs dim for dim (unless the feature dim is sharded),
    with a large one only the batch dim's tiling is kept."""
    dims = ctx.graph.derived("convolution", inst, convolution_dims)
    lhs, rhs = inst.operands
    groups = inst.attrs.get("feature_group_count", 1) * inst.attrs.get("batch_group_count", 1)
    if not dims.conv_spatial or (conv_spatial_partitions(dims, 0, lhs.sharding) == 1 and
                                 conv_spatial_partitions(dims, 1, rhs.sharding) == 1 and
                                 groups == 1):
        return _contraction(ctx, inst, dims, "convolution")
    if not _partitioned(lhs):
        return None
    s = lhs.sharding
    labels = inst.attrs["dim_labels"]
    if s.is_tile_maximal:
        candidate = s
    elif is_kernel_small(inst):
        if s.tile_counts[labels.lhs_feature] > 1:
            return None
        candidate = lhs_aligned_output(inst, s)
    else:
        candidate = algebra.replicate_all_except(s, [labels.lhs_batch])
    return _follow(ctx, inst, lhs, candidate, "convolution", aggressive=False)


# ---- gather / scatter ----------------------------------------------------------------------

def _gather_parallel(acc: Accumulator, view: IndexedOp, pairs: list[tuple[int, int]],
                     operand: Instruction, indices: Instruction) -> None:
    out = [view.result_dim_of_index_dim(i) for _, i in pairs]
    if _partitioned(operand):
        acc.improve(along(operand.sharding, [o for o, _ in pairs], out, view.result_rank), operand)
    if _partitioned(indices):
        acc.improve(along(indices.sharding, [i for _, i in pairs], out, view.result_rank), indices)


@FORWARD_RULES.register("gather")
def _gather(ctx: Context, inst: Instruction) -> Proposal | None:
    """Explicit batch dims, then index passthrough, then (SPMD) implicit parallel dims and the
    operand passthrough dims, each applied with improve. A replicated (or maximal, or manual)
    operand implies nothing for the result: with unsharded indices the gather stays
    unsharded."""
    view = ctx.graph.derived("gather", inst, gather_view)
    operand, indices = inst.operands
    acc = ctx.accumulate(inst)
    if view.operand_batching:
        _gather_parallel(acc, view, view.explicit_parallel(), operand, indices)
    if _partitioned(indices):
        acc.improve(result_from_indices(indices.sharding, view, indices.shape.rank), indices)
    if ctx.is_spmd:
        implicit = view.implicit_parallel(indices, ctx.graph)
        if implicit:
            _gather_parallel(acc, view, implicit, operand, indices)
        if _partitioned(operand) and operand.sharding.is_tiled:
            s = algebra.partially_replicate_on_dims(operand.sharding, [o for o, _ in implicit])
            acc.improve(result_from_operand(s, view), operand)
    return acc.result("gather")


def _scatter_parallel(acc: Accumulator, view: IndexedOp, pairs: list[tuple[int, int]],
                      inst: Instruction) -> None:
    n = scatter_operand_count(inst)
    operands, indices, updates = inst.operands[:n], inst.operands[n], inst.operands[n + 1:]
    operand_dims = [o for o, _ in pairs]
    index_dims = [i for _, i in pairs]
    update_dims = [view.result_dim_of_index_dim(i) for i in index_dims]
    rank = len(view.operand_dims)
    for k, op in enumerate(operands):
        if _partitioned(op):
            acc.improve_leaf(k, along(op.sharding, operand_dims, operand_dims, rank), op)
    if _partitioned(indices):
        candidate = along(indices.sharding, index_dims, operand_dims, rank)
        for k in range(n):
            acc.improve_leaf(k, candidate, indices)
    for k, update in enumerate(updates):
        if _partitioned(update):
            acc.improve_leaf(k, along(update.sharding, update_dims, operand_dims, rank), update)


@FORWARD_RULES.register("scatter")
def _scatter(ctx: Context, inst: Instruction) -> Proposal | None:
    """Parallel-dim candidates over the explicit batch dims from operands, indices and updates
    first, then each output takes its operand's sharding, then (when the indices or an update
    are sharded) the implicit parallel dims' candidates and each update's passthrough dims;
    non-SPMD: replicated after the explicit batch dims. The order matters where candidates
    tie: an update sharded along a batch dim gives its output its sharding before an operand
    sharded as finely along another dim can."""
    n = scatter_operand_count(inst)
    operands, indices, updates = inst.operands[:n], inst.operands[n], inst.operands[n + 1:]
    acc = ctx.accumulate(inst)
    view = ctx.graph.derived("scatter", inst, scatter_view)
    if view.operand_batching:
        _scatter_parallel(acc, view, view.explicit_parallel(), inst)
    if not ctx.is_spmd:
        for k in range(n):
            acc.improve_leaf(k, HloSharding.replicate())
        return acc.result("scatter")
    for k, op in enumerate(operands):
        if _partitioned(op):
            acc.improve_leaf(k, op.sharding, op)
    if not _partitioned(indices) and not any(_partitioned(u) for u in updates):
        return acc.result("scatter")
    implicit = view.implicit_parallel(indices, ctx.graph)
    if implicit:
        _scatter_parallel(acc, view, implicit, inst)
    for k, update in enumerate(updates):
        if _partitioned(update):
            candidate = operand_from_result(update.sharding, view)
            if candidate is not None:
                acc.improve_leaf(k, candidate, update)
    return acc.result("scatter")


# ---- everything else -----------------------------------------------------------------------

def default_rule(ctx: Context, inst: Instruction) -> Proposal | None:
    """Elementwise ops at levels >= 1 (SPMD) improve successively with every sharded operand, so
    partial shardings of different operands merge; other ops (and level 0) take the
    representative operand's sharding. An operand of other dims than the result (an
    elementwise fusion's parameter its fused root never reads) says nothing about it."""
    if is_elementwise(inst, ctx.graph) and ctx.may_combine:
        acc = ctx.accumulate(inst)
        lone = len(inst.operands) == 1 and ctx.single_consumer(inst)
        for op in inst.operands:
            if not _partitioned(op):
                continue
            candidate = op.sharding
            if inst.opcode == "rng":
                candidate = algebra.replicate_all_data_dims(candidate, inst.shape.rank)
                acc.improve(candidate, op, aggressive=ctx.single_consumer(inst))
            elif shapes_match(op.shape, inst.shape):
                acc.improve(candidate, op, aggressive=lone)
        return acc.result("elementwise")
    op = representative_operand(inst)
    if op is None or not _partitioned(op):
        return None
    return _follow(ctx, inst, op, op.sharding,
                   "elementwise" if is_elementwise(inst, ctx.graph) else inst.opcode)


FORWARD_RULES.set_default(default_rule)


def forward_rule(inst: Instruction) -> ForwardRule:
    return FORWARD_RULES.lookup(inst.opcode)
