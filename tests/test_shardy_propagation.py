"""Shardy's propagation: op sharding rules, projections and the two strategies against the
examples of Shardy's own documentation (worked by hand here), and whole modules against XLA's
Shardy pipeline (its answers recorded in tests/data/shardy/xla by record_xla.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gspmdc import api
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.module import Instruction
from gspmdc.ir.sdy import AxisRef, DimSharding, TensorSharding, instruction_shardings
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.shardy import ShardyOptions, propagate_shardy
from gspmdc.passes.shardy.factor_propagation import BOTH, FORWARD, compatible_major_axes
from gspmdc.passes.shardy.factor_propagation import propagate as solve
from gspmdc.passes.shardy.factor_rules import rule_of
from gspmdc.passes.shardy.projection import FactorSharding, TensorFactors, project, project_back

sys.path.insert(0, str(Path(__file__).parent))
from shardy_differential import agreement  # noqa: E402

DATA = Path(__file__).parent / "data" / "shardy"


def _param(dims, k=0):
    return Instruction(f"p{k}", "parameter", ArrayShape("f32", tuple(dims)), parameter_number=k)


def _inst(opcode, dims, operands, **attrs):
    return Instruction("op", opcode, ArrayShape("f32", tuple(dims)), operands, attrs)


def _rule(inst):
    rule = rule_of(inst, None)
    return rule.factor_sizes, rule.operands, rule.results, rule.reduction


# ---- op sharding rules (propagation.md's examples) --------------------------------------------

def test_dot_rule_is_the_einsum_ik_kj_ij():
    dot = _inst("dot", [8, 16], [_param([8, 32]), _param([32, 16], 1)],
                lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    # factors i=8, j=16, k=32: ([i, k], [k, j]) -> ([i, j]), k a reduction
    assert _rule(dot) == ((8, 16, 32), (((0,), (2,)), ((2,), (1,))), (((0,), (1,)),), (2,))


@pytest.mark.parametrize("in_dims, out_dims, sizes, operand, result", [
    ([2, 4, 32], [8, 32], (2, 4, 32), ((0,), (1,), (2,)), ((0, 1), (2,))),     # (i,j,k)->((ij),k)
    ([8, 32], [2, 4, 32], (2, 4, 32), ((0, 1), (2,)), ((0,), (1,), (2,))),     # ((ij),k)->(i,j,k)
    ([8, 4], [2, 16], (2, 4, 4), ((0, 1), (2,)), ((0,), (1, 2))),             # ((ij),k)->(i,(jk))
])
def test_reshape_rules_use_compound_factors(in_dims, out_dims, sizes, operand, result):
    reshape = _inst("reshape", out_dims, [_param(in_dims)])
    assert _rule(reshape) == (sizes, (operand,), (result,), ())


def test_reduce_maps_reduced_dims_to_reduction_factors():
    reduce = Instruction("r", "reduce", ArrayShape("f32", (8,)),
                         [_param([8, 16]), Instruction("z", "constant", ArrayShape("f32", ()))],
                         {"dimensions": (1,)})
    assert _rule(reduce) == ((8, 16), (((0,), (1,)), ()), (((0,),),), (1,))


# ---- projections ----------------------------------------------------------------------------

def test_projection_splits_axes_over_compound_factors():
    """sharding_projection.h: rule ([ij])->([i, j]) {i=2, j=4}, mesh x=4, y=2, operand
    [{"x", "y"}]: factor i gets "x":(1)2, factor j "x":(2)2 and "y"."""
    mesh = Mesh(["x", "y"], [4, 2])
    operand = TensorSharding("m", (DimSharding((AxisRef("x"), AxisRef("y"))),))
    factors = project(operand, ((0, 1),), (2, 4), mesh)
    assert factors.factors[0].axes == [AxisRef("x", 1, 2)]
    assert factors.factors[1].axes == [AxisRef("x", 2, 2), AxisRef("y")]
    result = TensorFactors({0: FactorSharding(list(factors.factors[0].axes)),
                            1: FactorSharding(list(factors.factors[1].axes), minor_most=True)})
    back = project_back(result, ((0,), (1,)), (2, 4), "m", mesh)
    assert back.dims == (DimSharding((AxisRef("x", 1, 2),), False),
                         DimSharding((AxisRef("x", 2, 2), AxisRef("y")), False))
    # and the operand's projection comes back merged
    assert project_back(factors, ((0, 1),), (2, 4), "m", mesh).dims[0].axes == \
        (AxisRef("x"), AxisRef("y"))


# ---- the strategies -------------------------------------------------------------------------

def _tensor(*factor_axes, closed=False):
    return TensorFactors({f: FactorSharding([AxisRef(a) for a in axes], closed, minor_most=True)
                          for f, axes in enumerate(factor_axes) if axes is not None})


MESH6 = Mesh(["a", "b", "c", "d", "e", "f", "g"], [2] * 7)


@pytest.mark.parametrize("lists, expected", [
    ([["a", "b"], ["a", "c"]], ["a"]),
    ([["a"], [], ["a", "b", "c"], ["a", "b", "d"]], ["a", "b"]),
])
def test_compatible_major_axes(lists, expected):
    tensors = [_tensor(axes) for axes in lists]
    assert compatible_major_axes(tensors, [], 0, BOTH, MESH6) == [AxisRef(a) for a in expected]


def test_compatible_major_axes_of_sub_axes():
    mesh = Mesh(["a", "b"], [4, 2])

    def tensor(*axes):
        return TensorFactors({0: FactorSharding(list(axes), minor_most=True)})

    half, whole = AxisRef("a", 1, 2), AxisRef("a")
    assert compatible_major_axes([tensor(half), tensor(whole)], [], 0, BOTH, mesh) == [whole]
    assert compatible_major_axes([tensor(half, AxisRef("b")), tensor(whole)], [], 0, BOTH,
                                 mesh) == [half]


def test_one_way_direction_lets_only_one_side_extend():
    operands, results = [_tensor(["a"])], [_tensor(["a", "b"])]
    assert compatible_major_axes(operands, results, 0, FORWARD, MESH6) == [AxisRef("a")]


def test_basic_propagation_of_the_documented_table():
    """propagation.md: T0 = (a | - | f), T1 = (a,b | c,d | g), T2 = (- | c,e | -); F0 gets a,b,
    F1 c, F2 nothing (f and g conflict)."""
    from gspmdc.ir.sdy import OpShardingRule
    rule = OpShardingRule((4, 4, 2), (((0,), (1,), (2,)),) * 3, ())
    t0, t1, t2 = _tensor(["a"], [], ["f"]), _tensor(["a", "b"], ["c", "d"], ["g"]), \
        _tensor([], ["c", "e"], [])
    solve([t0, t1, t2], [], rule, lambda f: BOTH, MESH6, "basic")
    assert [t0.factors[k].axes for k in range(3)] == \
        [[AxisRef("a"), AxisRef("b")], [AxisRef("c")], [AxisRef("f")]]
    assert [t2.factors[k].axes for k in range(3)] == \
        [[AxisRef("a"), AxisRef("b")], [AxisRef("c"), AxisRef("e")], []]


def test_aggressive_resolves_a_conflict_the_basic_strategy_leaves():
    """aggressive_factor_propagation.h, case 1: C = dot(A, B), A's non-contracting factor F0 on
    "a", C's F1 (B's non-contracting) on "a": basic propagates nothing; aggressive gives B F1 on
    "a"."""
    from gspmdc.ir.sdy import OpShardingRule
    rule = OpShardingRule((4, 4, 4), (((0,), (2,)), ((2,), (1,))), (((0,), (1,)),), (2,))

    def tensors():
        a = TensorFactors({0: FactorSharding([AxisRef("a")], minor_most=True),
                           2: FactorSharding([], minor_most=True)})
        b = TensorFactors({2: FactorSharding([], minor_most=True),
                           1: FactorSharding([], minor_most=True)})
        c = TensorFactors({0: FactorSharding([], minor_most=True),
                           1: FactorSharding([AxisRef("a")], minor_most=True)})
        return a, b, c

    a, b, c = tensors()
    solve([a, b], [c], rule, lambda f: BOTH, MESH6, "basic")
    assert b.factors[1].axes == [] and c.factors[0].axes == []
    a, b, c = tensors()
    solve([a, b], [c], rule, lambda f: BOTH, MESH6, "aggressive")
    assert b.factors[1].axes == [AxisRef("a")]


# ---- whole modules --------------------------------------------------------------------------

def _sharding_of(module, name):
    inst = next(i for _, i in module.all_instructions() if i.name == name)
    return instruction_shardings(inst)[0]


def test_user_priorities_propagate_in_order():
    """b's {"y"} on dim 1 (p0) reaches sum before a's {"y"} on dim 0 (p1) is let in; c's x (p2)
    comes last, on dim 0."""
    module = api.load(DATA / "handwritten_priorities.hlo")
    propagate_shardy(module)
    assert _sharding_of(module, "sum").body_text() == '@mesh, [{"x"}, {"y"}]'
    without = api.parse((DATA / "handwritten_priorities.hlo").read_text()
                        .replace("}p1", "}").replace("}p2", "}").replace("}p0", "}"))
    propagate_shardy(without)
    assert _sharding_of(without, "sum").body_text() != '@mesh, [{"x"}, {"y"}]'


def test_a_propagation_barrier_passes_one_way():
    text = '''HloModule barrier, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=4, "y"=2]>}}

ENTRY main {
  a = f32[8,8] parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}, {}]>"}
  n = f32[8,8] negate(a)
  bar = f32[8,8] custom-call(n), custom_call_target="xla.sdy.PropagationBarrier", frontend_attributes={xla.sdy.allowed_direction="#sdy<propagation_direction BACKWARD>"}
  b = f32[8,8] parameter(1), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{}, {\\"y\\"}]>"}
  ROOT m = f32[8,8] multiply(bar, b)
}
'''
    module = api.parse(text)
    propagate_shardy(module)
    # x does not pass forward through the barrier; y passes backward into n
    assert _sharding_of(module, "m").body_text() == '@mesh, [{}, {"y"}]'
    assert _sharding_of(module, "n").body_text() == '@mesh, [{"x"}, {"y"}]'


RECORDED = sorted((DATA / "xla").glob("*.before.hlo"))


@pytest.mark.parametrize("before", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_agrees_with_xlas_shardy_pipeline(before):
    """Every named instruction gets the sharding XLA's Shardy pipeline gave it."""
    after = before.with_name(before.name.replace(".before.", ".after."))
    result = agreement(before.read_text(), after.read_text(), before.name)
    assert result.compared > 0
    assert result.differences == []


@pytest.mark.parametrize("strategy", ["basic", "basic-then-aggressive"])
def test_other_strategies_run(strategy):
    module = api.load(DATA / "mlp_out_shardings.hlo")
    from gspmdc.passes.pass_manager import PassContext
    from gspmdc.passes.spmd.inline_calls import InlineCalls
    InlineCalls().apply(PassContext(), module)
    propagate_shardy(module, ShardyOptions(strategy))
    assert _sharding_of(module, "dot_general.2") is not None


def test_an_inlined_call_keeps_its_shardy_sharding():
    """A call's `xla.sdy.sharding` goes with its HloSharding to the inlined result: what Shardy's
    propagation reads is the call's annotation, not nothing."""
    from gspmdc.passes.pass_manager import PassContext
    from gspmdc.passes.spmd.inline_calls import InlineCalls
    sdy = 'frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"x\\"}, {}]>]>"}'
    module = api.parse(
        'HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}\n\n'
        "relu {\n  p = f32[4,2] parameter(0)\n  z = f32[] constant(0)\n"
        "  zb = f32[4,2] broadcast(z), dimensions={}\n  ROOT m = f32[4,2] maximum(p, zb)\n}\n\n"
        "ENTRY main {\n  a = f32[4,2] parameter(0)\n"
        f"  ROOT c = f32[4,2] call(a), to_apply=relu, sharding={{devices=[2,1]<=[2]}}, {sdy}\n}}\n")
    InlineCalls().apply(PassContext(), module)
    root = module.entry.root
    assert root.opcode == "maximum"
    assert _sharding_of(module, root.name).body_text() == '@mesh, [{"x"}, {}]'
