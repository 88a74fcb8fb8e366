"""ragged-dot: over a ragged batch dim it partitions as a dot (no operand gathered, partial
results over a tiled contracting dim combined by one all-reduce); the other modes run
replicated. Each case is checked against the unpartitioned program."""
from __future__ import annotations

import numpy as np
import pytest

from spmd_partition_helpers import check_equivalent, collectives

BATCH_MODE = """HloModule m, num_partitions={n}
ENTRY e {{
  a = f32[{b},6,{k}] parameter(0), sharding={lhs}
  w = f32[{b},{k},5] parameter(1), sharding={rhs}
  g = u32[3] parameter(2), sharding={{replicated}}
  ROOT d = f32[{b},6,5] ragged-dot(a, w, g), lhs_batch_dims={{0}}, rhs_batch_dims={{0}},
    lhs_contracting_dims={{2}}, rhs_contracting_dims={{1}}, lhs_ragged_dims={{0}},
    sharding={out}
}}
"""


def group_sizes(b: int) -> np.ndarray:
    return np.array([b // 3, 1, b - b // 3 - 1], np.uint32)


@pytest.mark.parametrize("n, b, k", [(2, 8, 4), (4, 7, 6), (3, 7, 5)])
def test_batch_sharded_ragged_dot_stays_local(n, b, k):
    text = BATCH_MODE.format(n=n, b=b, k=k, lhs=f"{{devices=[{n},1,1]<=[{n}]}}",
                             rhs=f"{{devices=[{n},1,1]<=[{n}]}}",
                             out=f"{{devices=[{n},1,1]<=[{n}]}}")
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(b, 6, k)).astype(np.float32),
              rng.normal(size=(b, k, 5)).astype(np.float32), group_sizes(b)]
    spmd = check_equivalent(text, n, inputs=inputs)
    assert collectives(spmd) == []


def test_contracting_sharded_ragged_dot_is_one_all_reduce():
    text = BATCH_MODE.format(n=4, b=6, k=8, lhs="{devices=[1,1,4]<=[4]}",
                             rhs="{devices=[1,4,1]<=[4]}", out="{replicated}")
    rng = np.random.default_rng(1)
    inputs = [rng.normal(size=(6, 6, 8)).astype(np.float32),
              rng.normal(size=(6, 8, 5)).astype(np.float32), group_sizes(6)]
    spmd = check_equivalent(text, 4, inputs=inputs)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3]])]


def test_free_ragged_dim_runs_replicated_and_agrees():
    text = """HloModule m, num_partitions=2
ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  w = f32[3,4,5] parameter(1), sharding={replicated}
  g = s32[3] parameter(2), sharding={replicated}
  ROOT d = f32[8,5] ragged-dot(a, w, g), lhs_contracting_dims={1}, rhs_contracting_dims={1},
    lhs_ragged_dims={0}, rhs_group_dims={0}, sharding={devices=[2,1]<=[2]}
}
"""
    rng = np.random.default_rng(2)
    inputs = [rng.normal(size=(8, 4)).astype(np.float32),
              rng.normal(size=(3, 4, 5)).astype(np.float32), np.array([3, 2, 2], np.int32)]
    check_equivalent(text, 2, inputs=inputs)


def test_uneven_contracting_dim_padding_is_masked():
    """63 contracting elements over 2 tiles: the padding element holds NaN and is masked."""
    text = BATCH_MODE.format(n=2, b=4, k=63, lhs="{devices=[1,1,2]<=[2]}",
                             rhs="{devices=[1,2,1]<=[2]}", out="{replicated}")
    rng = np.random.default_rng(3)
    inputs = [rng.normal(size=(4, 6, 63)).astype(np.float32),
              rng.normal(size=(4, 63, 5)).astype(np.float32), group_sizes(4)]
    check_equivalent(text, 2, inputs=inputs)
