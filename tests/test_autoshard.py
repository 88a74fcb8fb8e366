"""`gspmdc autoshard`: the command end to end (its output compiles and runs and reproduces the
unpartitioned program), pins, memory limits, the solver's time limit, `explain` of the choice,
and bad input."""
from __future__ import annotations

import json

import pytest

from gspmdc import api
from gspmdc.cli import main
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.parser import parse_module, parse_sharding
from gspmdc.passes.autoshard import autoshard
from gspmdc.passes.autoshard.annotate import read_record

import autoshard_models
import spmd_partition_helpers
from hlo_text import reducer

MESH = Mesh(["x", "y"], [2, 4])
MLP = autoshard_models.mlp(1024, 64, 64)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def shardings(module) -> dict[str, str]:
    return {i.name: i.sharding.to_text(False) for i in module.entry.instructions}


def test_the_annotated_module_compiles_and_reproduces_the_global_program(tmp_path, capsys):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP)
    out = tmp_path / "planned.hlo"
    code, stdout, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4", "-o",
                            str(out))
    assert code == 0 and stdout == ""
    assert "modelled step time" in err and "optimal" in err
    module = parse_module(out.read_text())
    assert module.attrs["mesh"].axis_sizes == (2, 4)
    assert all(i.sharding is not None for i in module.entry.instructions)
    # the plan runs on 8 partitions and matches the unpartitioned program run on one device
    spmd_partition_helpers.check_equivalent(out.read_text(), 8)


def test_output_is_deterministic_and_reparses_to_itself(tmp_path, capsys):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP)
    _, first, _ = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4")
    _, second, _ = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4")
    assert first == second
    assert parse_module(first).difference(parse_module(first)) is None


def test_user_shardings_of_parameters_and_result_are_pins_and_others_are_dropped():
    pinned = "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    text = MLP.replace("w1 = f32[64,64] parameter(1)",
                       f"w1 = f32[64,64] parameter(1), sharding={pinned}")
    text = text.replace("a = f32[1024,64] maximum(hb, zeros)",
                        "a = f32[1024,64] maximum(hb, zeros), sharding={replicated}")
    text = text.replace("ROOT y = f32[1024,64] dot(a, w2), lhs_contracting_dims={1}, "
                        "rhs_contracting_dims={0}",
                        "ROOT y = f32[1024,64] dot(a, w2), lhs_contracting_dims={1}, "
                        "rhs_contracting_dims={0}, sharding={replicated}")
    module = parse_module(text)
    result = autoshard(module, MESH)
    chosen = shardings(module)
    assert chosen["w1"] == pinned and chosen["y"] == "{replicated}"
    assert read_record(module.entry.instructions[1]) is None          # pinned: no record
    # the intermediate annotation was not a pin: data parallelism shards `a` along the batch
    assert chosen["a"] != "{replicated}"
    kept = parse_module(text)
    autoshard(kept, MESH, keep_annotations=True)
    assert shardings(kept)["a"] == "{replicated}"
    assert result.solution.status == "optimal"


def test_a_memory_limit_the_unsharded_program_exceeds_is_met():
    text = autoshard_models.mlp(256, 256, 256)
    unsharded = autoshard(parse_module(text), Mesh(["x"], [1]))      # one device: no choice
    unlimited = autoshard(parse_module(text), MESH)
    limit = unlimited.peak_bytes // 2
    assert unsharded.peak_bytes > limit
    module = parse_module(text)
    result = autoshard(module, MESH, memory_per_device=limit)
    assert result.fits and result.peak_bytes <= limit
    assert result.seconds > unlimited.seconds          # memory is bought with time
    # the weights are held in shards: their bytes per device come from the written shardings
    held = {i.name: i.sharding.shard_shape(i.shape).byte_size for i in module.entry.instructions}
    assert held["w1"] + held["w2"] < 2 * 256 * 256 * 4 // 2
    spmd_partition_helpers.check_equivalent(api.to_text(module), 8, rtol=1e-4, atol=1e-4)


#: a reduction over a dim split unevenly (1001 over 8): the partitioner masks the padding of
#: the last shard before reducing, buffers the memory rows do not model
UNEVEN_REDUCE = """HloModule uneven
""" + reducer("add") + """
ENTRY main {
  x = f32[64,1001] parameter(0), sharding={devices=[1,8]<=[8]}
  e = f32[64,1001] exponential(x)
  zero = f32[] constant(0)
  ROOT r = f32[64] reduce(e, zero), dimensions={1}, to_apply=add
}
"""


def partitioned_peak(text: str, tmp_path, capsys) -> int:
    """Peak bytes per device of the compiled plan, as `gspmdc cost --json` reports it."""
    path = tmp_path / "plan.hlo"
    path.write_text(text)
    code, out, _ = run(capsys, "cost", str(path), "-n", "8", "--json")
    assert code == 0
    return max(json.loads(out)["peak_memory_bytes_per_device"])


def test_the_memory_limit_is_checked_by_gspmdc_cost_where_padding_matters(tmp_path, capsys):
    mesh = Mesh(["x"], [8])
    free = parse_module(UNEVEN_REDUCE)
    unlimited = autoshard(free, mesh)
    modelled = unlimited.peak_bytes                 # no limit: the memory rows' figure
    # the plan the rows alone would accept needs far more once padding is masked
    assert partitioned_peak(api.to_text(free), tmp_path, capsys) > 2 * modelled
    limit = 3 * modelled // 2
    module = parse_module(UNEVEN_REDUCE)
    result = autoshard(module, mesh, memory_per_device=limit)
    assert result.fits and result.peak_bytes <= limit
    assert partitioned_peak(api.to_text(module), tmp_path, capsys) == result.peak_bytes
    assert shardings(module)["e"] != shardings(free)["e"]      # another plan: x resharded
    spmd_partition_helpers.check_equivalent(api.to_text(module), 8, rtol=1e-5, atol=1e-5)
    # a limit the rows accept (above the modelled peak) but no partitioned plan meets
    source = tmp_path / "uneven.hlo"
    source.write_text(UNEVEN_REDUCE)
    code, stdout, err = run(capsys, "autoshard", str(source), "--mesh", "x=8",
                            "--memory-per-device", str(modelled + modelled // 5))
    assert code == 2 and stdout == ""
    assert "no plan fits" in err and "by `gspmdc cost`" in err


def test_a_limit_nothing_meets_is_exit_2_and_writes_nothing(tmp_path, capsys):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP)
    out = tmp_path / "planned.hlo"
    code, stdout, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4",
                            "--memory-per-device", "1KiB", "-o", str(out))
    assert code == 2 and stdout == "" and not out.exists()
    assert "no plan fits 1024 bytes per device" in err


def test_the_solver_time_limit_falls_back_with_a_message(tmp_path, capsys):
    source = tmp_path / "mlp.hlo"
    source.write_text(autoshard_models.mlp(256, 256, 256))
    code, stdout, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4",
                            "--time-limit", "1e-9")
    assert code == 0
    assert "time limit of 1e-09 s" in err
    module = parse_module(stdout)
    assert all(i.sharding is not None for i in module.entry.instructions)


def test_identical_layers_share_choices_and_the_plan_is_the_unrestricted_optimum():
    """A stack of identical layers is solved as one layer's choices; on this stack the
    restriction loses nothing: the unrestricted integer program finds the same step time."""
    from gspmdc.passes.autoshard.costs import DEFAULT_MACHINE, CostModel
    from gspmdc.passes.autoshard.graph import build_graph
    from gspmdc.passes.autoshard.problem import build_problem
    from gspmdc.passes.autoshard.solve import solve
    from gspmdc.passes.autoshard.strategies import StrategyTable
    module = parse_module(autoshard_models.stack(16, 64, 512))
    costs = CostModel(DEFAULT_MACHINE, 8, module.computations)
    graph = build_graph(module, StrategyTable(MESH, costs, module.computations), {}, None)
    tied, free = build_problem(graph, costs), build_problem(graph, costs, tie=False)
    assert tied.num_choices <= free.num_choices - 16     # 9 dots and 11 weights in 2 choices
    inner = {tied.choice_of[graph.refs[(module.entry.name, f"h{i}")][0].node]
             for i in range(5, 11)}
    assert len(inner) == 1                  # the inner layers' dots are one choice
    best_tied, best_free = solve(tied, [], 60), solve(free, [], 60)
    assert best_tied.status == best_free.status == "optimal"
    assert best_tied.seconds == pytest.approx(best_free.seconds, rel=1e-9)


def test_a_reshard_by_an_exchange_of_pieces_is_priced_at_the_bytes_its_program_sends():
    """f32[16,8,8,1], dim 2 in 2 tiles held twice, to [2,2] tiles of dims 0 and 1 on devices
    3,0,1,2: every device lacks one dim-2 half of its new [8,4,8,1] tile (f32[8,4,4,1],
    512 B), one piece each by an exchange. The cost model plans the dims that the device
    count divides as the device count, where that piece is f32[2,2,2,1] (32 B); priced at the
    array's own dims, the reshard costs what the partitioned program sends."""
    from gspmdc.ir.shapes import ArrayShape
    from gspmdc.passes.autoshard.costs import DEFAULT_MACHINE, CostModel
    from gspmdc.passes.spmd.traffic import sent_per_device
    source = "{devices=[1,1,2,1,2]<=[4] last_tile_dim_replicate}"
    target = "{devices=[2,2,1,1]3,0,1,2}"
    costs = CostModel(DEFAULT_MACHINE, 4, {})
    _, sent = costs.reshard(ArrayShape("f32", (16, 8, 8, 1)), parse_sharding(source),
                            parse_sharding(target))
    text = ("HloModule m, num_partitions=4\n\nENTRY e {\n"
            f"  p = f32[16,8,8,1] parameter(0), sharding={source}\n"
            f"  ROOT c = f32[16,8,8,1] copy(p), sharding={target}\n}}\n")
    spmd = spmd_partition_helpers.check_equivalent(text, 4)
    assert sent_per_device(spmd, 4).tolist() == [512] * 4
    assert sent == 512


def test_the_machine_option_takes_gspmdc_costs_presets_and_files(tmp_path, capsys):
    from gspmdc.passes.analysis.machine import PRESETS
    source = tmp_path / "mlp.hlo"
    source.write_text(autoshard_models.mlp(256, 256, 256))
    times = {}
    for machine in ("tpu-v3", "h100-ib"):
        code, _, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4",
                           "--machine", machine)
        assert code == 0
        times[machine] = float(err.split("modelled step time ")[1].split()[0])
    assert times["h100-ib"] != times["tpu-v3"]
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(PRESETS["h100-ib"].to_json()))
    code, _, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4",
                       "--machine", str(path))
    assert code == 0 and float(err.split("modelled step time ")[1].split()[0]) == \
        times["h100-ib"]
    code, _, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4",
                       "--machine", "tpu-v9")
    assert code == 2 and "unknown machine 'tpu-v9'" in err


def test_explain_gives_the_rejected_shardings_and_their_costs(tmp_path, capsys):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP)
    out = tmp_path / "planned.hlo"
    assert run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4", "-o", str(out))[0] == 0
    code, text, _ = run(capsys, "explain", str(out), "h")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("h  {devices=[8,1]<=[8]}  ← chosen by autoshard")
    rejected = [line for line in lines if line.startswith("    {")]
    assert rejected and all(" +" in line for line in rejected)       # each one costs more
    assert any(line.startswith("    {replicated}") for line in rejected)
    assert lines[-1].startswith("  plan: mesh {x=2, y=4}: modelled step time")


def test_explain_alternatives_are_the_objective_change_of_a_real_alternative_plan():
    """An alternative's delta is the modelled time of the plan with that one choice changed."""
    module = parse_module(MLP)
    result = autoshard(module, MESH)
    h = next(i for i in module.entry.instructions if i.name == "h")
    record = read_record(h)
    replicated = next(a for a in record.alternatives if a.sharding == "{replicated}")
    pinned = parse_module(MLP.replace(
        "h = f32[1024,64] dot(x, w1)", "h = f32[1024,64] dot(x, w1), sharding={replicated}"))
    forced = autoshard(pinned, MESH, keep_annotations=True)
    # the best plan with h replicated is at most the single-choice change autoshard recorded
    assert forced.seconds <= result.seconds + replicated.delta * (1 + 1e-3)
    assert forced.seconds > result.seconds


@pytest.mark.parametrize("header, argv, message", [
    ("", [], "autoshard needs a device mesh: give --mesh"),
    (", mesh={x=8}", ["--mesh", "x=2,y=4"],
     "--mesh {x=2, y=4} differs from the module's mesh {x=8}"),
])
def test_a_missing_or_contradicting_mesh_is_exit_2(tmp_path, capsys, header, argv, message):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP.replace("HloModule mlp", f"HloModule mlp{header}"))
    code, out, err = run(capsys, "autoshard", str(source), *argv)
    assert code == 2 and out == "" and message in err


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "x=2,x=4"], "x"),
    (["--mesh", "x=two"], "size must be a positive integer"),
    (["--mesh", "x=8", "--memory-per-device", "lots"], "lots"),
])
def test_bad_options_are_refused_by_the_argument_parser(tmp_path, capsys, argv, message):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP)
    with pytest.raises(SystemExit) as e:
        main(["autoshard", str(source), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_pin_that_does_not_fit_the_mesh_is_exit_2(tmp_path, capsys):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP.replace("w1 = f32[64,64] parameter(1)",
                                  "w1 = f32[64,64] parameter(1), sharding={devices=[16,1]<=[16]}"))
    code, _, err = run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4")
    assert code == 2 and "w1: its sharding does not fit the mesh {x=2, y=4}" in err


def test_reshards_are_written_once_per_value_and_sharding_and_explained(tmp_path, capsys):
    """A replicated output pinned on a data-parallel MLP: the plan reshards, and writes each
    reshard as a Sharding custom-call between the value and the users that need it."""
    text = MLP.replace("ROOT y = f32[1024,64] dot(a, w2), lhs_contracting_dims={1}, "
                       "rhs_contracting_dims={0}",
                       "ROOT y = f32[1024,64] dot(a, w2), lhs_contracting_dims={1}, "
                       "rhs_contracting_dims={0}, sharding={replicated}")
    text = text.replace("x = f32[1024,64] parameter(0)",
                        "x = f32[1024,64] parameter(0), sharding={devices=[1,8]<=[8]}")
    source = tmp_path / "mlp.hlo"
    source.write_text(text)
    out = tmp_path / "planned.hlo"
    assert run(capsys, "autoshard", str(source), "--mesh", "x=2,y=4", "-o", str(out))[0] == 0
    module = parse_module(out.read_text())
    placed = [i for i in module.entry.instructions if i.name.endswith(".reshard")]
    assert placed
    seen = set()
    for copy in placed:
        operand = copy.operands[0]
        assert copy.opcode == "custom-call" and copy.sharding != operand.sharding
        key = (operand.name, copy.sharding)
        assert key not in seen                           # once per value and sharding
        seen.add(key)
        users = [i.name for i in module.entry.instructions if copy in i.operands]
        assert users
        code, lines, _ = run(capsys, "explain", str(out), copy.name)
        assert code == 0 and "a reshard autoshard placed" in lines
        assert all(u in lines for u in users)
    spmd_partition_helpers.check_equivalent(out.read_text(), 8, rtol=1e-4, atol=1e-4)
