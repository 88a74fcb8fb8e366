"""No more collective bytes than XLA (issue 13) where an instruction reads a tiled value in
another tiling and a user not planned yet would run for less on the whole value, though its plan
as it stands does not read it whole (a `dynamic-slice` sliced on tiled dims sums masked windows
of its tiles): insert-reshards gathers the value first and slices the tiling from it where the
gather, less what the later users save, moves fewer bytes from the busiest device than the
tiling alone (`_gathered_first`). XLA's partitioner reshards to a tiling it has no direct
technique for through the replicated value, and its reshard cache hands that value to the later
user. Bytes per device by hand from the cost model's formulas (an all-gather sends each device's
shard to the g-1 others); values against the unpartitioned program; with the `[xla]` extra,
against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def sliced_after_a_tiling(rows: int = 6, cols: int = 8, window: str = "5,3") -> str:
    """fuzz/16100001252 on, reduced: `p` in 2 x 2 tiles is read by `t` in 4 row tiles (another
    device order) and then, replicated, by a dynamic-slice at a run-time row."""
    w = window.split(",")
    return f"""HloModule m, num_partitions=4

ENTRY e {{
  p = f32[{rows},{cols}] parameter(0), sharding={{devices=[2,2]<=[4]}}
  t = f32[{rows},{cols}] tanh(p), sharding={{devices=[4,1]<=[2,2]T(1,0)}}
  i = u32[] parameter(1), sharding={{replicated}}
  c = u32[] constant(1), sharding={{replicated}}
  d = f32[{w[0]},{w[1]}] dynamic-slice(p, i, c), dynamic_slice_sizes={{{window}}},
    sharding={{replicated}}
  ROOT r = (f32[{w[0]},{w[1]}], f32[{rows},{cols}]) tuple(d, t),
    sharding={{{{replicated}}, {{devices=[4,1]<=[2,2]T(1,0)}}}}
}}
"""


def test_a_tiling_is_sliced_from_the_gather_a_later_dynamic_slice_runs_on():
    """Alone, `t`'s rows move by permutes of pieces (64 B from device 1) and the dynamic-slice
    sums masked windows of `p`'s tiles (an all-reduce of f32[5,3], 88 B from device 1): 152 B
    from the busiest device. Gathering `p` (f32[3,4] then f32[3,8] to one other device:
    48 + 96 = 144 B from every device) gives the dynamic-slice its operand whole and `t` its
    rows by a local slice: 144 B, XLA's program."""
    spmd = check_equivalent(sliced_after_a_tiling(), 4)
    assert [c[0] for c in collectives(spmd)] == ["all-gather", "all-gather"]
    assert list(sent_per_device(spmd, 4)) == [144] * 4


def test_a_gather_the_later_user_saves_too_little_of_is_not_made():
    """The same with a large `p` (f32[64,64]) and a small window (f32[2,3]): the dynamic-slice's
    all-reduce of 24 B saves far less than gathering `p` costs beyond moving its rows, so the
    rows move by themselves and the dynamic-slice sums its masked windows."""
    spmd = check_equivalent(sliced_after_a_tiling(64, 64, "2,3"), 4)
    ops = [c[0] for c in collectives(spmd)]
    assert "all-gather" not in ops
    assert ops[-1] == "all-reduce"


@needs_xla
def test_no_more_bytes_than_xla():
    compared_with_xla(sliced_after_a_tiling(), 4)
