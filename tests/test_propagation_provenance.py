"""Provenance: every inferred sharding knows the chain of instructions and rules it came through,
in memory and through the printed text (`sharding_origin` frontend attributes)."""
import pytest

from gspmdc.errors import GspmdcError
from gspmdc.ir.parser import parse_module
from gspmdc.ir.printer import print_module
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.propagation import ShardingPropagation, explain, propagate

from propagation_helpers import find

TEXT = """
HloModule m
callee {
  x = f32[8,4] parameter(0)
  ROOT y = f32[8,4] negate(x)
}
ENTRY e {
  p0 = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  a = f32[8,4] add(p0, p0)
  k = f32[8,4] call(a), to_apply=callee
  t = f32[4,8] transpose(k), dimensions={1,0}
  q = f32[4,8] parameter(1)
  b = f32[4,8] copy(q)
  m = f32[4,8] multiply(t, b)
  ROOT r = (f32[4,8]) tuple(m)
}"""


def propagated():
    return propagate(parse_module(TEXT, "<test>"))


def test_chain_leads_back_to_the_user_annotation():
    lines = explain(propagated(), "b")
    assert lines[0].startswith("b  {devices=[1,2]<=[2]}  ← backward from m via elementwise")
    names = [line.split()[0] for line in lines]
    assert names == ["b", "m", "t", "k", "y", "x", "a", "p0"]
    assert "forward from k via transpose" in lines[2]
    assert "control flow from callee:y" in lines[3]
    assert "caller operand" in lines[5] and "forward from e:a" in lines[5]
    assert lines[-1] == "p0  {devices=[2,1]<=[2]}  ← user annotation"


def test_max_steps():
    assert len(explain(propagated(), "b", max_steps=2)) == 2
    with pytest.raises(GspmdcError):
        explain(propagated(), "b", max_steps=0)


def test_chain_survives_printing_and_parsing():
    module = parse_module(TEXT, "<test>")
    ctx = PassContext()
    run_pipeline(ctx, module, [ShardingPropagation()])
    text = print_module(module)
    assert 'sharding_origin="' in text
    again = parse_module(text, "<printed>")
    for name in ("b", "m", "t", "k", "callee:y", "a"):
        assert explain(again, name) == explain(module, name, provenance=ctx.provenance["propagate"])


def test_unsharded_and_unknown_instructions():
    module = propagated()
    assert explain(module, "q") == ["q  (no sharding)"]
    with pytest.raises(GspmdcError, match="no instruction named 'nope'"):
        explain(module, "nope")


def test_an_unknown_annotation_is_named_where_it_stays_replicated():
    module = propagate(parse_module("""
HloModule m
ENTRY e {
  p = f32[8] parameter(0)
  y = f32[8] negate(p), sharding={unknown}
  ROOT z = f32[8] abs(y)
}""", "<test>"))
    assert explain(module, "y") == ["y  {replicated}  ← {unknown} annotation, taken as replicated"]


def test_origins_can_stay_out_of_the_text():
    module = parse_module(TEXT, "<test>")
    ctx = PassContext()
    run_pipeline(ctx, module, [ShardingPropagation(record_origins=False)])
    assert "sharding_origin" not in print_module(module)
    assert len(explain(module, "b", provenance=ctx.provenance["propagate"])) == 8


def test_malformed_origin_attribute_is_a_clear_error():
    module = propagated()
    text = print_module(module).replace('sharding_origin="backward|', 'sharding_origin="backward')
    with pytest.raises(GspmdcError, match="malformed sharding_origin"):
        explain(parse_module(text, "<bad>"), "b")


def test_existing_frontend_attributes_are_kept():
    module = propagate(parse_module(TEXT.replace(
        "b = f32[4,8] copy(q)", 'b = f32[4,8] copy(q), frontend_attributes={keep="1"}'), "<t>"))
    attrs = find(module, "b").attrs["frontend_attributes"]
    assert attrs.get("keep") == "1" and attrs.get("sharding_origin")


def test_a_source_or_computation_no_longer_in_the_module_ends_the_chain():
    module = parse_module("""HloModule m
ENTRY e {
  p = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  a = f32[8] negate(p), sharding={devices=[2]<=[2]}, frontend_attributes={sharding_origin="forward|elementwise|gone@0|0|"}
  b = f32[8] negate(p), sharding={devices=[2]<=[2]}, frontend_attributes={sharding_origin="forward|call|inlined:x@1|0|"}
  ROOT r = (f32[8], f32[8]) tuple(a, b)
}""")
    assert explain(module, "a")[1].startswith("gone  ← no longer in the module: it was removed")
    assert explain(module, "b")[1].startswith("x  ← no longer in the module: its computation "
                                              "inlined was removed")


def test_recorded_origins_that_loop_end_the_chain():
    """Hand-edited attributes whose sources lead back to each other: the chain ends (no hang)."""
    module = parse_module("""HloModule m
ENTRY e {
  p = f32[8] parameter(0)
  a = f32[8] negate(p), sharding={devices=[2]<=[2]}, frontend_attributes={sharding_origin="forward|elementwise|b@0|0|"}
  ROOT b = f32[8] negate(a), sharding={devices=[2]<=[2]}, frontend_attributes={sharding_origin="forward|elementwise|a@0|0|"}
}""")
    lines = explain(module, "a")
    assert [line.split()[0] for line in lines] == ["a", "b", "a"]
    assert lines[-1].endswith("(the recorded origins lead back here: a cycle)")
