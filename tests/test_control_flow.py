"""Control flow (while, conditional in both forms, call, fusion, call-start/call-done) against
results computed by hand or by the equivalent Python loop."""
from __future__ import annotations

import numpy as np
import pytest

from interpreter_helpers import run_hlo

from gspmdc.errors import RuntimeFailure

COUNTING_LOOP = """
HloModule loop

cond {
  s = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(LIMIT)
  ROOT lt = pred[] compare(i, n), direction=LT
}

double_plus_one {
  x = f32[3] parameter(0)
  two = f32[] constant(2)
  b = f32[3] broadcast(two), dimensions={}
  m = f32[3] multiply(x, b)
  one = f32[] constant(1)
  o = f32[3] broadcast(one), dimensions={}
  ROOT r = f32[3] add(m, o)
}

body {
  s = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[3] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[3] call(x), to_apply=double_plus_one
  ROOT t = (s32[], f32[3]) tuple(j, y)
}

ENTRY main {
  x = f32[3] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[3]) tuple(zero, x)
  ROOT w = (s32[], f32[3]) while(init), condition=cond, body=body
}"""


@pytest.mark.parametrize("limit", [0, 1, 7, 100])
def test_while_loop_runs_the_body_until_the_condition_fails(limit):
    x = np.array([0.5, -1.0, 3.0], np.float32)
    count, y = run_hlo(COUNTING_LOOP.replace("LIMIT", str(limit)), x)
    expected = x.astype(np.float64)
    for _ in range(limit):
        expected = expected * 2 + 1
    assert count == limit and count.dtype == np.int32
    np.testing.assert_allclose(y, expected.astype(np.float32), rtol=1e-6)


CONDITIONAL_INDEX = """
HloModule cond

b0 {
  x = f32[2] parameter(0)
  ROOT r = f32[2] negate(x)
}

b1 {
  x = s32[] parameter(0)
  c = f32[] convert(x)
  ROOT r = f32[2] broadcast(c), dimensions={}
}

b2 {
  x = f32[2] parameter(0)
  ROOT r = f32[2] add(x, x)
}

ENTRY main {
  i = s32[] parameter(0)
  a = f32[2] parameter(1)
  n = s32[] parameter(2)
  ROOT c = f32[2] conditional(i, a, n, a), branch_computations={b0, b1, b2}
}"""


@pytest.mark.parametrize("index, expected", [
    (0, [-1.0, -2.0]), (1, [9.0, 9.0]), (2, [2.0, 4.0]),
    (3, [2.0, 4.0]), (-1, [2.0, 4.0]), (1000, [2.0, 4.0]),   # out of range: the last branch
])
def test_conditional_index_form(index, expected):
    out = run_hlo(CONDITIONAL_INDEX, np.array(index, np.int32), np.array([1.0, 2.0], np.float32),
                  np.array(9, np.int32))
    np.testing.assert_array_equal(out, expected)


CONDITIONAL_PRED = """
HloModule cond

on_true {
  t = (f32[], f32[]) parameter(0)
  a = f32[] get-tuple-element(t), index=0
  b = f32[] get-tuple-element(t), index=1
  ROOT r = f32[] subtract(a, b)
}

on_false {
  x = f32[] parameter(0)
  ROOT r = f32[] multiply(x, x)
}

ENTRY main {
  p = pred[] parameter(0)
  a = f32[] parameter(1)
  b = f32[] parameter(2)
  t = (f32[], f32[]) tuple(a, b)
  ROOT c = f32[] conditional(p, t, b), true_computation=on_true, false_computation=on_false
}"""


@pytest.mark.parametrize("pred, expected", [(True, -2.0), (False, 25.0)])
def test_conditional_pred_form(pred, expected):
    out = run_hlo(CONDITIONAL_PRED, np.array(pred), np.float32(3.0) * np.ones((), np.float32),
                  np.full((), 5.0, np.float32))
    assert out == expected and out.shape == ()


def test_fusion_and_nested_calls():
    text = """
HloModule fused

inner {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  ROOT m = f32[4] maximum(a, b)
}

fused_computation {
  p0 = f32[4] parameter(0)
  p1 = f32[4] parameter(1)
  s = f32[4] subtract(p0, p1)
  ROOT c = f32[4] call(s, p1), to_apply=inner
}

ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  ROOT f = f32[4] fusion(x, y), kind=kLoop, calls=fused_computation
}"""
    x = np.array([1, 5, -3, 0], np.float32)
    y = np.array([2, 1, -4, 1], np.float32)
    np.testing.assert_array_equal(run_hlo(text, x, y), np.maximum(x - y, y))


def test_call_start_and_call_done():
    text = """
HloModule async

called_computation {
  p0 = s32[8] parameter(0)
  p1 = s32[8] parameter(1)
  ROOT add = s32[8] add(p0, p1)
}, execution_thread="thread_1"

ENTRY entry_computation {
  p0 = s32[8] parameter(0)
  p1 = s32[8] parameter(1)
  async-start = ((s32[8], s32[8]), s32[8], u32[]) call-start(p0, p1), async_execution_thread="thread_1", to_apply=called_computation
  ROOT async-done = s32[8] call-done(async-start)
}, execution_thread="thread_0"
"""
    a, b = np.arange(8, dtype=np.int32), np.full(8, 10, np.int32)
    np.testing.assert_array_equal(run_hlo(text, a, b), a + b)


def test_while_with_a_conditional_inside_computes_collatz_steps():
    text = """
HloModule collatz

cond {
  s = (s32[], s32[]) parameter(0)
  x = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  ROOT ne = pred[] compare(x, one), direction=NE
}

half {
  x = s32[] parameter(0)
  two = s32[] constant(2)
  ROOT h = s32[] divide(x, two)
}

triple {
  x = s32[] parameter(0)
  three = s32[] constant(3)
  m = s32[] multiply(x, three)
  one = s32[] constant(1)
  ROOT r = s32[] add(m, one)
}

body {
  s = (s32[], s32[]) parameter(0)
  x = s32[] get-tuple-element(s), index=0
  n = s32[] get-tuple-element(s), index=1
  two = s32[] constant(2)
  r = s32[] remainder(x, two)
  zero = s32[] constant(0)
  even = pred[] compare(r, zero), direction=EQ
  y = s32[] conditional(even, x, x), true_computation=half, false_computation=triple
  one = s32[] constant(1)
  m = s32[] add(n, one)
  ROOT t = (s32[], s32[]) tuple(y, m)
}

ENTRY main {
  x = s32[] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], s32[]) tuple(x, zero)
  w = (s32[], s32[]) while(init), condition=cond, body=body
  ROOT steps = s32[] get-tuple-element(w), index=1
}"""

    def steps(x):
        n = 0
        while x != 1:
            x = x // 2 if x % 2 == 0 else 3 * x + 1
            n += 1
        return n

    for start in (1, 6, 27):
        assert run_hlo(text, np.array(start, np.int32)) == steps(start)


def test_while_whose_body_leaves_the_state_unchanged_is_reported_not_hung():
    text = """
HloModule m
cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  zero = s32[] constant(0)
  j = s32[] add(i, zero)
  x = f32[4] get-tuple-element(s), index=1
  ROOT t = (s32[], f32[4]) tuple(j, x)
}
ENTRY e {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, x)
  ROOT w = (s32[], f32[4]) while(init), condition=cond, body=body
}
"""
    with pytest.raises(RuntimeFailure, match="cannot terminate: iteration 1 left the loop state"):
        run_hlo(text, np.full(4, np.nan, np.float32))
