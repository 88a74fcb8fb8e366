"""Propagation behaviours where gspmdc once differed from XLA (found by `make conformance-xla`),
each a small module with the shardings XLA gives it written out by hand. With the `[xla]` extra
installed, XLA itself is asked too: every instruction's sharding must agree with XLA's (so the
hand-written answers cannot drift from the judge)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gspmdc import api
from propagation_helpers import expect, run

from conformance.correspondence import compare_shardings
from conformance.oracle import xla_available


@dataclass(frozen=True)
class Behaviour:
    """A module, its partition count, the propagation options (both flags `on` or both off) and
    the shardings XLA gives (instruction name -> sharding text, None: no sharding)."""

    text: str
    num_partitions: int
    on: bool
    expected: dict = field(default_factory=dict)


DUS_BASE = """
HloModule m, num_partitions=2
ENTRY main {
  b = f32[2,9] parameter(0), sharding={devices=[2,1]<=[2]}
  u = f32[2,3] parameter(1), sharding={replicated}
  i = s32[] parameter(2)
  j = s32[] parameter(3), sharding={replicated}
  d = f32[2,9] dynamic-update-slice(b, u, i, j)
  ROOT t = (f32[2,9]) tuple(d), sharding={{devices=[1,2]<=[2]}}
}"""

BEHAVIOURS = {
    # one flag for several parameters / a root tuple of several elements: XLA keeps the uneven
    # shardings propagation gives the entry (f32[2] over 6 devices); a single array root is
    # replicated when uneven
    "single_flag_keeps_uneven_entry_shardings": Behaviour("""
HloModule m, num_partitions=6
ENTRY main {
  p0 = f32[2] parameter(0)
  p1 = f32[2] parameter(1), sharding={devices=[6]1,5,3,2,4,0}
  p2 = f32[12] parameter(2)
  a = f32[2] add(p0, p1)
  b = f32[12] broadcast(p2), dimensions={0}
  ROOT t = (f32[2], f32[12]) tuple(a, b)
}""", 6, True, {"p0": "{devices=[6]1,5,3,2,4,0}", "p1": "{devices=[6]1,5,3,2,4,0}",
                "a": "{devices=[6]1,5,3,2,4,0}", "p2": "{replicated}",
                "t": "{{devices=[6]1,5,3,2,4,0}, {replicated}}"}),
    "single_array_root_uneven_is_replicated": Behaviour("""
HloModule m, num_partitions=6
ENTRY main {
  p0 = f32[2] parameter(0), sharding={devices=[6]<=[6]}
  ROOT a = f32[2] negate(p0)
}""", 6, True, {"p0": "{replicated}", "a": "{replicated}"}),
    # backward, only the user's level counts: the reverse (which passes shardings forward only
    # from level 1) takes the negate's sharding at level 0; the slice's user is then the reverse,
    # consulted from level 1, when the slice has already followed its operand forward
    "level_zero_backward_into_a_level_one_op": Behaviour("""
HloModule m, num_partitions=2
ENTRY main {
  p0 = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  s = f32[8,2] slice(p0), slice={[0:8], [0:2]}
  r = f32[8,2] reverse(s), dimensions={0}
  n = f32[8,2] negate(r), sharding={devices=[1,2]<=[2]}
  ROOT t = (f32[8,2]) tuple(n)
}""", 2, False, {"s": "{devices=[2,1]<=[2]}", "r": "{devices=[1,2]<=[2]}"}),
    # a removed barrier hands its sharding to an operand that has none, even a parameter
    # propagation may not set; an operand with a sharding keeps its own
    "removed_barrier_hands_its_sharding_to_its_operand": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p0 = f32[8,4] parameter(0)
  b = f32[8,4] custom-call(p0), custom_call_target="ShardBarrierFrom", custom_call_has_side_effect=true
  c = f32[8,4] exponential(b)
  p1 = f32[8,4] parameter(1)
  d = f32[8,4] custom-call(p1), custom_call_target="ShardBarrierTo", custom_call_has_side_effect=true
  p2 = f32[8,4] parameter(2), sharding={devices=[4,1]<=[4]}
  g = f32[8,4] negate(p2)
  h = f32[8,4] custom-call(g), custom_call_target="ShardBarrierTo", custom_call_has_side_effect=true
  e = f32[8,4] add(c, d)
  e2 = f32[8,4] add(e, h)
  f = f32[8,4] copy(e2), sharding={devices=[1,4]<=[4]}
  ROOT t = (f32[8,4]) tuple(f)
}""", 4, False, {"p0": "{devices=[1,4]<=[4]}", "c": "{devices=[1,4]<=[4]}",
                 "p1": "{replicated}", "g": "{devices=[4,1]<=[4]}"}),
    # a replicated operand implies nothing for a gather's result: with unsharded indices the
    # gather (here the root, which propagation may set) stays unsharded, and so do the indices
    "gather_of_a_replicated_operand_stays_unsharded": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p0 = u64[3] parameter(0), sharding={replicated}
  c = s32[5,1] constant({{1}, {7}, {0}, {-1}, {3}})
  ROOT g = u64[5] gather(p0, c), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1}
}""", 4, True, {"c": None, "g": None}),
    # a concatenate with one user besides the root may replace its sharding aggressively: the
    # copy's partial tiling (level 0, backward) gives way to the operand's [2,2] at level 1
    "concatenate_with_one_user_takes_its_operand_aggressively": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p0 = f32[8,2] parameter(0), sharding={devices=[2,2]<=[4]}
  m = f32[8,2] negate(p0)
  p1 = f32[8,6] parameter(1)
  c = f32[8,8] concatenate(m, p1), dimensions={1}
  r = f32[8,8] copy(c), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  ROOT t = (f32[8,8], f32[8,8]) tuple(r, c)
}""", 4, False, {"c": "{devices=[2,2]<=[4]}"}),
    # each get-tuple-element user replaces its element in the tuple sharding the earlier users
    # already improved (XLA updates the instruction after each user): both elements of the
    # scatter take their users' [2] at level 0, before the operand's 1,0 order could reach
    # element 1 at level 1
    "tuple_operand_collects_every_get_tuple_element_user": Behaviour("""
HloModule m, num_partitions=2
min2 {
  a0 = s32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = s32[] parameter(2)
  b1 = s32[] parameter(3)
  m0 = s32[] minimum(a0, b0)
  m1 = s32[] minimum(a1, b1)
  ROOT r = (s32[], s32[]) tuple(m0, m1)
}
ENTRY main {
  c = s32[] constant(-3)
  b = s32[2] broadcast(c), dimensions={}
  p1 = s32[2] parameter(0), sharding={devices=[2]1,0}
  idx = s32[1,4] parameter(1)
  w0 = s32[4] parameter(2)
  w1 = s32[4] parameter(3)
  s = (s32[2], s32[2]) scatter(b, p1, idx, w0, w1), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=0, to_apply=min2
  g1 = s32[2] get-tuple-element(s), index=1
  r1 = s32[2] reshape(g1), sharding={devices=[2]<=[2]}
  g0 = s32[2] get-tuple-element(s), index=0
  r0 = s32[2] reshape(g0), sharding={devices=[2]<=[2]}
  ROOT t = (s32[2], s32[2]) tuple(r0, r1)
}""", 2, False, {"s": "{{devices=[2]<=[2]}, {devices=[2]<=[2]}}"}),
    # the final level-3 fixpoint visits every instruction again: update 1 (b3) was visited in
    # level 3 before the indices took their sharding from update 0 (which is also operand 0),
    # and takes the indices' sharding then
    "final_fixpoint_revisits_an_update_after_its_indices": Behaviour("""
HloModule m, num_partitions=4
add2 {
  a0 = s32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = s32[] parameter(2)
  b1 = s32[] parameter(3)
  r0 = s32[] add(a0, b0)
  r1 = s32[] add(a1, b1)
  ROOT t = (s32[], s32[]) tuple(r0, r1)
}
ENTRY main {
  c5 = s32[] constant(2)
  b4 = s32[6,2] broadcast(c5), dimensions={}
  c6 = s32[6,1] constant({ {-3}, {-1}, {3}, {7}, {2}, {1} })
  c4 = s32[] constant(-3)
  b3 = s32[6,2] broadcast(c4), dimensions={}
  s = (s32[6,2], s32[6,2]) scatter(b4, b4, c6, b4, b3), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add2, sharding={{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}, {devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}}
  g1 = s32[6,2] get-tuple-element(s), index=1
  g0 = s32[6,2] get-tuple-element(s), index=0
  ROOT t = (s32[6,2], s32[6,2]) tuple(g1, g0)
}""", 4, False, {"b4": "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}",
                 "c6": "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}",
                 "b3": "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}"}),
    # a dynamic-update-slice tries its update's sharding (sliced dims replicated), then its
    # base's: a replicated update is improved on by the tiled base, before the root's different
    # tiling reaches it backward (and with the options on, the update parameter follows it)
    "dynamic_update_slice_base_improves_on_a_replicated_update": Behaviour(DUS_BASE, 2, False,
                                                                           {"d": "{devices=[2,1]<=[2]}"}),
    "dynamic_update_slice_base_improves_on_a_replicated_update_options_on": Behaviour(
        DUS_BASE, 2, True, {"d": "{devices=[2,1]<=[2]}", "u": "{devices=[2,1]<=[2]}"}),
    # XLA's reshape scan runs between equal shapes too: the size-1 dim tiled 2 ways after an
    # untiled one hands its tiles to the first size-1 dim of the operand
    "reshape_between_equal_shapes_moves_a_tiled_size_one_dim": Behaviour("""
HloModule m, num_partitions=8
ENTRY main {
  p = f32[1,1,4] parameter(0)
  n = f32[1,1,4] negate(p)
  r = f32[1,1,4] reshape(n), sharding={devices=[1,2,4]<=[8]}
  ROOT t = (f32[1,1,4]) tuple(r)
}""", 8, False, {"n": "{devices=[2,1,4]<=[8]}", "r": "{devices=[1,2,4]<=[8]}"}),
    # a fusion whose fused computation holds only parameters, constants and elementwise ops
    # is elementwise (XLA's IsElementwise looks inside): it takes its operand's sharding
    # forward at level 0 and passes its user's backward (the fusions are dead code: XLA's
    # partitioner refuses a live fusion it has sharded, see docs/propagation.md)
    "elementwise_fusion_passes_shardings_both_ways": Behaviour("""
HloModule m, num_partitions=2
fused.0 {
  a = f32[8,4] parameter(0)
  b = s32[8,4] parameter(1)
  c = f32[8,4] constant({{1,2,3,4},{1,2,3,4},{1,2,3,4},{1,2,3,4},{1,2,3,4},{1,2,3,4},{1,2,3,4},{5,6,7,8}})
  m = f32[8,4] multiply(a, a)
  k = f32[8,4] convert(b)
  s = f32[8,4] add(m, k)
  ROOT r = f32[8,4] subtract(s, c)
}
fused.1 {
  a = f32[8,4] parameter(0)
  ROOT e = f32[8,4] exponential(a)
}
ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  i = s32[8,4] parameter(1)
  f = f32[8,4] fusion(x, i), kind=kLoop, calls=fused.0
  y = f32[8,4] parameter(2)
  l = f32[8,4] log(y)
  g = f32[8,4] fusion(l), kind=kOutput, calls=fused.1
  n = f32[8,4] negate(g), sharding={devices=[1,2]<=[2]}
  ROOT t = (f32[8,4]) tuple(x)
}""", 2, False, {"f": "{devices=[2,1]<=[2]}", "g": "{devices=[1,2]<=[2]}",
                 "l": "{devices=[1,2]<=[2]}", "i": None}),
    # a fusion holding anything else (a reduce, a broadcast) is opaque: no sharding either way
    "fusion_with_a_reduce_or_a_broadcast_is_opaque": Behaviour("""
HloModule m, num_partitions=2
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
fused.0 {
  a = f32[8,4] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(a, z), dimensions={1}, to_apply=add
}
fused.1 {
  a = f32[8,4] parameter(0)
  z = f32[] constant(2)
  b = f32[8,4] broadcast(z), dimensions={}
  ROOT m = f32[8,4] multiply(a, b)
}
ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  f = f32[8] fusion(x), kind=kInput, calls=fused.0
  g = f32[8,4] fusion(x), kind=kLoop, calls=fused.1
  n = f32[8,4] negate(g)
  ROOT t = (f32[8,4]) tuple(x)
}""", 2, False, {"f": None, "g": None, "n": None}),
    # a scatter with explicit batch dims takes the parallel candidates over them first: the
    # update sharded along the batch dim gives its output that sharding before the operand
    # (sharded as finely along the scattered dim) can; the other output, whose update is not
    # sharded, keeps its operand's; a single-output scatter likewise
    "scatter_explicit_batch_dims_come_before_the_operand": Behaviour("""
HloModule m, num_partitions=2
mx2 {
  a0 = f32[] parameter(0)
  a1 = f32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = f32[] parameter(3)
  r0 = f32[] maximum(a0, b0)
  r1 = f32[] maximum(a1, b1)
  ROOT r = (f32[], f32[]) tuple(r0, r1)
}
mx {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] maximum(a, b)
}
ENTRY main {
  op = f32[8,14] parameter(0), sharding={devices=[2,1]<=[2]}
  c7 = s32[] constant(7)
  idx = s32[1,14,1] broadcast(c7), dimensions={}
  c = f32[] constant(0.75)
  first = f32[1,14] broadcast(c), dimensions={}
  second = f32[1,14] parameter(1), sharding={devices=[1,2]<=[2]}
  s = (f32[8,14], f32[8,14]) scatter(op, op, idx, first, second), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, input_batching_dims={1}, scatter_indices_batching_dims={1}, to_apply=mx2
  g1 = f32[8,14] get-tuple-element(s), index=1
  g0 = f32[8,14] get-tuple-element(s), index=0
  one = f32[8,14] scatter(op, idx, second), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, input_batching_dims={1}, scatter_indices_batching_dims={1}, to_apply=mx
  n = f32[8,14] negate(one)
  ROOT t = (f32[8,14], f32[8,14], f32[8,14]) tuple(g1, g0, n)
}""", 2, False, {"s": "{{devices=[2,1]<=[2]}, {devices=[1,2]<=[2]}}", "g1": "{devices=[1,2]<=[2]}",
                 "g0": "{devices=[2,1]<=[2]}", "one": "{devices=[1,2]<=[2]}"}),
    # an op gspmdc cannot partition takes {replicated} from a replicated operand, but not when
    # it has a side effect, its own or one of a computation it calls (XLA's HasSideEffect looks
    # inside): a fusion holding a side-effecting custom-call stays unsharded
    "a_fusion_with_a_side_effect_inside_takes_no_replicated_sharding": Behaviour("""
HloModule m, num_partitions=2
fused {
  f = f32[8,4] parameter(0)
  b = f32[8,4] custom-call(f), custom_call_target="ShardBarrierTo", custom_call_has_side_effect=true
  c = f32[] constant(0.5)
  k = f32[4,8] broadcast(c), dimensions={}
  ROOT d = f32[8,8] dot(b, k), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
fused_pure {
  g = f32[8,4] parameter(0)
  c2 = f32[] constant(0.5)
  k2 = f32[4,8] broadcast(c2), dimensions={}
  ROOT d2 = f32[8,8] dot(g, k2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
ENTRY main {
  p = f32[8,4] parameter(0), sharding={replicated}
  fu = f32[8,8] fusion(p), kind=kOutput, calls=fused
  pure = f32[8,8] fusion(p), kind=kOutput, calls=fused_pure
  n = f32[8,4] negate(p)
  ROOT t = (f32[8,4]) tuple(n)
}""", 2, False, {"fu": None, "pure": "{replicated}"}),
    # a value whose users want shardings with as many tiles, neither inside the other, takes
    # the first user's, users in text order (XLA: its users in memory, which are in text order
    # for a module it reads; docs/propagation.md "users-order tie")
    "a_users_tie_goes_to_the_first_user": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p = f32[4,4] parameter(0)
  c = f32[4,4] copy(p)
  a = f32[4,4] abs(c), sharding={devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}
  e = f32[4,4] exponential(c), sharding={devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}
  ROOT t = (f32[4,4], f32[4,4]) tuple(a, e)
}""", 4, False, {"c": "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}"}),
    # a dot's operand merges the dot's result, whose unreduced subgroup (partial sums) counts as
    # replication, with the other operand: b is tiled on both dims, replicated 4 times (XLA's
    # partitioner test SubgroupUnreducedAndReplicated with b's sharding left to propagation;
    # gspmdc failed on the merge)
    "a_dot_operand_merges_an_unreduced_result_with_the_other_operand": Behaviour("""
HloModule m, num_partitions=16
ENTRY main {
  a = f32[8,1024] parameter(0), sharding={devices=[2,2,4]<=[16] last_tile_dim_replicate}
  b = f32[1024,256] parameter(1)
  ROOT dot = f32[8,256] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,2,2,2]<=[2,2,2,2]T(0,2,1,3) last_tile_dims={unreduced,replicated}}
}""", 16, True, {"a": "{devices=[2,2,4]<=[16] last_tile_dim_replicate}",
                 "b": "{devices=[2,2,4]<=[2,4,2]T(1,0,2) last_tile_dim_replicate}"}),
    # the diagonal of p0: the index is an iota along the explicit batching dim, so it makes no
    # implicit parallel dim of its own; the operand takes the result's tiles on its batching dim
    # (gspmdc paired index dim 0 with two operand dims and failed)
    "gather_iota_along_an_explicit_batching_dim_adds_no_parallel_dim": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p0 = f32[4,4] parameter(0)
  i = s32[4,1] iota(), iota_dimension=0
  ROOT g = f32[4] gather(p0, i), offset_dims={}, collapsed_slice_dims={1}, start_index_map={1},
      operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=1,
      slice_sizes={1,1}, sharding={devices=[4]<=[4]}
}""", 4, True, {"p0": "{devices=[4,1]<=[4]}", "i": "{devices=[4,1]<=[4]}"}),
    # index component 1 is an iota along index dim 1 (size 5) addressing operand dim 1 (size
    # 16): the sizes differ, so the gather has no implicit parallel dims at all, not even the
    # one component 0 would give; operand dim 0 is collapsed, nothing reaches the result
    "gather_iota_of_another_size_than_its_operand_dim_cancels_the_parallel_dims": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p0 = f32[4,16,2] parameter(0), sharding={devices=[4,1,1]<=[4]}
  row = s32[4,5,1] iota(), iota_dimension=0
  col = s32[4,5,1] iota(), iota_dimension=1
  idx = s32[4,5,2] concatenate(row, col), dimensions={2}
  g = f32[4,5,2] gather(p0, idx), offset_dims={2}, collapsed_slice_dims={0,1},
      start_index_map={0,1}, index_vector_dim=2, slice_sizes={1,1,2}
  ROOT n = f32[4,5,2] negate(g)
}""", 4, False, {"row": None, "col": None, "idx": None, "g": None}),
    # the indices are a copy of a concatenate whose first piece is an iota along index dim 0:
    # seen through the copy, operand dim 0 and result dim 0 are parallel
    "gather_indices_are_seen_through_a_copy_of_a_concatenate": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  p0 = f32[4,16,2] parameter(0), sharding={devices=[4,1,1]<=[4]}
  p1 = s32[4,5,1] parameter(1)
  row = s32[4,5,1] iota(), iota_dimension=0
  idx = s32[4,5,2] concatenate(row, p1), dimensions={2}
  idx2 = s32[4,5,2] copy(idx)
  g = f32[4,5,2] gather(p0, idx2), offset_dims={2}, collapsed_slice_dims={0,1},
      start_index_map={0,1}, index_vector_dim=2, slice_sizes={1,1,2}
  ROOT n = f32[4,5,2] negate(g)
}""", 4, False, {"g": "{devices=[4,1,1]<=[4]}", "idx2": "{devices=[4,1,1]<=[4]}",
                "idx": "{devices=[4,1,1]<=[4]}", "row": "{devices=[4,1,1]<=[4]}", "p1": None}),
    # `{unknown shard_as 0}` constraints on two computed values put the values themselves in
    # the group (the custom-calls go): after the levels both take the group's common sharding,
    # the first member's as the two are incompatible, members in reverse post order (y first)
    "unknown_shard_as_constraints_group_their_operands": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  a = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[8,8] parameter(1), sharding={devices=[1,4]<=[4]}
  x = f32[8,8] exponential(a)
  sx = f32[8,8] custom-call(x), custom_call_target="Sharding", sharding={unknown shard_as 0}
  y = f32[8,8] negate(b)
  sy = f32[8,8] custom-call(y), custom_call_target="Sharding", sharding={unknown shard_as 0}
  ROOT r = f32[8,8] add(sx, sy)
}""", 4, False, {"x": "{devices=[1,4]<=[4]}", "y": "{devices=[1,4]<=[4]}", "r": None}),
    # the gather's indices are a loop-carried value the body passes through unchanged, an iota
    # along dim 0 before the loop: index dim 0 and operand dim 0 are parallel inside the body
    # too, so the table's tiles reach the gather, the accumulator and the iota outside
    "gather_indices_carried_through_a_loop_keep_their_iota": Behaviour("""
HloModule m, num_partitions=4
cond {
  p = (s32[], f32[4,16,2], s32[4,5,1], s32[4,5,1], f32[4,5,2]) parameter(0)
  c = s32[] get-tuple-element(p), index=0
  l = s32[] constant(3)
  ROOT lt = pred[] compare(c, l), direction=LT
}
body {
  p = (s32[], f32[4,16,2], s32[4,5,1], s32[4,5,1], f32[4,5,2]) parameter(0)
  c = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  c1 = s32[] add(c, one)
  t = f32[4,16,2] get-tuple-element(p), index=1
  row = s32[4,5,1] get-tuple-element(p), index=2
  col = s32[4,5,1] get-tuple-element(p), index=3
  acc = f32[4,5,2] get-tuple-element(p), index=4
  idx = s32[4,5,2] concatenate(row, col), dimensions={2}
  g = f32[4,5,2] gather(t, idx), offset_dims={2}, collapsed_slice_dims={0,1},
      start_index_map={0,1}, index_vector_dim=2, slice_sizes={1,1,2}
  acc1 = f32[4,5,2] add(acc, g)
  ROOT r = (s32[], f32[4,16,2], s32[4,5,1], s32[4,5,1], f32[4,5,2]) tuple(c1, t, row, col, acc1)
}
ENTRY main {
  p0 = f32[4,16,2] parameter(0), sharding={devices=[4,1,1]<=[4]}
  p1 = s32[4,5,1] parameter(1)
  zero = s32[] constant(0)
  z = f32[] constant(0)
  acc0 = f32[4,5,2] broadcast(z), dimensions={}
  rowi = s32[4,5,1] iota(), iota_dimension=0
  init = (s32[], f32[4,16,2], s32[4,5,1], s32[4,5,1], f32[4,5,2]) tuple(zero, p0, rowi, p1, acc0)
  w = (s32[], f32[4,16,2], s32[4,5,1], s32[4,5,1], f32[4,5,2]) while(init), condition=cond,
      body=body
  ROOT out = f32[4,5,2] get-tuple-element(w), index=4
}""", 4, False, {"g": "{devices=[4,1,1]<=[4]}", "idx": "{devices=[4,1,1]<=[4]}",
                "acc1": "{devices=[4,1,1]<=[4]}", "rowi": "{devices=[4,1,1]<=[4]}",
                "acc0": "{devices=[4,1,1]<=[4]}", "out": None,
                "w": "{{replicated}, {devices=[4,1,1]<=[4]}, {devices=[4,1,1]<=[4]}, "
                     "{devices=[4,1,1]<=[4]}, {devices=[4,1,1]<=[4]}}"}),
    # `{unknown}` constrains nothing but is a sharding: it starts `{replicated}`, a neighbour
    # may replace it (x), and where none does it stays `{replicated}` and spreads as one (z)
    "unknown_starts_replicated_and_may_be_replaced": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  a = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}
  c = f32[8,8] parameter(1)
  x = f32[8,8] exponential(a), sharding={unknown}
  y = f32[8,8] negate(c), sharding={unknown}
  z = f32[8,8] abs(y)
  ROOT t = (f32[8,8], f32[8,8]) tuple(x, z)
}""", 4, False, {"x": "{devices=[4,1]<=[4]}", "y": "{replicated}", "z": "{replicated}",
                "c": None, "t": None}),
    # an `{unknown shard_as 0}` constraint on a parameter stays (a copy in the group) and hands
    # its `{unknown}` to the parameter, which propagation may not change: `{replicated}`
    "unknown_shard_as_constraint_on_a_parameter_leaves_it_replicated": Behaviour("""
HloModule m, num_partitions=4
ENTRY main {
  a = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[8,8] parameter(1)
  sb = f32[8,8] custom-call(b), custom_call_target="Sharding", sharding={unknown shard_as 0}
  x = f32[8,8] exponential(a)
  sx = f32[8,8] custom-call(x), custom_call_target="Sharding", sharding={unknown shard_as 0}
  y = f32[8,8] negate(sb)
  ROOT r = f32[8,8] add(sx, y)
}""", 4, False, {"b": "{replicated}", "sb": "{devices=[4,1]<=[4]}", "x": "{devices=[4,1]<=[4]}",
                "y": "{devices=[4,1]<=[4]}", "r": None}),
    # an outfeed's sharding covers its data and then its token; a tuple holding the outfeed's
    # result (the token) takes the last element (gspmdc took both and failed)
    "a_tuple_takes_the_token_part_of_an_outfeeds_sharding": Behaviour("""
HloModule m, num_partitions=2
ENTRY main {
  p0 = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  n = f32[8] negate(p0)
  t0 = (f32[8]) tuple(n)
  tok = token[] after-all()
  o = token[] outfeed(t0, tok), outfeed_shape=(f32[8]),
      sharding={{devices=[2]<=[2]}, {maximal device=0}}
  ROOT r = (f32[8], token[]) tuple(n, o)
}""", 2, True, {"n": "{devices=[2]<=[2]}", "t0": "{{devices=[2]<=[2]}}",
                "r": "{{devices=[2]<=[2]}, {maximal device=0}}"}),
}


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_gspmdc_gives_xlas_shardings(name):
    b = BEHAVIOURS[name]
    module = run(b.text, propagate_to_output=b.on, propagate_to_parameters=b.on)
    expect(module, **b.expected)


@pytest.fixture(scope="module")
def xla():
    if not xla_available():
        pytest.skip("needs the [xla] extra (jax, jaxlib)")
    from conformance.oracle import XlaOracle
    with XlaOracle() as oracle:
        yield oracle


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_xla_agrees_on_every_instruction(xla, name):
    b = BEHAVIOURS[name]
    answer = xla.partition(b.text, b.num_partitions, to_output=b.on, to_parameters=b.on)
    assert answer.ok, answer.error
    before = api.parse(answer.before, "before", verify=False)
    ours = api.parse(answer.before, "ours", verify=False)
    from gspmdc.passes.propagation import propagate
    propagate(ours, propagate_to_output=b.on, propagate_to_parameters=b.on, record_origins=False)
    theirs = api.parse(answer.propagated, "xla", verify=False)
    differ = [v.describe() for v in compare_shardings(before, ours, theirs)
              if v.compared and not v.agrees]
    assert not differ, differ
