"""`PlanContext.choose_for`: the candidate moving the fewest bytes, then the smallest tie-break,
then the first, checked against the exhaustive minimum of each candidate's whole `cost_of` (the
choice stops summing a candidate's bytes once they pass the cheapest so far's) over every order
of a set of candidates with equal and different costs."""
from itertools import permutations

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.op_rules import OpPlan, PlanContext, Signature

ROWS = parse_sharding("{devices=[4,1]<=[4]}")
COLS = parse_sharding("{devices=[1,4]<=[4]}")
REPLICATED = parse_sharding("{replicated}")
SHAPE = ArrayShape("f32", (8, 8))
# an elementwise op of two operands, one tiled by rows, one by columns, its result by rows
SIGNATURE = Signature(SHAPE, ROWS, (SHAPE, SHAPE), (ROWS, COLS), (0, 1))
CANDIDATES = [
    OpPlan((ROWS, ROWS), ROWS, "rows"),                 # reshards the second operand
    OpPlan((COLS, COLS), COLS, "columns"),              # the first, and the result
    OpPlan((REPLICATED, REPLICATED), REPLICATED, "replicated"),
    OpPlan((ROWS, ROWS), ROWS, "rows again"),           # ties with the first
    OpPlan((ROWS, ROWS), ROWS, "rows, sending itself", cost=1.0),
    OpPlan((ROWS, COLS), ROWS, "free, sending a lot", cost=1e6),
]


def _tie_break(plan: OpPlan) -> float:
    return float(len(plan.reason))


def test_the_choice_is_the_exhaustive_minimum_in_every_order():
    ctx = PlanContext(4)
    costs = {plan.reason: ctx.cost_of(SIGNATURE, plan) for plan in CANDIDATES}
    assert len(set(costs.values())) > 3 and costs["rows"] == costs["rows again"]
    for order in permutations(CANDIDATES, 4):
        order = list(order)
        for tie_break in (None, _tie_break):
            expected = min(range(len(order)), key=lambda i: (
                costs[order[i].reason], tie_break(order[i]) if tie_break else 0.0, i))
            assert ctx.choose_for(SIGNATURE, order, tie_break) is order[expected]


# an elementwise op of f32[8] on 4 devices, its operand and annotation in one row tile each
IN_ORDER = parse_sharding("{devices=[4]<=[4]}")
SWAPPED = parse_sharding("{devices=[4]1,0,2,3}")          # devices 0 and 1 trade tiles
REVERSED_PAIRS = parse_sharding("{devices=[4]1,0,3,2}")   # both pairs trade tiles
VECTOR = ArrayShape("f32", (8,))
IN_PLACE = Signature(VECTOR, IN_ORDER, (VECTOR,), (IN_ORDER,), (0,))


def test_a_tie_of_the_busiest_device_goes_to_fewer_bytes_in_all():
    """Computed on a device order and permuted back, each plan's busiest device sends its
    8 B tile twice (16 B); one pair trading tiles sends 16 B in all each way (32 B), both
    pairs 32 B each way (64 B). Without `totals` the first of the tie is kept; with them, the
    plan all devices together send fewer bytes with."""
    ctx = PlanContext(4)
    pairs = OpPlan((REVERSED_PAIRS,), REVERSED_PAIRS, "both pairs")
    one = OpPlan((SWAPPED,), SWAPPED, "one pair")
    assert ctx.cost_of(IN_PLACE, pairs) == ctx.cost_of(IN_PLACE, one) == 16
    assert ctx.total_for(IN_PLACE, pairs) == 64 and ctx.total_for(IN_PLACE, one) == 32
    assert ctx.choose_for(IN_PLACE, [pairs, one]) is pairs
    assert ctx.choose_for(IN_PLACE, [pairs, one], totals=True) is one
    assert ctx.choose_for(IN_PLACE, [one, pairs], totals=True) is one
