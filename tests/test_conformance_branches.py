"""The oracle's value check forces every branch of every conditional (`conformance/branches.py`):
the forced modules compute the chosen branch whatever the inputs (numpy), keep everything else
as it was (text, gspmdc's propagation), and with XLA a branch the random inputs never select is
still checked: a deliberately mis-partitioned second branch is caught, and so is XLA's own wrong
value on a generated module."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.runtime.interpreter import evaluate

from conformance import differential
from conformance.branches import branch_variants, forced_by_origin, forced_text
from conformance.differential import Case, run_case
from conformance.oracle import XlaOracle, xla_available
from conformance.report import divergence_classes
from spmd_partition_helpers import run_global

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: an outer conditional on a predicate computed from x (x[0] > 100: false for the test's inputs)
#: whose true branch holds an inner conditional on an index computed from y
NESTED = """HloModule nested, num_partitions=2

inner0 {
  a = f32[4] parameter(0)
  ROOT n = f32[4] negate(a)
}

inner1 {
  a = f32[4] parameter(0)
  ROOT m = f32[4] multiply(a, a)
}

inner2 {
  a = f32[4] parameter(0)
  ROOT e = f32[4] exponential(a)
}

outer_true {
  a = f32[4] parameter(0)
  i = s32[] constant(1)
  ROOT c = f32[4] conditional(i, a, a, a), branch_computations={inner0, inner1, inner2}
}

outer_false {
  a = f32[4] parameter(0)
  ROOT s = f32[4] sine(a)
}

ENTRY main {
  x = f32[4] parameter(0), sharding={devices=[2]0,1}
  s = f32[1] slice(x), slice={[0:1]}
  r = f32[] reshape(s)
  k = f32[] constant(100)
  p = pred[] compare(r, k), direction=GT
  ROOT o = f32[4] conditional(p, x, x), true_computation=outer_true, false_computation=outer_false
}
"""

X = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


def test_every_branch_of_every_reached_conditional_is_a_variant():
    labels = [v.label for v in branch_variants(NESTED)]
    assert labels == ["%c branch 0 (%inner0)", "%c branch 1 (%inner1)",
                      "%c branch 2 (%inner2)",
                      "%o branch 0 (%outer_true)", "%o branch 1 (%outer_false)"]


def test_a_forced_variant_computes_its_branch_whatever_the_selector():
    # the inputs select outer_false (sine); each variant computes its own branch, the inner
    # ones through outer_true, which the inputs never reach
    want = [-X, X * X, np.exp(X), X * X, np.sin(X)]
    for variant, expected in zip(branch_variants(NESTED), want):
        module = api.parse(forced_text(NESTED, variant.forcings), variant.label)
        np.testing.assert_allclose(np.asarray(evaluate(module, [X])), expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(evaluate(api.parse(NESTED, "n"), [X])), np.sin(X),
                               rtol=1e-6)


def test_forcing_adds_scalars_behind_a_barrier_and_changes_only_the_selector():
    variant = branch_variants(NESTED)[4]
    original = api.parse(NESTED, "n")
    forced = api.parse(forced_text(NESTED, variant.forcings), "forced")
    before = {i.name: i for _, i in original.all_instructions()}
    after = {i.name: i for _, i in forced.all_instructions()}
    added = ["o.branch", "o.branch.held", "o.force", "o.force.barrier", "o.force.on",
             "o.force.tuple", "o.forced"]
    assert sorted(set(after) - set(before)) == added
    for name, inst in before.items():
        got = after[name]
        operands = [o.name for o in got.operands]
        if name == "o":
            assert operands == ["o.forced", "x", "x"]          # the selector only
        else:
            assert operands == [o.name for o in inst.operands]
        assert (got.opcode, got.shape, got.sharding) == (inst.opcode, inst.shape, inst.sharding)
    assert [o.name for o in after["o.forced"].operands] == ["o.force.on", "o.branch", "p"]
    assert after["o.force.barrier"].opcode == "opt-barrier"
    assert all(after[n].sharding is None for n in added)


#: a manual constant equal to the branch number the forcing selects (fuzz/11400001349)
MANUAL_CONSTANT = """HloModule m, num_partitions=2

t {
  a = f32[4] parameter(0)
  ROOT m = f32[4] multiply(a, a)
}

f {
  a.1 = f32[4] parameter(0)
  ROOT s = f32[4] sine(a.1)
}

ENTRY e {
  x = f32[4] parameter(0), sharding={devices=[2]0,1}
  one = s32[] constant(1), sharding={manual}
  ones = s32[2] broadcast(one), dimensions={}, sharding={manual}
  back = s32[2] custom-call(ones), custom_call_target="SPMDShardToFullShape", sharding={replicated}
  k = s32[] parameter(1)
  held = s32[1] constant({1})
  o = f32[4] conditional(k, x, x), branch_computations={t, f}
  ROOT r = (f32[4], s32[2], s32[1]) tuple(o, back, held)
}
"""


def test_the_forced_branch_number_cannot_merge_with_a_manual_constant():
    """Branch 1 of `o`: the number is held in a constant of a shape no constant of the module
    has (`s32[1]` is taken, so `s32[1,1]`), reshaped to the selector: merging equal constants
    cannot replace it by the `{manual}` `one`, which would make the selector manual. After
    gspmdc's own cleanup the selector is not manual and the forced program computes branch 1."""
    variant = next(v for v in branch_variants(MANUAL_CONSTANT) if v.label.endswith("(%f)"))
    forced = api.parse(forced_text(MANUAL_CONSTANT, variant.forcings), "forced")
    insts = {i.name: i for _, i in forced.all_instructions()}
    assert str(insts["o.branch.held"].shape) == "s32[1,1]"
    assert insts["o.branch"].opcode == "reshape"
    assert not any(i.opcode == "constant" and str(i.shape) == "s32[]" and i.name != "one"
                   for i in insts.values())
    text = api.to_text(forced)
    case = Case("manual constant [on]", text, 2, True, True)
    _, spmd = differential._gspmdc_compile(text, case)
    selector = next(i for _, i in spmd.all_instructions() if i.name == "k")
    assert not selector.sharding.is_manual
    x = np.arange(4, dtype=np.float32)
    got = run_global(spmd, [x, np.int32(0)], 2)       # the inputs select branch 0
    np.testing.assert_allclose(np.asarray(got[0]), np.sin(x), rtol=1e-6)


#: NESTED's outer conditional as XLA's import leaves it: renamed, its source name kept as the
#: op_name, and (a call inlined at two sites) twice
IMPORTED = """HloModule imported, num_partitions=2

t.1 {
  a.1 = f32[4] parameter(0)
  ROOT m.1 = f32[4] multiply(a.1, a.1)
}

f.1 {
  a.2 = f32[4] parameter(0)
  ROOT s.1 = f32[4] sine(a.2)
}

ENTRY main.2 {
  x.1 = f32[4] parameter(0), sharding={devices=[2]0,1}
  k.1 = pred[] constant(false)
  o.1 = f32[4] conditional(k.1, x.1, x.1), true_computation=t.1, false_computation=f.1, metadata={op_name="o"}
  o.2 = f32[4] conditional(k.1, o.1, o.1), true_computation=t.1, false_computation=f.1, metadata={op_name="o"}
  ROOT r.1 = f32[4] add(o.1, o.2)
}
"""


def test_forcing_by_origin_forces_every_copy_xlas_import_made():
    outer_true = branch_variants(NESTED)[3]
    assert outer_true.label == "%o branch 0 (%outer_true)"
    forced = api.parse(forced_by_origin(IMPORTED, outer_true.forcings[:1]), "forced")
    assert [i.operands[0].name for _, i in forced.all_instructions()
            if i.opcode == "conditional"] == ["o.1.forced", "o.2.forced"]
    square = X * X
    np.testing.assert_allclose(np.asarray(evaluate(forced, [X])), square + square * square,
                               rtol=1e-6)
    assert forced_by_origin(IMPORTED, (("outer_true", "c", 1),)) is None


def test_forcing_by_origin_refuses_a_conditional_the_import_folded():
    # XLA's import folds a conditional on a constant selector into the branch it takes and may
    # leave a dead copy of the conditional: forcing the copy would change nothing the module
    # computes, so the forced module would be compared with the wrong branch's reference
    folded = IMPORTED.replace("ROOT r.1 = f32[4] add(o.1, o.2)",
                              "ROOT r.1 = f32[4] sine(x.1)\n  d.1 = f32[4] add(o.1, o.2)")
    outer_true = branch_variants(NESTED)[3]
    assert forced_by_origin(folded, outer_true.forcings[:1]) is None
    one_used = IMPORTED.replace("ROOT r.1 = f32[4] add(o.1, o.2)", "ROOT r.1 = f32[4] sine(o.1)")
    assert forced_by_origin(one_used, outer_true.forcings[:1]) is not None


def _propagated_shardings(text: str, case) -> dict:
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.propagation import ShardingPropagation
    module = api.parse(text, "m")
    pass_ = ShardingPropagation(propagate_to_output=(case.propagate_to_output,),
                          propagate_to_parameters=(case.propagate_to_parameters,),
                          record_origins=False)
    result = run_pipeline(PassContext(case.num_partitions), module, [pass_])
    return {(c.name, i.name): i.sharding for c, i in result.all_instructions()}


def test_forcing_leaves_gspmdcs_propagation_of_generated_modules_unchanged():
    # every instruction of the module keeps the sharding propagation gives it: the value check
    # of a forced branch runs the partitioning the module itself gets
    from fuzz import case
    checked = 0
    for i in range(400):
        c = case(10100 * 1000000 + i)
        if " conditional(" not in c.text or c.num_partitions < 2:
            continue
        want = _propagated_shardings(c.text, c)
        for variant in branch_variants(c.text):
            got = _propagated_shardings(forced_text(c.text, variant.forcings), c)
            assert {k: got[k] for k in want} == want, (i, variant.label)
            checked += 1
    assert checked >= 40


# ---- with XLA ----------------------------------------------------------------------------------

#: a conditional whose predicate (x[0] > 100) the random inputs never make true: they select
#: on_false (branch 1); the test breaks on_true (branch 0), which only forcing reaches
TWO_BRANCHES = """HloModule two, num_partitions=2

on_true {
  a = f32[8,4] parameter(0)
  ROOT m = f32[8,4] multiply(a, a)
}

on_false {
  a = f32[8,4] parameter(0)
  ROOT n = f32[8,4] negate(a)
}

ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[2,1]0,1}
  s = f32[1,1] slice(x), slice={[0:1], [0:1]}
  r = f32[] reshape(s)
  k = f32[] constant(100)
  p = pred[] compare(r, k), direction=GT
  ROOT o = f32[8,4] conditional(p, x, x), true_computation=on_true, false_computation=on_false
}
"""


def _breaking(op_name: str, instead: str):
    """A stand-in for gspmdc's compile that partitions as gspmdc does, then turns the
    instructions made for `op_name` (XLA's import keeps a source instruction's name as its
    metadata op_name, and gspmdc's partitioner keeps the metadata) into `instead`: a
    mis-partitioned branch."""
    compile_ = differential._gspmdc_compile

    def broken(text, case, *, partition=True):
        propagated, spmd = compile_(text, case, partition=partition)
        for _, inst in spmd.all_instructions():
            metadata = inst.attr("metadata")
            if partition and metadata is not None and metadata.get("op_name") == op_name:
                inst.opcode = instead
        return propagated, spmd
    return broken


def _case(text: str) -> Case:
    return Case("branches", text, api.parse(text, "m").num_partitions)


@pytest.fixture(scope="module")
def oracle():
    with XlaOracle() as xla:
        yield xla


@needs_xla
def test_a_mis_partitioned_branch_the_inputs_never_select_is_caught(oracle, monkeypatch):
    result = run_case(_case(TWO_BRANCHES), oracle, seed=0)
    assert result.values == "compared" and not result.value_mismatch
    assert [(b.label, b.values, b.mismatch) for b in result.branches] == [
        ("%o branch 0 (%on_true)", "compared", {}), ("%o branch 1 (%on_false)", "compared", {})]
    assert divergence_classes(result) == []
    monkeypatch.setattr(differential, "_gspmdc_compile", _breaking("m", "add"))
    result = run_case(_case(TWO_BRANCHES), oracle, seed=0)
    assert not result.value_mismatch                 # the inputs select on_false: no sign there
    broken = {b.label: b.mismatch for b in result.branches}
    assert "gspmdc" in broken["%o branch 0 (%on_true)"]
    assert broken["%o branch 1 (%on_false)"] == {}
    assert ("values", "gspmdc") in divergence_classes(result)


@needs_xla
def test_a_mis_partitioned_inner_branch_of_a_branch_never_taken_is_caught(oracle, monkeypatch):
    monkeypatch.setattr(differential, "_gspmdc_compile", _breaking("e", "negate"))
    result = run_case(_case(NESTED), oracle, seed=0)
    broken = [b.label for b in result.branches if "gspmdc" in b.mismatch]
    assert broken == ["%c branch 2 (%inner2)"]
    assert all(b.values == "compared" for b in result.branches)


@needs_xla
def test_xlas_wrong_values_on_a_branch_the_inputs_do_not_select_are_found(oracle):
    # fuzz/10100002451: XLA's partitioned variadic scatter in the conditional's second branch
    # writes the other operand's update (docs/partitioning.md); the random inputs select the
    # first branch, so only the forced run shows it; gspmdc's values agree on both
    from fuzz import case
    c = case(10100002451)
    result = run_case(Case("fuzz/10100002451", c.text, c.num_partitions), oracle, seed=10100)
    assert not result.value_mismatch
    by_label = {b.label: b.mismatch for b in result.branches}
    assert set(by_label) == {"%conditional.0 branch 0 (%branch.0)",
                             "%conditional.0 branch 1 (%branch.1)"}
    assert by_label["%conditional.0 branch 0 (%branch.0)"] == {}
    assert list(by_label["%conditional.0 branch 1 (%branch.1)"]) == ["XLA"]
    assert divergence_classes(result)[-1] == ("values", "XLA")


def _xla_shardings_by_origin(text: str) -> dict:
    """Each source instruction's name (the op_name XLA's import keeps) -> the shardings XLA's
    propagation gave the instructions made from it."""
    from conformance.correspondence import canonical
    found: dict = {}
    for _, inst in api.parse(text, "xla", verify=False).all_instructions():
        metadata = inst.attr("metadata")
        if metadata is not None and metadata.get("op_name") is not None:
            found.setdefault(metadata.get("op_name"), []).append(
                canonical(inst.sharding, inst.shape))
    return found


@needs_xla
def test_xla_keeps_a_forced_conditional_and_propagates_the_module_as_without_forcing(oracle):
    # XLA's import folds a select on a constant and inlines a conditional whose selector is a
    # constant: behind the barrier the selector stays unknown, the conditional stays, and XLA's
    # propagation gives every source instruction the shardings it gives it without forcing
    from fuzz import case
    checked = 0
    for i in (103, 111, 112):              # generated modules whose conditional XLA keeps
        c = case(10100 * 1000000 + i)
        want = oracle.partition(c.text, c.num_partitions, to_output=False, to_parameters=False)
        assert " conditional(" in want.before
        for variant in branch_variants(c.text):
            got = oracle.partition(forced_text(c.text, variant.forcings), c.num_partitions,
                                   to_output=False, to_parameters=False)
            assert " conditional(" in got.before, (i, variant.label)
            theirs = _xla_shardings_by_origin(got.propagated)
            assert {k: theirs.get(k) for k in _xla_shardings_by_origin(want.propagated)} == \
                _xla_shardings_by_origin(want.propagated), (i, variant.label)
            checked += 1
    assert checked == 7


def test_branch_figures_count_each_forced_run():
    from conformance.report import Figures
    from conformance.summary import CaseSummary
    record = CaseSummary("m off", 2, False, False, 0, "compared", values="compared",
                         branches=[["%c branch 0 (%a)", "compared", {}],
                                   ["%c branch 1 (%b)", "compared", {"gspmdc": "out0 differs"}],
                                   ["%c branch 2 (%d)", "not run: no global result: x", {}]])
    again = CaseSummary.from_json(record.to_json())
    figures = Figures()
    figures.add(again)
    assert (figures.branch_modules, figures.branches.compared, figures.branches.agreeing,
            figures.branches.gspmdc_agreeing, figures.branches.xla_agreeing) == (1, 2, 1, 1, 2)
    assert figures.branches.skipped == {"no global result": 1}
    assert any(line.startswith("branches forced: 2 runs in 1 modules") for line in figures.lines())


@needs_xla
def test_a_forced_branch_beside_a_manual_constant_runs_on_both_sides(oracle):
    """fuzz/11400001349 with propagation to parameters: its manual region holds `s32[] constant(1)`
    `{manual}`. Forcing branch 1 with the number held in an `s32[]` constant, XLA's import merged
    the two, the selector parameter became manual, and neither program could run the branch."""
    from fuzz import case
    generated = case(11400001349)
    result = run_case(Case("fuzz/11400001349 [on]", generated.text, generated.num_partitions,
                           True, True, generated.reference_text), oracle, seed=11400)
    assert result.status == "compared"
    assert [(b.values, b.mismatch) for b in result.branches] == [("compared", {})] * 3
    assert divergence_classes(result) == []
