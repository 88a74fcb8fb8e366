"""`gspmdc opt`: textual pipelines run any pass alone or in any valid order; the stage
precondition of each pass gives a clear error (exit 2); options parse and print back."""
from __future__ import annotations

import pytest

from gspmdc import api
from gspmdc.cli import main
from gspmdc.ir.stage import Stage, module_stage
from gspmdc.passes.pass_manager import PipelineError
from gspmdc.passes.pass_table import PASSES, format_pipeline, parse_pipeline
from gspmdc.passes.pipeline import compile_spmd

from spmd_partition_helpers import assert_close, inputs_for, reference, run_global
from hlo_text import reducer

PROGRAM = """HloModule m

""" + reducer("add") + """
ENTRY e {
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  w = f32[6,8] parameter(1), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  d = f32[10,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  z = f32[] constant(0)
  ROOT s = f32[8] reduce(d, z), dimensions={0}, to_apply=add
}
"""

FULL = "inline-calls,propagate,insert-reshards,pad-uneven,halo-exchange,lower-spmd,cleanup"


def opt(tmp_path, text: str, pipeline: str, *extra: str) -> int:
    source = tmp_path / "in.hlo"
    source.write_text(text)
    return main(["opt", str(source), "-p", pipeline, "-o", str(tmp_path / "out.hlo"), *extra])


def test_the_full_pipeline_equals_compile(tmp_path):
    assert opt(tmp_path, PROGRAM, FULL, "-n", "4", "--verify-each") == 0
    got = api.load(tmp_path / "out.hlo")
    assert got.difference(compile_spmd(api.parse(PROGRAM), 4)) is None


def test_a_pipeline_in_pieces_equals_one_pipeline(tmp_path):
    """Each piece starts from the previous piece's output file: the stage travels in the text."""
    text = PROGRAM
    for piece in ("propagate", "inline-calls,insert-reshards", "pad-uneven",
                  "halo-exchange,lower-spmd", "cleanup"):
        assert opt(tmp_path, text, piece, "-n", "4") == 0, piece
        text = (tmp_path / "out.hlo").read_text()
    spmd = api.parse(text)
    assert module_stage(spmd) is Stage.PARTITIONED
    inputs = inputs_for(PROGRAM)
    assert_close(run_global(spmd, inputs, 4), reference(PROGRAM, inputs))


@pytest.mark.parametrize("name", list(PASSES))
def test_every_pass_runs_alone_on_a_module_at_a_stage_it_accepts(tmp_path, name):
    module = api.parse(PROGRAM)
    stage = min(PASSES[name].accepts, key=list(Stage).index)
    if stage is not Stage.GLOBAL:   # bring the module there with the partitioner's own passes
        before = {Stage.RESHARDED: "insert-reshards", Stage.PADDED: "insert-reshards,pad-uneven",
                  Stage.HALO_PLANNED: "insert-reshards,pad-uneven,halo-exchange"}[stage]
        assert opt(tmp_path, PROGRAM, before, "-n", "4") == 0
        module = api.load(tmp_path / "out.hlo")
    assert module_stage(module) is stage
    assert opt(tmp_path, api.to_text(module), name, "-n", "4", "--verify-each") == 0
    after = api.load(tmp_path / "out.hlo")
    produced = PASSES[name].produces
    assert module_stage(after) is (produced or stage)
    if produced is not Stage.PARTITIONED:          # a global program still computes the same
        inputs = inputs_for(PROGRAM)
        assert_close(api.evaluate(after, inputs), reference(PROGRAM, inputs))


@pytest.mark.parametrize("pipeline, message", [
    ("lower-spmd", "lower-spmd needs a module after halo-exchange; this module is at stage "
                   "global (a global program)"),
    ("insert-reshards,halo-exchange", "halo-exchange needs a module after pad-uneven; this "
                                      "module is at stage resharded (after insert-reshards)"),
    ("insert-reshards,propagate", "propagate needs a global program or a module after "
                                  "propagate; this module is at stage resharded"),
    ("propagate,nonsense", "unknown pass 'nonsense'; known passes: inline-calls, propagate"),
    ("pad-uneven{level=3}", "pass pad-uneven has no option 'level' (its options: none)"),
    ("windowed-einsum{threshold=big}", "option threshold takes an integer, got 'big'"),
    ("propagate{is_spmd=maybe}", "option is_spmd takes true or false, got 'maybe'"),
    ("propagate,", "ends with a comma"),
    ("", "the pipeline is empty"),
])
def test_bad_pipelines_are_exit_2_with_a_clear_message(tmp_path, capsys, pipeline, message):
    assert opt(tmp_path, PROGRAM, pipeline, "-n", "4") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.hlo").exists()


def test_a_module_made_for_other_partitions_is_refused(tmp_path, capsys):
    assert opt(tmp_path, PROGRAM, "insert-reshards", "-n", "4") == 0
    resharded = (tmp_path / "out.hlo").read_text()
    assert opt(tmp_path, resharded, "pad-uneven", "-n", "8") == 2
    assert "declares num_partitions=4, but the pipeline runs for 8" in capsys.readouterr().err
    assert opt(tmp_path, resharded, "pad-uneven") == 0       # -n from the module


def test_options_parse_and_print_back():
    passes = parse_pipeline("propagate{propagate_to_output=[true,false] record_origins=false},"
                            " insert-reshards , windowed-einsum{threshold=4096}")
    assert [p.name for p in passes] == ["propagate", "insert-reshards", "windowed-einsum"]
    assert passes[0].propagate_to_output == (True, False) and not passes[0].record_origins
    assert passes[2].threshold == 4096
    assert format_pipeline(passes) == ("propagate{propagate_to_output=[true,false],"
                                       "record_origins=false},insert-reshards,"
                                       "windowed-einsum{threshold=4096}")
    assert parse_pipeline(format_pipeline(passes)) == passes
    with pytest.raises(PipelineError, match="takes one value"):
        parse_pipeline("windowed-einsum{threshold=[1,2]}")


def test_list(capsys):
    assert main(["opt", "--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == \
        list(PASSES)
