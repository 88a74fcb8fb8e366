"""While loops whose condition cannot change (ir/while_loops.py): recognised from the program
alone, refused by the runtime as soon as the condition first holds (before the body runs, even
when the body holds collectives, which hide the loop from the state-unchanged check), and named by
`gspmdc cost`. The shape of XLA's propagation test `WhileConv`: a counter the body never
increments, a convolution and a reduce-scatter in the body."""
from __future__ import annotations

import time

import numpy as np
import pytest

from gspmdc.cost_table import format_cost
from gspmdc.errors import RuntimeFailure
from gspmdc.ir.parser import parse_module
from gspmdc.ir.while_loops import invariant_condition_elements
from gspmdc.passes.analysis.cost import program_cost
from gspmdc.passes.analysis.machine import PRESETS
from gspmdc.runtime.backends.local import run_local

from spmd_helpers import REDUCERS

N = 2


def loop_module(counter_update: str = "next = s32[] add(count, one)",
                condition_extra: str = "", limit: str = "limit = s32[] constant(3)",
                compare: str = "ROOT lt = pred[] compare(count, limit), direction=LT") -> str:
    """A partitioned loop (2 partitions) of a convolution whose partial sums a reduce-scatter
    adds: `state = (count, lhs, acc)`; the body sets `acc` and `count = next`."""
    return f"""HloModule endless, num_partitions={N}
{REDUCERS}
cond {{
  s = (s32[], f32[4,3,2], f32[4,3,1]) parameter(0)
  count = s32[] get-tuple-element(s), index=0
  {condition_extra}
  {limit}
  {compare}
}}

body {{
  s = (s32[], f32[4,3,2], f32[4,3,1]) parameter(0)
  count = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  {counter_update}
  lhs = f32[4,3,2] get-tuple-element(s), index=1
  kernel = f32[2,2,1] constant({{{{{{1}},{{2}}}},{{{{3}},{{4}}}}}})
  conv = f32[4,3,2] convolution(lhs, kernel), window={{size=1}}, dim_labels=0bf_io0->0bf
  acc = f32[4,3,1] reduce-scatter(conv), channel_id=1, use_global_device_ids=true, replica_groups={{{{0,1}}}}, dimensions={{2}}, to_apply=addf
  ROOT t = (s32[], f32[4,3,2], f32[4,3,1]) tuple(next, lhs, acc)
}}

ENTRY main {{
  p0 = f32[4,3,2] parameter(0)
  start = s32[] parameter(1)
  zero = f32[] constant(0)
  zeros = f32[4,3,1] broadcast(zero), dimensions={{}}
  init = (s32[], f32[4,3,2], f32[4,3,1]) tuple(start, p0, zeros)
  w = (s32[], f32[4,3,2], f32[4,3,1]) while(init), condition=cond, body=body
  ROOT r = f32[4,3,1] get-tuple-element(w), index=2
}}
"""


PASSED_THROUGH = "next = s32[] get-tuple-element(s), index=0"


def the_loop(text: str):
    module = parse_module(text)
    return module, next(i for _, i in module.all_instructions() if i.opcode == "while")


def test_a_counter_the_body_passes_through_makes_the_condition_invariant():
    module, loop = the_loop(loop_module(PASSED_THROUGH))
    assert invariant_condition_elements(loop, module) == (0,)


@pytest.mark.parametrize("text", [
    loop_module(),                                                  # the counter moves
    loop_module("next = s32[] copy(count)"),                         # not recognised as passed
    loop_module(PASSED_THROUGH, condition_extra="acc = f32[4,3,1] get-tuple-element(s), index=2"),
], ids=["counter-moves", "copied-counter", "reads-an-element-the-body-sets"])
def test_loops_whose_condition_may_change_are_not_flagged(text):
    module, loop = the_loop(text)
    assert invariant_condition_elements(loop, module) is None


def test_a_condition_with_a_collective_may_change():
    text = loop_module(PASSED_THROUGH, condition_extra=(
        "total = s32[] all-reduce(count), channel_id=2, use_global_device_ids=true, "
        "replica_groups={{0,1}}, to_apply=add"),
        compare="ROOT lt = pred[] compare(total, limit), direction=LT")
    module, loop = the_loop(text)
    assert invariant_condition_elements(loop, module) is None


def inputs(start: int):
    lhs = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    return [[lhs, np.int32(start)] for _ in range(N)]


def test_the_runtime_refuses_the_endless_loop_before_its_body_runs():
    module = parse_module(loop_module(PASSED_THROUGH))
    began = time.monotonic()
    with pytest.raises(RuntimeFailure, match="while loop w cannot terminate: its condition holds "
                       "and reads only loop-state element 0, which the body passes through "
                       "unchanged"):
        run_local(module, inputs(0), N, timeout=60)
    assert time.monotonic() - began < 30


def test_an_endless_loop_that_is_never_entered_runs():
    module = parse_module(loop_module(PASSED_THROUGH))
    out = run_local(module, inputs(5), N, timeout=60)
    for value in out:
        np.testing.assert_array_equal(value, np.zeros((4, 3, 1), np.float32))


def test_the_terminating_loop_computes_the_convolution_by_numpy():
    module = parse_module(loop_module())
    lhs = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    kernel = np.array([[1, 2], [3, 4]], np.float32)                  # [input feature, output]
    full = np.einsum("sbi,io->sbo", lhs, kernel)                     # both partitions' sums
    out = run_local(module, inputs(0), N, timeout=60)
    for p, value in enumerate(out):
        np.testing.assert_array_equal(value, 2 * full[:, :, p:p + 1])


def test_gspmdc_cost_names_the_endless_loop():
    module = parse_module(loop_module(PASSED_THROUGH))
    cost = program_cost(module, N, PRESETS["tpu-v3"])
    figures = cost.figures
    assert figures.modelled_step_seconds is None
    assert format_cost(cost).splitlines()[-2:] == [
        "modelled step time: unknown (a loop never terminates once entered)",
        "  main/w: its condition reads only element 0 of the loop state, which the body passes "
        "through unchanged"]
    assert figures.extra["endless_loops"] == [
        {"name": "w", "computation": "main", "condition_reads": [0]}]
    assert program_cost(parse_module(loop_module()), N,
                        PRESETS["tpu-v3"]).figures.extra["endless_loops"] == []
