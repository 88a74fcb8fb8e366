"""The module's stage: recorded in the header by the passes (and accepted by XLA's parser),
inferred for modules that record none (JAX's global programs, shard_map programs among them,
and XLA's partitioned ones), and what `run` does with each: a shard_map program runs from global
inputs and `--check` works on it, against JAX's own outputs too."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.cli import main
from gspmdc.errors import GspmdcError
from gspmdc.ir.parser import parse_module
from gspmdc.ir.printer import print_module
from gspmdc.ir.stage import STAGE_KEY, Stage, inferred_stage, module_stage, set_stage
from gspmdc.passes.pipeline import compile_spmd

from hlo_text import reducer

HERE = Path(__file__).resolve().parent
SHARD_MAP = HERE / "data" / "shard_map"
JAX_PROGRAMS = HERE.parents[1] / "shared" / "jax-programs"
MPIEXEC = Path(sys.executable).with_name("mpiexec")

GLOBAL = """HloModule m
ENTRY e {
  p = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT n = f32[8,4] negate(p)
}
"""


def test_the_stage_prints_in_the_header_and_reparses():
    module = parse_module(GLOBAL)
    set_stage(module, Stage.RESHARDED)
    text = print_module(module)
    assert text.splitlines()[0] == \
        'HloModule m, frontend_attributes={gspmdc.stage="resharded"}'
    again = parse_module(text)
    assert module_stage(again) is Stage.RESHARDED
    assert again.difference(module) is None


def test_other_header_frontend_attributes_are_kept():
    module = parse_module(GLOBAL.replace("HloModule m", 'HloModule m, frontend_attributes='
                                                       '{xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}'))
    set_stage(module, Stage.PROPAGATED)
    text = print_module(module)
    assert 'frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}, ' \
           'gspmdc.stage="propagated"}' in text
    assert module_stage(parse_module(text)) is Stage.PROPAGATED


def test_an_unknown_stage_is_a_clear_error():
    module = parse_module(GLOBAL.replace("HloModule m", 'HloModule m, frontend_attributes='
                                                       '{gspmdc.stage="half-done"}'))
    with pytest.raises(GspmdcError, match="unknown gspmdc.stage='half-done'"):
        module_stage(module)


def test_compile_records_every_stage_in_its_dumps(tmp_path):
    compile_spmd(parse_module(GLOBAL), 2, dump_dir=tmp_path)
    stages = {path.name: module_stage(api.load(path)) for path in tmp_path.iterdir()}
    assert stages == {
        "000.input.hlo": Stage.GLOBAL, "001.inline-calls.hlo": Stage.GLOBAL,
        "002.propagate.hlo": Stage.PROPAGATED, "003.insert-reshards.hlo": Stage.RESHARDED,
        "004.pad-uneven.hlo": Stage.PADDED, "005.halo-exchange.hlo": Stage.HALO_PLANNED,
        "006.lower-spmd.hlo": Stage.PARTITIONED, "007.cleanup.hlo": Stage.PARTITIONED}


def test_compile_refuses_a_partitioned_module_and_continues_a_dump(tmp_path):
    spmd = compile_spmd(parse_module(GLOBAL), 2, dump_dir=tmp_path)
    with pytest.raises(GspmdcError, match="already partitioned"):
        compile_spmd(parse_module(print_module(spmd)), 2)
    resumed = compile_spmd(api.load(tmp_path / "003.insert-reshards.hlo"), 2)
    assert resumed.difference(spmd) is None


@pytest.mark.parametrize("opcode_line, stage", [
    ("  ROOT n = f32[8,4] negate(p)", Stage.GLOBAL),
    ("  ROOT n = u32[] partition-id()", Stage.PARTITIONED),
    ("  ROOT n = f32[8,4] all-reduce(p), channel_id=1, replica_groups={{0,1}}, "
     "use_global_device_ids=true, to_apply=add", Stage.PARTITIONED),
    # no channel_id: it combines replicas, not partitions
    ("  ROOT n = f32[8,4] all-reduce(p), replica_groups={}, to_apply=add", Stage.GLOBAL),
    # a collective inside a manual region belongs to a global program
    ("  ROOT n = f32[8,4] all-reduce(p), channel_id=1, replica_groups={{0,1}}, "
     "use_global_device_ids=true, to_apply=add, sharding={manual}", Stage.GLOBAL),
])
def test_the_inference_rule(opcode_line, stage):
    text = f"""HloModule m
{reducer('add')}
ENTRY e {{
  p = f32[8,4] parameter(0)
{opcode_line}
}}
"""
    assert inferred_stage(parse_module(text)) is stage


def test_the_recorded_stage_wins_over_the_contents():
    text = print_module(compile_spmd(parse_module(GLOBAL), 2)).replace(
        'gspmdc.stage="partitioned"', 'gspmdc.stage="global"')
    assert inferred_stage(parse_module(text.replace(STAGE_KEY, "other"))) is Stage.PARTITIONED
    assert module_stage(parse_module(text)) is Stage.GLOBAL


def test_the_shard_map_program_is_global_and_xlas_partitioned_one_is_not():
    assert module_stage(api.load(SHARD_MAP / "program.hlo")) is Stage.GLOBAL
    assert module_stage(api.load(SHARD_MAP / "xla_spmd.hlo")) is Stage.PARTITIONED


@pytest.mark.skipif(not JAX_PROGRAMS.is_dir(), reason="../shared/jax-programs is absent")
def test_the_stage_of_every_jax_program_and_of_xlas_partitioning_of_it():
    programs = sorted(p for p in JAX_PROGRAMS.iterdir() if (p / "program.hlo").exists())
    assert programs
    for folder in programs:
        assert module_stage(api.load(folder / "program.hlo")) is Stage.GLOBAL, folder.name
        assert module_stage(api.load(folder / "xla_spmd.hlo")) is Stage.PARTITIONED, folder.name


def test_a_shard_map_program_partitions_to_jaxs_outputs():
    """psum, ppermute, all_to_all and axis_index inside a shard_map, global code around it."""
    from spmd_partition_helpers import assert_close, run_global
    spmd = compile_spmd(api.load(SHARD_MAP / "program.hlo"), 8)
    with np.load(SHARD_MAP / "inputs.npz") as data:
        inputs = [np.array(data[f"arg{i}"]) for i in range(3)]
    with np.load(SHARD_MAP / "outputs.npz") as data:
        want = (np.array(data["out0"]), np.array(data["out1"]))
    assert_close(run_global(api.parse(api.to_text(spmd)), inputs, 8), want)


def test_run_check_of_a_shard_map_program(capsys):
    """--check compares with the program partitioned at its manual regions only."""
    code = main(["run", str(SHARD_MAP / "program.hlo"), "-n", "8", "--backend", "local",
                 "--check", "-q"])
    assert code == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count(" ok") == 2


@pytest.mark.parametrize("enter, leave", [
    ("SPMDFullToShardShape", "SPMDShardToFullShape"),
    ("xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape"),
])
def test_run_check_of_a_region_between_either_spelling_of_the_boundaries(tmp_path, capsys,
                                                                         enter, leave):
    # found by fuzzing: Shardy's boundary names were not region boundaries for the stage rule
    # and the --check reference, which then replicated the value entering the region (exit 2)
    program = tmp_path / "region.hlo"
    program.write_text(f"""HloModule region, num_partitions=2
ENTRY e {{
  x = f32[8] parameter(0)
  s = f32[8] custom-call(x), custom_call_target="Sharding", sharding={{devices=[2]<=[2]}}
  m = f32[4] custom-call(s), custom_call_target="{enter}", sharding={{manual}}
  y = f32[4] sine(m), sharding={{manual}}
  ROOT f = f32[8] custom-call(y), custom_call_target="{leave}", sharding={{devices=[2]<=[2]}}
}}
""")
    code = main(["run", str(program), "--backend", "local", "--check", "-q"])
    assert code == 0, capsys.readouterr().err
    assert module_stage(api.load(program)) == Stage.GLOBAL


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
def test_run_a_shard_map_program_on_mpi_from_jaxs_inputs(tmp_path):
    out = tmp_path / "out.npz"
    proc = subprocess.run([str(MPIEXEC.with_name("gspmdc")), "run", str(SHARD_MAP / "program.hlo"),
                           "--inputs", str(SHARD_MAP / "inputs.npz"), "--outputs", str(out),
                           "--check", "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(" ok") == 2
    with np.load(out) as got, np.load(SHARD_MAP / "outputs.npz") as want:
        for name in want.files:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_check_of_a_shard_map_program_can_fail(tmp_path, capsys, monkeypatch):
    """A partitioner bug outside the manual region (the sine dropped) is caught."""
    from gspmdc import prepare
    real = prepare._partition

    def sine_dropped(module, n, threshold):
        if module.entry.parameters[0].sharding is not None:    # not the reference
            for inst in module.entry.instructions:
                if inst.opcode == "sine":
                    inst.opcode = "copy"
        return real(module, n, threshold)
    monkeypatch.setattr(prepare, "_partition", sine_dropped)
    code = main(["run", str(SHARD_MAP / "program.hlo"), "-n", "8", "--backend", "local",
                 "--check", "-q"])
    assert code == 1
    captured = capsys.readouterr()
    assert "check out0" in captured.out and "MISMATCH" in captured.out


def test_global_and_partitioned_flags(tmp_path, capsys):
    spmd = tmp_path / "spmd.hlo"
    spmd.write_text(print_module(compile_spmd(parse_module(GLOBAL), 2)))
    assert main(["run", str(spmd), "--backend", "local", "--global", "-q"]) == 2
    assert "records stage partitioned, which is not --global" in capsys.readouterr().err
    # without a recorded stage, --global overrides the inference (partition-id: partitioned)
    program = tmp_path / "p.hlo"
    program.write_text("""HloModule m, num_partitions=2
ENTRY e {
  p = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT n = f32[8,4] negate(p), sharding={devices=[2,1]<=[2]}
}
""")
    assert main(["run", str(program), "--backend", "local", "--partitioned", "--check"]) == 2
    assert "already partitioned" in capsys.readouterr().err
    assert main(["run", str(program), "--backend", "local", "--global", "--check", "-q"]) == 0


#: a global program whose contents alone look partitioned: a cross-partition all-reduce outside
#: any manual region, no partition-only header (XLA's partitioner takes it as global)
ALL_REDUCE_OUTSIDE_MANUAL = f"""HloModule m, num_partitions=4
{reducer('add')}
ENTRY e {{
  p = f32[4,6] parameter(0), sharding={{devices=[2,2]<=[4]}}
  ROOT r = f32[4,6] all-reduce(p), channel_id=1, replica_groups={{{{0,1,2,3}}}},
    use_global_device_ids=true, to_apply=add
}}
"""


def test_compile_global_partitions_what_looks_partitioned(tmp_path, capsys):
    """--global: each partition all-reduces its replicated copy of the operand (gathered first),
    so the result is 4 times the input on every partition."""
    from spmd_partition_helpers import assert_close, run_global
    program = tmp_path / "p.hlo"
    program.write_text(ALL_REDUCE_OUTSIDE_MANUAL)
    assert main(["compile", str(program), "-n", "4"]) == 2
    assert "already partitioned" in capsys.readouterr().err
    out = tmp_path / "spmd.hlo"
    assert main(["compile", str(program), "-n", "4", "--global", "-o", str(out)]) == 0
    spmd = api.load(out)
    assert module_stage(spmd) is Stage.PARTITIONED
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    assert_close(run_global(spmd, [x], 4), 4 * x)


def test_a_tiled_cross_partition_all_reduce_outside_manual_regions_is_refused(tmp_path, capsys):
    program = tmp_path / "p.hlo"
    program.write_text(ALL_REDUCE_OUTSIDE_MANUAL.replace(
        "to_apply=add\n", "to_apply=add, sharding={devices=[2,2]<=[4]}\n"))
    assert main(["compile", str(program), "-n", "4", "--global"]) == 2
    assert "outside a manual region must be replicated" in capsys.readouterr().err


def test_compile_global_refuses_a_module_recording_a_partitioned_stage(tmp_path, capsys):
    spmd = tmp_path / "spmd.hlo"
    spmd.write_text(print_module(compile_spmd(parse_module(GLOBAL), 2)))
    assert main(["compile", str(spmd), "-n", "2", "--global"]) == 2
    assert "records stage partitioned, which is not --global" in capsys.readouterr().err
