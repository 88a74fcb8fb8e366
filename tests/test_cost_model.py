"""The pieces of `gspmdc cost` against numbers worked out by hand: the liveness analysis (peak
memory through parameters, outputs, temporaries, loops, calls and branches), operations per
instruction, the bytes of each collective per partition, and the machine model's times; and the
interpreter's measured peak of live arrays on the same programs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir import cost as model
from gspmdc.ir.cost import collective_seconds, instruction_traffic
from gspmdc.ir.flops import instruction_flops
from gspmdc.ir.liveness import memory_profile
from gspmdc.ir.schedule import execution_order, issue_order, ordered_computations
from gspmdc.passes.analysis.cost import program_cost
from gspmdc.passes.analysis.machine import Machine, PRESETS, load_machine
from gspmdc.runtime import io
from gspmdc.runtime.interpreter import evaluate
from gspmdc.runtime.live_arrays import LiveArrays

from hlo_text import hlo_module, reducer


def _peaks(text: str) -> tuple[int, int]:
    """(modelled, measured) peak bytes of a single-device program."""
    module = api.parse(text)
    live = LiveArrays()
    evaluate(module, io.random_inputs(module, 0), live_arrays=live)
    assert live.bytes == 0                         # every hold was dropped
    return memory_profile(module).peak_bytes, live.peak


def test_straight_line_peak_counts_parameters_and_live_temporaries():
    # a: 400 B parameter; b, c 400 B each; d needs b and c: 400 + 400 + 400 + 400 at d
    text = hlo_module("""
  a = f32[100] parameter(0)
  b = f32[100] negate(a)
  c = f32[100] exponential(a)
  d = f32[100] add(b, c)
  ROOT e = f32[100] negate(d)""")
    model, measured = _peaks(text)
    assert model == measured == 1600
    profile = memory_profile(api.parse(text))
    assert (profile.parameter_bytes, profile.output_bytes) == (400, 400)
    assert profile.peak_at == "e/d"
    assert [p.name for p in profile.timeline] == ["b", "c", "d", "e"]
    assert profile.timeline[-1].after_bytes == 800            # a and e


def test_tuples_and_copies_share_their_operands_buffers():
    text = hlo_module("""
  a = f32[100] parameter(0)
  b = f32[100] negate(a)
  t = (f32[100], f32[100]) tuple(a, b)
  g = f32[100] get-tuple-element(t), index=1
  c = f32[100] copy(g)
  ROOT r = f32[100] add(c, g)""")
    model, measured = _peaks(text)
    assert model == measured == 1200                       # a, b, r


def test_while_loop_state_is_live_through_the_loop():
    """The loop carries (i, x: f32[64]) and passes w: f32[256] through. Iteration 2 on, the
    body's parameter holds the i and x the previous iteration made (4 + 256 B) until their last
    use, beside the loop's operand (zero 4, x 256, w 1024, live for the whole loop) and the
    body's temporaries (y, z: 256 B each)."""
    text = hlo_module("""
  x = f32[64] parameter(0)
  w = f32[256] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[64], f32[256]) tuple(zero, x, w)
  loop = (s32[], f32[64], f32[256]) while(init), condition=cond, body=body
  ROOT out = f32[64] get-tuple-element(loop), index=1""", """
cond {
  p = (s32[], f32[64], f32[256]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[64], f32[256]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[64] get-tuple-element(p), index=1
  w = f32[256] get-tuple-element(p), index=2
  y = f32[64] negate(x)
  z = f32[64] exponential(y)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT r = (s32[], f32[64], f32[256]) tuple(i1, z, w)
}""")
    model, measured = _peaks(text)
    # at y: operand 4 + 256 + 1024, carried i and x 4 + 256, y 256 (at z the carried x is dead
    # and z takes its place: the same sum)
    assert model == measured == 1800
    profile = memory_profile(api.parse(text))
    assert profile.peak_at == "body/y"
    assert profile.peak_parameter_bytes == 1280                  # the entry's x and w
    assert profile.peak_loop_state_bytes == 4 + 4 + 256          # init's zero, carried i and x
    assert profile.peak_temporary_bytes == 256


def test_calls_and_conditionals_add_their_peaks_to_the_caller():
    text = hlo_module("""
  p = pred[] parameter(0)
  a = f32[100] parameter(1)
  c = f32[100] call(a), to_apply=twice
  ROOT k = f32[100] conditional(p, c, a), true_computation=big, false_computation=small""",
        """
twice {
  x = f32[100] parameter(0)
  y = f32[100] add(x, x)
  ROOT z = f32[100] add(y, y)
}
big {
  x = f32[100] parameter(0)
  y = f32[200] concatenate(x, x), dimensions={0}
  ROOT z = f32[100] slice(y), slice={[0:100]}
}
small {
  x = f32[100] parameter(0)
  ROOT z = f32[100] negate(x)
}""")
    module = api.parse(text)
    profile = memory_profile(module)
    # at k: p 1, a 400, c 400 + the big branch: y 800 + z 400 = 2001
    assert profile.peak_bytes == 2001
    # measured: the branch run depends on p; the model is the larger branch's
    for value in (True, False):
        live = LiveArrays()
        evaluate(module, [np.array(value), np.ones(100, np.float32)], live_arrays=live)
        assert live.peak == (2001 if value else 1201)


def test_an_annotation_custom_call_is_its_operand():
    # the LayoutConstraint holds no buffer of its own: a 400 B, n 400 B, r 400 B at r (a
    # buffer of its own would make 1600 B there)
    text = hlo_module("""
  a = f32[100] parameter(0)
  n = f32[100] negate(a)
  c = f32[100]{0} custom-call(n), custom_call_target="LayoutConstraint"
  ROOT r = f32[100] add(c, n)""")
    model, measured = _peaks(text)
    assert model == measured == 1200


def test_a_pad_read_by_a_dynamic_slice_is_fused():
    text = hlo_module("""
  a = f32[10] parameter(0)
  i = s32[] parameter(1)
  zero = f32[] constant(0)
  p = f32[1000] pad(a, zero), padding=0_990
  ROOT s = f32[10] dynamic-slice(p, i), dynamic_slice_sizes={10}""")
    model, measured = _peaks(text)
    assert model == measured == 40 + 4 + 4 + 40


def test_operations_of_dot_convolution_reduce_and_elementwise():
    module = api.parse(hlo_module("""
  a = f32[8,16] parameter(0)
  b = f32[16,4] parameter(1)
  d = f32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[8,4] exponential(d)
  z = f32[] constant(0)
  r = f32[8] reduce(e, z), dimensions={1}, to_apply=add
  img = f32[1,10,10,3] parameter(2)
  k = f32[3,3,3,5] parameter(3)
  c = f32[1,8,8,5] convolution(img, k), window={size=3x3}, dim_labels=b01f_01io->b01f
  ROOT t = (f32[8], f32[1,8,8,5]) tuple(r, c)""", reducer("add")))
    flops = {inst.name: instruction_flops(inst, module) for inst in module.entry.instructions}
    assert flops["d"] == 2 * 8 * 4 * 16
    assert flops["e"] == 32
    assert flops["r"] == 32 - 8                     # 3 additions per output element
    assert flops["c"] == 2 * (8 * 8 * 5) * (3 * 3 * 3)
    assert flops["t"] == flops["a"] == 0


def _collective(line: str, n: int, params: str = "f32[12] parameter(0)"):
    module = api.parse(hlo_module(f"  p0 = {params}\n  ROOT c = {line}", reducer("add"),
                                  f", num_partitions={n}"))
    return instruction_traffic(module.entry.root, n)


def test_ring_bytes_per_partition():
    ag = _collective("f32[48] all-gather(p0), channel_id=1, use_global_device_ids=true, "
                     "replica_groups={{0,1,2,3}}, dimensions={0}", 4)
    assert ag.sent.tolist() == ag.received.tolist() == [3 * 48] * 4 and ag.group_size == 4
    ar = _collective("f32[12] all-reduce(p0), channel_id=1, use_global_device_ids=true, "
                     "replica_groups={{0,1},{2,3}}, to_apply=add", 4)
    assert ar.sent.tolist() == [2 * 1 * 48 // 2] * 4 and ar.num_groups == 2
    rs = _collective("f32[4] reduce-scatter(p0), channel_id=1, use_global_device_ids=true, "
                     "replica_groups={{0,1,2}}, dimensions={0}, to_apply=add", 3)
    assert rs.sent.tolist() == [2 * 48 // 3] * 3
    cp = _collective("f32[12] collective-permute(p0), channel_id=1, "
                     "source_target_pairs={{0,1},{1,2},{3,3}}", 4)
    assert cp.sent.tolist() == [48, 48, 0, 0] and cp.received.tolist() == [0, 48, 48, 0]
    assert cp.num_groups == 3 and cp.group_size == 2          # its pairs
    alone = _collective("f32[12] all-reduce(p0), to_apply=add", 4)   # no channel: per partition
    assert alone.sent.tolist() == [0] * 4 and alone.group_size == 1
    # a chain from each group's first member: 0 -> 2 -> 1 and 3 -> 5 -> 4
    bc = _collective("f32[12] collective-broadcast(p0), channel_id=1, "
                     "replica_groups={{0,2,1},{3,5,4}}", 6)
    assert bc.sent.tolist() == [48, 0, 48, 48, 0, 48]
    assert bc.received.tolist() == [0, 48, 48, 0, 48, 48]
    assert bc.group_size == 3 and bc.num_groups == 2


def test_collective_broadcast_cost_equals_its_profiled_run(tmp_path):
    import json
    import subprocess
    import sys
    program = tmp_path / "broadcast.hlo"
    program.write_text(hlo_module("""
  p0 = f32[8,3] parameter(0)
  b = f32[8,3] collective-broadcast(p0), channel_id=1, replica_groups={{1,0},{3,2}}
  ROOT r = f32[8,3] add(b, p0), sharding={devices=[4,1]<=[4]}""",
                                header=", num_partitions=4"))
    measured = tmp_path / "measured.json"
    run = subprocess.run([sys.executable, "-m", "gspmdc", "run", program, "-n", "4", "-q",
                          "--backend", "local", "--profile-json", measured],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    cost = subprocess.run([sys.executable, "-m", "gspmdc", "cost", program, "-n", "4", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert cost.returncode == 0, cost.stderr
    model, ran = json.loads(cost.stdout), json.loads(measured.read_text())
    (modelled,), (counted,) = model["collectives"], ran["collectives"]
    assert modelled["opcode"] == counted["opcode"] == "collective-broadcast"
    assert modelled["bytes_sent_per_device"] == counted["bytes_sent_per_device"] == [0, 96, 0, 96]
    assert modelled["bytes_received_per_device"] == counted["bytes_received_per_device"] == \
        [96, 0, 96, 0]
    assert model["flops_per_device"] == ran["flops_per_device"] == [24] * 4


def test_a_started_collective_counts_with_its_operand_on_mpi_ranks(tmp_path):
    """The MPI backend starts an all-gather and finishes it when its value is used: the run's
    peak of live arrays must still hold the operand and the result together at the all-gather,
    as the liveness analysis does (the operand's last use is the all-gather)."""
    import json
    import subprocess
    import sys
    program = tmp_path / "gather.hlo"
    program.write_text(hlo_module("""
  p = f32[3,1024] parameter(0), sharding={replicated}
  b = f32[3,1024,2] broadcast(p), dimensions={0,1}
  ROOT ag = f32[3,2048,2] all-gather(b), channel_id=1, replica_groups={{0,1}}, dimensions={1},
    use_global_device_ids=true, sharding={replicated}""", header=", num_partitions=2"))
    measured = tmp_path / "measured.json"
    run = subprocess.run([sys.executable, "-m", "gspmdc", "run", program, "-n", "2", "-q",
                          "--profile-json", measured], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    peak = 3 * 1024 * 4 + 3 * 1024 * 2 * 4 + 3 * 2048 * 2 * 4      # p, b and ag at the gather
    assert json.loads(measured.read_text())["peak_memory_bytes_per_device"] == [peak] * 2
    assert memory_profile(api.parse(program.read_text())).peak_bytes == peak


@pytest.mark.parametrize("backend", ["local", "mpi"])
@pytest.mark.parametrize("w, issued_early, peak", [
    ("f32[3,256] broadcast(n2), dimensions={1}", True, 1024 + 1024 + 2048 + 3072),
    ("f32[2] slice(n2), slice={[0:2]}", False, 1024 + 8 + 2048)])
def test_a_collective_is_issued_early_as_far_as_the_peak_allows(backend, w, issued_early, peak,
                                                               tmp_path):
    """The all-gather reads only the parameter; program order computes n1 and n2 first. Issued
    right after the parameter (`gspmdc.ir.schedule`), its result is live while n1 and n2 are
    (p, ag, n1, n2: 5120 bytes): under a later peak of 7168 (p, n2, ag and a wide w while w is
    computed) it is, and the peak does not change. A narrow w (a slice of n2) frees n2, so the
    free-first order computes it before the all-gather, and the peak is p, w and ag (3080):
    issued early, the all-gather would raise it, so it waits. Counted by the liveness analysis
    and measured by the runtime alike."""
    import json
    import subprocess
    import sys
    program = tmp_path / "early.hlo"
    program.write_text(hlo_module(f"""
  p = f32[256] parameter(0), sharding={{replicated}}
  n1 = f32[256] negate(p)
  n2 = f32[256] negate(n1)
  ag = f32[512] all-gather(p), channel_id=1, replica_groups={{{{0,1}}}}, dimensions={{0}},
    use_global_device_ids=true
  w = {w}
  ROOT t = (f32[512], {w.split()[0]}) tuple(ag, w), sharding={{{{replicated}}, {{replicated}}}}""",
                                  header=", num_partitions=2"))
    module = api.parse(program.read_text())
    order = [i.name for i in execution_order(module.entry, ordered_computations(module))]
    assert (order.index("ag") < order.index("n1")) == issued_early
    assert memory_profile(module).peak_bytes == peak
    measured = tmp_path / "measured.json"
    run = subprocess.run([sys.executable, "-m", "gspmdc", "run", program, "-n", "2", "-q",
                          "--backend", backend, "--profile-json", measured],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(measured.read_text())["peak_memory_bytes_per_device"] == [peak] * 2


def test_collectives_are_issued_after_their_operands_in_their_order_and_not_past_barriers():
    # 0 a; 1 collective reading 0; 2 b; 3 barrier; 4 c; 5 collective reading 2; 6 collective
    # reading 4 (nothing has bytes: memory never holds a collective back)
    sizes = dict.fromkeys(range(7), 0)
    order = issue_order(range(7), {1: [0], 5: [2], 6: [4]}, sizes, {1, 5, 6}, {3})
    assert order == [0, 1, 2, 3, 5, 4, 6]


def test_an_all_gather_waits_where_issuing_it_early_would_raise_the_peak():
    # 0 p (1 byte); 1 a = f(p) (4); 2 b = g(a) (4); 3 all-gather of p (4); 4 h(b, 3) (1).
    # Program order peaks at 4 (b and the gather live: 1 + 4 + 4 + 1 = 10); issuing the
    # gather before 1 would hold it while a and b are both live (1 + 4 + 4 + 4 = 13).
    reads = {1: [0], 2: [1], 3: [0], 4: [2, 3]}
    sizes = {0: 1, 1: 4, 2: 4, 3: 4, 4: 1}
    assert issue_order(range(5), reads, sizes, {3}, set()) == [0, 1, 2, 3, 4]
    # when the gather only replaces what it frees, it is issued right after its operand
    sizes[3] = 1
    assert issue_order(range(5), reads, sizes, {3}, set()) == [0, 3, 1, 2, 4]


def test_free_first_order_defers_a_broadcast_to_its_use():
    # 0 big (8); 1 broadcast (8) read only by 4; 2 r = reduce(big) (1); 3 s = f(r) (1);
    # 4 g(3, 1) (1). Program order holds big and the broadcast together (16 + ...); the
    # free-first order reduces big first and makes the broadcast right before its use.
    reads = {1: [], 2: [0], 3: [2], 4: [3, 1]}
    sizes = {0: 8, 1: 8, 2: 1, 3: 1, 4: 1}
    assert issue_order(range(5), reads, sizes, set(), set()) == [0, 2, 3, 1, 4]


def test_a_call_of_a_computation_drawing_random_numbers_keeps_its_place():
    """`rng` advances the program's random state, so the draws happen in program order: the
    free-first order (lower peak here: the call and the slice that frees its result before the
    entry's large draw) must not run the call, whose computation draws, before that draw."""
    text = hlo_module("""
  zero = f32[] constant(0)
  one = f32[] constant(1)
  a = f32[1024] rng(zero, one), distribution=rng_uniform
  c = f32[256] call(), to_apply=draw
  s = f32[2] slice(c), slice={[0:2]}
  ROOT t = (f32[1024], f32[2]) tuple(a, s)""", """
draw {
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  ROOT r = f32[256] rng(lo, hi), distribution=rng_uniform
}
""")
    module = api.parse(text)
    order = [i.name for i in execution_order(module.entry, ordered_computations(module))]
    assert order.index("a") < order.index("c")
    # the same program without the draw inside the call may run the call first
    module = api.parse(text.replace("ROOT r = f32[256] rng(lo, hi), distribution=rng_uniform",
                                    "ROOT r = f32[256] broadcast(lo), dimensions={}"))
    order = [i.name for i in execution_order(module.entry, ordered_computations(module))]
    assert order.index("c") < order.index("a")


def test_live_arrays_count_a_started_value_from_its_start():
    live = LiveArrays()
    operand, pending = np.ones(10, np.float32), object()
    live.hold(operand)
    live.hold_pending(pending, 80)
    live.drop(operand)                       # its last use was starting the collective
    assert (live.bytes, live.peak) == (80, 120)
    live.settle(pending, np.ones(20, np.float32))
    assert (live.bytes, live.peak) == (80, 120)
    dropped = object()                       # a started value dropped unfinished holds nothing
    live.hold_pending(dropped, 8)
    live.drop(dropped)
    live.settle(dropped, np.ones(2, np.float32))
    assert live.bytes == 80


def test_machine_model_times():
    m = Machine("m", "test", 1e12, 1e11, None, 1e9, 1e-5)

    def seconds_of(traffic):
        return collective_seconds(traffic, m.latency, m.link_bandwidth)
    eight = [list(range(8))]
    seconds, algorithm = seconds_of(model.all_reduce(eight, 2 * 10 ** 6, 4, 8))   # 8 MB
    ring = 2 * 7 * (1e-5 + 10 ** 6 / 1e9)
    tree = 2 * 3 * (1e-5 + 8e-3)
    assert algorithm == "ring" and seconds == pytest.approx(ring) and ring < tree
    # 8 bytes over 1024 devices: latency bound
    seconds, algorithm = seconds_of(model.all_reduce([list(range(1024))], 2, 4, 1024))
    assert algorithm == "tree" and seconds == pytest.approx(2 * 10 * (1e-5 + 8e-9))
    assert seconds_of(model.collective_permute([(0, 1), (1, 0)], 10 ** 6, 2))[0] == \
        pytest.approx(1e-5 + 1e-3)
    assert seconds_of(model.all_gather([[0]], 100, 1)) == (0.0, "none")
    seconds, algorithm = seconds_of(model.collective_broadcast(eight, 10 ** 8, 8))
    assert algorithm == "ring" and seconds == pytest.approx(7e-5 + 0.1)   # pipelined chain
    seconds, algorithm = seconds_of(model.collective_broadcast(eight, 8, 8))
    assert algorithm == "tree" and seconds == pytest.approx(3 * (1e-5 + 8e-9))


def test_program_cost_step_time_adds_rooflines_and_collectives():
    text = hlo_module("""
  a = f32[1024,1024] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[1024,1024] parameter(1), sharding={replicated}
  ROOT d = f32[1024,1024] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={replicated}""",
                      header=", num_partitions=4")
    from gspmdc.passes.pipeline import compile_spmd
    spmd = compile_spmd(api.parse(text), 4)
    machine = Machine("m", "test", 1e12, 1e11, 2 ** 30, 1e10, 1e-6)
    cost = program_cost(spmd, 4, machine)
    figures = cost.figures
    dot_flops = 2 * 256 * 1024 * 1024
    assert figures.flops_per_device == (dot_flops,) * 4
    (gather,) = figures.collectives
    assert gather.opcode == "all-gather" and gather.bytes_sent_per_device == (3 * 256 * 4096,) * 4
    compute = max(dot_flops / 1e12, (256 + 1024 + 1024) * 4096 / 1e11)
    expected = compute + collective_seconds(model.all_gather([range(4)], 256 * 4096, 4),
                                            machine.latency, machine.link_bandwidth)[0]
    assert figures.modelled_step_seconds == pytest.approx(expected)
    assert figures.extra["modelled_utilization"] == pytest.approx(dot_flops / 1e12 / expected)


def test_machine_files_and_presets(tmp_path):
    assert {"tpu-v3", "tpu-v4", "a100", "h100", "h100-ib"} <= set(PRESETS)
    path = tmp_path / "m.json"
    import json
    path.write_text(json.dumps(PRESETS["a100"].to_json()))
    assert load_machine(str(path)) == PRESETS["a100"]
    path.write_text('{"name": "x"}')
    with pytest.raises(GspmdcError, match="lacks"):
        load_machine(str(path))
    with pytest.raises(GspmdcError, match="unknown machine"):
        load_machine("tpu-v9")
    assert math.isclose(PRESETS["tpu-v3"].flops_per_second, 61.5e12)
