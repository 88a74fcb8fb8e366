"""`op_rules.seen_by_users`: the sharding users see of a tuple result is its annotation except in
the elements no user reads (`{unknown}` in every user's need), which stay as computed;
element by element, checked by hand on a wide tuple."""
from __future__ import annotations

from gspmdc import api
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.sharding import HloSharding
from gspmdc.passes.spmd.op_rules import seen_by_users

WIDTH = 7
TILED, REPLICATED, UNKNOWN = (parse_sharding(t) for t in
                              ("{devices=[2]<=[2]}", "{replicated}", "{unknown}"))


def _tuple_shape():
    text = ("HloModule m\nENTRY e {\n  ROOT p = (" + ", ".join(["f32[8]"] * WIDTH) +
            ") parameter(0)\n}\n")
    return api.parse(text).entry.root.shape


def _need(unknown: set[int]) -> HloSharding:
    return HloSharding.tuple([UNKNOWN if i in unknown else TILED for i in range(WIDTH)])


def test_only_the_elements_every_user_leaves_unread_stay_as_computed():
    shape = _tuple_shape()
    annotated = HloSharding.tuple([TILED] * WIDTH)
    computed = HloSharding.tuple([REPLICATED] * WIDTH)
    # element 2 and 6 nobody reads; 4 one user reads; 0 two users leave unread, one reads
    needs = [_need({0, 2, 4, 6}), _need({0, 2, 6}), _need({2, 6})]
    seen = seen_by_users(shape, annotated, computed, needs)
    assert seen.leaf_shardings(shape) == [REPLICATED if i in (2, 6) else TILED
                                          for i in range(WIDTH)]
    # every element read by someone: the annotation itself
    assert seen_by_users(shape, annotated, computed, needs + [_need(set())]) is annotated
    # an array-shaped need (a user of the whole tuple as one value) reads everything
    assert seen_by_users(shape, annotated, computed, needs[:1] + [TILED]) is annotated
