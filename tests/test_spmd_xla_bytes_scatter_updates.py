"""No more collective bytes than XLA (issue 13) for a scatter whose updates, not its indices,
are tiled on a batch dim (index pass-through by the updates' tiles) while its operand is tiled
on the dim the indices address with window size 1 (trivially sliced operand): the updates stay
where they are, the operand's tiles are laid over the devices of each update tile (one
collective-permute), each device scatters its updates into its operand tile (the indices
shifted by the tile's offset: updates of other tiles fall out of bounds and are dropped) and
only that tile of the partial result is all-reduced over the update tiles.

Bytes per device by hand from the cost model's formulas (`gspmdc.ir.cost`: an all-gather sends
each device's shard to the g-1 others, a ring all-reduce of B bytes over g devices sends
2 (g-1)/g B, a collective-permute its shard from each device that sends); the partitioned
scatter's layout by hand; values against the unpartitioned program, with duplicate and
out-of-bounds indices and uneven shapes; with the `[xla]` extra, against XLA's own partitioned
program."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api

from conformance.oracle import xla_available

from filecheck import check, directives
from spmd_partition_helpers import (
    busiest_per_collective, check_equivalent, collectives, compared_with_xla, inputs_for,
    sent_bytes,
)

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def updates_tiled(size: int = 8, rows: int = 5, combiner: str = "add") -> str:
    """A scatter of single elements into `f32[size]` tiled 4 ways (pairs of replicas: tile t
    on devices {4,5}, {2,3}, {6,7}, {0,1}); the indices replicated; the updates `f32[rows,6]`
    tiled 2 ways on their rows ({0,1,4,5} and {2,3,6,7}); the result replicated."""
    return f"""HloModule m, num_partitions=8

combine {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] {combiner}(a, b)
}}

ENTRY e {{
  o = f32[{size}] parameter(0), sharding={{devices=[4,2]4,5,2,3,6,7,0,1 last_tile_dim_replicate}}
  i = s32[{rows},6,1] parameter(1), sharding={{replicated}}
  u = f32[{rows},6] parameter(2),
    sharding={{devices=[2,1,4]0,1,4,5,2,3,6,7 last_tile_dim_replicate}}
  ROOT s = f32[{size}] scatter(o, i, u), update_window_dims={{}}, inserted_window_dims={{0}},
    scatter_dims_to_operand_dims={{0}}, index_vector_dim=2, to_apply=combine,
    sharding={{replicated}}
}}
"""


def inputs(text: str, size: int, seed: int = 0) -> list:
    """Random inputs whose indices repeat (every index is drawn from a few values) and fall
    out of bounds on both sides."""
    o, i, u = inputs_for(text, seed)
    rng = np.random.default_rng(seed)
    choices = np.array([-1, 0, 1, size - 1, size, size + 5, 2])
    return [o, rng.choice(choices, i.shape).astype(i.dtype), u]


def test_the_operand_tiles_are_laid_over_each_update_tile():
    """Each update tile's devices (in the order of their operand tile, then of device id:
    {4,5,0,1} and {2,3,6,7}) take the operand's 4 tiles: tile 0 on {4,2}, 1 on {5,3}, 2 on
    {0,6}, 3 on {1,7}, partial over the update tiles. Devices 5, 2, 7 and 0 receive another
    tile (a collective-permute, 8 B from each of 4 devices), the f32[2] tile is all-reduced over
    each pair (2 (2-1)/2 8 = 8 B) and gathered over the 4 tiles (3 x 8 = 24 B): 40 B from the
    busiest device, (32/8 + 8 + 24) = 36 B per device. Before: the operand gathered (24 B) and
    the whole f32[8] all-reduced over the update tiles (32 B): 56 B from every device."""
    text = updates_tiled()
    spmd = check_equivalent(text, 8, inputs=inputs(text, 8))
    assert [c[0] for c in collectives(spmd)] == ["collective-permute", "all-reduce",
                                                 "all-gather"]
    assert collectives(spmd)[0][1] == [(0, 7), (1, 1), (2, 5), (3, 3), (4, 4), (5, 2),
                                       (6, 6), (7, 0)]
    assert busiest_per_collective(spmd, 8) == 40
    assert sent_bytes(spmd, 8) == 36
    check(api.to_text(spmd), directives("""
    // CHECK: %s = f32[2] scatter(
    // CHECK-SAME: sharding={devices=[4,2]4,2,5,3,0,6,1,7 last_tile_dims={unreduced}}
    // CHECK-NEXT: all-reduce(%s), {{.*}}replica_groups={{[{][{]}}4,2},{5,3},{0,6},{1,7}}
    // CHECK-NOT: all-reduce(
    """))


@pytest.mark.parametrize("size, rows, combiner", [(8, 5, "maximum"), (8, 5, "minimum"),
                                                  (7, 5, "add"), (6, 4, "multiply"),
                                                  (5, 3, "maximum")])
def test_updates_tiled_values(size, rows, combiner):
    """Other combiners (each partial starts from its identity) and operands whose tiles are
    uneven: the padding is never scattered into, out-of-bounds updates are dropped."""
    text = updates_tiled(size, rows, combiner)
    check_equivalent(text, 8, inputs=inputs(text, size, seed=size + rows))


@needs_xla
def test_no_more_bytes_than_xla():
    compared_with_xla(updates_tiled(), 8)
