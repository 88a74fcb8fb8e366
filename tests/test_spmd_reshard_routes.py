"""Reshard routes chosen for the whole program (issue 13; `passes/spmd/reshard_routes.py`):
where the plan of a reshard cheapest for its own busiest device loads a device other
collectives load already, another plan of it that spreads its bytes over devices idle elsewhere
is taken when that lowers the program's busiest device (then the bytes of all devices); a
reshard in a loop body counts its executions (the trip counts of the loops around it), one in
a branch as if the branch ran. Bytes per device by hand from the cost model's formulas
(`gspmdc.ir.cost`: a collective-permute sends its operand from each device whose pair moves,
an all-gather each device's shard to the g-1 others, an all-to-all every block but the
device's own); values against the unpartitioned program."""
from __future__ import annotations

import numpy as np

from gspmdc import api
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_routes
from gspmdc.passes.spmd.traffic import sent_per_device

from filecheck import check, directives
from spmd_partition_helpers import check_equivalent, collectives, inputs_for

TWO_RESHARDS = """HloModule m, num_partitions=4

ENTRY e {
  a = f32[4,8] parameter(0), sharding={devices=[1,4]0,2,1,3}
  b = f32[4,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT t = (f32[4,8], f32[4,8]) tuple(a, b),
    sharding={{devices=[2,1,2]0,3,2,1 last_tile_dim_replicate}, {devices=[4,1]0,3,2,1}}
}
"""


def test_the_route_of_a_reshard_spreads_its_bytes_over_devices_idle_elsewhere():
    """`b`'s reshard swaps the rows of devices 1 and 3: one collective-permute of their
    f32[1,8] shards, 32 B from each of them. `a`'s reshard (f32[4,2] column shards to f32[2,8]
    row tiles held by the pairs {0,3} and {2,1}) is cheapest alone as an all-to-all in pairs
    (each device half its shard, 16 B), a permute of the f32[2,4] halves from devices 1 and 3
    (32 B) and an all-gather of them in the pairs (32 B each): [48, 80, 48, 80], busiest 80;
    so the program sends [48, 112, 48, 112], busiest 112. Its other route of the same bytes
    over all devices permutes from devices 0 and 2 instead: [80, 48, 80, 48], and the program
    [80, 80, 80, 80]: busiest 80."""
    spmd = check_equivalent(TWO_RESHARDS, 4)
    assert sent_per_device(spmd, 4).tolist() == [80, 80, 80, 80]
    assert sorted(c[0] for c in collectives(spmd)) == \
        ["all-gather", "all-to-all", "collective-permute", "collective-permute"]
    check(api.to_text(spmd), directives("""
    // CHECK: all-to-all({{.*}}spmd_value="a"
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]2,0[}],[{]3,3[}],[{]0,2[}],[{]1,1[}][}]}}{{.*}}spmd_value="a"
    """))


def test_the_routes_of_a_reshard_are_its_plans_with_distinct_bytes_per_device():
    """`a`'s reshard above: the chosen plan first, then one plan per other vector of bytes per
    device: the same steps permuting from devices 0 and 2, each of the two with the all-gather
    before the permute (which then moves the gathered f32[2,8] tile, 64 B), and the all-gather
    of dim 1 whole then a slice (each device its f32[4,2] shard to the 3 others, 96 B); the sum
    over the devices of each is its plan's `total`."""
    source = parse_sharding("{devices=[1,4]0,2,1,3}")
    target = parse_sharding("{devices=[2,1,2]0,3,2,1 last_tile_dim_replicate}")
    shape = ArrayShape("f32", (4, 8))
    routes = plan_routes(shape, source, target, 4)
    assert routes.plans[0] is plan_reshard(shape, source, target, 4)
    assert routes.sent.tolist()[0] == [48, 80, 48, 80]
    assert sorted(map(tuple, routes.sent.tolist()[1:])) == [
        (48, 112, 48, 112), (80, 48, 80, 48), (96, 96, 96, 96), (112, 48, 112, 48)]
    assert [int(row.sum()) for row in routes.sent] == [plan.total for plan in routes.plans]


# a reshard of f32[2,4,10] from tiles of dim 2 (devices 3, 2, 1, 0) to halves of it held in
# pairs, made for an add each iteration of a loop (`x` to `acc`'s tiling) or in one branch of a
# conditional, beside `b`'s move from device 2 to device 0 in the entry (96 B from device 2)
TILED = "{devices=[1,1,4]3,2,1,0}"
ROWS = "{devices=[1,1,2,2]1,2,0,3 last_tile_dim_replicate}"
B_FROM = "{maximal device=2}"
B_TO = "{maximal device=0}"
B_SENT = np.array([0, 0, 96, 0])
STATE = "(s32[], f32[2,4,10], f32[2,4,10])"
STATE_SHARDING = f"{{{{replicated}}, {TILED}, {ROWS}}}"

LOOP = f"""HloModule m, num_partitions=4

body {{
  p = {STATE} parameter(0), sharding={STATE_SHARDING}
  i = s32[] get-tuple-element(p), index=0, sharding={{replicated}}
  x = f32[2,4,10] get-tuple-element(p), index=1, sharding={TILED}
  acc = f32[2,4,10] get-tuple-element(p), index=2, sharding={ROWS}
  one = s32[] constant(1), sharding={{replicated}}
  next = s32[] add(i, one), sharding={{replicated}}
  sum = f32[2,4,10] add(acc, x), sharding={ROWS}
  ROOT r = {STATE} tuple(next, x, sum), sharding={STATE_SHARDING}
}}

cond {{
  p = {STATE} parameter(0), sharding={STATE_SHARDING}
  i = s32[] get-tuple-element(p), index=0, sharding={{replicated}}
  n = s32[] constant(TRIPS), sharding={{replicated}}
  ROOT lt = pred[] compare(i, n), direction=LT, sharding={{replicated}}
}}

ENTRY e {{
  a = f32[2,4,10] parameter(0), sharding={TILED}
  c = f32[2,4,10] parameter(1), sharding={ROWS}
  b = f32[24] parameter(2), sharding={B_FROM}
  zero = s32[] constant(0), sharding={{replicated}}
  init = {STATE} tuple(zero, a, c), sharding={STATE_SHARDING}
  w = {STATE} while(init), condition=cond, body=body, sharding={STATE_SHARDING}
  out = f32[2,4,10] get-tuple-element(w), index=2, sharding={ROWS}
  ROOT t = (f32[2,4,10], f32[24]) tuple(out, b), sharding={{{ROWS}, {B_TO}}}
}}
"""


def _routes_of_x() -> tuple[np.ndarray, np.ndarray]:
    """The bytes per device of `x`'s reshard by its plan alone (permutes of the pieces of
    the new f32[2,4,5] tiles only: device 0 its f32[2,4,1] piece, 32 B, devices 1, 2 and 3
    six of their columns, 192 B: [32, 192, 192, 192]) and by the route of two permutes then
    an all-gather in the pairs {1,2} and {3,0}: [96, 224, 128, 192], as the routes pass prices
    them."""
    routes = plan_routes(ArrayShape("f32", (2, 4, 10)), parse_sharding(TILED),
                         parse_sharding(ROWS), 4)
    alone, spread = routes.sent[0], [r for r in routes.sent if r.tolist() == [96, 224, 128, 192]]
    assert alone.tolist() == [32, 192, 192, 192] and len(spread) == 1
    return alone, spread[0]


def _channel_ids(spmd) -> list[int]:
    return [i.attr("channel_id") for _, i in spmd.all_instructions()
            if i.attr("channel_id") is not None]


def test_a_reshard_in_a_loop_is_priced_times_the_trip_count_and_rerouted():
    """Two iterations: `x`'s reshard alone sends 2 x [32, 192, 192, 192] and the program, with
    `b`'s permute, [64, 384, 480, 384] (busiest 480); its route through the all-gather sends
    2 x [96, 224, 128, 192] and the program [192, 448, 352, 384] (busiest 448): taken, in the
    loop body. The routes' bytes times the trip count plus `b`'s are what the cost model
    counts on the printed program; the re-emitted collectives get new channel ids, unique."""
    spmd = check_equivalent(LOOP.replace("TRIPS", "2"), 4)
    alone, spread = _routes_of_x()
    assert (2 * alone + B_SENT).tolist() == [64, 384, 480, 384]
    assert sent_per_device(spmd, 4).tolist() == (2 * spread + B_SENT).tolist() == \
        [192, 448, 352, 384]
    ids = _channel_ids(spmd)
    assert len(ids) == len(set(ids)) == 4
    check(api.to_text(spmd), directives("""
    // CHECK: %body
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]2,1[}],[{]1,0[}][}]}}{{.*}}spmd_value="x"
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]3,1[}],[{]2,2[}],[{]1,3[}],[{]0,0[}][}]}}{{.*}}spmd_value="x"
    // CHECK: all-gather({{.*}}replica_groups={{[{][{]1,2[}],[{]3,0[}][}]}}{{.*}}spmd_value="x"
    // CHECK: ENTRY
    // CHECK: collective-permute({{.*}}spmd_value="b"
    """))


def test_a_route_cheaper_for_one_iteration_is_not_taken_for_three():
    """Three iterations: `x`'s plan alone makes the program [96, 576, 672, 576] (busiest
    672); the route through the all-gather, lighter on the busiest device for one or two
    iterations, would make it [288, 672, 480, 576] (busiest equal, more in all): the plan alone
    stays. A pass pricing the loop's reshard once would take the all-gather."""
    spmd = check_equivalent(LOOP.replace("TRIPS", "3"), 4)
    alone, spread = _routes_of_x()
    assert (3 * spread + B_SENT).tolist() == [288, 672, 480, 576]
    assert sent_per_device(spmd, 4).tolist() == (3 * alone + B_SENT).tolist() == \
        [96, 576, 672, 576]
    assert "all-gather(" not in api.to_text(spmd)
    check(api.to_text(spmd), directives("""
    // CHECK: %body
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]3,1[}],[{]1,0[}],[{]2,3[}][}]}}{{.*}}spmd_value="x"
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]2,0[}],[{]0,3[}][}]}}{{.*}}spmd_value="x"
    // CHECK: ENTRY
    """))


# the loop above run twice by the body of another loop run twice: `x`'s reshard 4 times
NESTED = LOOP.replace("TRIPS", "2").replace("ENTRY e {", f"""outer_cond {{
  p = {STATE} parameter(0), sharding={STATE_SHARDING}
  i = s32[] get-tuple-element(p), index=0, sharding={{replicated}}
  n = s32[] constant(2), sharding={{replicated}}
  ROOT lt = pred[] compare(i, n), direction=LT, sharding={{replicated}}
}}

outer_body {{
  p = {STATE} parameter(0), sharding={STATE_SHARDING}
  i = s32[] get-tuple-element(p), index=0, sharding={{replicated}}
  x = f32[2,4,10] get-tuple-element(p), index=1, sharding={TILED}
  acc = f32[2,4,10] get-tuple-element(p), index=2, sharding={ROWS}
  one = s32[] constant(1), sharding={{replicated}}
  next = s32[] add(i, one), sharding={{replicated}}
  zero = s32[] constant(0), sharding={{replicated}}
  init = {STATE} tuple(zero, x, acc), sharding={STATE_SHARDING}
  w = {STATE} while(init), condition=cond, body=body, sharding={STATE_SHARDING}
  sum = f32[2,4,10] get-tuple-element(w), index=2, sharding={ROWS}
  ROOT r = {STATE} tuple(next, x, sum), sharding={STATE_SHARDING}
}}

ENTRY e {{""").replace("body=body, sharding=" + STATE_SHARDING + "\n  out",
                       "body=outer_body, sharding=" + STATE_SHARDING + "\n  out") \
    .replace("condition=cond, body=outer_body", "condition=outer_cond, body=outer_body")


def test_a_reshard_in_nested_loops_is_priced_times_both_trip_counts():
    """The inner loop's body runs 2 x 2 times: `x`'s plan alone makes the program
    [128, 768, 864, 768] (busiest 864), the route through the all-gather [384, 896, 608, 768]
    (busiest 896): the plan alone stays, where pricing it by the inner trip count alone would
    take the all-gather."""
    assert NESTED.count("while(") == 2 and "condition=outer_cond" in NESTED
    spmd = check_equivalent(NESTED, 4)
    alone, spread = _routes_of_x()
    assert (4 * spread + B_SENT).tolist() == [384, 896, 608, 768]
    assert sent_per_device(spmd, 4).tolist() == (4 * alone + B_SENT).tolist() == \
        [128, 768, 864, 768]
    assert "all-gather(" not in api.to_text(spmd)


BRANCHES = f"""HloModule m, num_partitions=4

on_true {{
  p = (f32[2,4,10], f32[2,4,10]) parameter(0), sharding={{{TILED}, {ROWS}}}
  x = f32[2,4,10] get-tuple-element(p), index=0, sharding={TILED}
  acc = f32[2,4,10] get-tuple-element(p), index=1, sharding={ROWS}
  ROOT sum = f32[2,4,10] add(acc, x), sharding={ROWS}
}}

on_false {{
  p = (f32[2,4,10], f32[2,4,10]) parameter(0), sharding={{{TILED}, {ROWS}}}
  acc = f32[2,4,10] get-tuple-element(p), index=1, sharding={ROWS}
  ROOT neg = f32[2,4,10] negate(acc), sharding={ROWS}
}}

ENTRY e {{
  q = pred[] parameter(0), sharding={{replicated}}
  a = f32[2,4,10] parameter(1), sharding={TILED}
  c = f32[2,4,10] parameter(2), sharding={ROWS}
  b = f32[24] parameter(3), sharding={B_FROM}
  ops = (f32[2,4,10], f32[2,4,10]) tuple(a, c), sharding={{{TILED}, {ROWS}}}
  k = f32[2,4,10] conditional(q, ops, ops), true_computation=on_true,
    false_computation=on_false, sharding={ROWS}
  ROOT t = (f32[2,4,10], f32[24]) tuple(k, b), sharding={{{ROWS}, {B_TO}}}
}}
"""


def test_a_reshard_in_a_branch_is_rerouted():
    """A branch runs at most once per run (priced as if it ran: the bound the cost model
    takes): `x`'s reshard in the true branch takes the route through the all-gather, the
    program [96, 224, 224, 192] with `b`'s permute instead of [32, 192, 288, 192] by its plan
    alone; values agree whichever branch runs."""
    inputs = inputs_for(BRANCHES)
    for taken in (True, False):
        inputs[0] = np.array(taken)
        spmd = check_equivalent(BRANCHES, 4, inputs=inputs)
    alone, spread = _routes_of_x()
    assert (alone + B_SENT).tolist() == [32, 192, 288, 192]
    assert sent_per_device(spmd, 4).tolist() == (spread + B_SENT).tolist() == \
        [96, 224, 224, 192]
    ids = _channel_ids(spmd)
    assert len(ids) == len(set(ids)) == 4
    check(api.to_text(spmd), directives("""
    // CHECK: %on_true
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]2,1[}],[{]1,0[}][}]}}{{.*}}spmd_value="x"
    // CHECK: all-gather({{.*}}replica_groups={{[{][{]1,2[}],[{]3,0[}][}]}}{{.*}}spmd_value="x"
    // CHECK: %on_false
    // CHECK-NOT: channel_id
    // CHECK: ENTRY
    """))


UNBOUNDED_STATE = "(s32[], f32[2,4,10], f32[2,4,10], s32[])"
UNBOUNDED_SHARDING = f"{{{{replicated}}, {TILED}, {ROWS}, {{replicated}}}}"
UNBOUNDED = f"""HloModule m, num_partitions=4

body {{
  p = {UNBOUNDED_STATE} parameter(0), sharding={UNBOUNDED_SHARDING}
  i = s32[] get-tuple-element(p), index=0, sharding={{replicated}}
  x = f32[2,4,10] get-tuple-element(p), index=1, sharding={TILED}
  acc = f32[2,4,10] get-tuple-element(p), index=2, sharding={ROWS}
  n = s32[] get-tuple-element(p), index=3, sharding={{replicated}}
  one = s32[] constant(1), sharding={{replicated}}
  next = s32[] add(i, one), sharding={{replicated}}
  sum = f32[2,4,10] add(acc, x), sharding={ROWS}
  ROOT r = {UNBOUNDED_STATE} tuple(next, x, sum, n), sharding={UNBOUNDED_SHARDING}
}}

cond {{
  p = {UNBOUNDED_STATE} parameter(0), sharding={UNBOUNDED_SHARDING}
  i = s32[] get-tuple-element(p), index=0, sharding={{replicated}}
  n = s32[] get-tuple-element(p), index=3, sharding={{replicated}}
  ROOT lt = pred[] compare(i, n), direction=LT, sharding={{replicated}}
}}

ENTRY e {{
  a = f32[2,4,10] parameter(0), sharding={TILED}
  c = f32[2,4,10] parameter(1), sharding={ROWS}
  b = f32[24] parameter(2), sharding={B_FROM}
  trips = s32[] parameter(3), sharding={{replicated}}
  zero = s32[] constant(0), sharding={{replicated}}
  init = {UNBOUNDED_STATE} tuple(zero, a, c, trips), sharding={UNBOUNDED_SHARDING}
  w = {UNBOUNDED_STATE} while(init), condition=cond, body=body, sharding={UNBOUNDED_SHARDING}
  out = f32[2,4,10] get-tuple-element(w), index=2, sharding={ROWS}
  ROOT t = (f32[2,4,10], f32[24], f32[2,4,10]) tuple(out, b, a),
    sharding={{{ROWS}, {B_TO}, {ROWS}}}
}}
"""


def test_no_reshard_is_rerouted_where_a_loop_runs_an_unknown_number_of_times():
    """The loop above bounded by a value it carries (no static trip count), and `a` also read
    in `acc`'s tiling by the root: the program's bytes are unknown (`sent_per_device` is None),
    so every reshard keeps its plan, `a`'s in the entry too (permutes of pieces only, where
    beside `b`'s move alone it would take the route through the all-gather: the branch
    test)."""
    inputs = inputs_for(UNBOUNDED)
    inputs[3] = np.array(2, dtype=np.int32)
    spmd = check_equivalent(UNBOUNDED, 4, inputs=inputs)
    assert sent_per_device(spmd, 4) is None
    assert "all-gather(" not in api.to_text(spmd)
    check(api.to_text(spmd), directives("""
    // CHECK: %body
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]3,1[}],[{]1,0[}],[{]2,3[}][}]}}{{.*}}spmd_value="x"
    // CHECK: ENTRY
    // CHECK: collective-permute({{.*}}source_target_pairs={{[{][{]3,1[}],[{]1,0[}],[{]2,3[}][}]}}{{.*}}spmd_value="a"
    """))

TO_ONE_DEVICE = """HloModule m, num_partitions=8

ENTRY e {
  a = s32[4] parameter(0), sharding={devices=[8]<=[8]}
  b = f32[32] parameter(1), sharding={devices=[8]<=[8]}
  ROOT t = (s32[4], f32[32]) tuple(a, b),
    sharding={{maximal device=0}, {devices=[8]0,1,2,3,5,4,7,6}}
}
"""


def test_a_reshard_to_one_device_takes_the_route_that_spares_the_busy_devices():
    """`b`'s reshard swaps the f32[4] shards of devices 4 and 5, and of 6 and 7: a
    collective-permute, 16 B from each of them. `a` (s32[4] on 8 tiles of one element,
    devices 4 to 7 holding padding) goes to device 0 through the replicated array, every
    route ending where the plan does. Cheapest alone: the pieces exchanged into 4 tiles of one
    element (devices 2k and 2k+1 holding element k: device 0 sends element 0 to device 1,
    device k = 1, 2, 3 element k to devices 2k and 2k+1), then an all-gather in fours of the
    s32[1] shards (12 B each): [16, 20, 20, 20, 12, 12, 12, 12], and the program [16, 20, 20,
    20, 28, 28, 28, 28]. Its route into 2 tiles of two elements (devices 0 to 3 holding
    elements 0 and 1: devices 0 and 1 send theirs to the 3 others, 12 B; devices 2 and 3 to
    devices 4 to 7, 16 B) then an all-gather in pairs of the s32[2] shards (8 B each) sends
    [20, 20, 24, 24, 8, 8, 8, 8] (busiest 24 alone), and the program [20, 20, 24, 24, 24, 24,
    24, 24]: busiest 24."""
    spmd = check_equivalent(TO_ONE_DEVICE, 8)
    assert sent_per_device(spmd, 8).tolist() == [20, 20, 24, 24, 24, 24, 24, 24]
    assert [c[0] for c in collectives(spmd)].count("all-gather") == 1
    check(api.to_text(spmd), directives("""
    // CHECK: all-gather({{.*}}replica_groups=[4,2]<=[2,4]T(1,0){{.*}}spmd_value="a"
    """))


def test_the_routes_of_a_reshard_from_or_to_one_device():
    """To device 0, `a`'s routes above, then the all-gather of the padded s32[1] shards (28 B
    from each device), the masked gather (an all-reduce of the zero-padded shards placed in
    s32[4]: ring chunks of 1, 1, 1, 1, 0, 0, 0, 0 elements, device r sending (8 - c_r -
    c_{r+1}) * 4 B), and after each exchange a masked gather instead of the all-gather (in
    fours: chunks of 1 element, (8 - 2) * 4 = 24 B; in pairs: chunks of 2, (8 - 4) * 4 = 16 B). From device 2 to 4 tiles of a f32[4,6] held twice, every route
    broadcasts first (the select and an all-reduce of the 96 B array: chunks of 3 elements,
    each device sending (2 * 24 - 3 - 3) * 4 = 168 B) and then slices: one route. From one
    device to another: the permute alone (f32[4,6] from device 2, 96 B)."""
    shape = ArrayShape("s32", (4,))
    tiled = parse_sharding("{devices=[8]<=[8]}")
    to_one = plan_routes(shape, tiled, parse_sharding("{maximal device=0}"), 8)
    assert to_one.sent.tolist() == [[16, 20, 20, 20, 12, 12, 12, 12], [28] * 8,
                                    [24, 24, 24, 28, 32, 32, 32, 28],
                                    [28, 32, 32, 32, 24, 24, 24, 24],
                                    [20, 20, 24, 24, 8, 8, 8, 8],
                                    [28, 28, 32, 32, 16, 16, 16, 16]]
    assert [plan.collectives[-1] for plan in to_one.plans] == \
        ["all-gather", "all-gather", "all-reduce", "all-reduce", "all-gather", "all-reduce"]
    shape = ArrayShape("f32", (4, 6))
    one = parse_sharding("{maximal device=2}")
    from_one = plan_routes(shape, one, parse_sharding(
        "{devices=[2,2,2]<=[8] last_tile_dim_replicate}"), 8)
    assert from_one.sent.tolist() == [[168] * 8]
    between = plan_routes(shape, one, parse_sharding("{maximal device=5}"), 8)
    assert between.sent.tolist() == [[0, 0, 96, 0, 0, 0, 0, 0]]
