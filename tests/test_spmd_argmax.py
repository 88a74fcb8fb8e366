"""Arg-max / arg-min (variadic reduce of values and iota indices) over a tiled reduced dim
(passes/spmd/op_rules_reduce.py): local partial reduces combined by an all-gather of the small
partial results and a second reduce, never a gather of the operand. Checked bit for bit against
numpy's argmax/argmin (lowest index on ties) and the unpartitioned interpreter, on 2, 3, 4 and 8
partitions with uneven shards whose garbage padding must be masked."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.passes.spmd.traffic import collective_traffic

from spmd_partition_helpers import check_equivalent, collectives, run_global

DEVICES = [2, 3, 4, 8]


def comparator(name: str, direction: str) -> str:
    """`(value, index)` pairs: the strictly better value wins, ties go to the lower index."""
    return f"""
{name} {{
  a = f32[] parameter(0)
  ia = s32[] parameter(1)
  b = f32[] parameter(2)
  ib = s32[] parameter(3)
  better = pred[] compare(a, b), direction={direction}
  same = pred[] compare(a, b), direction=EQ
  lower = pred[] compare(ia, ib), direction=LT
  tie = pred[] and(same, lower)
  pick = pred[] or(better, tie)
  v = f32[] select(pick, a, b)
  i = s32[] select(pick, ia, ib)
  ROOT r = (f32[], s32[]) tuple(v, i)
}}
"""


def arg_reduce(rows: int, cols: int, sharding: str, result: str, kind: str = "max") -> str:
    init = "-inf" if kind == "max" else "inf"
    direction = "GT" if kind == "max" else "LT"
    return f"""HloModule m
{comparator("pick", direction)}
ENTRY e {{
  x = f32[{rows},{cols}] parameter(0), sharding={sharding}
  i = s32[{rows},{cols}] iota(), iota_dimension=1, sharding={sharding}
  v0 = f32[] constant({init}), sharding={{replicated}}
  i0 = s32[] constant(0), sharding={{replicated}}
  ROOT r = (f32[{rows}], s32[{rows}]) reduce(x, i, v0, i0), dimensions={{1}}, to_apply=pick, sharding={{{result}, {result}}}
}}
"""


def tied_values(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Small integers: every row has its extreme several times."""
    return np.random.default_rng(seed).integers(0, 4, (rows, cols)).astype(np.float32)


def check(text: str, n: int, x: np.ndarray, kind: str):
    spmd = check_equivalent(text, n, inputs=[x])
    want = np.argmax(x, axis=1) if kind == "max" else np.argmin(x, axis=1)
    values, indices = run_global(spmd, [x], n)
    np.testing.assert_array_equal(indices, want.astype(np.int32))
    np.testing.assert_array_equal(values, x[np.arange(x.shape[0]), want])
    return spmd


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("n", DEVICES)
def test_arg_reduce_over_a_tiled_dim_all_gathers_only_the_partial_results(n, kind):
    rows, cols = 5, 8 * n + 3                            # uneven: garbage padding on the last
    x = tied_values(rows, cols, seed=n)
    text = arg_reduce(rows, cols, f"{{devices=[1,{n}]<=[{n}]}}", "{replicated}", kind)
    spmd = check(text, n, x, kind)
    found = collectives(spmd)
    assert [c[0] for c in found] == ["all-gather", "all-gather"]
    assert all(c[1] == [list(range(n))] for c in found)
    sent = sum(t.total_sent_bytes for t in collective_traffic(spmd, n))
    assert sent == (n - 1) * rows * (4 + 4)              # one partial (value, index) per row
    gather = (n - 1) * rows * -(-cols // n) * (4 + 4)   # gathering the values and indices
    assert 8 * sent <= gather


@pytest.mark.parametrize("kind", ["max", "min"])
def test_arg_reduce_on_a_2x2_mesh_keeps_the_rows_tiled(kind):
    """Rows on mesh dim 0, columns on mesh dim 1: the partials are gathered within each row
    group only ({0,1} and {2,3}), and the result stays tiled on rows."""
    rows, cols = 6, 11
    x = tied_values(rows, cols, seed=7)
    text = arg_reduce(rows, cols, "{devices=[2,2]<=[4]}",
                      "{devices=[2,2]<=[4] last_tile_dim_replicate}", kind)
    spmd = check(text, 4, x, kind)
    assert [c[:2] for c in collectives(spmd)] == [("all-gather", [[0, 1], [2, 3]])] * 2


def test_ties_across_shards_resolve_to_the_lowest_global_index():
    """Every shard holds the maximum: the result is the first column, as unpartitioned."""
    n, rows, cols = 4, 3, 10
    x = np.zeros((rows, cols), np.float32)
    x[:, 2::3] = 5.0                                    # columns 2, 5, 8: on shards 0, 1, 2
    text = arg_reduce(rows, cols, f"{{devices=[1,{n}]<=[{n}]}}", "{replicated}")
    check(text, n, x, "max")


def test_arg_reduce_on_one_device_with_its_indices_tiled():
    # found by fuzzing: a result on one device for the values and tiled for the indices made
    # the local reduce keep the tuple sharding's shard shapes (s32[2]) while computing whole
    # values on that device (s32[8]): exit 3 at run time
    rows, cols, n = 8, 6, 4
    text = arg_reduce(rows, cols, "{replicated}", "{replicated}").replace(
        "sharding={{replicated}, {replicated}}", "sharding={{maximal device=2}, {devices=[4]<=[4]}}")
    assert "maximal device=2" in text
    x = tied_values(rows, cols)
    check(text, n, x, "max")
