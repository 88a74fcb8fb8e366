"""Windowed ops partitioned along their windowed dims (op_rules_window.py + halo.py): each case is
compiled for several partition counts (uneven ones included), run on the local backend with
garbage in the padding, and compared with the unpartitioned program; halo cases must move data
with collective-permutes only (no all-gather)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd

from hlo_text import hlo_module, reducer
from spmd_partition_helpers import (
    assert_close, check_equivalent, collectives, inputs_for, reference, run_global,
)

REDUCERS = reducer("add") + reducer("max") + """
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=GE
}

argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  ge = pred[] compare(a, b), direction=GE
  v = f32[] select(ge, a, b)
  k = s32[] select(ge, i, j)
  ROOT r = (f32[], s32[]) tuple(v, k)
}
"""


def module(body: str) -> str:
    return hlo_module(body, REDUCERS)


def tiled(n: int, rank: int, dim: int) -> str:
    counts = [1] * rank
    counts[dim] = n
    return "{devices=[" + ",".join(map(str, counts)) + f"]<=[{n}]}}"


def halo_only(spmd, required: bool = True) -> list[str]:
    """The collectives' opcodes, asserting they are all collective-permutes (and that there is
    at least one when `required`)."""
    kinds = [c[0] for c in collectives(spmd)]
    assert set(kinds) <= {"collective-permute"} and (kinds or not required), kinds
    return kinds


# (operand rows, window spec on dim 0, expected output rows)
WINDOWS = [
    (40, "size=3x1 pad=1_1x0_0", 40),                 # the "same" 3-tap window
    (37, "size=5x1 pad=2_2x0_0", 37),                 # window 5, uneven
    (40, "size=7x1 stride=2x1 pad=3_3x0_0", 20),      # window 7, stride 2
    (33, "size=3x1 stride=2x1", 16),                  # no padding, uneven, stride 2
    (16, "size=7x1 pad=3_3x0_0", 16),                 # halo longer than a shard on 8
    (24, "size=3x1 pad=2_0x0_0 rhs_dilate=2x1", 22),  # window dilation
    (12, "size=3x1 pad=1_1x0_0 lhs_dilate=2x1", 23),  # base dilation
]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("rows,window,out", WINDOWS)
@pytest.mark.parametrize("reducer,init", [("add", "0"), ("max", "-inf")])
def test_reduce_window_exchanges_halos(n, rows, window, out, reducer, init):
    if reducer == "max" and n in (2, 8):
        pytest.skip("max is checked on 3 and 4 partitions")
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},64] parameter(0), sharding={s}
  z = f32[] constant({init})
  ROOT r = f32[{out},64] reduce-window(x, z), window={{{window}}}, to_apply={reducer},
    sharding={s}"""), n)
    halo_only(spmd)


def test_a_halo_longer_than_a_shard_takes_several_hops():
    """f32[16] on 8 (2 per shard), window 7 pad 3_3: 3 elements from each side, i.e. a full
    neighbour and one element of the next: two permutes per side, distances 1 and 2."""
    spmd = check_equivalent(module("""
  x = f32[16,64] parameter(0), sharding={devices=[8,1]<=[8]}
  z = f32[] constant(0)
  ROOT r = f32[16,64] reduce-window(x, z), window={size=7x1 pad=3_3x0_0}, to_apply=add,
    sharding={devices=[8,1]<=[8]}"""), 8)
    pairs = [c[1] for c in collectives(spmd)]
    distances = sorted({t - s for p in pairs for s, t in p})
    assert distances == [-2, -1, 1, 2]
    assert len(pairs) == 4


def test_two_windowed_dims_on_a_2x2_mesh():
    """Halo example (F): one exchange per dim within the mesh rows / columns; corners arrive through
    the second exchange."""
    spmd = check_equivalent(module("""
  x = f32[10,12] parameter(0), sharding={devices=[2,2]<=[4]}
  z = f32[] constant(0)
  ROOT r = f32[10,12] reduce-window(x, z), window={size=3x3 pad=1_1x1_1}, to_apply=add,
    sharding={devices=[2,2]<=[4]}"""), 4)
    pairs = sorted(sorted(c[1]) for c in collectives(spmd))
    assert pairs == [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(1, 0), (3, 2)], [(2, 0), (3, 1)]]


@pytest.mark.parametrize("shape,sharding,window,pairs", [
    # dim 0: one element on 2 shards, one window (stride 2): the partitions of dim-0 shard 1
    # hold only padding and compute no real output; dim 1's halo (window 2, pad 0_1) moves
    # one element from the right within dim-0 shard 0's partitions only
    ("f32[1,4]", "{devices=[2,4]<=[8]}", "size=1x2 stride=2x1 pad=0_0x0_1",
     [(1, 0), (2, 1), (3, 2)]),
    # 3 rows on 4 shards (the last all padding), one window (stride 4): only dim-0 shard 0
    # has an output; trailing padding on dim 1 (5 columns a shard, window 3 pad 0_2): shard 0
    # reads 2 columns of shard 1, shard 1 reads its own and the padding
    ("f32[3,10]", "{devices=[4,2]<=[8]}", "size=1x3 stride=4x1 pad=0_0x0_2", [(1, 0)]),
])
@pytest.mark.parametrize("reducer,init", [("add", "0"), ("max", "-inf")])
def test_partitions_without_a_real_output_on_one_dim_get_no_halo_on_another(
        shape, sharding, window, pairs, reducer, init):
    """A dim with fewer windows than shards whose own exchange is nothing (each output reads
    its own shard) still trims the partitions without output from the other dims' exchanges,
    as XLA's windowed-input reshard drops them (docs/design/partitioning.md#halo-exchange)."""
    rows, cols = map(int, shape[4:-1].split(","))
    fields = dict(f.split("=") for f in window.split())
    (k0, k1), (s0, s1) = map(int, fields["size"].split("x")), map(int, fields["stride"].split("x"))
    high = int(fields["pad"].split("x")[1].split("_")[1])
    out = ((rows - k0) // s0 + 1, (cols + high - k1) // s1 + 1)
    spmd = check_equivalent(module(f"""
  x = {shape} parameter(0), sharding={sharding}
  z = f32[] constant({init})
  ROOT r = f32[{out[0]},{out[1]}] reduce-window(x, z), window={{{window}}}, to_apply={reducer},
    sharding={sharding}"""), 8)
    assert collectives(spmd) == [("collective-permute", pairs)]


def test_variadic_reduce_window_masks_each_input_with_its_init():
    spmd = check_equivalent(module("""
  x = f32[30,32] parameter(0), sharding={devices=[4,1]<=[4]}
  i = s32[30,32] iota(), iota_dimension=0, sharding={devices=[4,1]<=[4]}
  z = f32[] constant(-inf)
  k = s32[] constant(-1)
  ROOT r = (f32[30,32], s32[30,32]) reduce-window(x, i, z, k), window={size=3x1 pad=1_1x0_0},
    to_apply=argmax, sharding={{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}"""), 4)
    halo_only(spmd)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("rows,padding,out", [
    (40, "0_2x0_0", 42),         # (D): high padding
    (40, "3_-5x0_0", 38),        # negative high padding (cropping)
    (40, "-3_2x0_0", 39),        # negative low padding
    (20, "1_1_1x0_0", 41),       # interior padding (base dilation 2)
])
def test_pad_along_a_tiled_dim(n, rows, padding, out):
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},64] parameter(0), sharding={s}
  z = f32[] constant(1.5)
  ROOT p = f32[{out},64] pad(x, z), padding={padding}, sharding={s}"""), n)
    halo_only(spmd, required=False)      # e.g. 0_2 on 3: every window is the own shard


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("rows,spec,out", [
    (40, "[5:36]", 31),
    (40, "[1:39:2]", 19),
    (37, "[3:37:3]", 12),
])
def test_slice_along_a_tiled_dim(n, rows, spec, out):
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},64] parameter(0), sharding={s}
  ROOT r = f32[{out},64] slice(x), slice={{{spec}, [0:64]}}, sharding={s}"""), n)
    assert "all-gather" not in [c[0] for c in collectives(spmd)]


def test_slice_keeps_the_tiling_of_dims_it_does_not_touch():
    spmd = check_equivalent(module("""
  x = f32[10,64] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT r = f32[10,20] slice(x), slice={[0:10], [3:63:3]}, sharding={devices=[4,1]<=[4]}"""), 4)
    assert collectives(spmd) == []


@pytest.mark.parametrize("n", [2, 3, 4])
def test_concatenate_along_a_tiled_dim(n):
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[22,32] parameter(0), sharding={s}
  y = f32[13,32] parameter(1), sharding={s}
  ROOT c = f32[35,32] concatenate(x, y), dimensions={{0}}, sharding={s}"""), n)
    halo_only(spmd)


@pytest.mark.parametrize("n,rows", [(2, 8), (4, 10), (3, 7), (8, 20)])
def test_reverse_of_a_tiled_dim(n, rows):
    """Even: one permute to the mirrored devices; uneven: plus the shift of the padding by
    `n*I - S` (20 on 8: I=3, shift 4, two hops)."""
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},6] parameter(0), sharding={s}
  ROOT r = f32[{rows},6] reverse(x), dimensions={{0}}, sharding={s}"""), n)
    kinds = halo_only(spmd)
    shift = n * -(-rows // n) - rows
    assert len(kinds) == 1 + -(-shift // -(-rows // n))


def test_a_halo_bigger_than_a_gather_gathers():
    """A window as wide as the array (a cumulative sum): the hops would move as many bytes as
    a gather (7 x 2 rows vs 14 rows), and the one gather wins."""
    spmd = check_equivalent(module("""
  x = f32[16,8] parameter(0), sharding={devices=[8,1]<=[8]}
  z = f32[] constant(0)
  ROOT r = f32[16,8] reduce-window(x, z), window={size=16x1 pad=15_0x0_0}, to_apply=add,
    sharding={devices=[8,1]<=[8]}"""), 8)
    assert "all-gather" in [c[0] for c in collectives(spmd)]


def test_the_halo_exchange_dump_records_the_plan_and_evaluates_unchanged(tmp_path):
    text = module("""
  x = f32[10,4] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0)
  ROOT r = f32[5,4] reduce-window(x, z), window={size=3x1 stride=2x1 pad=1_1x0_0},
    to_apply=add, sharding={devices=[4,1]<=[4]}""")
    compile_spmd(api.parse(text), 4, dump_dir=tmp_path, propagate=False)
    (dump,) = tmp_path.glob("*.halo-exchange.hlo")
    dumped = dump.read_text()
    # shards of I=3, W=2 outputs each reading a window of 5 (the last shard's outputs 6-7 do
    # not exist: real=[1,1,1,0]): the plan lower-spmd executes
    assert 'halo="operand 0 dim 0: left=[1,0,-1,-2],right=[1,2,3,4],from_left=0,' \
           'from_right=2,mask,shards=4,input=3,output=2,window=5,valid=10,' \
           'offsets=[0,1,2,2],pad=1_1,real=[1,1,1,0]"' in dumped
    inputs = inputs_for(text)
    assert_close(api.evaluate(api.parse(dumped), inputs), reference(text, inputs))


@pytest.mark.parametrize("n,rows,reducer,init", [
    (4, 64, "add", "0"), (3, 64, "add", "0"), (8, 20, "max", "-inf"),
])
def test_a_cumulative_window_is_a_prefix_scan(n, rows, reducer, init):
    """JAX's cumsum/cummax: local scans plus one all-gather of the n shard totals per column
    (XLA gathers the whole dim)."""
    s = tiled(n, 2, 0)
    spmd = check_equivalent(module(f"""
  x = f32[{rows},8] parameter(0), sharding={s}
  z = f32[] constant({init})
  ROOT r = f32[{rows},8] reduce-window(x, z), window={{size={rows}x1 pad={rows - 1}_0x0_0}},
    to_apply={reducer}, sharding={s}"""), n, rtol=1e-4, atol=1e-4)
    (gather,) = [i for i in spmd.entry.instructions if i.opcode == "all-gather"]
    assert gather.shape.dims == (n, 8)
    assert [c[0] for c in collectives(spmd)] == ["all-gather"]


@pytest.mark.parametrize("rows,reducer,init,sharding,pairs", [
    (7, "max", "-inf", "{devices=[2,1]<=[2]}", [(0, 1)]),
    (2, "add", "0", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", [(0, 2), (1, 3)]),
    (9, "max", "-inf", "{devices=[2,2]<=[2,2]T(1,0)}", [(0, 1), (2, 3)]),
])
def test_a_scan_over_two_shards_permutes_the_first_shards_totals(rows, reducer, init, sharding,
                                                                  pairs):
    """With two shards the carry is the first shard's totals: one collective-permute from each
    first-shard partition to its second-shard partner (by hand from the tile assignment), and
    the first shard combines the init value, not the zeros a permute leaves it (a `max` over
    negative inputs fails otherwise)."""
    spmd = check_equivalent(module(f"""
  x = f32[{rows},8] parameter(0), sharding={sharding}
  z = f32[] constant({init})
  ROOT r = f32[{rows},8] reduce-window(x, z), window={{size={rows}x1 pad={rows - 1}_0x0_0}},
    to_apply={reducer}, sharding={sharding}"""), len({d for p in pairs for d in p}),
        inputs=[np.random.default_rng(1).uniform(-3, -1, (rows, 8)).astype(np.float32)])
    assert collectives(spmd) == [("collective-permute", pairs)]


def test_a_non_identity_init_is_combined_once_per_window():
    """Masked positions take the reducer's identity (0), not the init (1), which the local
    reduce-window combines once per window, as the unpartitioned op does."""
    spmd = check_equivalent(module("""
  x = f32[10,8] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(1)
  ROOT r = f32[10,8] reduce-window(x, z), window={size=3x1 pad=1_1x0_0}, to_apply=add,
    sharding={devices=[4,1]<=[4]}"""), 4)
    halo_only(spmd)


def test_lowering_executes_the_recorded_plan_and_refuses_one_that_does_not_fit(tmp_path):
    """lower-spmd emits the plan the halo-exchange dump records (it does not compute it
    again): a plan receiving more than it needs still gives the right values, with more bytes;
    a plan for another shard count or a malformed one is a clear error."""
    from gspmdc.errors import GspmdcError
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.spmd.cleanup import Cleanup
    from gspmdc.passes.spmd.lower_spmd import LowerSpmd

    text = module("""
  x = f32[12,4] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0)
  ROOT r = f32[12,4] reduce-window(x, z), window={size=3x1 pad=1_1x0_0}, to_apply=add,
    sharding={devices=[4,1]<=[4]}""")
    compile_spmd(api.parse(text), 4, dump_dir=tmp_path, propagate=False)
    (dump,) = tmp_path.glob("*.halo-exchange.hlo")
    recorded = dump.read_text()
    plan = "left=1,right=1,from_left=1,from_right=1,mask,shards=4,input=3,output=3,window=5," \
           "valid=12,offsets=0"
    assert plan in recorded

    def lowered(edited: str):
        return api.parse(api.to_text(run_pipeline(PassContext(4), api.parse(edited),
                                                  [LowerSpmd(), Cleanup()])))

    def permuted_rows(spmd) -> list[int]:
        return sorted(i.shape.dims[0] for i in spmd.entry.instructions
                      if i.opcode == "collective-permute")
    assert permuted_rows(lowered(recorded)) == [1, 1]
    # two rows from the left, the window cut one further in: the same window input
    wider = recorded.replace(plan, plan.replace("from_left=1,", "from_left=2,")
                             .replace("offsets=0", "offsets=1"))
    spmd = lowered(wider)
    assert permuted_rows(spmd) == [1, 2]           # two rows come from the left neighbour
    inputs = inputs_for(text)
    assert_close(run_global(spmd, inputs, 4), reference(text, inputs))
    with pytest.raises(GspmdcError, match="is for 2 shards of 3, but x has 4 shards of 3"):
        lowered(recorded.replace("shards=4", "shards=2"))
    with pytest.raises(GspmdcError, match="malformed halo plan of operand 0 dim 0: missing"):
        lowered(recorded.replace(",valid=12", ""))
    with pytest.raises(GspmdcError, match="right does not agree"):
        lowered(recorded.replace("right=1", "right=2"))
