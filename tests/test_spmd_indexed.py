"""dynamic-slice, dynamic-update-slice, sort and TopK partitioning
(docs/design/partitioning.md#sort-and-topk): each
strategy forced by the shardings, checked against the unpartitioned program on 2, 3, 4 and 8
partitions (uneven shards, garbage padding, start indices clamped by HLO), with the collectives
each strategy implies."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.oracle import xla_available
from hlo_text import hlo_module
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

DEVICES = [2, 3, 4, 8]
#: start indices below 0, inside, near the end and beyond (HLO clamps them into range)
STARTS = [-7, 0, 3, 11, 30, 36, 90]


LESS = """
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LT
}
"""


def module(body: str) -> str:
    return hlo_module(body, LESS)


def values(*dims: int) -> np.ndarray:
    return np.random.default_rng(sum(dims)).standard_normal(dims).astype(np.float32)


def rows(n: int) -> str:
    return f"{{devices=[{n},1]<=[{n}]}}"


def columns(n: int) -> str:
    return f"{{devices=[1,{n}]<=[{n}]}}"


def kinds(spmd) -> list[str]:
    return [c[0] for c in collectives(spmd)]


# ---- dynamic-update-slice --------------------------------------------------------------------

@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("update_rows", [5, 20])
def test_update_of_a_tiled_sliced_dim_is_written_in_place_by_each_partition(n, update_rows):
    """The operand stays tiled on the updated dim; every partition writes the part of the update
    in its range (the 20-row update spans several shards): no communication."""
    text = module(f"""
  x = f32[37,4] parameter(0), sharding={rows(n)}
  u = f32[{update_rows},4] parameter(1), sharding={{replicated}}
  i = s32[] parameter(2), sharding={{replicated}}
  j = s32[] parameter(3), sharding={{replicated}}
  ROOT d = f32[37,4] dynamic-update-slice(x, u, i, j), sharding={rows(n)}""")
    for start in STARTS:
        spmd = check_equivalent(text, n, inputs=[values(37, 4), values(update_rows, 4),
                                                 np.int32(start), np.int32(-2)])
        assert kinds(spmd) == []


def test_update_of_two_tiled_sliced_dims_and_a_tiled_whole_dim():
    text = module("""
  x = f32[9,11,4] parameter(0), sharding={devices=[2,2,2]<=[8]}
  u = f32[4,6,4] parameter(1), sharding={devices=[1,1,2,4]<=[8] last_tile_dim_replicate}
  i = s64[] parameter(2), sharding={replicated}
  j = s64[] parameter(3), sharding={replicated}
  k = s64[] parameter(4), sharding={replicated}
  ROOT d = f32[9,11,4] dynamic-update-slice(x, u, i, j, k), sharding={devices=[2,2,2]<=[8]}""")
    for start in [(-1, 3), (4, 9), (7, 0), (2, 5)]:
        spmd = check_equivalent(text, 8, inputs=[values(9, 11, 4), values(4, 6, 4),
                                                 np.int64(start[0]), np.int64(start[1]),
                                                 np.int64(3)])
        assert "all-gather" not in kinds(spmd)


@pytest.mark.parametrize("index_type, starts", [
    ("u32", [2**31 + 5, 2**32 - 1, 3]), ("u64", [2**63 + 1, 2**40, 0]),
    ("s64", [-(2**40), 2**40, 7])])
def test_wide_start_indices_clamp_before_the_local_arithmetic(index_type, starts):
    """Start indices of a type an s32 cannot hold are clamped to the array as HLO clamps them
    (a u32 start of 2^31 + 5 writes the last rows; converted to s32 first it turned negative
    and wrote the first: fuzz/16100003546, a start drawn by rng-bit-generator), for a tiled
    update and a tiled slice alike."""
    text = module(f"""
  x = f32[37,4] parameter(0), sharding={rows(4)}
  u = f32[5,4] parameter(1), sharding={{replicated}}
  i = {index_type}[] parameter(2), sharding={{replicated}}
  j = {index_type}[] parameter(3), sharding={{replicated}}
  d = f32[37,4] dynamic-update-slice(x, u, i, j), sharding={rows(4)}
  s = f32[5,4] dynamic-slice(x, i, j), dynamic_slice_sizes={{5,4}}, sharding={rows(4)}
  ROOT t = (f32[37,4], f32[5,4]) tuple(d, s), sharding={{{rows(4)}, {rows(4)}}}""")
    dtype = {"u32": np.uint32, "u64": np.uint64, "s64": np.int64}[index_type]
    for start in starts:
        check_equivalent(text, 4, inputs=[values(37, 4), values(5, 4), dtype(start), dtype(0)])


@pytest.mark.parametrize("n", DEVICES)
def test_update_covering_a_tiled_dim_keeps_it_tiled(n):
    text = module(f"""
  x = f32[6,13] parameter(0), sharding={columns(n)}
  u = f32[2,13] parameter(1), sharding={columns(n)}
  i = s32[] parameter(2), sharding={{replicated}}
  j = s32[] parameter(3), sharding={{replicated}}
  ROOT d = f32[6,13] dynamic-update-slice(x, u, i, j), sharding={columns(n)}""")
    spmd = check_equivalent(text, n, inputs=[values(6, 13), values(2, 13), np.int32(5),
                                             np.int32(4)])
    assert kinds(spmd) == []


# ---- dynamic-slice ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", DEVICES)
def test_slice_covering_a_tiled_dim_keeps_it_tiled(n):
    text = module(f"""
  x = f32[6,13] parameter(0), sharding={columns(n)}
  i = s32[] parameter(1), sharding={{replicated}}
  j = s32[] parameter(2), sharding={{replicated}}
  ROOT d = f32[3,13] dynamic-slice(x, i, j), dynamic_slice_sizes={{3,13}}, sharding={columns(n)}""")
    for start in [-2, 2, 9]:
        spmd = check_equivalent(text, n, inputs=[values(6, 13), np.int32(start),
                                                 np.int32(start)])
        assert kinds(spmd) == []


@pytest.mark.parametrize("n", DEVICES)
def test_small_slice_of_a_tiled_dim_sums_masked_local_windows(n):
    """Each partition cuts the slice's part in its range (zeros elsewhere); one all-reduce of
    the slice replaces a gather of the operand. Dim 1 is sliced too, but whole locally."""
    text = module(f"""
  x = f32[37,4] parameter(0), sharding={rows(n)}
  i = s32[] parameter(1), sharding={{replicated}}
  j = s32[] parameter(2), sharding={{replicated}}
  ROOT d = f32[5,2] dynamic-slice(x, i, j), dynamic_slice_sizes={{5,2}}, sharding={{replicated}}""")
    for start in STARTS:
        spmd = check_equivalent(text, n, inputs=[values(37, 4), np.int32(start), np.int32(1)])
        assert kinds(spmd) == ["all-reduce"]


@pytest.mark.parametrize("n", [2, 8])
def test_large_slice_of_a_tiled_dim_gathers_that_dim(n):
    text = module(f"""
  x = f32[37,4] parameter(0), sharding={rows(n)}
  i = s32[] parameter(1), sharding={{replicated}}
  j = s32[] parameter(2), sharding={{replicated}}
  ROOT d = f32[33,4] dynamic-slice(x, i, j), dynamic_slice_sizes={{33,4}}, sharding={{replicated}}""")
    for start in STARTS:
        spmd = check_equivalent(text, n, inputs=[values(37, 4), np.int32(start), np.int32(1)])
        assert kinds(spmd) == ["all-gather"]


def test_slice_of_two_tiled_dims_keeps_its_partial_sum_tiled():
    """Both dims tiled and sliced on a 2x4 mesh; the partial slice is reduce-scattered into the
    result's tiling."""
    text = module("""
  x = f32[40,44] parameter(0), sharding={devices=[2,4]<=[8]}
  i = s64[] parameter(1), sharding={replicated}
  j = s64[] parameter(2), sharding={replicated}
  ROOT d = f32[4,8] dynamic-slice(x, i, j), dynamic_slice_sizes={4,8}, sharding={devices=[1,8]<=[8]}""")
    for start in [(-3, 40), (18, 9), (37, 0)]:
        spmd = check_equivalent(text, 8, inputs=[values(40, 44), np.int64(start[0]),
                                                 np.int64(start[1])])
        assert "all-gather" not in kinds(spmd)


# ---- sort and TopK ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", DEVICES)
def test_sort_along_an_untiled_dim_keeps_the_tiling(n):
    text = module(f"""
  x = f32[11,6] parameter(0), sharding={rows(n)}
  ROOT s = f32[11,6] sort(x), dimensions={{1}}, to_apply=less, sharding={rows(n)}""")
    assert kinds(check_equivalent(text, n, inputs=[values(11, 6)])) == []


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sort_along_a_tiled_dim_moves_its_tiles_to_a_divisible_dim(n):
    text = module(f"""
  x = f32[16,{3 * n}] parameter(0), sharding={columns(n)}
  ROOT s = f32[16,{3 * n}] sort(x), dimensions={{1}}, to_apply=less, sharding={columns(n)}""")
    spmd = check_equivalent(text, n, inputs=[values(16, 3 * n)])
    assert kinds(spmd) == ["all-to-all", "all-to-all"]


@pytest.mark.parametrize("n", [3, 8])
def test_sort_along_a_tiled_dim_without_a_divisible_dim_gathers_it(n):
    text = module(f"""
  x = f32[7,{2 * n + 1}] parameter(0), sharding={columns(n)}
  ROOT s = f32[7,{2 * n + 1}] sort(x), dimensions={{1}}, to_apply=less, sharding={{replicated}}""")
    spmd = check_equivalent(text, n, inputs=[values(7, 2 * n + 1)])
    assert kinds(spmd) == ["all-gather"]


@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("op", [
    'custom-call(x), custom_call_target="TopK"', "topk(x), k=3, largest=true"])
def test_topk_keeps_tiled_batch_dims_and_handles_a_tiled_last_dim(n, op):
    text = module(f"""
  x = f32[9,10] parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  t = (f32[9,3], s32[9,3]) {op}, sharding={{{{devices=[{n},1]<=[{n}]}}, {{devices=[{n},1]<=[{n}]}}}}
  v = f32[9,3] get-tuple-element(t), index=0, sharding={{devices=[{n},1]<=[{n}]}}
  ROOT w = s32[9,3] get-tuple-element(t), index=1, sharding={{devices=[{n},1]<=[{n}]}}""")
    assert kinds(check_equivalent(text, n, inputs=[values(9, 10)])) == []
    gathered = text.replace(f"x = f32[9,10] parameter(0), sharding={{devices=[{n},1]<=[{n}]}}",
                            f"x = f32[9,10] parameter(0), sharding={columns(n)}")
    check_equivalent(gathered, n, inputs=[values(9, 10)])


@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("op", [
    'custom-call(x), custom_call_target="TopK"', "topk(x), k=3, largest=true",
    "topk(x), k=3, largest=false"])
def test_topk_along_a_tiled_dim_gathers_only_every_shards_top_k(n, op):
    """The last dim (uneven, with ties) tiled: each partition's top 3, all-gathered (values and
    indices), then the top 3 of those; the operand itself is never gathered."""
    text = module(f"""
  x = f32[4,{10 * n + 1}] parameter(0), sharding={columns(n)}
  t = (f32[4,3], s32[4,3]) {op}, sharding={{{{replicated}}, {{replicated}}}}
  v = f32[4,3] get-tuple-element(t), index=0, sharding={{replicated}}
  i = s32[4,3] get-tuple-element(t), index=1, sharding={{replicated}}
  ROOT o = (f32[4,3], s32[4,3]) tuple(v, i), sharding={{{{replicated}}, {{replicated}}}}""")
    x = np.round(values(4, 10 * n + 1) * 2)          # few distinct values: ties across shards
    spmd = check_equivalent(text, n, inputs=[x])
    assert kinds(spmd) == ["all-gather", "all-gather"]
    gathered = [i for i in spmd.entry.instructions if i.opcode == "all-gather"]
    assert all(g.shape.dims == (4, 3 * n) for g in gathered)


@pytest.mark.parametrize("op", [
    'custom-call(x), custom_call_target="TopK"', "topk(x), k=2, largest=false"])
def test_topk_gathers_the_operand_when_the_candidates_weigh_more(op):
    """f32[3,6] in column shards of 3, k = 2 (fuzz/10600002745): every shard's top 2 values and
    their s32 indices are 3 x 2 x 8 = 48 B per device, the shard itself 3 x 3 x 4 = 36 B, so
    the operand is gathered (XLA's 36 B) and the TopK runs replicated."""
    text = module(f"""
  x = f32[3,6] parameter(0), sharding={columns(2)}
  t = (f32[3,2], s32[3,2]) {op}, sharding={{{{replicated}}, {{replicated}}}}
  ROOT i = s32[3,2] get-tuple-element(t), index=1, sharding={{replicated}}""")
    spmd = check_equivalent(text, 2, inputs=[values(3, 6)])
    assert kinds(spmd) == ["all-gather"]
    assert sent_bytes(spmd, 2) == 36


@pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")
def test_topk_with_heavy_candidates_sends_no_more_than_xla():
    compared_with_xla(module("""
  x = f32[3,6] parameter(0), sharding={devices=[1,2]<=[2]}
  t = (f32[3,2], s32[3,2]) topk(x), k=2, largest=false
  ROOT i = s32[3,2] get-tuple-element(t), index=1"""), 2)


def test_topk_whose_indices_nobody_reads_gathers_only_candidate_values():
    """f32[10] in shards of 5, k = 4, only the values read (fuzz/10100001146): the shards' top 4
    values are 4 x 4 = 16 B per device (their indices are dead, never gathered), below the
    shard's 20 B, so the candidates are gathered, not the operand."""
    text = module("""
  x = f32[10] parameter(0), sharding={devices=[2]<=[2]}
  t = (f32[4], s32[4]) topk(x), k=4, largest=true, sharding={{replicated}, {replicated}}
  ROOT v = f32[4] get-tuple-element(t), index=0, sharding={replicated}""")
    spmd = check_equivalent(text, 2, inputs=[values(10)])
    assert [c.shape.dims for c in spmd.entry.instructions if c.opcode == "all-gather"] == [(8,)]
    assert sent_bytes(spmd, 2) == 16


MIN_S32 = """
min {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT r = s32[] minimum(a, b)
}
"""


def test_a_start_clamped_to_zero_is_never_broadcast():
    """A dynamic-update-slice whose update covers its tiled operand: HLO clamps the start to 0
    whatever it is (XLA's simplifier replaces the op by its update), so the start, a reduce on
    device 1 annotated replicated, is not broadcast (fuzz/10600002119: an all-reduce of 4 B
    before; XLA sends nothing)."""
    text = hlo_module("""
  p = s32[4] parameter(0), sharding={maximal device=1}
  big = s32[] constant(2147483647)
  s = s32[] reduce(p, big), dimensions={0}, to_apply=min, sharding={replicated}
  z = f32[] constant(0)
  o = f32[3] broadcast(z), dimensions={}
  w = f32[] constant(-0.25)
  u = f32[3] broadcast(w), dimensions={}
  ROOT d = f32[3] dynamic-update-slice(o, u, s), sharding={devices=[2]<=[2]}""", MIN_S32)
    spmd = check_equivalent(text, 2, inputs=[np.array([5, -3, 7, 2], np.int32)])
    assert kinds(spmd) == []
