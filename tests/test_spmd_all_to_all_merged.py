"""Tiles moved between several pairs of dims by one all-to-all (XLA reshards so when a sharding
trades the tiles of some dims for those of others: every device sends each block once, instead
of once per pair). Bytes are worked out by hand from the cost model's formula (an all-to-all
over g devices sends every block but the device's own: (g-1)/g of the operand); values against
the unpartitioned program; with the `[xla]` extra, bytes against XLA's own partitioned program
(skipped without it)."""
from __future__ import annotations

import pytest

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import AllToAll, plan_reshard

from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

COPY = """HloModule m, num_partitions={n}

ENTRY main {{
  p = f32[{dims}] parameter(0), sharding={source}
  ROOT c = f32[{dims}] copy(p), sharding={target}
}}
"""


def copy_module(dims, source: str, target: str, n: int) -> str:
    return COPY.format(n=n, dims=",".join(map(str, dims)), source=source, target=target)


TWO_PAIRS = copy_module((8, 8, 8, 8), "{devices=[1,4,2,1]<=[8]}",
                        "{devices=[2,1,1,4]<=[4,2]T(1,0)}", 8)
THREE_PAIRS = copy_module((2, 4, 2, 2, 4, 2), "{devices=[2,2,2,1,1,1]<=[8]}",
                          "{devices=[1,1,1,2,2,2]<=[2,2,2]T(1,0,2)}", 8)
UNEVEN_PAIRS = copy_module((3, 5, 6, 12), "{devices=[1,4,1,3]<=[12]}",
                           "{devices=[2,1,3,1,2]<=[12] last_tile_dim_replicate}", 12)


def test_two_pairs_move_in_one_all_to_all_over_all_devices():
    """[1,4,2,1] -> [2,1,1,4]: dim 2's 2 tiles go to dim 0 and dim 1's 4 to dim 3. One
    all-to-all over the 8 devices, each member in the place of its sub-tiles of dims 2 and 1
    (device d = 2 * (dim 1 tile) + (dim 2 tile): place 4 * (dim 2 tile) + (dim 1 tile)), sends
    7 of the 8 blocks of the [8,2,4,8] shard (2048 B): 1792 B, where an all-to-all per pair
    sends 1024 + 1536 B."""
    plan = plan_reshard(ArrayShape("f32", (8, 8, 8, 8)),
                        parse_sharding("{devices=[1,4,2,1]<=[8]}"),
                        parse_sharding("{devices=[2,1,1,4]<=[4,2]T(1,0)}"), 8)
    assert [type(s) for s in plan.steps] == [AllToAll]
    assert sorted(plan.steps[0].moves) == [(1, 3, 4), (2, 0, 2)]
    assert plan.cost == 2048 * 7 // 8
    spmd = check_equivalent(TWO_PAIRS, 8)
    assert collectives(spmd) == [("all-to-all", [[0, 2, 4, 6, 1, 3, 5, 7]], (0,))]
    assert sent_bytes(spmd, 8) == 1792


def test_three_pairs_move_in_one_all_to_all_then_a_permute():
    """[2,2,2,1,1,1] -> [1,1,1,2,2,2] in the order (1,0,2) of the device digits: dims 0, 1, 2
    give their tiles to dims 3, 4, 5 in one all-to-all over the 8 devices (7/8 of the 128 B
    shard: 112 B, where three all-to-alls over pairs send 64 B each), then the devices whose
    digits the target's order swaps (4 of 8) receive their tiles from another: 128 B from
    each of those."""
    spmd = check_equivalent(THREE_PAIRS, 8)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all", "collective-permute"]
    ata = collectives(spmd)[0]
    assert ata[1] == [list(range(8))]
    assert sent_bytes(spmd, 8) == 112 + 128 * 4 / 8


def test_uneven_pairs_move_in_one_all_to_all():
    """Uneven dims: [1,4,1,3] -> [2,1,3,1] (each tile twice): dim 1 (5 elements in 4 tiles
    of 2) gives 2 tiles to dim 0 (3 elements, padded to 4) and dim 3 (12 in 3 tiles of 4) gives
    its 3 to dim 2 (6), in one all-to-all over 6 devices; the padding never reaches the
    result."""
    spmd = check_equivalent(UNEVEN_PAIRS, 12)
    kinds = [c[0] for c in collectives(spmd)]
    assert kinds.count("all-to-all") == 1
    ata = next(c for c in collectives(spmd) if c[0] == "all-to-all")
    assert len(ata[1][0]) == 6


@needs_xla
@pytest.mark.parametrize("text,n", [(TWO_PAIRS, 8), (THREE_PAIRS, 8), (UNEVEN_PAIRS, 12)],
                         ids=["two-pairs", "three-pairs", "uneven-pairs"])
def test_no_more_bytes_than_xla(text, n):
    """XLA partitions the same module: gspmdc sends no more bytes per device, and both programs
    compute the reference's values."""
    compared_with_xla(text, n)
