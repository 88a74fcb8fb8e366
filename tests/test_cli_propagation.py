"""`gspmdc propagate` and `gspmdc explain` from the command line."""
from __future__ import annotations

from pathlib import Path

from gspmdc.cli import main
from gspmdc.ir.parser import parse_file, parse_sharding

EXAMPLE = Path(__file__).resolve().parents[1] / "gspmdc" / "examples" / "mlp.hlo"


def test_propagate_writes_every_sharding_and_keeps_names(tmp_path, capsys):
    out = tmp_path / "p.hlo"
    assert main(["propagate", str(EXAMPLE), "-o", str(out)]) == 0
    before, after = parse_file(EXAMPLE), parse_file(out)
    assert [i.name for i in before.entry.instructions] == [i.name for i in after.entry.instructions]
    by_name = {i.name: i for i in after.entry.instructions}
    # the hidden activation follows the Sharding constraint ({devices=[2,4]<=[8]}): batch on x,
    # hidden on y; the first dot's output takes it from its operands' layouts
    assert by_name["h"].sharding == parse_sharding("{devices=[2,4]<=[8]}")
    assert by_name["hb"].sharding == parse_sharding("{devices=[2,4]<=[8]}")
    # user annotations are kept as written
    assert by_name["w1"].sharding == before.entry.instruction("w1").sharding
    assert all(i.sharding is not None for i in after.entry.instructions)


def test_propagate_flag_lists_are_checked(capsys):
    assert main(["propagate", str(EXAMPLE), "--propagate-to-output", "maybe"]) == 2
    assert "expected true/false" in capsys.readouterr().err


def test_explain_prints_the_chain_back_to_the_user_annotation(capsys):
    assert main(["explain", str(EXAMPLE), "hb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # hb takes the callee parameter's sharding: backward, a parameter of the called computation
    # takes its user's sharding at level 0 (only the user's level counts)
    assert lines[0].startswith("hb  {devices=[2,4]<=[8]}  ← control flow from relu:x")
    assert lines[-1] == "a_sharded  {devices=[2,4]<=[8]}  ← user annotation"
    assert main(["explain", str(EXAMPLE), "hb", "-n", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_explain_works_on_a_propagated_file(tmp_path, capsys):
    out = tmp_path / "p.hlo"
    assert main(["propagate", str(EXAMPLE), "-o", str(out)]) == 0
    assert main(["explain", str(out), "hb"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("← user annotation")


def test_explain_unknown_instruction_is_exit_2(capsys):
    assert main(["explain", str(EXAMPLE), "nosuch"]) == 2
    assert "no instruction named 'nosuch'" in capsys.readouterr().err


def test_explain_a_collective_of_a_compiled_module(tmp_path, capsys):
    out = tmp_path / "spmd.hlo"
    assert main(["compile", str(EXAMPLE), "-n", "8", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out), "all-reduce"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # the second dot contracts the hidden dim, split 4 ways on y: partial sums over groups of 4
    assert lines[0] == ("all-reduce = f32[8,64] all-reduce: 2 groups of 4 devices, "
                        "sends 3072 bytes per device")
    assert lines[1].startswith("why: the local dot leaves partial results")
    assert "w2  {devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}  ← user annotation" in \
        [line.strip() for line in lines]


DEAD_SOURCE = """HloModule m, num_partitions=2
ENTRY e {
  p = f32[8,4] parameter(0), sharding={devices=[1,2]<=[2]}
  q = f32[4,4] parameter(1)
  n = f32[8,4] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  dead = f32[8,4] copy(n), sharding={devices=[2,1]<=[2]}
  ROOT r = f32[8,4] add(n, n), sharding={replicated}
}
"""


def test_explain_a_collective_whose_origin_chain_passes_a_removed_instruction(tmp_path, capsys):
    """`n` takes its sharding from the unused `dead`, which the partitioner's cleanup removes:
    the chain says what happened to it instead of failing. The partitioner computes `n`
    replicated (its only live user reads it so; gathering `p` costs what gathering `n` would), so
    the chain starts with that step, then propagation's sharding."""
    source, out = tmp_path / "dead.hlo", tmp_path / "spmd.hlo"
    source.write_text(DEAD_SOURCE)
    assert main(["compile", str(source), "-n", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out), "all-gather"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = lines.index("n  {replicated}  ← computed so by the partitioner's plan for this op; "
                     "propagation's sharding is on the next line")
    assert lines[at + 1] == "n  {devices=[2,1]<=[2]}  ← backward from dead via elementwise (level 0)"
    assert lines[at + 2].startswith("dead  ← no longer in the module: it was removed after "
                                    "propagation")


def test_explain_an_annotated_instruction_the_partitioner_computes_in_another_sharding(
        tmp_path, capsys):
    """A dot contracting a dim both operands tile leaves partial sums: the partitioned `n` is
    `{unreduced}` and a reshard makes the annotated rows for its user. The chain says so, then
    names the annotation."""
    source, out = tmp_path / "partial.hlo", tmp_path / "spmd.hlo"
    source.write_text("""HloModule m, num_partitions=2
ENTRY e {
  p = f32[8,4] parameter(0), sharding={devices=[1,2]<=[2]}
  q = f32[4,4] parameter(1), sharding={devices=[2,1]<=[2]}
  n = f32[8,4] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1]<=[2]}
  ROOT r = f32[8,4] add(n, n), sharding={devices=[2,1]<=[2]}
}
""")
    assert main(["compile", str(source), "-n", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out), "n"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = lines.index("n  {unreduced}  ← computed so by the partitioner's plan for this op; "
                     "propagation's sharding is on the next line")
    assert lines[at + 1] == "n  {devices=[2,1]<=[2]}  ← user annotation"


def test_explain_a_sharding_barrier_that_propagation_removes(tmp_path, capsys):
    source = tmp_path / "barrier.hlo"
    source.write_text("HloModule m, num_partitions=2\nENTRY e {\n"
                      "  p = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}\n"
                      "  b = f32[8,4] custom-call(p), custom_call_target=\"ShardBarrierTo\"\n"
                      "  ROOT n = f32[8,4] negate(b)\n}\n")
    assert main(["explain", str(source), "b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ['b  ← a sharding barrier (custom-call "ShardBarrierTo"): propagation stops '
                     'shardings from crossing it, then removes it, so it has no sharding of its '
                     'own; its operand p:',
                     "p  {devices=[2,1]<=[2]}  ← user annotation"]
    assert main(["explain", str(source), "e:b", "-n", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
