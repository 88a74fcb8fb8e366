"""`PlanContext.signature`: which needs of its operands the shared-reshard callbacks are asked
about (each operand the shardings the plans read it in, in plan order; a plan with fewer
operands reads none past its own), and that a signature the caller built (`own`) is returned
itself where no operand has a shared reshard, else extended with them; and that `choose` builds
no signature for a lone plan computing the result in the instruction's own sharding."""
from gspmdc.ir.parser import parse_module, parse_sharding
from gspmdc.passes.spmd.op_rules import OpPlan, PlanContext, Signature

ROWS = parse_sharding("{devices=[4,1]<=[4]}")
COLS = parse_sharding("{devices=[1,4]<=[4]}")
REPLICATED = parse_sharding("{replicated}")

MODULE = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}
  y = f32[8,8] parameter(1), sharding={devices=[1,4]<=[4]}
  ROOT a = f32[8,8] add(x, y), sharding={devices=[4,1]<=[4]}
}
"""


def _add():
    return parse_module(MODULE).entry.root


def _asked(plans, held=frozenset()):
    """(operand name, needs) per `had` question, and the signature, with `held` had for x."""
    asked = []

    def had(value, needs):
        asked.append((value.name, needs))
        return held if value.name == "x" else frozenset()
    inst = _add()
    own = Signature.of(inst)
    return asked, own, PlanContext(4, had=had).signature(inst, plans, users=False, own=own)


def test_each_operand_is_asked_the_plans_needs_in_plan_order():
    plans = [OpPlan((ROWS, ROWS), ROWS, "rows"), OpPlan((COLS, COLS), COLS, "columns"),
             OpPlan((REPLICATED, REPLICATED), REPLICATED, "replicated")]
    asked, _, _ = _asked(plans)
    assert asked == [("x", (ROWS, COLS, REPLICATED)), ("y", (ROWS, COLS, REPLICATED))]


def test_a_plan_with_fewer_operands_reads_none_past_its_own():
    plans = [OpPlan((ROWS, ROWS), ROWS, "rows"), OpPlan((COLS,), COLS, "one operand")]
    asked, _, _ = _asked(plans)
    assert asked == [("x", (ROWS, COLS)), ("y", (ROWS,))]


def test_the_callers_signature_is_returned_itself_without_shared_reshards():
    _, own, signature = _asked([OpPlan((ROWS, ROWS), ROWS, "rows")])
    assert signature is own


def test_the_callers_signature_is_extended_with_the_shared_reshards():
    held = frozenset({REPLICATED})
    _, own, signature = _asked([OpPlan((ROWS, ROWS), ROWS, "rows")], held)
    assert signature is not own and signature.operand_had == (held, frozenset())
    assert signature._replace(operand_had=()) == own


def _choose_asks(plans):
    """The operands `choose` asks `had` about, choosing among `plans` for the add."""
    asked = []

    def had(value, needs):
        asked.append(value.name)
        return frozenset()
    PlanContext(4, had=had).choose(_add(), plans)
    return asked


def test_a_lone_plan_in_the_instructions_own_sharding_is_chosen_without_its_signature():
    assert _choose_asks([OpPlan((ROWS, ROWS), ROWS, "rows")]) == []


def test_a_lone_plan_in_another_sharding_and_plans_compared_build_the_signature():
    assert _choose_asks([OpPlan((COLS, COLS), COLS, "columns")]) == ["x", "y"]
    assert _choose_asks([OpPlan((ROWS, ROWS), ROWS, "rows"),
                         OpPlan((COLS, COLS), COLS, "columns")]) == ["x", "y"]
