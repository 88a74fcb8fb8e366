"""The partitioner's pipeline as a user sees it: dumps after every pass (re-parseable; up to
halo-exchange they are global programs that still evaluate to the reference), the SPMD module's
header and signature, `gspmdc compile`, `--time-passes`, the metadata every collective carries
and `explain_collective`."""
from __future__ import annotations

import re

import numpy as np
import pytest

from gspmdc import api
from gspmdc.cli import main
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd import explain_collective
from gspmdc.passes.spmd.cleanup import Cleanup
from gspmdc.passes.spmd.lower_spmd import LowerSpmd

from spmd_partition_helpers import COLLECTIVES, assert_close, inputs_for, reference, run_global
from hlo_text import reducer

MLP = """HloModule mlp

""" + reducer("add") + """
ENTRY main {
  x = f32[10,16]{1,0} parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  w1 = f32[16,32]{1,0} parameter(1), sharding={devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}
  h = f32[10,32] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[2,2]<=[4]}
  zero = f32[] constant(0)
  zeros = f32[10,32] broadcast(zero), dimensions={}
  relu = f32[10,32] maximum(h, zeros)
  w2 = f32[32,16]{1,0} parameter(2), sharding={devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}
  o = f32[10,16] dot(relu, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  s = f32[10] reduce(o, zero), dimensions={1}, to_apply=add
  ROOT t = (f32[10,16], f32[10]) tuple(o, s),
    sharding={{devices=[2,1,2]<=[4] last_tile_dim_replicate}, {replicated}}
}
"""

PASSES = ["inline-calls", "propagate", "insert-reshards", "pad-uneven", "halo-exchange",
          "lower-spmd", "cleanup"]


def test_dumps_after_every_pass_reparse_and_global_ones_evaluate_to_the_reference(tmp_path):
    compile_spmd(api.parse(MLP), 4, dump_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["000.input.hlo"] + [f"{i:03d}.{p}.hlo" for i, p in enumerate(PASSES, 1)]
    inputs = inputs_for(MLP)
    want = reference(MLP, inputs)
    for name in names:
        module = api.load(tmp_path / name)            # parses and verifies
        if "lower-spmd" in name or "cleanup" in name:
            assert module.num_partitions == 4
            continue
        assert_close(api.evaluate(module, inputs), want, rtol=1e-5, atol=1e-5)


def test_lower_spmd_needs_nothing_but_the_halo_exchange_dump(tmp_path):
    """The global IR carries every decision: lowering a re-parsed dump gives a correct program."""
    compile_spmd(api.parse(MLP), 4, dump_dir=tmp_path)
    module = api.load(tmp_path / "005.halo-exchange.hlo")
    spmd = run_pipeline(PassContext(4), module, [LowerSpmd(), Cleanup()])
    spmd = api.parse(api.to_text(spmd))
    inputs = inputs_for(MLP)
    assert_close(run_global(spmd, inputs, 4), reference(MLP, inputs), rtol=1e-5, atol=1e-5)


def test_insert_reshards_dump_shows_where_communication_happens(tmp_path):
    compile_spmd(api.parse(MLP), 4, dump_dir=tmp_path)
    text = (tmp_path / "003.insert-reshards.hlo").read_text()
    # the second dot leaves partial sums; one reshard node combines them for the tuple
    assert re.search(r"%o = f32\[10,16\]\S* dot\(.*sharding=\{devices=\[2,1,2\]<=\[4\] "
                     r"last_tile_dims=\{unreduced\}\}", text)
    assert re.search(r'%o\.reshard = f32\[10,16\] custom-call\(%o\), custom_call_target='
                     r'"Sharding", sharding=\{devices=\[2,1,2\]<=\[4\] last_tile_dim_replicate\}, '
                     r'metadata=\{op_type="reshard" op_name="o" spmd_value="o" spmd_role="result"',
                     text)
    masks = (tmp_path / "004.pad-uneven.hlo").read_text()
    assert "pad-mask" not in text and "pad-mask" not in masks   # 10 rows split 2 ways: even


def test_spmd_module_header_and_signature():
    spmd = compile_spmd(api.parse(MLP), 4)
    text = api.to_text(spmd)
    header = text.splitlines()[0]
    assert "num_partitions=4" in header
    assert "spmd_global_signature={(f32[10,16], f32[16,32], f32[32,16])->(f32[10,16], " \
           "f32[10])}" in header
    params = spmd.entry.parameters
    assert [str(p.shape) for p in params] == ["f32[5,16]{1,0}", "f32[16,16]{1,0}",
                                             "f32[16,16]{1,0}"]
    assert params[0].sharding.to_text() == "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    assert spmd.entry.root.sharding.to_text() == \
        "{{devices=[2,1,2]<=[4] last_tile_dim_replicate}, {replicated}}"


def test_every_collective_says_why():
    spmd = compile_spmd(api.parse(MLP), 4)
    found = [i for i in spmd.entry.instructions if i.opcode in COLLECTIVES]
    assert found
    for inst in found:
        metadata = inst.attr("metadata")
        assert metadata.get("op_type") == "reshard"
        for key in ("op_name", "spmd_value", "spmd_role", "spmd_from", "spmd_to",
                    "spmd_reason", "spmd_step"):
            assert metadata.get(key), (inst.name, key)
        assert inst.sharding is None


def test_explain_names_the_conflict_and_the_annotations_behind_it():
    spmd = api.parse(api.to_text(compile_spmd(api.parse(MLP), 4)))
    (reduce,) = [i for i in spmd.entry.instructions if i.opcode == "all-reduce" and
                 i.attr("metadata").get("spmd_value") == "o"]
    lines = explain_collective(spmd, reduce.name)
    assert lines[0].startswith(f"{reduce.name} = f32[5,16] all-reduce: 2 groups of 2 devices, "
                               "sends 320 bytes per device")
    assert lines[1].startswith("why: ")
    assert "partial results" in lines[1]
    assert lines[2] == "  the local o is {devices=[2,1,2]<=[4] last_tile_dims={unreduced}}; o must " \
                       "be {devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    text = "\n".join(lines)
    assert "w2's sharding comes from" in text and "user annotation" in text


def test_explain_a_halo_exchange_permute():
    """Collectives the op rules emit (here a reduce-window's halo) explain themselves too."""
    text = """HloModule m, num_partitions=4
""" + reducer("add") + """
ENTRY e {
  x = f32[16] parameter(0), sharding={devices=[4]<=[4]}
  z = f32[] constant(0)
  ROOT w = f32[16] reduce-window(x, z), window={size=3 pad=1_1}, to_apply=add,
    sharding={devices=[4]<=[4]}
}
"""
    spmd = api.parse(api.to_text(compile_spmd(api.parse(text), 4)))
    permutes = [i for i in spmd.entry.instructions if i.opcode == "collective-permute"]
    assert permutes
    for permute in permutes:
        lines = explain_collective(spmd, permute.name)
        assert lines[1].startswith("why: ") and "neighbours" in lines[1]
        assert lines[2] == "  part of the halo-exchange of w"
        assert "not created by the partitioner" not in "\n".join(lines)


def test_time_passes_prints_every_pass(capsys):
    compile_spmd(api.parse(MLP), 4, time_passes=True)
    err = capsys.readouterr().err
    for name in PASSES:
        assert re.search(rf"^{re.escape(name)}\s+\d+\.\d+ ms$", err, re.MULTILINE), name


def test_compile_command_writes_a_runnable_spmd_module(tmp_path):
    source = tmp_path / "mlp.hlo"
    source.write_text(MLP)
    out = tmp_path / "out.hlo"
    assert main(["compile", str(source), "-n", "4", "-o", str(out),
                 "--dump-dir", str(tmp_path / "dumps")]) == 0
    spmd = api.load(out)
    assert spmd.num_partitions == 4
    assert len(list((tmp_path / "dumps").iterdir())) == len(PASSES) + 1
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **{f"arg{i}": a for i, a in enumerate(inputs_for(MLP))})
    assert main(["run", str(source), "-n", "4", "--backend", "local", "--inputs", str(inputs),
                 "--check", "-q", "--garbage-padding"]) == 0


def test_compile_command_rejects_bad_input_cleanly(tmp_path, capsys):
    source = tmp_path / "manual.hlo"
    source.write_text("HloModule m\n\nENTRY e {\n  x = f32[4] parameter(0), sharding={manual}\n"
                      "  ROOT n = f32[4] negate(x), sharding={replicated}\n}\n")
    out = tmp_path / "out.hlo"
    assert main(["compile", str(source), "-n", "2", "-o", str(out)]) == 2
    assert "manual" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit) as e:             # an argparse error
        main(["compile", str(source), "-n", "0"])
    assert e.value.code == 2


@pytest.mark.parametrize("mesh", [(2, 4), (64, 64)])
def test_compile_output_does_not_grow_with_the_device_count(mesh):
    """The same program on 8 and on 4096 devices: replica groups in iota form, no per-device
    text beyond the partition tables."""
    a, b = mesh
    n = a * b
    text = f"""HloModule m
ENTRY e {{
  x = f32[{4 * a},64] parameter(0), sharding={{devices=[{a},1,{b}]<=[{n}] last_tile_dim_replicate}}
  w = f32[64,{8 * b}] parameter(1), sharding={{devices=[1,{b},{a}]<=[{a},{b}]T(1,0) last_tile_dim_replicate}}
  ROOT h = f32[{4 * a},{8 * b}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}},
    sharding={{devices=[{a},1,{b}]<=[{n}] last_tile_dim_replicate}}
}}"""
    spmd = compile_spmd(api.parse(text), n)
    (gather,) = [i for i in spmd.entry.instructions if i.opcode == "all-gather"]
    printed = api.to_text(spmd)
    assert re.search(r"replica_groups=\[\d+,\d+\]<=\[", printed)
    assert len(printed) < 4000
    assert gather.shape.dims == (4, 8 * b)
