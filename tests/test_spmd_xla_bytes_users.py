"""No more collective bytes than XLA (issue 13) in two classes of seeds 10600 and 11100: the
order of the all-to-alls when two dims trade their tiles with two others over uneven dims (XLA
moves the last pair first, `GetReshardAllToAllSourceTargetDims`, which pads a smaller shard
first); and a value's reshard shared by its users (XLA reshards a value once per target
sharding, its reshard cache, so one gather made for one user makes another user's read free).
Bytes are worked out by hand from the cost model's formulas (`gspmdc.ir.cost`: all-to-all =
every block but the device's own); values against the unpartitioned program; with the `[xla]`
extra, against XLA's own partitioned program (skipped without it)."""
from __future__ import annotations

import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import AllToAll, plan_reshard

from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

TRADED_UNEVEN = """HloModule m, num_partitions=4

ENTRY main {
  p = f32[3,7,2,2] parameter(0), sharding={devices=[1,1,2,2]<=[4]}
  ROOT n = f32[3,7,2,2] negate(p), sharding={devices=[2,2,1,1]3,0,2,1}
}
"""


def test_the_last_dims_trade_their_tiles_first():
    """fuzz/11100002245: dims 2 and 3 give their 2 tiles each to dims 0 (3 rows) and 1 (7
    columns). Dim 3 to dim 1 first: the [3,7,1,1] shard padded to [3,8,1,1] (96 B), half of
    it sent: 48 B; then dim 2 to dim 0: [3,4,1,2] padded to [4,4,1,2] (128 B): 64 B. Dim 2 to
    dim 0 first pads the rows of the larger shard, [4,7,1,1] (112 B): 56, then 64 B. The permute
    to the target's device order after them moves [2,4,2,2] (128 B) from 3 of the 4 devices."""
    plan = plan_reshard(ArrayShape("f32", (3, 7, 2, 2)),
                        parse_sharding("{devices=[1,1,2,2]<=[4]}"),
                        parse_sharding("{devices=[2,2,1,1]3,0,2,1}"), 4)
    moves = [(s.source, s.target) for s in plan.steps if isinstance(s, AllToAll)]
    assert moves == [(3, 1), (2, 0)]
    assert plan.cost == 48 + 64 + 128
    spmd = check_equivalent(TRADED_UNEVEN, 4)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all", "all-to-all",
                                                 "collective-permute"]
    assert sent_bytes(spmd, 4) == 48 + 64 + 128 * 3 / 4


@needs_xla
@pytest.mark.parametrize("text,n", [(TRADED_UNEVEN, 4)], ids=["traded-uneven"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both programs
    compute the reference's values."""
    compared_with_xla(text, n)
