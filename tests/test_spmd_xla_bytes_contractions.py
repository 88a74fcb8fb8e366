"""No more collective bytes than XLA (issue 13) on contractions: a dot whose operand holds a
contracting block replicated over a group of devices slices that operand by the output's
tiles (XLA's dot partitioning grouped on contracting dims) where its users read those tiles,
and a grouped convolution whose
group dim is tiled unevenly keeps whole groups on every tile (XLA pads the group dim), and
one whose input alone is tiled on its features gathers them rather than all-reduce a larger
output. Bytes
per device by hand from the cost model's formulas (`gspmdc.ir.cost`: a ring all-reduce of B
bytes over g devices sends 2 (g-1)/g B); values against the unpartitioned program; with the
`[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from gspmdc.passes.spmd.traffic import sent_per_device

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def _dot_module(output_devices: str, user: str = "") -> str:
    root = "ROOT " if not user else ""
    tail = f"\n  ROOT n = f32[7,2] negate(d), sharding={{{user}}}" if user else ""
    return f"""HloModule m, num_partitions=6

ENTRY e {{
  x = f32[14,4,7] parameter(0), sharding={{devices=[2,1,1,3]<=[6] last_tile_dim_replicate}}
  c = f32[] constant(0.5)
  w = f32[4,2,14] broadcast(c), dimensions={{}}
  {root}d = f32[7,2] dot(x, w), lhs_contracting_dims={{1,0}}, rhs_contracting_dims={{0,2}},
    sharding={{devices=[3,1,2]{output_devices} last_tile_dim_replicate}}{tail}
}}
"""


def test_a_dot_slices_the_replicas_of_a_contracting_block_by_the_output():
    """`x` holds half of contracting dim 0 on each group of three devices, replicated in the
    group; the output is tiled 3 ways on `x`'s free dim 2, tile t on devices {t, t+3}. Each
    device slices its third of `x`'s dim 2 (no communication), so the partial sums are
    f32[3,2] (the output's tiles, 7 rows padded to 9) and one all-reduce over the pairs
    {t, t+3} sums them: 2 (2-1)/2 * 24 = 24 B per device (before: the whole f32[7,2] of partial
    sums all-reduced, 56 B, then sliced)."""
    spmd = check_equivalent(_dot_module("<=[2,3]T(1,0)"), 6)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 6) == 24


def test_a_dot_read_whole_sums_its_whole_partial_result():
    """The dot above, its one user reading it whole: the whole f32[7,2] of partial sums
    all-reduced over the pairs (56 B per device) serves the user, where the output's tiles
    summed (24 B) and then gathered three ways (48 B) would cost 72: the split candidate is
    priced where the users read the dot (fuzz/10100000770 off: 69.3 B, not 85.3)."""
    spmd = check_equivalent(_dot_module("<=[2,3]T(1,0)", user="replicated"), 6)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 6) == 56


@needs_xla
@pytest.mark.parametrize("user", ["", "replicated"])
def test_a_dot_sliced_by_the_output_in_another_device_order_against_xla(user):
    """fuzz/10100000770's dot: the output's tiles in an explicit order, so the summed tiles
    are permuted to it afterwards, as in XLA's program (an all-reduce of f32[3,2] and a
    permute; before: 56 B of partial sums all-reduced against XLA's 36); and the same dot
    read whole by its user."""
    compared_with_xla(_dot_module("0,4,1,2,3,5", user), 6)



def _per_device(spmd, n: int) -> list[int]:
    from gspmdc.passes.spmd.traffic import sent_per_device
    return [int(b) for b in sent_per_device(spmd, n)]


SQUARE = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[1,4] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  ROOT d = f32[1,1] dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={1},
    sharding={devices=[2,2]<=[4]}
}
"""


def test_a_dot_tie_on_the_busiest_device_takes_the_fewest_bytes_in_all():
    """`x . x^T` annotated `[2,2]`: the rhs is read either replicated (an all-gather of x's
    f32[1,4] row tiles over the pairs, 16 B from every device) or in the output's column tiles
    (devices 1 and 2 hold the other tile than they need: one permute, 16 B from each of the
    two). Both send 16 B from the busiest device (and do the same local work: one padded row
    each); the permute sends half as many in all, XLA's program (fuzz/12800002515 on: 12/10 B
    where XLA sends 12/8)."""
    spmd = check_equivalent(SQUARE, 4)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute"]
    assert _per_device(spmd, 4) == [0, 16, 16, 0]


WHOLE_OPERAND = """HloModule m, num_partitions=4

ENTRY e {
  a = f32[4,2] parameter(0), sharding={replicated}
  b = f32[4,2] parameter(1), sharding={replicated}
  m = f32[4,2] minimum(a, b), sharding={devices=[4,1]<=[4]}
  n = f32[4,2] negate(m), sharding={devices=[4,1]<=[4]}
  w = f32[4,6,2] parameter(2), sharding={replicated}
  d = f32[6] dot(m, w), lhs_contracting_dims={0,1}, rhs_contracting_dims={0,2},
    sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  ROOT t = (f32[6], f32[4,2]) tuple(d, n),
    sharding={{devices=[2,2]<=[4] last_tile_dim_replicate}, {devices=[4,1]<=[4]}}
}
"""


def test_a_dot_reads_whole_an_operand_every_partition_computes_again_for_free():
    """`m`, tiled on the dot's contracting dim, is a pure op of replicated parameters: every
    partition computes it again whole for nothing, and `w`, replicated, is sliced by the
    output's tiles of its free dim: the dot sends nothing, as XLA's program does (its
    elementwise op of replicated operands is computed whole and sliced, and the dot reads the
    whole value). Before, the planner priced that whole `m` as a gather for a contraction, and
    the dot kept `m`'s contracting tiles: a reduce-scatter and an all-reduce, 24 B from every
    device (fuzz/12900000516 off: 40/36 B where XLA sends 24/21)."""
    spmd = check_equivalent(WHOLE_OPERAND, 4)
    assert collectives(spmd) == []
    dots = [i for _, i in spmd.all_instructions() if i.opcode == "dot"]
    assert [d.shape.dims for d in dots] == [(3,)]        # the output's tile, not all of it
    assert _per_device(spmd, 4) == [0, 0, 0, 0]



KERNEL_OF_A_CONSTANT = """HloModule m, num_partitions=2

ENTRY e {
  x = f64[2,9,9,1] parameter(0), sharding={replicated}
  c = f64[] constant(0.75)
  k = f64[9,1,4,2] broadcast(c), dimensions={}, sharding={maximal device=1}
  ROOT y = f64[9,3,1,6] convolution(x, k), window={size=4x2 stride=1x2 pad=-1_1x0_0 lhs_dilate=1x2},
    dim_labels=10bf_oi01->fb10, batch_group_count=3, sharding={devices=[1,1,1,2]<=[2]}
}
"""


def test_a_convolution_of_a_replicated_input_and_a_kernel_broadcast_from_a_constant_runs_whole():
    """The kernel, a broadcast of a constant placed on device 1, is computed again on every
    partition for nothing (every partition has the constant), and the input is replicated: the
    convolution runs whole and its result is sliced, no bytes. Pricing that broadcast as a
    send from device 1 in the plan running whole, while a plan keeping the input tiled took it
    free, exchanged the input's halos instead: two permutes, 288 B (fuzz/11500000727 on)."""
    spmd = check_equivalent(KERNEL_OF_A_CONSTANT, 2)
    assert collectives(spmd) == []


def _grouped_conv(group_attribute: str, lhs: str, rhs: str, out: str, labels: str,
                  window: str) -> str:
    return f"""HloModule m, num_partitions=2

ENTRY e {{
  x = f32[{lhs}] parameter(0), sharding={{devices=[2,1,1,1]0,1}}
  k = f32[{rhs}] parameter(1), sharding={{replicated}}
  ROOT c = f32[{out}] convolution(x, k), window={{{window}}}, dim_labels={labels},
    {group_attribute}, sharding={{devices=[2,1,1,1]0,1}}
}}
"""


UNEVEN_BATCH_GROUPS = _grouped_conv(
    "batch_group_count=3", "3,8,8,3", "4,3,4,3", "3,3,13,1", "b01f_1i0o->f10b",
    "size=4x4 stride=1x2 pad=-1_2x2_2 lhs_dilate=2x1 rhs_dilate=1x2")


def test_three_batch_groups_on_two_devices_run_in_place():
    """Three batch groups of one image each, the batch tiled on two devices (2 + 1 and a
    padded row) like the output features: each device convolves its two (padded) groups
    with their kernels' output features (a local batch_group_count of 2); no communication
    (fuzz/10100001626: XLA's 0 B for the convolution; before: the input gathered, 1,536 B)."""
    spmd = check_equivalent(UNEVEN_BATCH_GROUPS, 2)
    assert collectives(spmd) == []


def test_batch_groups_split_by_uneven_tiles_are_not_run_in_place():
    """Three batch groups of two images each on two devices: a tile of three images would
    split a group, so the convolution does not run on the batch tiles (values still the
    unpartitioned program's)."""
    text = _grouped_conv("batch_group_count=3", "6,5,5,2", "2,2,2,3", "3,4,4,2",
                         "b01f_01io->f01b", "size=2x2")
    spmd = check_equivalent(text, 2)
    assert collectives(spmd) != []


def test_three_feature_groups_on_two_devices_run_in_place():
    """Three feature groups (depthwise), the input features and the output features tiled
    on two devices (2 + 1 and padding): each device convolves its two groups; no
    communication."""
    text = _grouped_conv("feature_group_count=3", "2,6,6,3", "3,3,1,3", "2,4,4,3",
                         "b01f_01io->b01f", "size=3x3")
    text = text.replace("sharding={devices=[2,1,1,1]0,1}", "sharding={devices=[1,1,1,2]0,1}")
    spmd = check_equivalent(text, 2)
    assert collectives(spmd) == []


@needs_xla
def test_uneven_batch_groups_against_xla():
    compared_with_xla(UNEVEN_BATCH_GROUPS, 2)


# the input's features (dim 0) tiled on pairs and its batch of three groups (dim 1) three ways;
# the kernel's input features tiled like the input's; the output tiled on its batch (dim 1)
FEATURE_TILED_BATCH_GROUPS = """HloModule m, num_partitions=6

ENTRY e {
  x = f32[2,9] parameter(0), sharding={devices=[2,3]<=[2,3]T(1,0)}
  c = f32[] constant(0.5)
  k = f32[9,2] broadcast(c), dimensions={}, sharding={devices=[1,2,3]0,1,3,2,4,5 last_tile_dim_replicate}
  y = f32[9,3] convolution(x, k), dim_labels=fb_oi->fb, batch_group_count=3, sharding={devices=[1,3,2]0,4,2,3,1,5 last_tile_dim_replicate}
  ROOT n = f32[9,3] negate(y), sharding={devices=[1,3,2]0,4,2,3,1,5 last_tile_dim_replicate}
}
"""


def test_an_input_tiled_on_its_features_alone_gathers_them_instead_of_summing_the_output():
    """Each device holds one of two feature blocks of its group's batch block, `f32[1,3]`.
    Gathering the features within each pair ({0,4}, {3,2}, {1,5}: 12 B per device) gives
    whole input features: the local convolution of a batch group with the kernel's matching
    output features (sliced for free from the broadcast) has no partial sums, and its
    `f32[3,3]` tile moves from the output features to the output batch by one all-to-all
    over three devices, 2/3 * 36 = 24 B: 36 B per device (XLA's program; fuzz/12900002531
    on). Before: the kernel sliced by features and the `f32[3,3]` partial sums all-reduced
    over the pairs, 2 (2-1)/2 * 36 = 36 B, then the all-to-all: 60 B."""
    spmd = check_equivalent(FEATURE_TILED_BATCH_GROUPS, 6)
    assert [c[0] for c in collectives(spmd)] == ["all-gather", "all-to-all"]
    assert sent_per_device(spmd, 6).tolist() == [36] * 6


@needs_xla
def test_an_input_tiled_on_its_features_alone_against_xla():
    compared_with_xla(FEATURE_TILED_BATCH_GROUPS, 6)
