"""The exchange of the pieces of the new tiles (`passes/spmd/reshard_exchange.py`) keeps the
cheaper of two fillings of its permute rounds: tile by tile, and largest piece first with each
piece where the busiest device sends least (a round's buffer is its largest piece, so a small
piece in a round of large ones is sent at the large size). Rounds against a hand-worked
layout; values against numpy; with the `[xla]` extra, no more bytes than XLA's program from
the busiest device, then in all (issue 13: fuzz/16100002939 on)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_exchange import plan_exchange
from gspmdc.passes.spmd.reshard_plan import plan_reshard
from gspmdc.passes.spmd.tiling import Tiling
from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, run_global

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

#: f32[5]: tile k of 2 elements on devices {0,4}, {1,3}, {6,7}, {2,5} (the last one padding)
SOURCE = "{devices=[4,2]0,4,1,3,6,7,2,5 last_tile_dim_replicate}"
#: elements 0-2 on devices {0,5,6,7}, 3-4 on {1,2,3,4}
TARGET = "{devices=[2,4]0,5,6,7,1,2,3,4 last_tile_dim_replicate}"


def _module(with_pad: bool) -> str:
    """fuzz/16100002939 on, reduced: `a` read in `TARGET` by `l`; with `with_pad`, a pad whose
    halos or pieces load devices 0-5 before it."""
    pad = """  p = u32[9,13] parameter(1), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}
  c = u32[] constant(3), sharding={replicated}
  q = u32[12,14] pad(p, c), padding=3_0x1_0,
    sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}
""" if with_pad else ""
    root = "(u32[12,14], f32[5]) tuple(q, l), sharding={{devices=[2,2,2]<=[8] " \
           f"last_tile_dim_replicate}}, {TARGET}}}" if with_pad else \
        f"(f32[5]) tuple(l), sharding={{{TARGET}}}"
    return f"""HloModule m, num_partitions=8

ENTRY e {{
  x = f32[5] parameter(0), sharding={SOURCE}
  a = f32[5] abs(x), sharding={SOURCE}
  l = f32[5] log-plus-one(a), sharding={TARGET}
{pad}  ROOT r = {root}
}}
"""


def test_largest_pieces_fill_the_first_rounds():
    """Elements 0-1 (2 elements, from 0 or 4) go to 5, 6 and 7; element 2 (from 1 or 3) to 0,
    5, 6, 7; element 3 (from 1 or 3) to 2 and 4; element 4 (from 6 or 7) to 1, 2, 3, 4. The
    2-element pieces first: {0->5, 4->6} and {0->7}; then each 1-element piece in the round,
    by the holder, that leaves the busiest device sending least, then all devices: a new
    round of size 1 where one may still be opened ({1->0, 3->2, 6->1, 7->3},
    {1->4, 3->5, 7->2}), else a 2-element round (3->7 and 6->4 in the first, 1->6 in the
    second). Devices 0, 1 and 3 send 16 B, all devices 76 B; filled tile by tile device 1 sent
    8 + 8 + 4 = 20 B, all 92 B (XLA's permute, halo and pair gathers: 20 B, 128 B)."""
    rounds = plan_exchange((5,), Tiling(parse_sharding(SOURCE), 1, 8),
                           Tiling(parse_sharding(TARGET), 1, 8))
    assert rounds[0].pairs is None                     # the local pieces
    assert [(r.size, sorted(map(tuple, r.pairs.tolist()))) for r in rounds[1:]] == [
        ((2,), [(0, 5), (3, 7), (4, 6), (6, 4)]),
        ((2,), [(0, 7), (1, 6)]),
        ((1,), [(1, 0), (3, 2), (6, 1), (7, 3)]),
        ((1,), [(1, 4), (3, 5), (7, 2)])]
    plan = plan_reshard(ArrayShape("f32", (5,)), parse_sharding(SOURCE),
                        parse_sharding(TARGET), 8)
    assert (plan.cost, plan.total) == (16, 76)


def test_tile_by_tile_is_kept_where_the_busiest_device_sends_as_much():
    """f32[2,7] in [2,3] tiles (devices 0, 3, 1 on row 0's column tiles [0,3), [3,6), [6,7);
    4, 2, 5 on row 1's) to 6 column tiles of 2: device 0 needs row 1's columns 0-1 from 4,
    device 1 four single elements from 0, 3, 4 and 2, device 2 row 0's columns 4-5 from 3,
    device 3 column 6 from 1 and 5. Tile by tile ({0->1, 1->3, 3->2, 4->0} of [1,2], then
    {3->1, 5->3}, {4->1}, {2->1} of [1,1]) devices 3 and 4 send 8 + 4 = 12 B, all 48 B;
    largest first sends 12 B from them too (44 B in all, device 2 sending 8 B instead of 4), so
    the tile-by-tile rounds stay: at an equal busiest device, moving bytes onto other devices
    can load one that other instructions load already (fuzz/11500000064 on: 16 B from its
    busiest device, not 20)."""
    source, target = "{devices=[2,3]<=[2,3]T(1,0)}", "{devices=[1,6]<=[6]}"
    rounds = plan_exchange((2, 7), Tiling(parse_sharding(source), 2, 6),
                           Tiling(parse_sharding(target), 2, 6))
    assert [(r.size, sorted(map(tuple, r.pairs.tolist()))) for r in rounds[1:]] == [
        ((1, 2), [(0, 1), (1, 3), (3, 2), (4, 0)]),
        ((1, 1), [(3, 1), (5, 3)]),
        ((1, 1), [(4, 1)]),
        ((1, 1), [(2, 1)])]
    plan = plan_reshard(ArrayShape("f32", (2, 7)), parse_sharding(source),
                        parse_sharding(target), 6)
    assert (plan.cost, plan.total) == (12, 48)


def test_the_exchange_reproduces_the_value():
    spmd = check_equivalent(_module(False), 8)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"] * 4
    assert list(sent_per_device(spmd, 8)) == [16, 16, 0, 16, 8, 0, 12, 8]
    x = np.array([1.5, -2.0, 3.25, 7.0, -9.5], dtype=np.float32)
    np.testing.assert_allclose(run_global(spmd, [x], 8)[0], np.log1p(np.abs(x)), rtol=1e-6)


@needs_xla
@pytest.mark.parametrize("with_pad", [False, True], ids=["alone", "after-a-pad"])
def test_no_more_bytes_than_xla(with_pad):
    """XLA moves the value by a permute of every device's tile, a halo of one element and
    gathers over pairs (20 B from its busiest devices 6 and 7, 16 B from device 1); after
    the pad, whose bytes fall on devices 0-5, tile by tile sent 100 B from device 1 against
    XLA's 96."""
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    with XlaOracle() as xla:
        result = run_case(Case("bytes", _module(with_pad), 8), xla)
    assert result.status == "compared", result.detail
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
    assert (result.our_busiest, result.our_bytes) <= (result.xla_busiest, result.xla_bytes)
