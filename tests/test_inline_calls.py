"""inline-calls on its own: computations without calls are left as they are (the same
instruction objects and operand lists), unreachable computations are dropped either way, and
calls and asynchronous calls of one computation are all inlined, the values those numpy gives."""
from __future__ import annotations

import numpy as np

from gspmdc import api
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.spmd.inline_calls import InlineCalls

NO_CALLS = """HloModule m

unused {
  a = f32[4] parameter(0)
  ROOT n = f32[4] negate(a)
}

ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  s = f32[4] add(x, y)
  ROOT m = f32[4] multiply(s, y)
}
"""

BOTH_CALLS = """HloModule m

plus {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  ROOT s = f32[4] add(a, b)
}, execution_thread="thread_1"

times {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  ROOT p = f32[4] multiply(a, b)
}

ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  start = ((f32[4], f32[4]), f32[4], u32[]) call-start(x, y), async_execution_thread="thread_1",
    to_apply=plus
  s = f32[4] call-done(start)
  ROOT m = f32[4] call(s, y), to_apply=times
}
"""


def _inline(text: str):
    return run_pipeline(PassContext(1), api.parse(text), [InlineCalls()])


def test_a_computation_without_calls_is_left_as_it_is():
    module = api.parse(NO_CALLS)
    entry = module.entry
    instructions = list(entry.instructions)
    operand_lists = [inst.operands for inst in instructions]
    result = run_pipeline(PassContext(1), module, [InlineCalls()])
    assert list(result.computations) == ["e"]                    # `unused` is unreachable
    assert result.entry.instructions == instructions
    assert all(a is b for a, b in zip(instructions, result.entry.instructions))
    assert all(inst.operands is ops for inst, ops in zip(instructions, operand_lists))
    assert result.entry.root is instructions[-1]


def test_calls_and_asynchronous_calls_of_one_computation_are_all_inlined():
    module = _inline(BOTH_CALLS)
    assert list(module.computations) == ["e"]
    assert [i.opcode for i in module.entry.instructions] == \
        ["parameter", "parameter", "add", "multiply"]
    x = np.array([1.5, -2.0, 3.25, 0.5], np.float32)
    y = np.array([0.25, 4.0, -1.0, 2.0], np.float32)
    np.testing.assert_array_equal(api.evaluate(module, [x, y]), (x + y) * y)
