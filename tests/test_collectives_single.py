"""Collectives: the group rules of every mode (hand-computed groups), the shared group semantics on
the worked 4-partition examples of docs/design/collectives.md#semantics, and the single-partition
backend through
the interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.errors import GspmdcError
from gspmdc.ir.attributes import ReplicaGroups
from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape
from gspmdc.runtime.collectives import (
    Reduction, fold, gather_concat, group_of, participant_groups, permute_pairs, permute_source,
    scatter_block, split_blocks,
)

from hlo_text import hlo_module, max_magnitude_reducer, reducer
from interpreter_helpers import run_hlo

ADD = Reduction(combine=np.add, ufunc=np.add)


def collective(opcode, groups=None, **attrs):
    if groups is not None:
        attrs["replica_groups"] = ReplicaGroups(tuple(tuple(g) for g in groups))
    return Instruction("c", opcode, ArrayShape("f32", (4,)), attrs=attrs)


# ---------------------------------------------------------------------------- group modes

def test_cross_replica_mode_makes_every_partition_its_own_group():
    for groups in (None, [], [[0]]):
        assert participant_groups(collective("all-reduce", groups), 4) == [[0], [1], [2], [3]]
    with pytest.raises(GspmdcError, match="replica id 1 in its groups does not exist"):
        participant_groups(collective("all-reduce", [[0, 1]]), 4)


def test_global_device_ids_name_partitions():
    inst = collective("all-gather", [[0, 2], [1, 3]], channel_id=1, use_global_device_ids=True)
    assert participant_groups(inst, 4) == [[0, 2], [1, 3]]
    inst = collective("reduce-scatter", [[3, 1, 2, 0]], channel_id=1, use_global_device_ids=True)
    assert participant_groups(inst, 4) == [[3, 1, 2, 0]]
    inst = collective("all-reduce", [], channel_id=1, use_global_device_ids=True)
    assert participant_groups(inst, 4) == [[0, 1, 2, 3]]


def test_channel_without_global_ids_spans_all_partitions_of_the_replicas():
    inst = collective("all-reduce", [[0]], channel_id=1)
    assert participant_groups(inst, 4) == [[0, 1, 2, 3]]
    assert participant_groups(collective("all-gather", None, channel_id=7), 2) == [[0, 1]]


def test_all_to_all_with_a_channel_is_cross_partition():
    inst = collective("all-to-all", [[0, 1], [2, 3]], channel_id=2)
    assert participant_groups(inst, 4) == [[0, 1], [2, 3]]
    assert participant_groups(collective("all-to-all", [[0]]), 3) == [[0], [1], [2]]


@pytest.mark.parametrize("groups, message", [
    ([[0, 4]], "partition id 4 in its groups does not exist"),
    ([[0, 1], [1, 2]], "partition id 1 appears twice"),
    ([[0, 1, 2], [3]], "unequal sizes"),
])
def test_bad_groups_are_rejected(groups, message):
    inst = collective("all-reduce", groups, channel_id=1, use_global_device_ids=True)
    with pytest.raises(GspmdcError, match=message):
        participant_groups(inst, 4)


def test_group_of_finds_the_partition_and_its_position():
    inst = collective("all-reduce")
    assert group_of(inst, [[3, 1], [0, 2]], 1) == ([3, 1], 1)
    with pytest.raises(GspmdcError, match="partition 5 is in none"):
        group_of(inst, [[3, 1], [0, 2]], 5)


def test_permute_pairs_with_and_without_channel():
    inst = collective("collective-permute", source_target_pairs=((0, 1), (1, 2), (2, 3)), channel_id=1)
    pairs = permute_pairs(inst, 4)
    assert pairs == [(0, 1), (1, 2), (2, 3)]
    assert [permute_source(pairs, p) for p in range(4)] == [None, 0, 1, 2]
    same = collective("collective-permute", source_target_pairs=((0, 0),))
    assert permute_pairs(same, 3) == [(0, 0), (1, 1), (2, 2)]
    with pytest.raises(GspmdcError, match="replica id 1"):
        permute_pairs(collective("collective-permute", source_target_pairs=((0, 1),)), 2)
    with pytest.raises(GspmdcError, match="partition id 1 appears twice"):
        permute_pairs(collective("collective-permute", source_target_pairs=((0, 1), (2, 1)),
                                 channel_id=3), 4)


# ---------------------------------- group semantics (docs/design/collectives.md#semantics)

def partition_values():
    return [np.array([p, 10 + p, 20 + p, 30 + p], np.int32) for p in range(4)]


def results_per_partition(inst, compute):
    """Evaluate a collective for each of 4 partitions from the per-partition values, the way a
    local backend composes the shared helpers."""
    values = partition_values()
    groups = participant_groups(inst, 4)
    out = []
    for p in range(4):
        group, position = group_of(inst, groups, p)
        out.append(compute([values[m] for m in group], position, len(group)))
    return out


def test_worked_example_all_gather():
    inst = collective("all-gather", [[0, 2], [1, 3]], channel_id=1, use_global_device_ids=True)
    out = results_per_partition(inst, lambda vals, pos, g: gather_concat(vals, 0))
    for p in (0, 2):
        np.testing.assert_array_equal(out[p], [0, 10, 20, 30, 2, 12, 22, 32])
    for p in (1, 3):
        np.testing.assert_array_equal(out[p], [1, 11, 21, 31, 3, 13, 23, 33])


def test_worked_example_reduce_scatter():
    inst = collective("reduce-scatter", [[0, 1, 2, 3]], channel_id=1, use_global_device_ids=True)
    out = results_per_partition(inst, lambda vals, pos, g: scatter_block(fold(vals, ADD), 0, pos, g))
    assert [o.tolist() for o in out] == [[6], [46], [86], [126]]


def test_worked_example_all_to_all():
    inst = collective("all-to-all", [[0, 1, 2, 3]], channel_id=1)
    out = results_per_partition(
        inst, lambda vals, pos, g: gather_concat([split_blocks(v, 0, g)[pos] for v in vals], 0))
    for k in range(4):
        np.testing.assert_array_equal(out[k], [10 * k, 10 * k + 1, 10 * k + 2, 10 * k + 3])


def test_worked_example_all_reduce_in_cross_replica_and_partition_mode():
    inst = collective("all-reduce", [[0]], channel_id=1)
    out = results_per_partition(inst, lambda vals, pos, g: fold(vals, ADD))
    for o in out:
        np.testing.assert_array_equal(o, [6, 46, 86, 126])


def test_fold_is_left_to_right_in_group_order():
    combine = Reduction(combine=lambda a, b: 2 * a + b)
    assert fold([np.int64(1), np.int64(2), np.int64(3)], combine) == 11


def test_split_blocks_requires_divisibility():
    with pytest.raises(GspmdcError, match="does not split into 3 equal blocks"):
        split_blocks(np.zeros(4), 0, 3)


# ------------------------------------------------------------ single-partition evaluation

ADD_COMPUTATION = reducer("add") + max_magnitude_reducer("smax")


def run_collective(body, *args):
    return run_hlo(hlo_module(body, ADD_COMPUTATION, ", num_partitions=1"), *args)


def test_single_partition_collectives_return_their_operands():
    x = np.arange(-3, 5, dtype=np.float32).reshape(2, 4)
    y = np.ones((3,), np.float32)
    out = run_collective("""
  x = f32[2,4] parameter(0)
  y = f32[3] parameter(1)
  ar = f32[2,4] all-reduce(x), channel_id=1, replica_groups={{0}}, use_global_device_ids=true, to_apply=add
  ar2 = (f32[2,4], f32[3]) all-reduce(x, y), replica_groups={}, to_apply=smax
  ag = f32[2,4] all-gather(x), channel_id=2, replica_groups={{0}}, dimensions={1}, use_global_device_ids=true
  rs = f32[2,4] reduce-scatter(x), channel_id=3, replica_groups={}, dimensions={0}, to_apply=add
  a2a = f32[2,4] all-to-all(x), channel_id=4, replica_groups={{0}}, dimensions={1}
  t2a = (f32[2,4]) all-to-all(x), channel_id=5, replica_groups={{0}}
  ROOT r = (f32[2,4], (f32[2,4], f32[3]), f32[2,4], f32[2,4], f32[2,4], (f32[2,4])) tuple(ar, ar2, ag, rs, a2a, t2a)""",
                         x, y)
    ar, (ar2x, ar2y), ag, rs, a2a, (t2a,) = out
    for value in (ar, ar2x, ag, rs, a2a, t2a):
        np.testing.assert_array_equal(value, x)
    np.testing.assert_array_equal(ar2y, y)


def test_single_partition_collective_permute_copies_only_for_a_self_pair():
    x = np.array([1.5, -2.0], np.float32)
    copied, zeroed, none = run_collective("""
  x = f32[2] parameter(0)
  a = f32[2] collective-permute(x), channel_id=1, source_target_pairs={{0,0}}
  b = f32[2] collective-permute(x), source_target_pairs={}
  c = f32[2] collective-permute(x), channel_id=2, source_target_pairs={}
  ROOT r = (f32[2], f32[2], f32[2]) tuple(a, b, c)""", x)
    np.testing.assert_array_equal(copied, x)
    np.testing.assert_array_equal(zeroed, [0, 0])
    np.testing.assert_array_equal(none, [0, 0])


def test_single_partition_rejects_groups_naming_other_partitions():
    with pytest.raises(GspmdcError, match="partition id 1 in its groups does not exist"):
        run_collective("""
  x = f32[2] parameter(0)
  ROOT a = f32[2] all-reduce(x), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add""",
                       np.zeros(2, np.float32))
