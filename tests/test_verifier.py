"""The module verifier: a valid module passes, and each check rejects a module built to break it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspmdc.errors import GspmdcError, UnsupportedError, VerificationError
from gspmdc.ir.attributes import ComputationRef, Ident, RawAttr
from gspmdc.ir.module import Computation, Module
from gspmdc.ir.parser import parse_module
from gspmdc.ir.shape_inference import check_shape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.verifier import verify_module

from shape_test_builders import computation, module_of, op, param, scalar_computation


def valid_module(**attrs) -> Module:
    """sum(x * y) with a reducer, plus a while loop counting to 3."""
    add = scalar_computation("add", "add", ["f32", "f32"])
    cp = param("s32[]", 0, "c.i")
    cond = computation("cond", [cp], [
        three := op("constant", shape="s32[]", name="c.3"),
        op("compare", cp, three, shape="pred[]", direction=Ident("LT"), name="c.lt")])
    bp = param("s32[]", 0, "b.i")
    body = computation("body", [bp], [
        one := op("constant", shape="s32[]", name="b.1"),
        op("add", bp, one, shape="s32[]", name="b.next")])
    x, y = param("f32[8]", 0, "x"), param("f32[8]", 1, "y")
    x.sharding = HloSharding.iota_tiled([2])
    prod_ = op("multiply", x, y, shape="f32[8]", name="mul")
    zero = op("constant", shape="f32[]", name="zero")
    total = op("reduce", prod_, zero, shape="f32[]", dimensions=(0,),
               to_apply=ComputationRef("add"), name="sum")
    start = op("constant", shape="s32[]", name="start")
    loop = op("while", start, shape="s32[]", condition=ComputationRef("cond"),
              body=ComputationRef("body"), name="loop")
    root = op("tuple", total, loop, shape="(f32[], s32[])", name="out")
    main = computation("main", [x, y], [prod_, zero, total, start, loop, root])
    return module_of(add, cond, body, main, **attrs)


def problems(module: Module) -> list[str]:
    return verify_module(module, collect=True)


def test_valid_module_passes():
    module = valid_module(num_partitions=2)
    assert verify_module(module) is None
    assert problems(module) == []


def test_shape_mismatch_message():
    module = valid_module()
    module.computation("main").instruction("mul").shape = param("f32[4]").shape
    with pytest.raises(VerificationError) as info:
        verify_module(module)
    assert str(info.value) == ("computation main, instruction mul: result shape f32[4] is "
                               "incompatible with inferred f32[8]")


def test_missing_entry_and_second_entry():
    module = valid_module()
    module.entry_name = "nowhere"
    assert any("entry computation nowhere does not exist" in p for p in problems(module))
    module = valid_module()
    module.computation("add").is_entry = True
    assert problems(module) == ["computation add is marked ENTRY, but the entry is main"]


def test_recursion_is_rejected():
    module = valid_module()
    body = module.computation("body")
    # body calls itself through a call instruction
    body.instructions.insert(1, op("call", body.instructions[0], shape="s32[]",
                                   to_apply=ComputationRef("body"), name="b.self"))
    assert "computation body: recursive call chain body -> body" in problems(module)


def test_root_must_belong_to_the_computation():
    module = valid_module()
    module.computation("main").root = param("f32[8]", 0, "stranger")
    assert problems(module) == ["computation main: root stranger is not an instruction of the "
                                "computation"]


def test_duplicate_instruction_names():
    module = valid_module()
    module.computation("main").instruction("zero").name = "mul"
    assert "computation main: instruction name mul is defined more than once" in problems(module)


def test_parameter_numbers_dense_and_unique():
    module = valid_module()
    module.computation("main").instruction("y").parameter_number = 0
    found = problems(module)
    assert "computation main: parameter number 0 is used more than once" in found
    module = valid_module()
    module.computation("main").instruction("y").parameter_number = 2
    assert problems(module) == ["computation main: parameter numbers [0, 2] are not 0..n-1"]


def test_ssa_order():
    module = valid_module()
    main = module.computation("main")
    mul = main.instruction("mul")
    main.instructions.remove(mul)
    main.instructions.insert(main.instructions.index(main.instruction("sum")) + 1, mul)
    assert problems(module) == ["computation main, instruction sum: operand 0 (mul) is used "
                                "before its definition"]


def test_operand_from_another_computation():
    module = valid_module()
    foreign = module.computation("body").instruction("b.1")
    module.computation("main").instruction("loop").operands = [foreign]
    assert problems(module) == ["computation main, instruction loop: operand 0 (b.1) is not an "
                                "instruction of the computation"]


def test_unknown_called_computation():
    module = valid_module()
    module.computation("main").instruction("sum").attrs["to_apply"] = ComputationRef("mul")
    assert problems(module) == ["computation main, instruction sum: calls unknown computation mul"]


def test_missing_result_shape():
    module = valid_module()
    module.computation("main").instruction("mul").shape = None
    assert problems(module) == ["computation main, instruction mul: no result shape"]


def test_operand_count():
    module = valid_module()
    main = module.computation("main")
    main.instruction("mul").operands.append(main.instruction("x"))
    assert problems(module) == ["computation main, instruction mul: multiply takes 2 operands, "
                                "found 3"]


def test_reducer_signature():
    module = valid_module()
    add = module.computation("add")
    add.root.shape = param("s32[]").shape
    found = problems(module)
    assert any("instruction sum: reducer add result 0 must be a f32[] scalar" in p for p in found)


def test_while_condition_must_return_pred():
    module = valid_module()
    cond = module.computation("cond")
    cond.root = cond.instruction("c.3")
    assert problems(module) == ["computation main, instruction loop: condition cond must return "
                                "pred[], returns s32[]"]


def test_while_body_must_keep_the_state():
    module = valid_module()
    module.computation("body").instruction("b.i").shape = param("f32[]").shape
    found = problems(module)
    assert any("instruction loop: body body parameter 0 has shape f32[]" in p for p in found)


def test_conditional_branch_count_and_results():
    module = valid_module()
    main = module.computation("main")
    pred = op("constant", shape="pred[]", name="pred")
    start = main.instruction("start")
    cond = op("conditional", pred, start, shape="s32[]", name="branch",
              branch_computations=(ComputationRef("body"), ComputationRef("body")))
    main.instructions[-1:-1] = [pred, cond]
    found = problems(module)
    assert any("instruction branch: branch index must be s32[]" in p for p in found)
    pred.shape = param("s32[]").shape
    found = problems(module)
    assert found == ["computation main, instruction branch: conditional has 2 branches but 1 "
                     "branch operands"]


def test_invalid_sharding():
    module = valid_module(num_partitions=2)
    module.computation("main").instruction("y").sharding = HloSharding.iota_tiled([2, 1])
    found = problems(module)
    assert len(found) == 1 and found[0].startswith(
        "computation main, instruction y: invalid sharding:")
    assert "rank" in found[0]
    module = valid_module(num_partitions=2)
    module.computation("main").instruction("x").sharding = HloSharding.iota_tiled([4])
    assert any("invalid sharding" in p for p in problems(module))


def test_unknown_opcode_is_unsupported():
    module = valid_module()
    main = module.computation("main")
    main.instruction("mul").opcode = "frobnicate"
    with pytest.raises(UnsupportedError, match="computation main, instruction mul: unknown opcode"):
        verify_module(module)


def test_collect_reports_every_problem_and_raise_reports_the_first():
    module = valid_module()
    main = module.computation("main")
    main.instruction("mul").shape = param("f32[4]").shape
    main.instruction("y").parameter_number = 5
    found = problems(module)
    assert len(found) == 2  # parameter numbering, mul's shape (sum of an f32[4] is still f32[])
    assert found[0] == "computation main: parameter numbers [0, 5] are not 0..n-1"
    with pytest.raises(VerificationError, match="parameter numbers"):
        verify_module(module)


def test_empty_computation_without_root():
    module = Module("m", [Computation("main", [], None)], "main")
    assert problems(module) == ["computation main: no root instruction"]


def test_constant_literal_must_fill_the_shape():
    module = parse_module("HloModule m\nENTRY e {\n  ROOT c = f32[2,3] constant({{1,2,3},{4,5,6}})\n}")
    assert problems(module) == []
    module.entry.root.shape = param("f32[3,2]").shape
    assert problems(module) == ["computation e, instruction c: literal of shape (2, 3) and type "
                                "float32 does not fill f32[3,2]"]


def test_outfeed_sharding_describes_the_data():
    text = """HloModule m, num_partitions=2
ENTRY e {
  data = (f32[4,2], f32[2]) parameter(0)
  token = token[] after-all()
  ROOT out = token[] outfeed(data, token), sharding=%s
}"""
    for sharding in ("{{devices=[2,1]0,1}, {replicated}}",
                     "{{devices=[2,1]0,1}, {replicated}, {maximal device=0}}", "{replicated}"):
        assert problems(parse_module(text % sharding)) == [], sharding
    found = problems(parse_module(text % "{devices=[2]0,1}"))
    assert len(found) == 1 and "invalid sharding" in found[0]


# ---- the team's corpora -------------------------------------------------------------------------

SHARED = Path(__file__).resolve().parents[2] / "shared"


def _corpus(name: str) -> list[tuple[str, str, int | None]]:
    """(label, HLO text, partition count the case runs with) for every module of a corpus."""
    if name == "jax-programs":
        return [(str(p.relative_to(SHARED)), p.read_text(), None)
                for p in sorted(SHARED.glob("jax-programs/*/*.hlo"))]
    cases = json.loads((SHARED / "conformance" / f"{name}.json").read_text())["cases"]
    return [(c["name"], c["hlo"], c.get("num_devices")) for c in cases]


@pytest.mark.parametrize("corpus", ["xla-propagation", "xla-partitioner", "jax-programs"])
def test_every_corpus_module_verifies(corpus):
    """XLA accepts every module of the corpora (the cases that expect an error expect it from
    propagation or partitioning, not from the verifier), so gspmdc's verifier must too."""
    if not SHARED.is_dir():
        pytest.skip("../shared (the team's corpora) is absent")
    failures = {}
    modules = _corpus(corpus)
    assert modules, f"corpus {corpus} is empty"
    for label, text, num_devices in modules:
        module = parse_module(text)
        if num_devices is not None and module.num_partitions is None:
            module.attrs["num_partitions"] = num_devices
        found = verify_module(module, collect=True)
        if found:
            failures[label] = found
    assert not failures, "\n".join(f"{label}: {p}" for label, ps in failures.items() for p in ps)


def _mutations(inst):
    """Ways to break one instruction: operand count/order, each attribute removed or given
    out-of-range or ill-typed values, the result shape dropped."""
    operands = list(inst.operands)
    if operands:
        yield lambda: inst.operands.pop()
        yield lambda: inst.operands.append(operands[0])
        yield lambda: inst.operands.reverse()
    for key, value in list(inst.attrs.items()):
        yield lambda k=key: inst.attrs.pop(k)
        yield lambda k=key: inst.attrs.__setitem__(k, RawAttr("?"))
        if isinstance(value, tuple):
            yield lambda k=key, v=value: inst.attrs.__setitem__(k, (99,) * len(v))
            yield lambda k=key, v=value: inst.attrs.__setitem__(k, (-1,) * len(v))
        if isinstance(value, int) and not isinstance(value, bool):
            yield lambda k=key: inst.attrs.__setitem__(k, -5)
    yield lambda: setattr(inst, "shape", None)


def test_broken_instructions_get_clear_errors_not_crashes():
    """Every way of breaking an instruction of the partitioner corpus gives a GspmdcError (or
    passes), never another exception."""
    if not SHARED.is_dir():
        pytest.skip("../shared (the team's corpora) is absent")
    for _, text, _ in _corpus("xla-partitioner"):
        module = parse_module(text)
        for _, inst in module.all_instructions():
            for mutate in list(_mutations(inst)):
                saved = list(inst.operands), dict(inst.attrs), inst.shape
                mutate()
                try:
                    check_shape(inst, module)
                except GspmdcError:
                    pass
                inst.operands, inst.attrs, inst.shape = saved


@pytest.mark.parametrize("target", ["Sharding", "ShardBarrierFrom", "ShardBarrierTo",
                                    "SPMDFullToShardShape", "SPMDShardToFullShape", "TopK"])
def test_custom_calls_with_a_meaning_take_one_operand(target):
    # found by fuzzing: a constraint, barrier or region boundary without an operand verified,
    # then propagation and partitioning read its operand 0 (IndexError, exit 3)
    text = f"""HloModule m
ENTRY e {{
  p = f32[4] parameter(0)
  c = f32[4] custom-call(), custom_call_target="{target}"
  ROOT a = f32[4] add(p, c)
}}"""
    with pytest.raises(VerificationError, match=f"custom-call {target} takes 1 operand, found 0"):
        verify_module(parse_module(text))
    opaque = verify_module(parse_module(text.replace(target, "my_kernel")))
    assert opaque is None


@pytest.mark.parametrize("written, shown", [("-1", "-1"), ('<"Sharding"', '<"Sharding"')])
def test_a_custom_call_target_is_a_string(written, shown):
    # found by make fuzz: propagation joined non-string targets into its provenance (exit 3)
    text = f"""HloModule m
ENTRY e {{
  p = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(p), custom_call_target={written}
}}"""
    with pytest.raises(VerificationError, match=f"custom_call_target must be a string, found {shown}"):
        verify_module(parse_module(text))


def test_a_func_result_sharding_carries_its_sharding():
    # found by make fuzz: a mistyped key (xla.xdy.sharding) reached Shardy propagation (exit 3)
    text = """HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}
ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = f32[4] custom-call(p), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.xdy.sharding="x"}
}"""
    with pytest.raises(VerificationError, match="needs its xla.sdy.sharding frontend attribute"):
        verify_module(parse_module(text))
    good = text.replace('xla.xdy.sharding="x"',
                        'xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"x\\"}]>]>"')
    assert verify_module(parse_module(good)) is None
    # outside a Shardy module (no xla.sdy.meshes) it is an identity annotation, as XLA takes it
    gspmd = text.replace(", frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=2]>}}", "")
    assert "meshes" not in gspmd
    assert verify_module(parse_module(gspmd)) is None


@pytest.mark.parametrize("target", ["xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape"])
def test_shardy_region_boundaries_take_one_or_more_operands(target):
    # a shard_map with several inputs or outputs crosses its boundary in one custom-call
    text = f"""HloModule m
ENTRY e {{
  p = f32[4] parameter(0)
  q = f32[2] parameter(1)
  c = (f32[4], f32[2]) custom-call(p, q), custom_call_target="{target}"
  ROOT a = f32[4] get-tuple-element(c), index=0
}}"""
    assert verify_module(parse_module(text)) is None
    empty = text.replace("custom-call(p, q)", "custom-call()")
    with pytest.raises(VerificationError, match=f"custom-call {target} takes at least 1 operand"):
        verify_module(parse_module(empty))


def test_a_sharding_constraint_keeps_its_operand_shape():
    text = """HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  ROOT c = f32[5] custom-call(p), custom_call_target="Sharding", sharding={replicated}
}"""
    with pytest.raises(VerificationError, match=r"must have its operand's shape f32\[4\]"):
        verify_module(parse_module(text))
