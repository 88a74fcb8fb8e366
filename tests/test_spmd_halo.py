"""Halo arithmetic (passes/spmd/halo.py): hand-computed per-shard halo tables, the reference's
worked examples (docs/design/partitioning.md#worked-halo-examples A-E), and a brute-force
cross-check that enumerates which input elements
each shard's outputs read."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from gspmdc.passes.spmd.halo import WindowedDim, halo_sent, plan_halo


def _table(plan):
    return plan.left.tolist(), plan.right.tolist(), plan.from_left, plan.from_right, plan.mask


# Each case: WindowedDim, then (left, right, from_left, from_right, mask) derived by hand.
# I = cdiv(S, n), wc = (S + lo + hi - k) // s + 1, W = cdiv(wc, n), window input
# s*(W-1) + k, start(i) = s*W*i - lo, left(i) = I*i - start(i),
# right(i) = start(i) + window_input - I*(i+1).
HAND = [
    # (A) S=10, n=4, k=3, s=1, pad 1_1: I=3, wc=10, W=3, input 5, start=[-1,2,5,8]:
    # left=1, right=1 everywhere; real reads [-1,4),[2,7),[5,10),[8,11) need 1 each side;
    # padding is read -> mask.
    (WindowedDim(10, 4, 3, 1, 1, 1), ([1] * 4, [1] * 4, 1, 1, True)),
    # (B) same, stride 2: wc=5, W=2, input 5, start=[-1,3,7,11]: left=[1,0,-1,-2],
    # right=[1,2,3,4]. Real outputs 0..4: shard 1 (o=2,3) reads base [3,8) -> 2 from the right;
    # shard 2 (o=4) reads [7,10) -> 1; shard 3 has none. Nothing from the left.
    (WindowedDim(10, 4, 3, 2, 1, 1), ([1, 0, -1, -2], [1, 2, 3, 4], 0, 2, True)),
    # window 5, S=12, n=4, pad 2_2: I=3, wc=12, W=3, input 7, start=3i-2: left=2, right=2.
    (WindowedDim(12, 4, 5, 1, 2, 2), ([2] * 4, [2] * 4, 2, 2, True)),
    # window 7, stride 2, S=10, n=4, pad 3_3: I=3, wc=5, W=2, input 9, start=[-3,1,5,9]:
    # left=[3,2,1,0], right=[3,4,5,6]. Real reads: shard 0 (o=0,1) base [-3,6) -> 3 right;
    # shard 1 (o=2,3) [1,10) -> 2 left, 4 right; shard 2 (o=4) [5,12) -> data [5,10): 1 left,
    # 1 right. from_right = 4 > I: two hops (3 + 1).
    (WindowedDim(10, 4, 7, 2, 3, 3), ([3, 2, 1, 0], [3, 4, 5, 6], 2, 4, True)),
    # uneven, no padding: S=7, n=2, k=3: I=4, wc=5, W=3, input 5, start=[0,3]: left=[0,1],
    # right=[1,0]; shard 1 (o=3,4) reads [3,7): 1 left, nothing right; no padding read.
    (WindowedDim(7, 2, 3), ([0, 1], [1, 0], 1, 1, False)),
    # uneven with 3 shards, window 3, stride 2, pad 1_1: S=8, I=3, wc=4, W=2, input 5,
    # start=[-1,3,7]: left=[1,0,-1], right=[1,2,3]; shard 0 (o=0,1) reads [-1,4) -> 1 right;
    # shard 1 (o=2,3) reads [3,8) -> 2 right (elements 6,7); shard 2 none.
    (WindowedDim(8, 3, 3, 2, 1, 1), ([1, 0, -1], [1, 2, 3], 0, 2, True)),
    # (C) XLA's ReduceWindowTiledTwoSideHalo: S=4, n=2, k=5, s=3, pad 2_2: I=2, wc=2, W=1,
    # input 5, start=[-2,1]: left=[2,1], right=[1,2].
    (WindowedDim(4, 2, 5, 3, 2, 2), ([2, 1], [1, 2], 1, 1, True)),
    # (D) pad 0_2 of S=257 on 2: I=129, wc=259, W=130, input 130, start=[0,130]:
    # left=[0,-1], right=[1,2]; shard 1 reads [130,259) -> data to 257, nothing right.
    (WindowedDim(257, 2, 1, 1, 0, 2), ([0, -1], [1, 2], 0, 1, True)),
    # (E) slice [5:256] of 257 on 2 = pad -5_-1: wc=251, W=126, start=[5,131]:
    # left=[-5,-2], right=[2,-1]; never reads padding.
    (WindowedDim(257, 2, 1, 1, -5, -1), ([-5, -2], [2, -1], 0, 2, False)),
]


@pytest.mark.parametrize("dim,expected", HAND)
def test_hand_computed_halo_tables(dim, expected):
    assert _table(plan_halo(dim)) == expected


def test_static_halos_are_reported_as_one_number():
    assert plan_halo(WindowedDim(10, 4, 3, 1, 1, 1)).describe() == \
        "left=1,right=1,from_left=1,from_right=1,mask"
    plan = plan_halo(WindowedDim(10, 4, 3, 2, 1, 1))
    assert not plan.static
    assert plan.describe() == "left=[1,0,-1,-2],right=[1,2,3,4],from_left=0,from_right=2,mask"


def test_worked_example_c_offsets():
    """Halo example (C): concatenation f32[4] padded to 6, window of 5 cut at offsets [0, 1]."""
    plan = plan_halo(WindowedDim(4, 2, 5, 3, 2, 2))
    assert (plan.window_input, plan.pad_left, plan.pad_right) == (5, 1, 1)
    assert plan.offsets.tolist() == [0, 1]


def test_base_dilation_is_in_dilated_units():
    """pad 1_0_1 (interior 1) of S=5 on 2: base dilated x2 -> shards of 6 (I=3), valid 9;
    padded length 10, W=5, start=[-1,4]: left=[1,2], right=[-2,-3]; shard 1 reads base [4,9):
    2 elements (x2 and its hole) from the left."""
    plan = plan_halo(WindowedDim(5, 2, 1, 1, 1, 0, base_dilation=2))
    assert (plan.input_shard, plan.valid, plan.output_shard) == (6, 9, 5)
    assert _table(plan) == ([1, 2], [-2, -3], 2, 0, True)


def _brute_force(dim: WindowedDim):
    """Per shard, from the explicit list of padded positions its outputs read: (left, right)
    over all its outputs; the data elements outside its own block that the span of its real
    outputs' reads covers (the exchange is contiguous), as (needed from the left, needed from
    the right); and whether any real output reads a non-data position. Base dilation 1."""
    n, s, lo = dim.shards, dim.stride, dim.padding_low
    size = dim.size
    shard = -(-size // n)
    wc = dim.output_count
    w = -(-wc // n)
    taps = np.arange(dim.window) * dim.window_dilation
    lefts, rights, need_l, need_r, mask = [], [], [], [], False
    for i in range(n):
        outputs = np.arange(w * i, w * (i + 1))
        reads = (outputs[:, None] * s + taps[None, :] - lo)       # base positions
        lefts.append(int(shard * i - reads.min()))
        rights.append(int(reads.max() + 1 - shard * (i + 1)))
        real = reads[outputs < wc]
        mask |= bool(((real < 0) | (real >= size)).any())
        span = np.arange(real.min(), real.max() + 1) if real.size else real
        data = span[(span >= 0) & (span < size)]
        need_l.append(int(max(0, shard * i - data.min())) if data.size else 0)
        need_r.append(int(max(0, data.max() + 1 - shard * (i + 1))) if data.size else 0)
    return lefts, rights, max(need_l), max(need_r), mask


CASES = [WindowedDim(size, n, k, s, lo, hi, window_dilation=wd)
         for size, n, k, s, (lo, hi), wd in itertools.product(
             (7, 10, 16), (2, 3, 4, 8), (1, 3, 5, 7), (1, 2, 3), ((0, 0), (1, 1), (3, 2), (-2, 1)),
             (1, 2))
         if (size - 1) + 1 + lo + hi >= (k - 1) * wd + 1]


def test_plans_match_brute_force_reads():
    for dim in CASES:
        assert _table(plan_halo(dim)) == _brute_force(dim), dim


def test_offsets_keep_every_window_inside_the_padded_concatenation():
    """The dynamic-slice never clamps: each real shard's window starts where its data is."""
    for dim in CASES:
        plan = plan_halo(dim)
        length = plan.pad_left + plan.from_left + plan.input_shard + plan.from_right + \
            plan.pad_right
        assert (plan.offsets >= 0).all() and \
            (plan.offsets + plan.window_input <= length).all(), dim
        # concat position p of shard i holds base position I*i - from_left - pad_left + p
        i = np.arange(dim.shards)
        base = plan.input_shard * i - plan.from_left - plan.pad_left + plan.offsets
        real = plan.output_shard * i < dim.output_count
        assert (base[real] == plan.start[real]).all(), dim


def test_strided_window_reading_padding_is_one_directional_by_hand():
    """4 elements on 2 shards, window 2, stride 2, padding 0_2 (3 outputs, 2 a shard): shard
    i reads base [4i, 4i + 4): left = 2i - 4i, right = 4i + 4 - 2(i + 1); nothing comes from
    the left, 2 elements from the right, and only shard 0 receives (shard 1 reads padding)."""
    plan = plan_halo(WindowedDim(4, 2, 2, 2, 0, 2))
    assert plan.left.tolist() == [0, -2] and plan.right.tolist() == [2, 4]
    assert (plan.from_left, plan.from_right) == (0, 2)
    assert plan.receives("right", 1).tolist() == [True, False] and plan.mask
    # f32 [2, 2, 3] shards: the busiest sends 2 elements x 2 x 3 x 4 bytes, all together as much
    assert halo_sent({1: plan}, (2, 2, 3), 4, 2) == (48, 48)


def test_a_dim_with_one_window_trims_the_other_dims_exchange_by_hand():
    """Dim 0: 3 rows on 4 shards, one window (size 1, stride 4): shard 0 computes output 0 from
    its own row, the others have no output (`real`), nothing moves on dim 0 (`identity`) but
    the plan is kept (`needed`). Dim 1: 10 columns on 2 shards, window 3, pad 0_2: shard 0
    needs 2 columns from shard 1. Of the 8 partitions only the one with dim-0 ordinal 0 and
    dim-1 ordinal 1 sends: 2 columns of 1 row of f32."""
    rows = plan_halo(WindowedDim(3, 4, 1, 4))
    cols = plan_halo(WindowedDim(10, 2, 3, 1, 0, 2))
    assert rows.identity and rows.needed and rows.real.tolist() == [True, False, False, False]
    assert (cols.from_left, cols.from_right) == (0, 2)
    plans = {0: rows, 1: cols}
    assert halo_sent(plans, (1, 5), 4, 8) == (8, 8)
    assert not plan_halo(WindowedDim(4, 4, 1, 1)).needed      # every shard has an output
