"""The async wrappers (async-start / async-update / async-done) and collective-broadcast, which
the verifier accepted and the runtime could not run: against numpy written here, on one device
and on several partitions of the local backend."""
from __future__ import annotations

import numpy as np

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.local import run_local
from interpreter_helpers import run_hlo
from hlo_text import reducer

ASYNC = """
HloModule m, num_partitions=4

wrapped {
  a = f32[3] parameter(0)
  b = f32[3] parameter(1)
  ROOT m = f32[3] multiply(a, b)
}

""" + reducer("sum", "add") + """
reduce_all {
  v = f32[3] parameter(0)
  ROOT r = f32[3] all-reduce(v), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=sum
}

ENTRY e {
  p = f32[3] parameter(0)
  q = f32[3] parameter(1)
  start = ((f32[3], f32[3]), f32[3], u32[]) async-start(p, q), calls=wrapped
  update = ((f32[3], f32[3]), f32[3], u32[]) async-update(start)
  product = f32[3] async-done(update)
  reduce-start = ((f32[3]), f32[3]) async-start(product), calls=reduce_all
  ROOT total = f32[3] async-done(reduce-start)
}
"""


def test_async_wrappers_run_their_computation_on_one_device():
    text = ASYNC.replace("num_partitions=4", "num_partitions=1").replace(
        "{{0,1,2,3}}", "{{0}}")
    p, q = np.array([1, 2, 3], np.float32), np.array([4, -5, 0.5], np.float32)
    np.testing.assert_array_equal(run_hlo(text, p, q), p * q)


def test_an_async_all_reduce_runs_across_partitions():
    args = [[np.arange(3, dtype=np.float32) + k, np.full(3, k + 1, np.float32)] for k in range(4)]
    results = run_local(parse_module(ASYNC), args, 4, timeout=60)
    want = sum(a * b for a, b in args)
    for got in results:
        np.testing.assert_array_equal(got, want)


def broadcast_program(attrs: str, tuple_form: bool = False) -> str:
    if tuple_form:
        return f"""HloModule m, num_partitions=4
ENTRY e {{
  x = f32[2] parameter(0)
  y = s32[] parameter(1)
  ROOT b = (f32[2], s32[]) collective-broadcast(x, y), {attrs}
}}"""
    return f"""HloModule m, num_partitions=4
ENTRY e {{
  x = f32[2] parameter(0)
  ROOT b = f32[2] collective-broadcast(x), {attrs}
}}"""


def test_collective_broadcast_sends_the_first_members_value_to_its_group():
    args = [[np.array([k, 10 + k], np.float32)] for k in range(4)]
    results = run_local(parse_module(broadcast_program(
        "channel_id=1, replica_groups={{1,0},{3,2}}")), args, 4, timeout=60)
    for k, got in enumerate(results):
        source = 1 if k < 2 else 3
        np.testing.assert_array_equal(got, [source, 10 + source])


def test_collective_broadcast_of_several_operands_gives_a_tuple():
    args = [[np.array([k, -k], np.float32), np.array(100 + k, np.int32)] for k in range(4)]
    results = run_local(parse_module(broadcast_program(
        "channel_id=2, replica_groups={{2,1,0,3}}", tuple_form=True)), args, 4, timeout=60)
    for values, scalar in results:
        np.testing.assert_array_equal(values, [2, -2])
        assert scalar == 102 and scalar.dtype == np.int32


def test_a_cross_replica_collective_broadcast_keeps_each_partitions_value():
    args = [[np.array([k, 10 + k], np.float32)] for k in range(4)]
    results = run_local(parse_module(broadcast_program("replica_groups={{0}}")), args, 4,
                        timeout=60)
    for k, got in enumerate(results):
        np.testing.assert_array_equal(got, [k, 10 + k])
