"""The local (threaded) backend: every collective in every replica-group spelling and group mode
against numpy written here, the worked examples of docs/design/collectives.md#semantics, loops of
collectives,
failures (one partition raising, a non-SPMD program, a timeout) that must surface promptly, and
the profiler's bookkeeping."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gspmdc.errors import RuntimeFailure
from gspmdc.ir.parser import parse_module, parse_sharding
from gspmdc.ir.sharding import HloSharding
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS
from gspmdc.runtime.profile import ProfileRecorder, format_profiles
from gspmdc.runtime.sharded_io import assemble_outputs, split_inputs, spmd_signature

from spmd_helpers import (SHARED, GROUP_FORMS, fold_shift_add, group_of, partition_values, ring_loop,
                          spmd_module)
from hlo_text import reducer

N = 8


def run(text: str, args_per_partition, n: int = N, **kwargs):
    return run_local(parse_module(text), args_per_partition, n, **kwargs)


GLOBAL_IDS = "channel_id=1, use_global_device_ids=true"


@pytest.mark.parametrize("form", sorted(GROUP_FORMS))
def test_all_reduce_folds_in_group_order(form):
    spelling, groups = GROUP_FORMS[form]
    text = spmd_module(N, ["s32[3]"], "", f"r = s32[3] all-reduce(p0), {GLOBAL_IDS}, "
                                          f"replica_groups={spelling}, to_apply=shift_add")
    xs = partition_values(N, (3,))
    out = run(text, [[x] for x in xs])
    for p in range(N):
        group, _ = group_of(groups, p)
        np.testing.assert_array_equal(out[p], fold_shift_add([xs[m] for m in group]))


@pytest.mark.parametrize("form", sorted(GROUP_FORMS))
def test_all_gather_concatenates_in_group_order(form):
    spelling, groups = GROUP_FORMS[form]
    g = len(groups[0])
    text = spmd_module(N, ["s32[2,3]"], "", f"r = s32[2,{3 * g}] all-gather(p0), {GLOBAL_IDS}, "
                                            f"replica_groups={spelling}, dimensions={{1}}")
    xs = partition_values(N, (2, 3))
    out = run(text, [[x] for x in xs])
    for p in range(N):
        group, _ = group_of(groups, p)
        np.testing.assert_array_equal(out[p], np.concatenate([xs[m] for m in group], axis=1))


@pytest.mark.parametrize("form", sorted(GROUP_FORMS))
def test_reduce_scatter_gives_each_member_its_block(form):
    spelling, groups = GROUP_FORMS[form]
    g = len(groups[0])
    text = spmd_module(N, ["s32[8,2]"], "", f"r = s32[{8 // g},2] reduce-scatter(p0), "
                                            f"{GLOBAL_IDS}, replica_groups={spelling}, "
                                            f"dimensions={{0}}, to_apply=add")
    xs = partition_values(N, (8, 2))
    out = run(text, [[x] for x in xs])
    for p in range(N):
        group, k = group_of(groups, p)
        total = sum(xs[m] for m in group)
        np.testing.assert_array_equal(out[p], total[k * 8 // g:(k + 1) * 8 // g])


@pytest.mark.parametrize("form", sorted(GROUP_FORMS))
def test_all_to_all_array_form_exchanges_blocks(form):
    spelling, groups = GROUP_FORMS[form]
    g = len(groups[0])
    text = spmd_module(N, ["s32[3,4]"], "", f"r = s32[3,4] all-to-all(p0), channel_id=2, "
                                            f"replica_groups={spelling}, dimensions={{1}}")
    xs = partition_values(N, (3, 4))
    out = run(text, [[x] for x in xs])
    b = 4 // g
    for p in range(N):
        group, k = group_of(groups, p)
        want = np.concatenate([xs[m][:, k * b:(k + 1) * b] for m in group], axis=1)
        np.testing.assert_array_equal(out[p], want)


@pytest.mark.parametrize("form", ["iota"])
def test_all_to_all_tuple_form_sends_operand_k_to_member_k(form):
    spelling, groups = GROUP_FORMS[form]
    text = spmd_module(N, ["s32[2]", "s32[2]"], "",
                       f"r = (s32[2], s32[2]) all-to-all(p0, p1), channel_id=3, "
                       f"replica_groups={spelling}")
    xs, ys = partition_values(N, (2,)), partition_values(N, (2,))
    ys = [y + 50 for y in ys]
    out = run(text, [[x, y] for x, y in zip(xs, ys)])
    for p in range(N):
        group, k = group_of(groups, p)
        operand_k = [xs, ys][k]
        assert isinstance(out[p], tuple) and len(out[p]) == 2
        for j, m in enumerate(group):
            np.testing.assert_array_equal(out[p][j], operand_k[m])


def test_collective_permute_zeros_for_non_targets_and_self_copy():
    text = spmd_module(N, ["s32[2]"], "", "r = s32[2] collective-permute(p0), channel_id=4, "
                                          "source_target_pairs={{0,3},{3,5},{5,0},{6,6},{1,2}}")
    xs = partition_values(N, (2,))
    out = run(text, [[x] for x in xs])
    source = {3: 0, 5: 3, 0: 5, 6: 6, 2: 1}
    for p in range(N):
        want = xs[source[p]] if p in source else np.zeros(2, np.int32)
        np.testing.assert_array_equal(out[p], want)


def test_group_modes_cross_replica_and_cross_partition():
    body = """
    a = s32[2] all-reduce(p0), replica_groups={}, to_apply=add
    b = s32[2] all-reduce(p0), channel_id=5, replica_groups={{0}}, to_apply=add
    """
    text = spmd_module(4, ["s32[2]"], body, "r = (s32[2], s32[2]) tuple(a, b)")
    xs = partition_values(4, (2,))
    out = run(text, [[x] for x in xs], 4)
    for p in range(4):
        np.testing.assert_array_equal(out[p][0], xs[p])          # cross-replica: identity
        np.testing.assert_array_equal(out[p][1], sum(xs))        # one group of all partitions


def test_worked_examples_of_the_reference():
    body = """
    ag = s32[8] all-gather(p0), channel_id=1, use_global_device_ids=true, replica_groups={{0,2},{1,3}}, dimensions={0}
    rs = s32[1] reduce-scatter(p0), channel_id=2, use_global_device_ids=true, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add
    aa = s32[4] all-to-all(p0), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}
    cp = s32[4] collective-permute(p0), channel_id=4, source_target_pairs={{0,1},{1,2},{2,3}}
    """
    text = spmd_module(4, ["s32[4]"], body, "r = (s32[8], s32[1], s32[4], s32[4]) "
                                            "tuple(ag, rs, aa, cp)")
    xs = [np.array([p, 10 + p, 20 + p, 30 + p], np.int32) for p in range(4)]
    out = run(text, [[x] for x in xs], 4)
    assert out[0][0].tolist() == out[2][0].tolist() == [0, 10, 20, 30, 2, 12, 22, 32]
    assert out[1][0].tolist() == out[3][0].tolist() == [1, 11, 21, 31, 3, 13, 23, 33]
    assert [o[1].tolist() for o in out] == [[6], [46], [86], [126]]
    assert [o[2].tolist() for o in out] == [[10 * k + j for j in range(4)] for k in range(4)]
    assert out[0][3].tolist() == [0, 0, 0, 0] and out[1][3].tolist() == xs[0].tolist()
    assert out[3][3].tolist() == xs[2].tolist()


def test_multi_operand_all_reduce_and_partition_id():
    body = """
    id = u32[] partition-id()
    ar = (s32[2], s32[3]) all-reduce(p0, p1), channel_id=1, use_global_device_ids=true, replica_groups={{0,1},{2,3}}, to_apply=add
    mx = s32[2] all-reduce(p0), channel_id=2, use_global_device_ids=true, replica_groups={{0,1},{2,3}}, to_apply=max
    a = s32[2] get-tuple-element(ar), index=0
    b = s32[3] get-tuple-element(ar), index=1
    """
    text = spmd_module(4, ["s32[2]", "s32[3]"], body,
                       "r = (u32[], s32[2], s32[3], s32[2]) tuple(id, a, b, mx)")
    xs, ys = partition_values(4, (2,)), partition_values(4, (3,))
    out = run(text, [[x, y] for x, y in zip(xs, ys)], 4)
    for p in range(4):
        g0, g1 = (0, 1) if p < 2 else (2, 3)
        assert out[p][0] == p and out[p][0].dtype == np.uint32
        np.testing.assert_array_equal(out[p][1], xs[g0] + xs[g1])
        np.testing.assert_array_equal(out[p][2], ys[g0] + ys[g1])
        np.testing.assert_array_equal(out[p][3], np.maximum(xs[g0], xs[g1]))


def test_collectives_in_a_loop_keep_their_order():
    xs = partition_values(4, (3,))
    out = run(ring_loop(4, 12), [[x] for x in xs], 4)
    for p in range(4):          # 12 shifts by one on a ring of 4: back home
        np.testing.assert_array_equal(out[p], xs[p])


FAIL_ON_ONE = """HloModule fail, num_partitions=4

ENTRY main {
  x = f32[4] parameter(0)
  c = f32[4] custom-call(x), custom_call_target="gspmdc_test.fail_on_partition_1"
  ROOT r = f32[4] all-reduce(c), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=addf
}

""" + reducer("addf", "add")


@pytest.fixture
def fail_on_partition_1(monkeypatch):
    def handler(inst, args, ctx):
        if ctx.partition_id == 1:
            raise ValueError("injected failure")
        return args[0]
    monkeypatch.setitem(CUSTOM_CALL_TARGETS, "gspmdc_test.fail_on_partition_1", handler)


def test_a_failing_partition_stops_all_promptly(fail_on_partition_1):
    args = [[np.ones(4, np.float32)] for _ in range(4)]
    start = time.monotonic()
    with pytest.raises(RuntimeFailure, match=r"partition 1: main/c: custom-call failed: "
                                             r"ValueError: injected failure"):
        run(FAIL_ON_ONE, args, 4)
    assert time.monotonic() - start < 5


def test_a_non_spmd_program_is_reported_not_hung():
    text = """HloModule diverge, num_partitions=2

""" + reducer("addf", "add") + """
with_collective {
  x = f32[2] parameter(0)
  ROOT r = f32[2] all-reduce(x), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=addf
}

without {
  ROOT x = f32[2] parameter(0)
}

ENTRY main {
  x = f32[2] parameter(0)
  id = u32[] partition-id()
  zero = u32[] constant(0)
  first = pred[] compare(id, zero), direction=EQ
  ROOT r = f32[2] conditional(first, x, x), true_computation=with_collective, false_computation=without
}
"""
    args = [[np.ones(2, np.float32)] for _ in range(2)]
    with pytest.raises(RuntimeFailure, match="diverged.*partition 0 is at all-reduce r; "
                                             "partition 1 has finished"):
        run(text, args, 2)


def test_timeout_bounds_the_run(monkeypatch):
    def slow(inst, args, ctx):
        if ctx.partition_id == 0:
            time.sleep(1)
        return args[0]
    monkeypatch.setitem(CUSTOM_CALL_TARGETS, "gspmdc_test.fail_on_partition_1", slow)
    args = [[np.ones(4, np.float32)] for _ in range(4)]
    start = time.monotonic()
    with pytest.raises(RuntimeFailure, match="timed out after 0.3 s"):
        run(FAIL_ON_ONE, args, 4, timeout=0.3)
    assert time.monotonic() - start < 1.5   # the grace join ends with the slow kernel


def test_profile_counts_calls_bytes_and_times():
    xs = partition_values(4, (3,))
    recorders = [ProfileRecorder(p, 4) for p in range(4)]
    run(ring_loop(4, 12), [[x] for x in xs], 4, recorders=recorders)
    for p, rec in enumerate(recorders):
        prof = rec.profile()
        stats = prof.collectives["y"]
        assert (stats.opcode, stats.calls, stats.bytes_sent) == ("collective-permute", 12, 12 * 12)
        assert prof.wall > 0 and prof.kernel_seconds > 0 and prof.collective_seconds > 0
        assert prof.kernel_seconds + prof.collective_seconds <= prof.wall
    table = format_profiles([r.profile() for r in recorders])
    assert "collective-permute" in table and "144 B" in table


def test_profile_bytes_follow_the_ring_cost_model():
    body = """
    ag = s32[8,2] all-gather(p0), channel_id=1, use_global_device_ids=true, replica_groups={{0,1,2,3}}, dimensions={0}
    ar = s32[2,2] all-reduce(p0), channel_id=2, use_global_device_ids=true, replica_groups={{0,1},{2,3}}, to_apply=add
    """
    text = spmd_module(4, ["s32[2,2]"], body, "r = (s32[8,2], s32[2,2]) tuple(ag, ar)")
    recorders = [ProfileRecorder(p, 4) for p in range(4)]
    run(text, [[x] for x in partition_values(4, (2, 2))], 4, recorders=recorders)
    stats = recorders[2].profile().collectives
    assert stats["ag"].bytes_sent == 3 * 16 and stats["ag"].group_size == 4
    assert stats["ar"].bytes_sent == 2 * 1 * 16 // 2 and stats["ar"].group_size == 2


def xla_programs():
    folder = SHARED / "jax-programs"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if (p / "xla_spmd.hlo").is_file())


def xla_output_sharding(folder) -> HloSharding:
    """XLA's partitioned root carries no sharding; reference.json records the outputs'."""
    outputs = json.loads((folder / "reference.json").read_text())["outputs"]
    shardings = [parse_sharding(o["hlo_sharding"]) for o in outputs]
    program = parse_module((folder / "program.hlo").read_text())
    return HloSharding.tuple(shardings) if program.entry.root.shape.is_tuple else shardings[0]


@pytest.mark.parametrize("folder", xla_programs(), ids=lambda p: p.name)
def test_xla_partitioned_programs_reproduce_jax_outputs(folder):
    spmd = parse_module((folder / "xla_spmd.hlo").read_text())
    signature = spmd_signature(spmd, output_sharding=xla_output_sharding(folder))
    with np.load(folder / "inputs.npz") as data:
        inputs = [data[f"arg{i}"] for i in range(len(signature.parameters))]
    per_partition = split_inputs(signature, inputs, padding="garbage")
    result = assemble_outputs(signature, run_local(spmd, per_partition))
    outputs = list(result) if isinstance(result, tuple) else [result]
    with np.load(folder / "outputs.npz") as expected:
        assert len(outputs) == len(expected.files)
        for k, value in enumerate(outputs):
            np.testing.assert_allclose(value, expected[f"out{k}"], rtol=2e-5, atol=2e-5,
                                       err_msg=f"{folder.name} out{k}")
