"""A dilated dim exchanged before another carries only its undilated elements
(docs/design/partitioning.md#halo-exchange): the later exchanges never send its holes or
padding, which are added once every exchange is done (as XLA exchanges undilated data and
leaves the dilation to the local op; fuzz/13900001379 on)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.spmd.halo import WindowedDim, exchange_order, halo_sent, plan_halo

from conformance.differential import program_bytes
from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

# f32[4,1,3] tiled [2,2,1] padded `0_-4_1x2_0x0_0` into f32[3,3,3] tiled alike.
# Dim 0: rows dilated x2 and cropped to [x0, hole, x1]; shards of 2 outputs: shard 0 reads
# [x0, hole], shard 1 [x1, past the end]; x1 lives on row shard 0 (rows 0..1).
# Dim 1: one element padded 2 low: [pad, pad, e0]; shard 1 reads [e0, past the end] from
# shard 0 (shard 1 of the operand holds only padding).
CROPPED = """HloModule m, num_partitions=4

ENTRY e {
  p = f32[4,1,3] parameter(0), sharding={devices=[2,2,1]<=[4]}
  c = f32[] constant(0.5)
  ROOT r = f32[3,3,3] pad(p, c), padding=0_-4_1x2_0x0_0, sharding={devices=[2,2,1]<=[4]}
}
"""


def _plans():
    return {0: plan_halo(WindowedDim(4, 2, 1, 1, 0, -4, 2)),
            1: plan_halo(WindowedDim(1, 2, 1, 1, 2, 0))}


def test_undilated_window_of_a_cropped_dilated_dim():
    """Dim 0's concatenation is [x1 of the left shard | own x(2i), x(2i+1)] (undilated): shard
    0's window [x0, hole] starts at its own first element (index 1), shard 1's [x1, beyond]
    at the received one (index 0). One element each, so later exchanges carry 1 row where the
    dilated window held 2 positions."""
    plan = _plans()[0]
    count, first = plan.undilated_window()
    assert (count, first.tolist()) == (1, [1, 0])
    assert (plan.window_input, plan.carried) == (2, 1)


def test_later_exchange_prices_the_undilated_rows():
    """Dim 0 first: row shard 0 sends row x1 (1 x 1 x 3 floats, 12 B) down; then dim 1: column
    shard 0 sends its one carried row (1 x 1 x 3, 12 B) right. Device (0,0) does both: 24 B;
    devices (0,1) and (1,0) one each: 48 B in all. Had the dilated 2-position window travelled,
    dim 1's piece would be 2 x 1 x 3 (36 B on device (0,0))."""
    plans = _plans()
    assert exchange_order(plans, (2, 1, 3)) == [0, 1]
    assert halo_sent(plans, (2, 1, 3), 4, 4) == (24.0, 48.0)


def test_pad_sends_undilated_rows_and_matches_the_reference():
    spmd = check_equivalent(CROPPED, 4)
    assert collectives(spmd) == [("collective-permute", [(0, 2), (1, 3)]),
                                 ("collective-permute", [(0, 1), (2, 3)])]
    for inst in spmd.entry.instructions:
        if inst.opcode == "collective-permute":
            assert inst.shape.dims == (1, 1, 3)
    sent = program_bytes(api.to_text(spmd), 4)
    assert (sent.busiest, sent.mean) == (24, 12.0)


# Pads with interior padding on two or three tiled dims, every exchange order the cost model
# picks: the windows cut from the undilated elements and dilated last must hold exactly the
# unpartitioned program's values (shards whose windows start on a hole, on padding, past the
# data, uneven shards).
DILATED = [
    ("f32[6,4]", "[2,2]", "1_0_2x1_1_0", "[2,2]"),
    ("f32[5,3]", "[2,2]", "-1_2_1x0_-1_2", "[2,2]"),
    ("f32[7,2]", "[3,2]", "2_-3_1x1_0_1", "[3,2]"),
    ("f32[4,5,3]", "[2,2,2]", "0_-4_1x-2_1_1x1_1_2", "[2,2,2]"),
    ("f32[3,6]", "[2,3]", "3_0_3x-1_-1_1", "[2,3]"),
    ("f32[6,4]", "[2,2]", "1_0_2x1_1_1", "[1,4]"),
]


def _pad_module(shape: str, tiles: str, padding: str, result_tiles: str) -> str:
    dims = [int(d) for d in shape[4:-1].split(",")]
    out = []
    for size, spec in zip(dims, padding.split("x")):
        low, high, interior = (int(v) for v in spec.split("_"))
        out.append(size + (size - 1) * interior + low + high)
    n = int(np.prod([int(t) for t in tiles.strip("[]").split(",")]))
    return f"""HloModule m, num_partitions={n}

ENTRY e {{
  p = {shape} parameter(0), sharding={{devices={tiles}<=[{n}]}}
  c = f32[] constant(0.5)
  ROOT r = f32[{",".join(map(str, out))}] pad(p, c), padding={padding}, sharding={{devices={result_tiles}<=[{n}]}}
}}
"""


@pytest.mark.parametrize("shape,tiles,padding,result_tiles", DILATED)
def test_dilated_exchanges_match_the_reference(shape, tiles, padding, result_tiles):
    text = _pad_module(shape, tiles, padding, result_tiles)
    check_equivalent(text, int(np.prod([int(t) for t in tiles.strip("[]").split(",")])))


def test_base_dilated_reduce_window_on_two_dims_matches_the_reference():
    """reduce-window with `lhs_dilate=2x3` (max, holes and padding -inf) on both tiled dims."""
    text = """HloModule m, num_partitions=4

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] maximum(a, b)
}

ENTRY e {
  p = f32[5,4] parameter(0), sharding={devices=[2,2]<=[4]}
  c = f32[] constant(-inf)
  ROOT r = f32[4,5] reduce-window(p, c), window={size=3x2 stride=2x2 pad=1_0x0_1 lhs_dilate=2x3}, to_apply=max, sharding={devices=[2,2]<=[4]}
}
"""
    check_equivalent(text, 4)


@needs_xla
def test_reshard_then_dilated_halo_sends_what_xla_sends():
    """fuzz/13900001379's pad: c64[8,4,1,3] tiled [1,4,1,1] into [1,2,2,1] (an all-to-all),
    then dim 1's one-row halo and dim 2's exchange of that one row: 584 B on the busiest
    device, 396 on average, as XLA (the operand gathered and the result sliced sent 592 / 588)."""
    text = """HloModule m, num_partitions=4

ENTRY e {
  p = c64[8,4,1,3] parameter(0), sharding={devices=[1,4,1,1]<=[4]}
  v = c64[] parameter(1), sharding={maximal device=1}
  ROOT r = c64[10,3,3,10] pad(p, v), padding=1_1x0_-4_1x2_0x2_3_1, sharding={devices=[1,2,2,1]<=[4]}
}
"""
    result = compared_with_xla(text, 4)
    assert (result.our_busiest, result.our_bytes) == (result.xla_busiest, result.xla_bytes)
