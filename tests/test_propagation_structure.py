"""Control flow, tuples, constraints, manual regions, shard groups, barriers and the entry
policy (docs/design/propagation.md), with expected shardings worked out by hand."""
import pytest

from gspmdc.errors import GspmdcError
from gspmdc.ir.parser import parse_module
from gspmdc.passes import pass_manager
from gspmdc.passes.pass_table import make_pass
from gspmdc.passes.propagation import PropagationError, driver, parse_flags, propagate

from propagation_helpers import expect, find, run, sharding_of
from hlo_text import reducer

LOOP = """
HloModule m
cond {
  cp = (s32[], f32[8,4]) parameter(0)
  i = s32[] get-tuple-element(cp), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  bp = (s32[], f32[8,4]) parameter(0)
  i = s32[] get-tuple-element(bp), index=0
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x = f32[8,4] get-tuple-element(bp), index=1
  y = f32[8,4] exponential(x)
  ROOT bt = (s32[], f32[8,4]) tuple(i1, y)
}
ENTRY e {
  z = s32[] constant(0)
  p = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  init = (s32[], f32[8,4]) tuple(z, p)
  w = (s32[], f32[8,4]) while(init), condition=cond, body=body
  r = f32[8,4] get-tuple-element(w), index=1
  ROOT c = (f32[8,4]) tuple(r)
}"""


def test_while_loop_body_condition_operand_and_result_agree():
    m = run(LOOP)
    loop = "{{replicated}, {devices=[2,1]<=[2]}}"
    expect(m, init=loop, w=loop, bt=loop, bp=loop, cp=loop, x="{devices=[2,1]<=[2]}",
           y="{devices=[2,1]<=[2]}", r="{devices=[2,1]<=[2]}")


def test_root_while_gets_a_copy_when_the_output_is_fixed():
    text = LOOP.replace("  r = f32[8,4] get-tuple-element(w), index=1\n  ROOT c = (f32[8,4]) tuple(r)\n",
                        "").replace("  w = (s32[], f32[8,4]) while", "  ROOT w = (s32[], f32[8,4]) while")
    m = run(text)
    root = m.entry.root
    assert root.opcode == "copy" and root.operands[0].name == "w" and root.sharding is None
    expect(m, w="{{replicated}, {devices=[2,1]<=[2]}}")
    m = run(text, propagate_to_output=True)
    assert m.entry.root.name == "w"


def test_conditional_branches_follow_their_operands_and_roots_agree():
    m = run("""
HloModule m
on_true {
  tp = f32[8] parameter(0)
  ROOT tn = f32[8] negate(tp)
}
on_false {
  fp = f32[8] parameter(0)
  ROOT fe = f32[8] exponential(fp)
}
ENTRY e {
  c = pred[] parameter(0)
  a = f32[8] parameter(1), sharding={devices=[2]<=[2]}
  b = f32[8] parameter(2)
  k = f32[8] conditional(c, a, b), true_computation=on_true, false_computation=on_false
  ROOT t = (f32[8]) tuple(k)
}""")
    # the true branch follows a; the conditional and both roots share one sharding; the false
    # branch's parameter is copied back to operand b
    s = "{devices=[2]<=[2]}"
    expect(m, tp=s, tn=s, fe=s, k=s, fp=s, b=None)


def test_call_callee_parameter_and_root():
    m = run("""
HloModule m
callee {
  x = f32[8,4] parameter(0)
  ROOT y = f32[8,4] negate(x)
}
ENTRY e {
  p = f32[8,4] parameter(0), sharding={devices=[1,2]<=[2]}
  q = f32[8,4] copy(p)
  k = f32[8,4] call(q), to_apply=callee
  ROOT t = (f32[8,4]) tuple(k)
}""")
    s = "{devices=[1,2]<=[2]}"
    expect(m, x=s, y=s, k=s)


def test_tuple_and_get_tuple_element():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  q = f32[4] parameter(1)
  t = (f32[8], f32[4]) tuple(p, q)
  g = f32[4] get-tuple-element(t), index=1
  h = f32[4] copy(g), sharding={devices=[2]<=[2]}
  g0 = f32[8] get-tuple-element(t), index=0
  ROOT r = (f32[4], f32[8]) tuple(h, g0)
}""")
    # leaf 0 from p, leaf 1 backward from h through the get-tuple-element
    expect(m, t="{{devices=[2]<=[2]}, {devices=[2]<=[2]}}", g0="{devices=[2]<=[2]}",
           g="{devices=[2]<=[2]}")


def test_sharding_custom_call_is_a_fixed_constraint_pushed_to_its_operand():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,4] parameter(0)
  a = f32[8,4] negate(p)
  s = f32[8,4] custom-call(a), custom_call_target="Sharding", sharding={devices=[2,1]<=[2]}
  b = f32[8,4] exponential(s)
  c = f32[8,4] copy(b), sharding={devices=[1,2]<=[2]}
  ROOT t = (f32[8,4]) tuple(c)
}""")
    s = find(m, "s")
    assert s.opcode == "copy" and not s.attrs
    # the constraint survives the user's different layout; b sits between the two and follows
    # the constraint (forward, level 0) before the user could pull it
    expect(m, s="{devices=[2,1]<=[2]}", a="{devices=[2,1]<=[2]}", b="{devices=[2,1]<=[2]}")


def test_unspecified_dims_are_refined_from_a_neighbour():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,8] parameter(0)
  a = f32[8,8] copy(p), sharding={devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}
  s = f32[8,8] custom-call(a), custom_call_target="Sharding",
      backend_config="unspecified_dims=[1]", sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  b = f32[8,8] copy(s)
  ROOT t = (f32[8,8]) tuple(b)
}""")
    # rows fixed on {0,1}/{2,3}; columns (unspecified) from a, on {0,2}/{1,3}: cell (i,j) = 2i+j
    expect(m, s="{devices=[2,2]<=[4]}", b="{devices=[2,2]<=[4]}")


MANUAL = """
HloModule m
""" + reducer("sum", "add") + """
ENTRY e {
  p = f32[8,4] parameter(0)
  a = f32[8,4] copy(p), sharding={devices=[2,1]<=[2]}
  to_manual = f32[4,4] custom-call(a), custom_call_target="SPMDFullToShardShape", sharding={manual}
  n = f32[4,4] negate(to_manual)
  z = f32[] constant(0)
  r = f32[4] reduce(n, z), dimensions={1}, to_apply=sum
  back = f32[4] copy(r)
  full = f32[8] custom-call(back), custom_call_target="SPMDShardToFullShape", sharding={devices=[2]<=[2]}
  ROOT t = (f32[8]) tuple(full)
}"""


def test_manual_flows_inside_a_manual_region_and_stops_at_its_exit():
    m = run(MANUAL)
    expect(m, n="{manual}", r="{manual}", back="{manual}", z="{manual}",
           full="{devices=[2]<=[2]}", a="{devices=[2,1]<=[2]}")


def test_shard_like_groups_exchange_shardings():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[2,1]<=[2]}
  a = f32[8,8] negate(p)
  sa = f32[8,8] custom-call(a), custom_call_target="Sharding", sharding={unknown shard_like 0}
  q = f32[8,8] parameter(1)
  b = f32[8,8] exponential(q)
  sb = f32[8,8] custom-call(b), custom_call_target="Sharding", sharding={unknown shard_like 0}
  ROOT t = (f32[8,8], f32[8,8]) tuple(sa, sb)
}""")
    # `{unknown shard_like 0}` constraints only put their operands in the group and go
    s = "{devices=[2,1]<=[2]}"
    expect(m, a=s, b=s)
    assert not [i for i in m.entry.instructions if i.opcode == "custom-call"]


def test_shard_as_members_end_with_one_sharding():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  a = f32[8,8] negate(p)
  sa = f32[8,8] custom-call(a), custom_call_target="Sharding", sharding={unknown shard_as 1}
  q = f32[8,8] parameter(1), sharding={devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}
  b = f32[8,8] exponential(q)
  sb = f32[8,8] custom-call(b), custom_call_target="Sharding", sharding={unknown shard_as 1}
  ROOT t = (f32[8,8], f32[8,8]) tuple(sa, sb)
}""")
    # the two partial shardings merge into the common one, on the constraints' operands
    expect(m, a="{devices=[2,2]<=[4]}", b="{devices=[2,2]<=[4]}")


def test_shard_barriers():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  f = f32[8] custom-call(p), custom_call_target="ShardBarrierFrom", custom_call_has_side_effect=true
  a = f32[8] negate(f)
  q = f32[8] parameter(1)
  b = f32[8] copy(q)
  to = f32[8] custom-call(b), custom_call_target="ShardBarrierTo", custom_call_has_side_effect=true
  c = f32[8] add(to, a), sharding={devices=[2]<=[2]}
  ROOT t = (f32[8], f32[8]) tuple(a, c)
}""")
    # nothing crosses a barrier-from forward; a barrier-to hands its operand only {replicated};
    # both barriers are removed afterwards
    assert all(i.opcode != "custom-call" for i in m.entry.instructions)
    expect(m, b="{replicated}")
    assert find(m, "c").operands[0].name == "b"


@pytest.mark.parametrize("flags, expected", [
    ((True,), ["{devices=[4]<=[4]}", "{devices=[4]<=[4]}"]),
    ((False, True), ["{replicated}", "{devices=[4]<=[4]}"]),
    ((True, False), ["{devices=[4]<=[4]}", None]),
])
def test_parameter_flags(flags, expected):
    m = run("""
HloModule m
ENTRY e {
  p0 = f32[8] parameter(0), sharding={replicated}
  p1 = f32[8] parameter(1)
  ROOT a = f32[8] add(p0, p1), sharding={devices=[4]<=[4]}
}""", propagate_to_parameters=flags)
    expect(m, p0=expected[0], p1=expected[1])


def test_output_tuple_flags_and_uneven_outputs():
    m = run("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  a = f32[8] negate(p)
  s = f32[6] slice(a), slice={[0:6]}
  ROOT t = (f32[8], f32[6], f32[8]) tuple(a, s, a), sharding={{replicated}, {replicated}, {replicated}}
}""", propagate_to_output=(True, True, False))
    # element 0 propagated; element 1 would be cut unevenly (6 over 4) -> replicated;
    # element 2 keeps the input's
    expect(m, t="{{devices=[4]<=[4]}, {replicated}, {replicated}}")


def test_cse_prevention_only_keeps_shardings_on_scalar_broadcasts_only():
    m = run("""
HloModule m
ENTRY e {
  p = f32[] parameter(0), sharding={replicated}
  b = f32[8] broadcast(p), dimensions={}
  a = f32[8] negate(b)
  ROOT c = f32[8] copy(a), sharding={devices=[2]<=[2]}
}""", cse_prevention_only=True)
    b = find(m, "b")
    assert b.sharding.metadata[0].get("op_name") == "_sharding_propagation_cse_prevention"
    expect(m, b="{devices=[2]<=[2]}", a=None)
    # a later normal run drops the marked sharding before propagating again
    propagate(m, record_origins=False)
    expect(m, b="{devices=[2]<=[2]}", a="{devices=[2]<=[2]}")
    assert not b.sharding.metadata


def test_while_channel_devices_conflict_is_an_error():
    with pytest.raises(PropagationError, match="conflicts with device 1"):
        run("""
HloModule m
cond {
  cp = f32[] parameter(0)
  ROOT t = pred[] constant(true)
}
body {
  bp = f32[] parameter(0)
  aa = token[] after-all()
  r = (f32[], u32[], token[]) recv(aa), channel_id=1, sharding={{maximal device=1}, {maximal device=1}, {maximal device=1}}
  rd = (f32[], token[]) recv-done(r), channel_id=1
  ROOT d = f32[] get-tuple-element(rd), index=0, sharding={maximal device=0}
}
ENTRY e {
  p = f32[] parameter(0)
  ROOT w = f32[] while(p), condition=cond, body=body
}""", is_spmd=False)


def test_non_convergence_is_reported(monkeypatch):
    monkeypatch.setattr(driver, "MAX_CHANGES", 0)
    with pytest.raises(PropagationError, match="does not converge: a changed 1 times"):
        run("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  a = f32[8] negate(p)
  ROOT t = (f32[8]) tuple(a)
}""")


def test_pass_from_the_table_and_flag_parsing():
    module = parse_module("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  ROOT a = f32[8] negate(p)
}""")
    pass_ = make_pass("propagate", {"propagate_to_output": "true"})
    assert pass_.propagate_to_output == (True,)
    out = pass_manager.run_pipeline(pass_manager.PassContext(2), module, [pass_])
    assert sharding_of(out, "a").is_tiled
    assert parse_flags("true") == (True,)
    assert parse_flags("false, TRUE") == (False, True)
    with pytest.raises(GspmdcError):
        parse_flags("yes")


@pytest.mark.parametrize("to_output", [False, True])
def test_one_sharding_on_a_tuple_means_the_same_as_one_per_leaf(to_output):
    # found by fuzzing: `sharding={maximal device=1}` on a tuple-shaped instruction made the
    # tuple rule index past an empty leaf list (IndexError), and the entry policy rebuild the
    # root's sharding as `sharding={}`; it must propagate exactly as its per-leaf spelling
    text = """
HloModule m
ENTRY e {
  p = f32[4] parameter(0), sharding={devices=[2]<=[2]}
  q = s32[3] parameter(1)
  ROOT t = (f32[4], s32[3]) tuple(p, q), sharding=SHARDING
}"""
    one = run(text.replace("SHARDING", "{maximal device=1}"), propagate_to_output=to_output)
    per_leaf = run(text.replace("SHARDING", "{{maximal device=1}, {maximal device=1}}"),
                   propagate_to_output=to_output)
    assert sharding_of(one, "t") == sharding_of(per_leaf, "t")
    assert len(sharding_of(one, "t").elements) == 2
