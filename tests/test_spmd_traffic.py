"""Collective traffic per run (`passes/spmd/traffic.py`): executions of collectives in loops
follow the loop's static trip count, computed here by hand for each loop form."""
from __future__ import annotations

import pytest

from gspmdc import api
from gspmdc.passes.spmd.traffic import collective_traffic, execution_counts, trip_count

from hlo_text import reducer

LOOP = """HloModule loop, num_partitions=4

{add}
cond {{
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  bound = s32[] constant({bound})
  ROOT c = pred[] compare({compare}), direction={direction}
}}

body {{
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  step = s32[] constant({step})
  next = s32[] {update}(i, step)
  x = f32[8] get-tuple-element(p), index=1
  r = f32[8] all-reduce(x), channel_id=1, replica_groups={{{{0,1,2,3}}}}, use_global_device_ids=true, to_apply=add
  ROOT t = (s32[], f32[8]) tuple(next, r)
}}

ENTRY main {{
  x = f32[8] parameter(0)
  start = s32[] constant({start})
  init = (s32[], f32[8]) tuple(start, x)
  w = (s32[], f32[8]) while(init), condition=cond, body=body
  y = f32[8] get-tuple-element(w), index=1
  ROOT g = f32[32] all-gather(y), channel_id=2, dimensions={{0}}, replica_groups={{{{0,1,2,3}}}},
    use_global_device_ids=true
}}
"""


def loop(start=0, bound=10, step=1, direction="LT", update="add", counter_first=True):
    compare = "i, bound" if counter_first else "bound, i"
    return api.parse(LOOP.format(add=reducer("add"), start=start, bound=bound, step=step,
                                 direction=direction, update=update, compare=compare))


@pytest.mark.parametrize("kwargs, trips", [
    (dict(), 10),                                            # for i in range(10)
    (dict(start=3, bound=10, step=2), 4),                    # 3 5 7 9
    (dict(start=0, bound=10, direction="LE"), 11),           # 0..10
    (dict(start=10, bound=0, update="subtract"), 0),         # 10 < 0 fails at once
    (dict(start=0, bound=10, update="subtract"), None),      # counts down forever
    (dict(start=10, bound=0, direction="GT", update="subtract"), 10),
    (dict(start=10, bound=2, step=3, direction="GE", update="subtract"), 3),  # 10 7 4
    (dict(start=0, bound=12, step=3, direction="NE"), 4),    # 0 3 6 9
    (dict(start=0, bound=10, step=3, direction="NE"), None),  # never equal: no static count
    (dict(bound=10, direction="GT", counter_first=False), 10),  # 10 > i
    (dict(start=5, bound=5), 0),
])
def test_trip_counts_by_hand(kwargs, trips):
    module = loop(**kwargs)
    w = next(i for i in module.entry.instructions if i.opcode == "while")
    assert trip_count(w, module.computations) == trips


def test_collectives_in_the_body_run_once_per_iteration():
    module = loop(start=0, bound=6)
    counts = execution_counts(module)
    assert counts["main"] == 1 and counts["body"] == 6 and counts["cond"] == 7
    found = {t.name: t for t in collective_traffic(module, 4)}
    assert found["r"].executions == 6 and found["r"].total_result_bytes == 6 * 32
    assert found["r"].total_sent_bytes == pytest.approx(6 * 2 * 3 / 4 * 32)
    assert found["g"].executions == 1 and found["g"].total_result_bytes == 128
    assert found["g"].total_sent_bytes == 3 * 32


def test_a_loop_without_a_static_count_is_unknown():
    text = LOOP.format(add=reducer("add"), start=0, bound=10, step=1, direction="LT", update="add",
                       compare="i, bound").replace("start = s32[] constant(0)",
                                                   "start = s32[] parameter(1)")
    module = api.parse(text)
    found = {t.name: t for t in collective_traffic(module, 4)}
    assert found["r"].executions is None and found["r"].total_result_bytes is None
    assert found["g"].executions == 1
