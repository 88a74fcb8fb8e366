"""Convolution partitioning (passes/spmd/op_rules_conv.py): each strategy forced by the shardings,
checked against the unpartitioned program on 2, 3, 4 and 8 partitions (uneven shards with garbage
padding), with the collectives each strategy implies."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.op_rules_conv import parallel_dims
from gspmdc.passes.spmd.traffic import collective_traffic, sent_per_device
from gspmdc.runtime import io

from hlo_text import hlo_module as module
from spmd_partition_helpers import check_equivalent, collectives, run_global

SHARED = Path(__file__).resolve().parents[2] / "shared"

DEVICES = [2, 3, 4, 8]


def tiled(n: int, rank: int, dim: int, replicate: int = 1) -> str:
    counts = [1] * rank
    counts[dim] = n
    if replicate > 1:
        counts.append(replicate)
        return f"{{devices=[{','.join(map(str, counts))}]<=[{n * replicate}] " \
               "last_tile_dim_replicate}"
    return f"{{devices=[{','.join(map(str, counts))}]<=[{n}]}}"


def kinds(spmd) -> list[str]:
    return [c[0] for c in collectives(spmd)]


@pytest.mark.parametrize("n", DEVICES)
def test_batch_tiled_input_with_replicated_kernel_needs_no_collective(n):
    batch = 2 * n + 1                                   # uneven: padding only meets padding
    text = module(f"""
  x = f32[{batch},9,9,3] parameter(0), sharding={tiled(n, 4, 0)}
  k = f32[3,3,3,5] parameter(1), sharding={{replicated}}
  ROOT c = f32[{batch},9,9,5] convolution(x, k), window={{size=3x3 pad=1_1x1_1}}, dim_labels=b01f_01io->b01f, sharding={tiled(n, 4, 0)}""")
    assert kinds(check_equivalent(text, n)) == []


@pytest.mark.parametrize("n", DEVICES)
def test_output_feature_tiled_kernel_needs_no_collective(n):
    features = 3 * n - 1
    text = module(f"""
  x = f32[2,7,7,3] parameter(0), sharding={{replicated}}
  k = f32[3,3,3,{features}] parameter(1), sharding={tiled(n, 4, 3)}
  ROOT c = f32[2,5,5,{features}] convolution(x, k), window={{size=3x3}}, dim_labels=b01f_01io->b01f, sharding={tiled(n, 4, 3)}""")
    assert kinds(check_equivalent(text, n)) == []


@pytest.mark.parametrize("n", DEVICES)
def test_input_feature_tiled_on_both_gives_partial_sums_combined_by_one_all_reduce(n):
    """Uneven input features: garbage padding on both operands must be masked with zeros."""
    features = 2 * n + 1
    text = module(f"""
  x = f32[2,6,6,{features}] parameter(0), sharding={tiled(n, 4, 3)}
  k = f32[3,3,{features},4] parameter(1), sharding={tiled(n, 4, 2)}
  ROOT c = f32[2,4,4,4] convolution(x, k), window={{size=3x3}}, dim_labels=b01f_01io->b01f, sharding={{replicated}}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == ["all-reduce"]
    assert collectives(spmd)[0][1] == [list(range(n))]


@pytest.mark.parametrize("n", [2, 4])
def test_input_feature_partial_sums_are_reduce_scattered_into_a_tiled_output(n):
    text = module(f"""
  x = f32[{2 * n},6,6,{2 * n}] parameter(0), sharding={tiled(n, 4, 3)}
  k = f32[3,3,{2 * n},4] parameter(1), sharding={tiled(n, 4, 2)}
  ROOT c = f32[{2 * n},4,4,4] convolution(x, k), window={{size=3x3}}, dim_labels=b01f_01io->b01f, sharding={tiled(n, 4, 0)}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == ["reduce-scatter"]


@pytest.mark.parametrize("n", [2, 4])
def test_depthwise_convolution_keeps_groups_local(n):
    """feature_group_count = features: input features tiled like kernel output features, the
    local convolution has features/n groups; no collective."""
    features = 4 * n
    text = module(f"""
  x = f32[2,8,8,{features}] parameter(0), sharding={tiled(n, 4, 3)}
  k = f32[3,3,1,{features}] parameter(1), sharding={tiled(n, 4, 3)}
  ROOT c = f32[2,8,8,{features}] convolution(x, k), window={{size=3x3 pad=1_1x1_1}}, dim_labels=b01f_01io->b01f, feature_group_count={features}, sharding={tiled(n, 4, 3)}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == []
    conv = next(i for i in spmd.entry.instructions if i.opcode == "convolution")
    assert conv.attr("feature_group_count") == features // n


@pytest.mark.parametrize("n", [2, 4])
def test_grouped_convolution_tiles_only_whole_groups(n):
    """2 groups of 2n input features on n partitions: a tiling of the input features by n would
    split groups, so only the batch-tiled output (or 2-way group tiling) keeps them local; the
    result must still be right."""
    text = module(f"""
  x = f32[{n},6,6,{4 * n}] parameter(0), sharding={tiled(n, 4, 3)}
  k = f32[3,3,{2 * n},6] parameter(1), sharding={{replicated}}
  ROOT c = f32[{n},4,4,6] convolution(x, k), window={{size=3x3}}, dim_labels=b01f_01io->b01f, feature_group_count=2, sharding={tiled(n, 4, 3)}""")
    check_equivalent(text, n, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [2, 4])
def test_batch_group_convolution_tiles_groups_of_the_batch(n):
    """batch_group_count = 2n (the weight-gradient form): lhs batch tiled like kernel output
    features, the local convolution has 2 batch groups; output features tiled."""
    groups = 2 * n
    text = module(f"""
  x = f32[{groups},6,6,3] parameter(0), sharding={tiled(n, 4, 0)}
  k = f32[3,3,3,{groups}] parameter(1), sharding={tiled(n, 4, 3)}
  ROOT c = f32[1,4,4,{groups}] convolution(x, k), window={{size=3x3}}, dim_labels=b01f_01io->b01f, batch_group_count={groups}, sharding={tiled(n, 4, 3)}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == []
    conv = next(i for i in spmd.entry.instructions if i.opcode == "convolution")
    assert conv.attr("batch_group_count") == 2


def test_mixed_mesh_batch_and_output_feature():
    """2x2 mesh: input batch on mesh dim 0 (replicated on dim 1), kernel output features on
    mesh dim 1 (replicated on dim 0): the output is tiled [2,1,1,2] with no communication."""
    text = module("""
  x = f32[4,5,5,3] parameter(0), sharding={devices=[2,1,1,1,2]<=[4] last_tile_dim_replicate}
  k = f32[1,1,3,6] parameter(1), sharding={devices=[1,1,1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT c = f32[4,5,5,6] convolution(x, k), window={size=1x1}, dim_labels=b01f_01io->b01f, sharding={devices=[2,1,1,2]<=[4]}""")
    assert kinds(check_equivalent(text, 4)) == []


# ---- spatial dims: halo exchange -------------------------------------------------------------

SPATIAL = [
    # (image size, window attribute): same padding; stride 2 with asymmetric padding; dilated
    # window; input (lhs) dilation; a window wider than a shard
    (10, "size=3 pad=1_1"),
    (11, "size=3 stride=2 pad=0_1"),
    (12, "size=3 pad=2_2 rhs_dilate=2"),
    (7, "size=3 pad=1_1 lhs_dilate=2"),
    (13, "size=7 pad=3_3"),
]


def out_size(size: int, window: str) -> int:
    fields = dict(f.split("=") for f in window.split())
    k, s = int(fields["size"]), int(fields.get("stride", 1))
    lo, hi = map(int, fields.get("pad", "0_0").split("_"))
    b, w = int(fields.get("lhs_dilate", 1)), int(fields.get("rhs_dilate", 1))
    return (b * (size - 1) + 1 + lo + hi - ((k - 1) * w + 1)) // s + 1


@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("size,window", SPATIAL)
def test_spatially_tiled_input_exchanges_halos_with_collective_permutes(n, size, window):
    """1-d convolution over a spatial dim tiled n ways (uneven for most n): the input's halo
    comes from the neighbours by collective-permutes — no all-gather — and the result equals
    the unpartitioned program (garbage padding masked)."""
    out = out_size(size, window)
    text = module(f"""
  x = f32[2,{size},3] parameter(0), sharding={tiled(n, 3, 1)}
  k = f32[{window.split()[0][5:]},3,4] parameter(1), sharding={{replicated}}
  ROOT c = f32[2,{out},4] convolution(x, k), window={{{window}}}, dim_labels=b0f_0io->b0f, sharding={tiled(n, 3, 1)}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert set(kinds(spmd)) <= {"collective-permute"}
    assert kinds(spmd)


def test_strided_window_reading_padding_takes_a_one_way_halo_from_the_shards_read():
    """Window 2, stride 2, padding 0_2 on 4 elements tiled 2 ways (shards of 2): shard 0's
    outputs 0 and 1 read elements [0, 4), its own and all of shard 1's; shard 1's output 2
    reads the padding [4, 6). Only shard 1 sends (to shard 0, from the right): the busiest
    partition sends what an all-gather would, every partition together half, as in XLA's
    program (docs/design/partitioning.md#convolution-strategies)."""
    text = module("""
  x = f32[2,4,3] parameter(0), sharding={devices=[1,2,1]<=[2]}
  k = f32[2,3,4] parameter(1), sharding={replicated}
  ROOT c = f32[2,3,4] convolution(x, k), window={size=2 stride=2 pad=0_2}, dim_labels=b0f_0io->b0f, sharding={devices=[1,2,1]<=[2]}""")
    x, k = np.arange(24, dtype=np.float32).reshape(2, 4, 3), \
        np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    padded = np.concatenate([x, np.zeros((2, 2, 3), np.float32)], axis=1)
    want = np.stack([np.einsum("bkf,kfo->bo", padded[:, 2 * o:2 * o + 2], k)
                     for o in range(3)], axis=1)
    spmd = check_equivalent(text, 2, inputs=[x, k], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(run_global(spmd, [x, k], 2), want, rtol=1e-5, atol=1e-4)
    assert collectives(spmd) == [("collective-permute", [(1, 0)])]


def test_two_spatial_dims_on_a_2x2_mesh_exchange_per_dim():
    """Halo example (F): dims 1 and 2 tiled 2x2; corners arrive through the second exchange."""
    text = module("""
  x = f32[1,8,8,2] parameter(0), sharding={devices=[1,2,2,1]<=[4]}
  k = f32[3,3,2,3] parameter(1), sharding={replicated}
  ROOT c = f32[1,8,8,3] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, sharding={devices=[1,2,2,1]<=[4]}""")
    spmd = check_equivalent(text, 4, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == ["collective-permute"] * 4


def test_spatially_tiled_input_with_batch_and_reversed_window():
    """Batch on mesh dim 0, rows on mesh dim 1 (2x4 like conv_spatial), window reversal."""
    text = module("""
  x = f32[2,16,6,3] parameter(0), sharding={devices=[2,4,1,1]<=[8]}
  k = f32[3,3,3,5] parameter(1), sharding={replicated}
  ROOT c = f32[2,8,6,5] convolution(x, k), window={size=3x3 stride=2x1 pad=1_1x1_1 rhs_reversal=1x0}, dim_labels=b01f_01io->b01f, sharding={devices=[2,4,1,1]<=[8]}""")
    spmd = check_equivalent(text, 8, rtol=1e-4, atol=1e-4)
    assert set(kinds(spmd)) == {"collective-permute"}


def test_conv_spatial_program_moves_no_more_bytes_than_xla():
    """The JAX program with images tiled on rows: three convolutions exchange halos, the
    result reproduces JAX's outputs and no more collective bytes move than in XLA's program."""
    folder = SHARED / "jax-programs" / "conv_spatial"
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    reference = json.loads((folder / "reference.json").read_text())
    n = reference["num_partitions"]
    spmd = api.parse(api.to_text(compile_spmd(api.load(folder / "program.hlo"), n)))
    traffic = collective_traffic(spmd, n)
    xla = reference["collectives"]["xla_spmd"]
    assert "all-gather" not in {t.opcode for t in traffic}
    assert sum(t.total_result_bytes for t in traffic) <= xla["total_dynamic_bytes"]
    inputs = io.read_inputs(folder / "inputs.npz", api.load(folder / "program.hlo"))
    got = io.output_arrays(spmd, run_global(spmd, inputs, n))
    want = np.load(folder / "outputs.npz")
    for key in want.files:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5)


# ---- the weight-gradient case: input and kernel tiled alike on a spatial dim ----------------

GRADIENT = [
    # (input rows, kernel rows, window attribute of dim 0, output rows by hand, up to how many
    # partitions the halos are smaller than a gather: the kernel spans most of the input, as
    # in XLA's tests; else the bytes choose the gather)
    (8, 8, "size=8 pad=1_1", 3, 4),                      # (8 + 2 - 8) + 1
    (16, 8, "size=8 pad=3_2 rhs_dilate=2", 7, 4),        # (16 + 5 - 15) + 1
    (10, 8, "size=8 pad=1_1", 5, 4),                     # uneven input rows on 4
    (6, 8, "size=8 lhs_dilate=2 pad=1_0", 5, 2),         # (11 + 1 - 8) + 1
    (9, 4, "size=4 stride=2 pad=0_1", 4, 0),             # (9 + 1 - 4) // 2 + 1
    # kernels tiled unevenly: the last shard's padded taps are masked to 0
    (14, 7, "size=7 pad=1_0 rhs_dilate=2", 3, 4),        # (15 - 13) + 1
    (12, 5, "size=5 pad=1_1 rhs_dilate=2", 6, 4),        # (14 - 9) + 1
    (11, 6, "size=6 pad=0_1", 7, 0),                     # (12 - 6) + 1, uneven on 4
    (13, 3, "size=3 stride=2 rhs_dilate=3", 4, 0),       # (13 - 7) // 2 + 1
]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("rows,taps,window,out,halo", GRADIENT)
def test_weight_gradient_exchanges_input_halos_and_all_reduces_partial_sums(n, rows, taps,
                                                                            window, out, halo):
    """XLA's ConvolutionLhsTiledRhsTiled form (dim_labels f0b_i0o->0bf): each partition
    convolves its kernel shard's taps with the input window they read (a halo from the
    neighbours), and one all-reduce sums the partial outputs; nothing is gathered."""
    text = module(f"""
  x = f32[3,{rows},2] parameter(0), sharding={tiled(n, 3, 1)}
  k = f32[3,{taps},4] parameter(1), sharding={tiled(n, 3, 1)}
  ROOT c = f32[{out},2,4] convolution(x, k), window={{{window}}}, dim_labels=f0b_i0o->0bf, sharding={{replicated}}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    if n <= halo:
        assert "all-gather" not in kinds(spmd) and kinds(spmd).count("all-reduce") == 1


@pytest.mark.parametrize("n", [2, 4])
def test_weight_gradient_whose_shards_read_only_their_own_rows_has_a_valid_local_window(n):
    """When the kernel spans the whole input row dim (one output row, no padding) each
    partition's taps read exactly its own input rows: no halo is exchanged, and the local
    convolution's window is the kernel shard's size — the printed program re-parses (the
    verifier checks window size against the kernel) and computes the reference's values."""
    text = module(f"""
  x = f32[3,8,2] parameter(0), sharding={tiled(n, 3, 1)}
  k = f32[3,8,4] parameter(1), sharding={tiled(n, 3, 1)}
  ROOT c = f32[1,2,4] convolution(x, k), window={{size=8 stride=2}}, dim_labels=f0b_i0o->0bf, sharding={{replicated}}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == ["all-reduce"]
    local = [i for i in api.parse(api.to_text(spmd)).entry.instructions
             if i.opcode == "convolution"]
    assert [w.size for w in local[0].attr("window").dims] == [8 // n]


def test_xla_weight_gradient_cases_are_equivalent_without_gathers():
    path = SHARED / "conformance" / "xla-partitioner.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    cases = {c["name"]: c for c in json.loads(path.read_text())["cases"]}
    case = cases["ConvolutionLhsTiledRhsTiledWithPadding_HaloOnLhs"]
    spmd = compile_spmd(api.parse(case["hlo"]), case["num_devices"], propagate=False)
    assert sorted(set(kinds(spmd))) == ["all-reduce", "collective-permute"]


# ---- the kernel aligned to a spatially tiled input ------------------------------------------

def test_kernel_resharded_to_the_inputs_spatial_tiles_sends_less_than_gathering_the_input():
    """Input `f32[5,8,3,3]` tiled on its spatial dim 1 (dim 0, labels `10fb`), kernel tiled on
    its input features, output replicated, 2 partitions. The kernel moves its tiles to the
    window's spatial dim (all-to-all: half of each `f32[3,2,1,4]` shard, 48 B); partition 1's
    taps 2-3 read input rows 2-4, so partition 0 sends it row 2 (`8*3*3` f32, 288 B); each
    partition's partial output `f32[2,4,3,3]` is all-reduced (288 B). By hand: 624 B from
    partition 0, 336 from partition 1, where gathering both operands sent 960 (the input's
    `f32[3,8,3,3]` shard, 864 B, and the kernel's, 96) from each."""
    text = module(f"""
  x = f32[5,8,3,3] parameter(0), sharding={tiled(2, 4, 0)}
  k = f32[3,3,1,4] parameter(1), sharding={tiled(2, 4, 1)}
  ROOT c = f32[2,4,3,3] convolution(x, k), window={{size=1x4 stride=2x1 pad=-1_1x0_0}}, dim_labels=10fb_oi01->10bf, sharding={{replicated}}""")
    spmd = check_equivalent(text, 2, rtol=1e-4, atol=1e-4)
    assert sorted(kinds(spmd)) == ["all-reduce", "all-to-all", "collective-permute"]
    assert list(sent_per_device(spmd, 2)) == [624, 336]


# (input rows, kernel taps, window, output rows) of dim 0 (labels f0b_i0o->0bf): 16 input
# features and one output feature, so a partial output is small beside the input's rows and
# the kernel aligned to the input's row tiles is chosen on most of them
ALIGNED = [
    (9, 8, "size=8", 2),                                   # 9 - 8 + 1
    (10, 4, "size=4 stride=3 pad=1_1", 3),                 # (10 + 2 - 4) // 3 + 1
    (7, 5, "size=5 pad=1_1", 5),                           # 7 + 2 - 5 + 1
    (6, 6, "size=6 lhs_dilate=2 pad=1_1", 8),              # 11 + 2 - 6 + 1
    (11, 4, "size=4 rhs_dilate=3", 2),                     # 11 - 10 + 1
    (12, 5, "size=5 stride=2 rhs_dilate=2 pad=0_1", 3),    # (12 + 1 - 9) // 2 + 1
]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("rows,taps,window,out", ALIGNED)
@pytest.mark.parametrize("kernel", ["features", "replicated"])
def test_kernel_aligned_to_a_spatially_tiled_input_computes_the_convolution(n, rows, taps,
                                                                            window, out,
                                                                            kernel):
    """An input tiled (evenly or not) on a windowed spatial dim whose kernel is tiled on its
    input features or replicated: the kernel aligned to the input's row tiles (each partition
    convolving the rows its taps read, halos included, into a partial output), or whatever
    else the bytes choose, computes the unpartitioned program's values."""
    k_sharding = tiled(n, 3, 0) if kernel == "features" else "{replicated}"
    text = module(f"""
  x = f32[16,{rows},2] parameter(0), sharding={tiled(n, 3, 1)}
  k = f32[16,{taps},1] parameter(1), sharding={k_sharding}
  ROOT c = f32[{out},2,1] convolution(x, k), window={{{window}}}, dim_labels=f0b_i0o->0bf, sharding={{replicated}}""")
    check_equivalent(text, n, rtol=1e-4, atol=1e-4)


# ---- parallel spatial dims: a dot's batch dim written as a window -----------------------------

# (input/kernel size B of the parallel dim 0, its window attribute: size B, base dilation B, a
# stride or window dilation of B - 1)
PARALLEL = [
    (8, "size=8x3 stride=7x1 lhs_dilate=8x1 pad=0_0x1_1"),
    (6, "size=6x3 rhs_dilate=5x1 lhs_dilate=6x1"),
    (5, "size=5x3 stride=4x1 lhs_dilate=5x1 pad=0_0x1_1"),      # uneven on 2 and 4
]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("size,window", PARALLEL)
def test_parallel_spatial_dim_is_partitioned_like_a_batch_dim(n, size, window):
    """Output position o of dim 0 reads input o with kernel tap o alone: input, kernel and
    output tiled alike there, each partition convolves its block (the window rewritten to the
    block's size) and nothing moves; the unpartitioned program checks the values."""
    text = module(f"""
  x = f32[{size},9,3,2] parameter(0), sharding={tiled(n, 4, 0)}
  k = f32[{size},3,2,4] parameter(1), sharding={tiled(n, 4, 0)}
  ROOT c = f32[{size},{9 if 'pad' in window else 7},3,4] convolution(x, k), window={{{window}}}, dim_labels=01bf_01io->01bf, sharding={tiled(n, 4, 0)}""")
    spmd = check_equivalent(text, n, rtol=1e-4, atol=1e-4)
    assert kinds(spmd) == []


def test_parallel_dim_keeps_its_tiles_while_the_kernel_gathers_its_spatial_tiles():
    """2x2 devices: dim 0 parallel (8 positions in blocks of 4), dim 1 an ordinary window (4
    taps, padding 1_2, 12 input rows in 6s) tiled on the other mesh axis. The kernel gathers
    only its dim-1 tiles (each device sends its f32[4,2,2,4], 256 B) and keeps dim 0; the input
    exchanges halos on dim 1 (a row f32[4,1,3,2] is 96 B: one row to the right, two to the
    left): 352 B from the first device of each pair, 448 from the second, where gathering the
    kernel's dim 0 as well sent 768 for the kernel alone."""
    text = module("""
  x = f32[8,12,3,2] parameter(0), sharding={devices=[2,2,1,1]<=[4]}
  k = f32[8,4,2,4] parameter(1), sharding={devices=[2,2,1,1]<=[4]}
  ROOT c = f32[8,12,3,4] convolution(x, k), window={size=8x4 stride=7x1 lhs_dilate=8x1 pad=0_0x1_2}, dim_labels=01bf_01io->01bf, sharding={devices=[2,2,1,1]<=[4]}""")
    spmd = check_equivalent(text, 4, rtol=1e-4, atol=1e-4)
    assert collectives(spmd) == [("all-gather", [[0, 1], [2, 3]], (1,)),
                                 ("collective-permute", [(0, 1), (2, 3)]),
                                 ("collective-permute", [(1, 0), (3, 2)])]
    assert list(sent_per_device(spmd, 4)) == [352, 448, 352, 448]


@pytest.mark.parametrize("window,parallel", [
    ("size=8x3 stride=7x1 lhs_dilate=8x1", {0}),
    ("size=8x3 rhs_dilate=7x1 lhs_dilate=8x1", {0}),
    ("size=8x3 stride=7x1", set()),                          # no base dilation
    ("size=8x3 stride=7x1 lhs_dilate=8x1 pad=1_0x0_0", set()),  # padded
    ("size=8x3 stride=6x1 lhs_dilate=8x1", set()),           # stride not B - 1
])
def test_parallel_dims_are_xlas_batch_dims_written_as_windows(window, parallel):
    inst = api.parse(module(f"""
  x = f32[8,9,3,2] parameter(0)
  k = f32[8,3,2,4] parameter(1)
  ROOT c = convolution(x, k), window={{{window}}}, dim_labels=01bf_01io->01bf""")).entry.root
    assert set(parallel_dims(inst)) == parallel
