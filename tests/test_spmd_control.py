"""Partitioning of control flow: while loops with sharded loop state, conditionals and calls.

Each program is partitioned, run on the local backend (uneven padding filled with garbage) and
compared with the unpartitioned program on the reference interpreter; the collectives of the
partitioned loop bodies and branches are checked against what the shardings require."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.errors import GspmdcError

from spmd_partition_helpers import check_equivalent, partition
from hlo_text import reducer

ADD = reducer("add")

WHILE = ADD + """
cond {
  p = (s32[], f32[8,6], f32[6,6]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[8,6], f32[6,6]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,6] get-tuple-element(p), index=1, sharding={devices=[4,1]<=[4]}
  w = f32[6,6] get-tuple-element(p), index=2, sharding={replicated}
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  d = f32[8,6] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[4,1]<=[4]}
  z = f32[8,6] tanh(d), sharding={devices=[4,1]<=[4]}
  ROOT t = (s32[], f32[8,6], f32[6,6]) tuple(i1, z, w),
    sharding={{replicated}, {devices=[4,1]<=[4]}, {replicated}}
}

ENTRY e {
  a = f32[8,6] parameter(0), sharding={devices=[4,1]<=[4]}
  w = f32[6,6] parameter(1), sharding={replicated}
  zero = s32[] constant(0), sharding={replicated}
  t = (s32[], f32[8,6], f32[6,6]) tuple(zero, a, w),
    sharding={{replicated}, {devices=[4,1]<=[4]}, {replicated}}
  loop = (s32[], f32[8,6], f32[6,6]) while(t), condition=cond, body=body,
    sharding={{replicated}, {devices=[4,1]<=[4]}, {replicated}}
  ROOT r = f32[8,6] get-tuple-element(loop), index=1, sharding={devices=[4,1]<=[4]}
}
"""


def _computation(module, prefix):
    return next(c for name, c in module.computations.items() if name.startswith(prefix))


def _collective_opcodes(comp):
    return [i.opcode for i in comp.instructions if i.opcode in
            ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")]


def test_while_with_sharded_state_runs_locally():
    spmd = check_equivalent(WHILE, 4)
    body = _computation(spmd, "body")
    # the state arrives and leaves in its sharding: row-sharded dot, no communication at all
    assert _collective_opcodes(body) == []
    assert body.parameters[0].shape.elements[1].dims == (2, 6)
    assert _collective_opcodes(spmd.entry) == []


def test_while_init_and_body_root_are_resharded_to_the_loop_sharding():
    # the init arrives replicated and the body computes d and z column-sharded: the init is
    # sliced before the loop (no collective) and z is resharded to rows inside the body
    columns = "sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}"
    text = WHILE.replace("a = f32[8,6] parameter(0), sharding={devices=[4,1]<=[4]}",
                         "a = f32[8,6] parameter(0), sharding={replicated}") \
        .replace("t = (s32[], f32[8,6], f32[6,6]) tuple(zero, a, w),\n    sharding={{replicated}, "
                 "{devices=[4,1]<=[4]}, {replicated}}",
                 "t = (s32[], f32[8,6], f32[6,6]) tuple(zero, a, w)")
    resharded = text.replace("z = f32[8,6] tanh(d), sharding={devices=[4,1]<=[4]}",
                             f"z = f32[8,6] tanh(d), {columns}") \
        .replace("rhs_contracting_dims={0},\n    sharding={devices=[4,1]<=[4]}",
                 f"rhs_contracting_dims={{0}},\n    {columns}")
    spmd = check_equivalent(resharded, 4)
    assert _collective_opcodes(spmd.entry) == []
    # (columns held twice to rows: each device lacks the other column half of its rows, sent
    # by its pieces' holders)
    assert set(_collective_opcodes(_computation(spmd, "body"))) == {"collective-permute"}
    # z alone annotated in columns: its only user, the loop state, reads it in rows, so the
    # body computes it in rows from the row-sharded d (no collective)
    alone = text.replace("z = f32[8,6] tanh(d), sharding={devices=[4,1]<=[4]}",
                         f"z = f32[8,6] tanh(d), {columns}")
    spmd = check_equivalent(alone, 4)
    assert _collective_opcodes(spmd.entry) == []
    assert _collective_opcodes(_computation(spmd, "body")) == []


def test_while_condition_reading_sharded_state_is_replicated():
    # the trip count depends on a reduction over the sharded state: every partition must agree
    text = ADD + """
cond {
  p = (s32[], f32[8]) parameter(0)
  x = f32[8] get-tuple-element(p), index=1, sharding={devices=[4]<=[4]}
  z = f32[] constant(0)
  s = f32[] reduce(x, z), dimensions={0}, to_apply=add
  limit = f32[] constant(100)
  ROOT lt = pred[] compare(s, limit), direction=LT
}

body {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8] get-tuple-element(p), index=1, sharding={devices=[4]<=[4]}
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  two = f32[] constant(2)
  b = f32[8] broadcast(two), dimensions={}, sharding={devices=[4]<=[4]}
  y = f32[8] multiply(x, b), sharding={devices=[4]<=[4]}
  ROOT t = (s32[], f32[8]) tuple(i1, y), sharding={{replicated}, {devices=[4]<=[4]}}
}

ENTRY e {
  zero = s32[] constant(0), sharding={replicated}
  c = f32[] constant(1)
  a = f32[8] broadcast(c), dimensions={}, sharding={devices=[4]<=[4]}
  t = (s32[], f32[8]) tuple(zero, a), sharding={{replicated}, {devices=[4]<=[4]}}
  loop = (s32[], f32[8]) while(t), condition=cond, body=body,
    sharding={{replicated}, {devices=[4]<=[4]}}
  ROOT r = s32[] get-tuple-element(loop), index=0, sharding={replicated}
}
"""
    spmd = check_equivalent(text, 4)
    cond = _computation(spmd, "cond")
    assert _collective_opcodes(cond) == ["all-reduce"]
    # the sum is 8 * 2^k after k iterations: below 100 for k = 0..3, so the loop runs 4 times
    from spmd_partition_helpers import run_global
    assert int(run_global(spmd, [], 4)) == 4


CONDITIONAL = ADD + """
Negate {
  x = f32[9,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[9,6] negate(x), sharding={devices=[4,1]<=[4]}
}

ColumnSums {
  y = f32[9,6] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0), sharding={replicated}
  r = f32[6] reduce(y, z), dimensions={0}, to_apply=add, sharding={replicated}
  ROOT b = f32[9,6] broadcast(r), dimensions={1}, sharding={devices=[4,1]<=[4]}
}

ENTRY e {
  p = pred[] parameter(0), sharding={replicated}
  a = f32[9,6] parameter(1), sharding={devices=[4,1]<=[4]}
  c = f32[9,6] parameter(2), sharding={replicated}
  ROOT r = f32[9,6] conditional(p, a, c), true_computation=Negate,
    false_computation=ColumnSums, sharding={devices=[4,1]<=[4]}
}
"""


@pytest.mark.parametrize("taken", [True, False])
def test_conditional_branches_are_partitioned(taken):
    from spmd_partition_helpers import inputs_for
    inputs = inputs_for(CONDITIONAL)
    inputs[0] = np.array(taken)
    spmd = check_equivalent(CONDITIONAL, 4, inputs=inputs)
    assert _collective_opcodes(_computation(spmd, "Negate")) == []
    # the false branch's operand arrives replicated: the column sums needed replicated are
    # computed whole from it on every partition instead of summing per-shard partial sums
    assert _collective_opcodes(_computation(spmd, "ColumnSums")) == []
    branch = _computation(spmd, "ColumnSums")
    assert branch.parameters[0].shape.dims == (9, 6)        # arrives as the operand: replicated
    assert spmd.entry.root.opcode == "conditional"


def test_conditional_selector_is_replicated_before_the_branch():
    # an index selector tiled nowhere but held by one device: broadcast to every partition
    text = """
Double {
  x = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  ROOT y = f32[8] add(x, x), sharding={devices=[2]<=[2]}
}

Same {
  x = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  ROOT y = f32[8] copy(x), sharding={devices=[2]<=[2]}
}

ENTRY e {
  i = s32[] parameter(0), sharding={maximal device=1}
  a = f32[8] parameter(1), sharding={devices=[2]<=[2]}
  ROOT r = f32[8] conditional(i, a, a), branch_computations={Double, Same},
    sharding={devices=[2]<=[2]}
}
"""
    from spmd_partition_helpers import inputs_for
    for index in (0, 1, 7):
        inputs = inputs_for(text)
        inputs[0] = np.array(index, dtype=np.int32)
        spmd = check_equivalent(text, 2, inputs=inputs)
    assert _collective_opcodes(spmd.entry) == ["all-reduce"]


def test_shared_body_is_cloned_per_call_site():
    # one body used by two loops with different state shardings: each gets its own copy
    text = """
cond {
  p = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,8] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  y = f32[8,8] sine(x)
  ROOT t = (s32[], f32[8,8]) tuple(i1, y)
}

ENTRY e {
  a = f32[8,8] parameter(0), sharding={devices=[2,1]<=[2]}
  zero = s32[] constant(0)
  t0 = (s32[], f32[8,8]) tuple(zero, a)
  l0 = (s32[], f32[8,8]) while(t0), condition=cond, body=body,
    sharding={{replicated}, {devices=[2,1]<=[2]}}
  r0 = f32[8,8] get-tuple-element(l0), index=1, sharding={devices=[2,1]<=[2]}
  t1 = (s32[], f32[8,8]) tuple(zero, r0)
  l1 = (s32[], f32[8,8]) while(t1), condition=cond, body=body,
    sharding={{replicated}, {devices=[1,2]<=[2]}}
  ROOT r1 = f32[8,8] get-tuple-element(l1), index=1, sharding={devices=[1,2]<=[2]}
}
"""
    spmd = check_equivalent(text, 2, propagate=True)
    loops = [i for i in spmd.entry.instructions if i.opcode == "while"]
    bodies = {i.attr("body").name for i in loops}
    assert len(bodies) == 2
    shapes = sorted(spmd.computations[b].parameters[0].shape.elements[1].dims for b in bodies)
    assert shapes == [(4, 8), (8, 4)]


def test_call_that_is_not_inlined_runs_on_its_operands_shardings():
    from gspmdc import api
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.spmd import Cleanup, HaloExchange, InsertReshards, LowerSpmd, PadUneven
    from spmd_partition_helpers import assert_close, inputs_for, reference, run_global
    text = """
f {
  x = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  y = f32[8,4] parameter(1), sharding={devices=[2,1]<=[2]}
  ROOT m = f32[8,4] multiply(x, y), sharding={devices=[2,1]<=[2]}
}

ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  b = f32[8,4] parameter(1), sharding={replicated}
  ROOT c = f32[8,4] call(a, b), to_apply=f, sharding={devices=[1,2]<=[2]}
}
"""
    module = api.parse(text)
    spmd = run_pipeline(PassContext(2), module, [InsertReshards(), PadUneven(), HaloExchange(),
                                                 LowerSpmd(), Cleanup()])
    spmd = api.parse(api.to_text(spmd))
    inputs = inputs_for(text)
    assert_close(run_global(spmd, inputs, 2), reference(text, inputs))
    call = next(i for i in spmd.entry.instructions if i.opcode == "call")
    callee = spmd.computations[call.attr("to_apply").name]
    assert callee.parameters[0].shape.dims == (4, 4)        # a arrives row-sharded
    assert callee.parameters[1].shape.dims == (8, 4)        # b arrives replicated


def test_loop_sharding_for_more_devices_is_rejected_cleanly():
    text = WHILE.replace("sharding={{replicated}, {devices=[4,1]<=[4]}, {replicated}}\n  ROOT",
                         "sharding={{replicated}, {devices=[8,1]<=[8]}, {replicated}}\n  ROOT")
    with pytest.raises(GspmdcError):
        partition(text, 4)


def test_nested_loops_and_a_branch_inside_a_loop_keep_their_shardings():
    # the outer loop carries a row-sharded matrix; its body runs an inner loop on the same
    # state and a conditional on the iteration's parity: no collective anywhere
    text = """
inner_cond {
  p = (s32[], f32[8,4]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  two = s32[] constant(2)
  ROOT lt = pred[] compare(j, two), direction=LT
}

inner_body {
  p = (s32[], f32[8,4]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  x = f32[8,4] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j1 = s32[] add(j, one)
  y = f32[8,4] cosine(x)
  ROOT t = (s32[], f32[8,4]) tuple(j1, y)
}

Square {
  x = f32[8,4] parameter(0)
  ROOT y = f32[8,4] multiply(x, x)
}

Halve {
  x = f32[8,4] parameter(0)
  half = f32[] constant(0.5)
  h = f32[8,4] broadcast(half), dimensions={}
  ROOT y = f32[8,4] multiply(x, h)
}

outer_cond {
  p = (s32[], f32[8,4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}

outer_body {
  p = (s32[], f32[8,4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,4] get-tuple-element(p), index=1
  zero = s32[] constant(0)
  t0 = (s32[], f32[8,4]) tuple(zero, x)
  l = (s32[], f32[8,4]) while(t0), condition=inner_cond, body=inner_body
  y = f32[8,4] get-tuple-element(l), index=1
  one = s32[] constant(1)
  parity = s32[] and(i, one)
  z = f32[8,4] conditional(parity, y, y), branch_computations={Square, Halve}
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[8,4]) tuple(i1, z)
}

ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  zero = s32[] constant(0)
  t = (s32[], f32[8,4]) tuple(zero, a)
  l = (s32[], f32[8,4]) while(t), condition=outer_cond, body=outer_body
  ROOT r = f32[8,4] get-tuple-element(l), index=1, sharding={devices=[2,1]<=[2]}
}
"""
    spmd = check_equivalent(text, 2, propagate=True)
    for comp in spmd.computations.values():
        assert _collective_opcodes(comp) == [], comp.name
    assert _computation(spmd, "inner_body").parameters[0].shape.elements[1].dims == (4, 4)
    assert _computation(spmd, "Square").parameters[0].shape.dims == (4, 4)


def test_loop_body_also_mapped_over_elements_is_copied_for_the_loop():
    # `inc` is both a while body (partitioned: its parameter is the loop state) and the
    # function `map` applies to every element (run unchanged on scalars)
    text = """
inc {
  x = f32[] parameter(0)
  one = f32[] constant(1)
  ROOT y = f32[] add(x, one)
}

cond {
  p = f32[] parameter(0)
  limit = f32[] constant(3)
  ROOT lt = pred[] compare(p, limit), direction=LT
}

ENTRY e {
  a = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  m = f32[8] map(a), dimensions={0}, to_apply=inc, sharding={devices=[2]<=[2]}
  zero = f32[] constant(0)
  l = f32[] while(zero), condition=cond, body=inc
  b = f32[8] broadcast(l), dimensions={}, sharding={devices=[2]<=[2]}
  ROOT r = f32[8] add(m, b), sharding={devices=[2]<=[2]}
}
"""
    spmd = check_equivalent(text, 2)
    loop = next(i for i in spmd.entry.instructions if i.opcode == "while")
    mapped = next(i for i in spmd.entry.instructions if i.opcode == "map")
    assert loop.attr("body").name != mapped.attr("to_apply").name


ASYNC_CALL = """HloModule m, num_partitions=2

called_computation {
  p0 = s32[8] parameter(0)
  p1 = s32[8] parameter(1)
  ROOT add = s32[8] add(p0, p1)
}, execution_thread="thread_1"

ENTRY entry_computation {
  p0 = s32[8] parameter(0), sharding=SHARDING
  p1 = s32[8] parameter(1), sharding=SHARDING
  async-start = ((s32[8], s32[8]), s32[8], u32[]) call-start(p0, p1),
    async_execution_thread="thread_1", to_apply=called_computation
  ROOT async-done = s32[8] call-done(async-start), sharding=SHARDING
}, execution_thread="thread_0"
"""


def test_an_async_call_is_partitioned_like_a_call():
    """XLA's call-start/call-done form (the propagation corpus's AsyncInstruction cases): made
    synchronous and inlined, so the callee's add runs on the shards, with no gather."""
    spmd = check_equivalent(ASYNC_CALL.replace("SHARDING", "{devices=[2]<=[2]}"), 2,
                            propagate=True)
    assert [i.opcode for i in spmd.entry.instructions] == ["parameter", "parameter", "add"]


def test_an_async_call_on_manual_values_runs_per_device():
    spmd = partition(ASYNC_CALL.replace("SHARDING", "{manual}"), 2, propagate=True)
    assert [i.opcode for i in spmd.entry.instructions] == ["parameter", "parameter", "add"]
    assert spmd.entry.root.shape.dims == (8,)


def test_while_whose_counter_lives_on_another_device_terminates_everywhere():
    # found by fuzzing: the counter is on device 1 only; on device 0 the local loop state does
    # not change from one iteration to the next (its copy of the counter is a placeholder), while
    # the condition reads the real counter through an all-reduce. The runtime took the unchanged
    # local state for a loop that cannot end (exit 3).
    text = """
HloModule m, num_partitions=2

cond {
  p = (s32[], f32[1,4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[1,4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[1,4] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[1,4]) tuple(i1, x), sharding={{maximal device=1}, {devices=[1,2]<=[2]}}
}

ENTRY e {
  x = f32[1,4] parameter(0)
  start = s32[] constant(-1)
  t = (s32[], f32[1,4]) tuple(start, x), sharding={{maximal device=0}, {maximal device=0}}
  w = (s32[], f32[1,4]) while(t), condition=cond, body=body
  ROOT r = f32[1,4] get-tuple-element(w), index=1
}
"""
    check_equivalent(text, 2, propagate=True)
