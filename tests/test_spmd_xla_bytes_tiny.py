"""No more collective bytes than XLA (issue 13) on tiny and uneven values, class by class as the
oracle found them on seed 10600: a dim with fewer elements than tiles made whole by a masked sum
before the other dims are gathered, a `multiply` reduce over an uneven dim reduced locally and
all-reduced, a `pad` with interior padding whose dilated dim is exchanged last, and a `cholesky`
whose matrix tiles move to a batch dim. Bytes are worked out by hand from the cost model's ring
formulas (`gspmdc.ir.cost`); values against numpy or the unpartitioned program, with garbage in
the padding; with the `[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd.reshard_plan import plan_reshard

from conformance.differential import collective_bytes
from conformance.oracle import xla_available
from hlo_text import reducer
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, run_global

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


# ---- a dim with fewer elements than tiles (fuzz/10600002166) ---------------------------------

TINY_DIM = """HloModule m, num_partitions=6

ENTRY e {
  p = f32[2,1] parameter(0), sharding={devices=[2,3]<=[6]}
  ROOT n = f32[2,1] negate(p), sharding={replicated}
}
"""


def test_tiny_dim_is_summed_then_the_other_dim_gathered():
    """f32[2,1] tiled [2,3] needed replicated: dim 1 (one element in 3 tiles) is made whole by
    a sum of the zero-padded shards over groups of 3 (ring chunks (1,0,0): the members send 1, 2,
    1 elements: 4, 8, 4 B), then dim 0 is all-gathered over pairs (4 B each): 12 B from the
    busiest device, 2 x 16 + 6 x 4 = 56 B from all. Gathering both dims (before) sent 8 + 4 B
    from every device (72 B together); one sum over all 6 (the whole masked gather) 16 B from
    the busiest, as XLA sums the dims at most half their tile count and gathers the others."""
    plan = plan_reshard(ArrayShape("f32", (2, 1)), parse_sharding("{devices=[2,3]<=[6]}"),
                        parse_sharding("{replicated}"), 6)
    assert plan.collectives == ["all-reduce", "all-gather"]
    assert (plan.cost, plan.total) == (12, 56)
    spmd = check_equivalent(TINY_DIM, 6)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2], [3, 4, 5]]),
                                 ("all-gather", [[0, 3], [1, 4], [2, 5]], (0,))]
    assert collective_bytes(api.to_text(spmd), 6) == pytest.approx(56 / 6)
    x = np.array([[1.5], [-2.0]], dtype=np.float32)
    np.testing.assert_array_equal(run_global(spmd, [x], 6), -x)


@needs_xla
def test_tiny_dim_sends_what_xla_sends():
    result = compared_with_xla(TINY_DIM, 6)
    assert result.our_bytes == pytest.approx(result.xla_bytes)


# ---- a multiply reduce over an uneven dim (fuzz/10600001702) ----------------------------------

PRODUCT = f"""HloModule m, num_partitions=3

{reducer("mul", "multiply", "f32")}

ENTRY e {{
  p = f32[2] parameter(0), sharding={{devices=[3]<=[3]}}
  one = f32[] constant(1)
  ROOT r = f32[] reduce(p, one), dimensions={{0}}, to_apply=mul, sharding={{replicated}}
}}
"""


def test_multiply_reduce_over_an_uneven_dim_is_all_reduced():
    """f32[2] in 3 tiles of 1 (the third all padding), its product needed replicated. Each
    partition masks its padding with the init value 1 (multiply's identity), reduces its shard
    and the partial products are all-reduced with `multiply`: ring chunks (1,0,0), the members
    send 1, 2, 1 elements: 8 B from the busiest, 16 B together. Gathering the elements also
    sends 8 B from the busiest (its element to 2 others), but 24 B together: on the tie of the
    busiest device the bytes of all decide (XLA reduces locally)."""
    spmd = check_equivalent(PRODUCT, 3)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2]])]
    reduce_ops = [i for i in spmd.entry.instructions if i.opcode == "all-reduce"]
    root = spmd.computations[reduce_ops[0].attr("to_apply").name].root
    assert root.opcode == "multiply"
    assert collective_bytes(api.to_text(spmd), 3) == pytest.approx(16 / 3)
    x = np.array([1.5, -2.0], dtype=np.float32)
    np.testing.assert_allclose(run_global(spmd, [x], 3), x.prod(), rtol=1e-6)


@needs_xla
def test_multiply_reduce_sends_what_xla_sends():
    result = compared_with_xla(PRODUCT, 3)
    assert result.our_bytes == pytest.approx(result.xla_bytes)


# ---- the order of halo exchanges (fuzz/10600002869, fuzz/10100002759) -------------------------

INTERIOR_PAD = """HloModule m, num_partitions=8

ENTRY e {
  p = f32[6,5] parameter(0), sharding={devices=[2,4]<=[8]}
  c = f32[] constant(0.5)
  ROOT r = f32[15,9] pad(p, c), padding=1_3_1x3_1, sharding={devices=[2,4]<=[8]}
}
"""


def test_interior_padded_dim_is_exchanged_last():
    """f32[6,5] tiled [2,4] (shards [3,2]), padded 1_3 with interior 1 on dim 0 and 3_1 on dim 1
    into f32[15,9] tiled alike (shards [8,3]). Dim 1: shard 1's outputs read columns 0..2, shard
    2's column 3..4: the column shards 0 and 1 each send their whole [3,2] shard (24 B) to the
    next. Dim 0: row shard 0's outputs (positions 1, 3, 5, 7 hold rows 0..3) read row 3 of
    shard 1, which sends it across the 3 columns its window now has (12 B), except to column
    shard 3, which has no real output (`HaloPlan.real`). Per device: 4 of 8 send 24 B, 3 send
    12 B: 16.5 B on average, 36 B on the busiest (device 4: both). Dilated first (before), the
    dim-1 exchange carried the 8 dilated rows: 64 B from 4 devices (XLA: 28 B on average, 40 on
    its busiest)."""
    spmd = check_equivalent(INTERIOR_PAD, 8)
    found = collectives(spmd)
    assert [c[0] for c in found] == ["collective-permute", "collective-permute"]
    assert found[0][1] == [(0, 1), (1, 2), (4, 5), (5, 6)]
    assert found[1][1] == [(4, 0), (5, 1), (6, 2)]
    assert collective_bytes(api.to_text(spmd), 8) == pytest.approx(16.5)


CROPPED_PAD = """HloModule m, num_partitions=8

ENTRY e {
  p = f64[3,5,5] parameter(0), sharding={devices=[1,2,4]<=[8]}
  c = f64[] constant(0.5)
  ROOT r = f64[5,1,11] pad(p, c), padding=2_0x-12_0_2x4_2, sharding={devices=[1,2,4]<=[8]}
}
"""


def test_cropping_dilated_dim_is_exchanged_first():
    """f64[3,5,5] tiled [1,2,4] padded into f64[5,1,11]: dim 1 (interior 2, cropped by 12) keeps
    one element, row 4 of the second shard, read by the first (1 element x 3 x the 2 columns
    of a shard: 48 B from 4 devices); dim 2 (4_2) moves a whole 2-column shard to the next for
    shards 0 and 1. Dim 1 first, those columns carry the 1 row left, and only to the first
    row shard (the second has no real output): 48 B from 2 devices, 36 B on average. Dim 2
    first (dilated last), they carried the 3 rows of the shard to both row shards (the second
    sends on dim 1 after): 144 B from 4 devices, then dim 1's element across the 3 columns:
    72 B from 4, 108 B on average."""
    spmd = check_equivalent(CROPPED_PAD, 8)
    found = collectives(spmd)
    assert [c[0] for c in found] == ["collective-permute", "collective-permute"]
    assert found[0][1] == [(4, 0), (5, 1), (6, 2), (7, 3)]
    assert found[1][1] == [(0, 1), (1, 2)]
    assert collective_bytes(api.to_text(spmd), 8) == pytest.approx(36)


@needs_xla
def test_interior_pad_sends_fewer_bytes_than_xla():
    result = compared_with_xla(INTERIOR_PAD, 8)
    assert result.our_bytes < result.xla_bytes


# ---- cholesky with a tiled matrix dim (fuzz/10600002152) ---------------------------------------

def cholesky_module(sharding: str) -> str:
    """A batch of 4 positive definite 4x4 matrices `p p^T + 4 I`, factorised."""
    return f"""HloModule m, num_partitions=8

ENTRY e {{
  p = f32[4,4,4] parameter(0), sharding={sharding}
  d = f32[4,4,4] dot(p, p), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_contracting_dims={{2}}, sharding={sharding}
  i = s32[4,4] iota(), iota_dimension=0
  j = s32[4,4] iota(), iota_dimension=1
  eq = pred[4,4] compare(i, j), direction=EQ
  four = f32[] constant(4)
  zero = f32[] constant(0)
  f = f32[4,4] broadcast(four), dimensions={{}}
  z = f32[4,4] broadcast(zero), dimensions={{}}
  s = f32[4,4] select(eq, f, z)
  b = f32[4,4,4] broadcast(s), dimensions={{1,2}}
  a = f32[4,4,4] add(d, b), sharding={sharding}
  ROOT l = f32[4,4,4] cholesky(a), lower=true, sharding={sharding}
}}
"""


def test_cholesky_moves_matrix_tiles_to_the_batch_dim():
    """f32[4,4,4] with its row dim tiled 4 ways (held twice): as XLA, the cholesky runs on the
    batch dim tiled 4 ways, reached and left by all-to-alls over the 4 row tiles: each device
    sends 3 of the 4 blocks of its [4,1,4] shard (48 B) twice, 96 B, where gathering the rows
    sent 3 x 64 B = 192 B. The factors against numpy's."""
    text = cholesky_module("{devices=[1,4,1,2]<=[8] last_tile_dim_replicate}")
    spmd = check_equivalent(text, 8, rtol=1e-4, atol=1e-4)
    after_dot = [c[0] for c in collectives(spmd)][-2:]
    assert after_dot == ["all-to-all", "all-to-all"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4, 4)).astype(np.float32)
    a = x @ x.transpose(0, 2, 1) + 4 * np.eye(4, dtype=np.float32)
    np.testing.assert_allclose(run_global(spmd, [x], 8), np.linalg.cholesky(a), rtol=1e-4,
                               atol=1e-4)


def test_cholesky_matrix_tiles_with_no_batch_dim_to_take_them_are_gathered():
    """f32[3,3,3] wanted [1,3,2] on 6 devices (fuzz/12800001197 on): the row dim's 3 tiles move
    to the batch dim of 3, the column dim's 2 cannot (3 is not a multiple of 6) and are
    replicated, so every device factorises whole 3x3 matrices; before, the column tiles stayed
    and the local cholesky of a [1,3,3] operand claimed a [1,3,2] result. The factors against
    numpy's."""
    text = """HloModule m, num_partitions=6

ENTRY e {
  p = f32[3,3,3] parameter(0), sharding={devices=[3,2,1]<=[6]}
  d = f32[3,3,3] dot(p, p), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={2}, sharding={devices=[3,2,1]<=[6]}
  i = s32[3,3] iota(), iota_dimension=0
  j = s32[3,3] iota(), iota_dimension=1
  eq = pred[3,3] compare(i, j), direction=EQ
  three = f32[] constant(3)
  zero = f32[] constant(0)
  f = f32[3,3] broadcast(three), dimensions={}
  z = f32[3,3] broadcast(zero), dimensions={}
  s = f32[3,3] select(eq, f, z)
  b = f32[3,3,3] broadcast(s), dimensions={1,2}
  a = f32[3,3,3] add(d, b), sharding={devices=[3,2,1]<=[6]}
  ROOT l = f32[3,3,3] cholesky(a), lower=true, sharding={devices=[1,3,2]<=[6]}
}
"""
    spmd = check_equivalent(text, 6, rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 3, 3)).astype(np.float32)
    a = x @ x.transpose(0, 2, 1) + 3 * np.eye(3, dtype=np.float32)
    np.testing.assert_allclose(run_global(spmd, [x], 6), np.linalg.cholesky(a), rtol=1e-4,
                               atol=1e-4)


@needs_xla
def test_cholesky_sends_no_more_than_xla():
    compared_with_xla(cholesky_module("{devices=[1,4,1,2]<=[8] last_tile_dim_replicate}"), 8)
