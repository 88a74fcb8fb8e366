"""Inferring one instruction's sharding from its operands, its users or its shard group (XLA's
InferShardingFromOperands / InferShardingFromUsers / InferShardingFromShardGroup): the checks
common to all opcodes, then the per-opcode tables of `forward_rules` / `backward_rules`.

Common checks: forward, the instruction must pass shardings at the current level
(docs/design/propagation.md#the-driver); backward, only the user's level counts (an instruction
that passes shardings only from level 1, a slice say, takes its user's sharding at level 0),
except that a broadcast waits for level 2 either way; a manual sharding
is never changed; `{manual}` flows from a manual operand or user before anything else (never into
`SPMDShardToFullShape` forward or out of `SPMDFullToShardShape` backward; at level 0 not into
concatenate or dynamic-slice); an instruction that cannot be partitioned is only made replicated
when an operand is replicated (docs/design/propagation.md#which-instructions-take-a-sharding).
"""
from __future__ import annotations

from gspmdc.ir.custom_call_targets import (
    BARRIER_FROM, BARRIER_TO, FULL_TO_SHARD, SHARD_TO_FULL, target_of,
)
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import Trait, has_side_effect, opcodes, with_trait
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import for_shape, is_spatially_partitioned

from .backward_rules import from_user
from .context import Context, Proposal
from .forward_rules import forward_rule
from .graph import ModuleGraph
from .improve import improved_sharding
from .opclass import is_elementwise, passes_at_level, supports_spatial_partitioning

_MANUAL_TUPLE_OPS = opcodes("reduce", "sort", "reduce-window")
_ASYNC_OPS = with_trait(Trait.ASYNC) | opcodes("call-start", "call-done")


def _is_manual(s: HloSharding | None) -> bool:
    # the kind first: asked of every operand and user of every visit, mostly arrays
    return s is not None and (s.kind == "manual" or s.kind == "tuple" and s.is_manual)


def _async_thread(inst: Instruction) -> str | None:
    while inst.opcode in _ASYNC_OPS:
        thread = inst.attrs.get("async_execution_thread")
        if thread is not None:
            return thread
        if not inst.operands:
            return None
        inst = inst.operands[0]
    return None


def _takes_manual_forward(ctx: Context, inst: Instruction) -> bool:
    """XLA's shape condition for manual flowing forward: arrays, reduce/sort/reduce-window,
    tuple-shaped custom-calls, async ops running on a thread that is not being propagated."""
    if isinstance(inst.shape, ArrayShape) or inst.opcode in _MANUAL_TUPLE_OPS:
        return True
    if inst.opcode == "custom-call" and isinstance(inst.shape, TupleShape):
        return True
    threads = ctx.options.execution_threads
    return inst.opcode in _ASYNC_OPS and threads is not None and \
        _async_thread(inst) not in threads


def _supports(inst: Instruction, ctx: Context, backward: bool) -> bool:
    """`supports_spatial_partitioning` for a forward or a backward visit: a question about the
    graph and the pass options only, answered once per instruction and direction (the graph's
    `derived` facts "supported forward" / "supported backward")."""
    comp = ctx.graph.computation_of[inst]
    return supports_spatial_partitioning(
        inst, comp, is_spmd=ctx.is_spmd, is_callee=ctx.graph.is_callee(comp),
        to_output=ctx.options.to_output and not backward,
        to_parameters=ctx.options.to_parameters and backward, graph=ctx.graph)


def infer_from_operands(ctx: Context, inst: Instruction) -> Proposal | None:
    if not passes_at_level(inst, ctx.level, ctx.graph) or _is_manual(inst.sharding):
        return None
    if (inst.sharding is None or inst.sharding.is_tile_maximal) and _takes_manual_forward(ctx, inst):
        for op in inst.operands:
            if not _is_manual(op.sharding):
                continue
            if target_of(inst) == SHARD_TO_FULL or \
                    (ctx.level == 0 and inst.opcode in ("concatenate", "dynamic-slice")):
                return None
            return Proposal(for_shape(HloSharding.manual(), inst.shape), "manual", (op,))
    if not ctx.graph.derived("supported forward", inst, _supports, ctx, False):
        comp = ctx.graph.computation_of[inst]
        if isinstance(inst.shape, TupleShape) or not inst.operands or comp.root is inst or \
                ctx.graph.derived("side effect", inst, _acts_on_the_world, ctx.graph):
            return None
        for op in inst.operands:
            s = op.sharding
            if s is not None and s.is_tile_maximal and s.unique_device is None:
                new = improved_sharding(HloSharding.replicate(), inst.sharding, inst.shape,
                                        may_combine=ctx.may_combine)
                return None if new is None else Proposal(new, "replicated operand", (op,))
        return None
    return forward_rule(inst)(ctx, inst)


def _acts_on_the_world(inst: Instruction, graph: ModuleGraph) -> bool:
    """XLA's `HasSideEffect`: `inst` has a side effect of its own, or an instruction of a
    computation it calls has one (a fusion holding a side-effecting custom-call, recursively)."""
    return has_side_effect(inst) or any(
        _acts_on_the_world(i, graph) for name in inst.called_computation_names()
        for i in graph.computation(name).instructions)


def _rule_label(ctx: Context, user: Instruction) -> str:
    if is_elementwise(user, ctx.graph):
        return "elementwise"
    return target_of(user) or user.opcode


def infer_from_users(ctx: Context, inst: Instruction) -> Proposal | None:
    if (ctx.level < 2 and inst.opcode == "broadcast") or _is_manual(inst.sharding):
        return None
    users = ctx.graph.users[inst]
    for user in users:
        if user.sharding is not None or user.opcode == "rng-bit-generator":
            break
    else:       # no user has a sharding to give: every rule below answers None
        return None
    if inst.sharding is None or inst.sharding.is_tile_maximal:
        for user in users:
            if user.sharding is None or target_of(user) == FULL_TO_SHARD:
                continue
            if isinstance(inst.shape, ArrayShape) and user.sharding.is_manual:
                return Proposal(HloSharding.manual(), "manual", (user,))
            candidate = from_user(ctx, inst, user)
            if candidate is not None and candidate.is_manual:
                return Proposal(candidate, "manual", (user,))
    if not ctx.graph.derived("supported backward", inst, _supports, ctx, True):
        return None
    acc = ctx.accumulate(inst)
    labels: list[str] = []
    barrier_to = target_of(inst) == BARRIER_TO
    for user in users:
        if user.opcode == "rng-bit-generator":
            return Proposal(for_shape(HloSharding.replicate(), inst.shape),
                            "rng-bit-generator seed", (user,))
        candidate = from_user(ctx, inst, user, acc.value)
        if candidate is not None and barrier_to:
            candidate = for_shape(HloSharding.replicate(), inst.shape)
        if candidate is not None and acc.improve(candidate, user):
            labels.append(_rule_label(ctx, user))
    if not labels:                  # nothing improved: the sharding is the one it had
        return None
    return acc.result(", ".join(dict.fromkeys(labels)))


def infer_from_group(ctx: Context, inst: Instruction, members: list[Instruction]) -> Proposal | None:
    if not passes_at_level(inst, ctx.level, ctx.graph) or _is_manual(inst.sharding) or \
            target_of(inst) == BARRIER_TO:
        return None
    if inst.sharding is None or inst.sharding.is_tile_maximal:
        for m in members:
            if m is not inst and _is_manual(m.sharding):
                return Proposal(m.sharding, "shard group (manual)", (m,))
    acc = ctx.accumulate(inst)
    for m in members:
        if m is inst or target_of(m) == BARRIER_FROM or not is_spatially_partitioned(m.sharding):
            continue
        acc.improve(m.sharding, m)
    return acc.result("shard_as/shard_like")
