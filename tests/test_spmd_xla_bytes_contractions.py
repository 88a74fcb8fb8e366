"""No more collective bytes than XLA (issue 13) on contractions: a grouped convolution whose
group dim is tiled unevenly keeps whole groups on every tile (XLA pads the group dim). Bytes
per device by hand from the cost model's formulas (`gspmdc.ir.cost`: a ring all-reduce of B
bytes over g devices sends 2 (g-1)/g B); values against the unpartitioned program; with the
`[xla]` extra, against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


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
