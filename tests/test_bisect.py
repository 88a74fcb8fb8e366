"""`gspmdc bisect` on partitioned programs with injected faults: it must name the instruction
whose value the fault spoils first, the check that fails (an operand's reshard, the value, the
result's reshard), the partitions whose pieces are wrong (worked out by hand from the fault) and,
in a loop, the iteration; on correct programs it must find nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gspmdc import api
from gspmdc.bisect import bisect, format_result
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd import InlineCalls
from gspmdc.runtime import io

EXAMPLES = Path(__file__).resolve().parents[1] / "gspmdc" / "examples"
PROGRAMS = Path(__file__).resolve().parents[2] / "shared" / "jax-programs"

#: y needs the replicated x split in four row blocks: a dynamic-slice with offsets {0,2,4,6}
SMALL = """
HloModule small, num_partitions=4

ENTRY e {
  x = f32[8,6] parameter(0), sharding={replicated}
  y = f32[8,6] negate(x), sharding={devices=[4,1]<=[4]}
  ROOT z = f32[8,6] exponential(y), sharding={devices=[4,1]<=[4]}
}
"""


def _spmd_text(text: str, n: int) -> str:
    return api.to_text(compile_spmd(api.parse(text), n))


def _bisect(text: str, spmd_text: str, n: int, seed: int = 0):
    reference = run_pipeline(PassContext(n), api.parse(text), [InlineCalls()])
    return bisect(reference, api.parse(spmd_text), n, io.random_inputs(api.parse(text), seed))


def _inject(spmd_text: str, old: str, new: str) -> str:
    assert spmd_text.count(old) == 1, f"the fault site {old!r} is not unique"
    return spmd_text.replace(old, new)


def test_correct_programs_have_no_difference():
    for text, n in ((SMALL, 4), ((EXAMPLES / "mlp.hlo").read_text(), 8),
                    ((EXAMPLES / "pipeline.hlo").read_text(), 4)):
        result = _bisect(text, _spmd_text(text, n), n)
        assert result.difference is None and result.divergence is None
        assert result.checked >= 4


def test_off_by_one_slice_offset_names_the_operand_reshard_and_the_partition():
    faulty = _inject(_spmd_text(SMALL, 4), "constant({0, 2, 4, 6})", "constant({0, 3, 4, 6})")
    d = _bisect(SMALL, faulty, 4).difference
    assert d is not None
    assert (d.instruction.name, d.check.role, d.check.value) == ("y", "operand 0 reshard", "x")
    assert d.check.spmd.opcode == "dynamic-slice"
    assert [p.partition for p in d.pieces] == [1]           # only partition 1 reads rows 3-4


def test_wrong_partition_offsets_name_the_swapped_partitions():
    faulty = _inject(_spmd_text(SMALL, 4), "constant({0, 2, 4, 6})", "constant({0, 4, 2, 6})")
    d = _bisect(SMALL, faulty, 4).difference
    assert (d.instruction.name, d.check.role) == ("y", "operand 0 reshard")
    assert [p.partition for p in d.pieces] == [1, 2]
    assert d.execution == 0 and d.executions == 1


def test_all_reduce_over_wrong_groups_names_the_result_reshard():
    text = (EXAMPLES / "mlp.hlo").read_text()
    faulty = _inject(_spmd_text(text, 8), "replica_groups=[2,4]<=[8]",
                     "replica_groups={{0,4},{1,5},{2,6},{3,7}}")
    d = _bisect(text, faulty, 8).difference
    assert (d.instruction.name, d.check.role) == ("y", "result reshard")
    assert d.check.spmd.opcode == "all-reduce"
    assert [p.partition for p in d.pieces] == list(range(8))


def test_all_reduce_with_the_wrong_reducer_names_the_result_reshard():
    text = (EXAMPLES / "mlp.hlo").read_text()
    faulty = _inject(_spmd_text(text, 8), "ROOT %result = f32[] add(%x, %y)",
                     "ROOT %result = f32[] maximum(%x, %y)")
    d = _bisect(text, faulty, 8).difference
    assert (d.instruction.name, d.check.role) == ("y", "result reshard")


def test_fault_in_a_loop_body_names_the_iteration():
    """The pipeline's shift sends stage 2's activation to stage 3; sending it nowhere gives
    stage 3 zeros. In the first iteration every activation is still zero, so the first wrong
    value is stage 3's dot input in the second iteration."""
    text = (EXAMPLES / "pipeline.hlo").read_text()
    faulty = _inject(_spmd_text(text, 4), "source_target_pairs={{0,1},{1,2},{2,3}}",
                     "source_target_pairs={{0,1},{1,2}}")
    result = _bisect(text, faulty, 4)
    d = result.difference
    assert d is not None
    assert d.check.computation == "body" and d.instruction.name == "y"
    assert (d.execution, d.executions) == (1, 9)
    assert d.loop is not None and d.loop.endswith("/loop")
    assert [p.partition for p in d.pieces] == [3]
    assert "collective-permute" in [i.opcode for i in d.partitioner_instructions]
    report = "\n".join(format_result(result, 4))
    assert "iteration 2 of loop" in report and "partitions whose piece differs: 3 (of 4)" in report


def test_wrong_local_computation_names_the_value():
    """A partitioned instruction computing the wrong numbers (not a reshard) fails its value
    check: the relu's zeros become halves."""
    text = (EXAMPLES / "mlp.hlo").read_text()
    faulty = _inject(_spmd_text(text, 8), "%zero = f32[] constant(0)",
                     "%zero = f32[] constant(0.5)")
    d = _bisect(text, faulty, 8).difference
    assert (d.instruction.name, d.check.role) == ("zero", "value")
    assert [p.partition for p in d.pieces] == list(range(8))


def test_cli_reports_and_exits_1_on_a_difference(tmp_path):
    program = tmp_path / "small.hlo"
    program.write_text(SMALL)
    spmd = tmp_path / "small.spmd.hlo"
    spmd.write_text(_inject(_spmd_text(SMALL, 4), "constant({0, 2, 4, 6})",
                            "constant({0, 3, 4, 6})"))
    done = subprocess.run([sys.executable, "-m", "gspmdc", "bisect", str(program), "-n", "4",
                           "--partitioned", str(spmd)], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("first difference: the reshard of its operand 0 (x), at e/y")
    assert "partitions whose piece differs: 1 (of 4)" in done.stdout
    clean = subprocess.run([sys.executable, "-m", "gspmdc", "bisect", str(program)],
                           capture_output=True, text=True)
    assert clean.returncode == 0 and clean.stdout.startswith("no difference"), clean.stderr


def test_cli_refuses_a_partitioned_file_as_the_reference(tmp_path):
    spmd = tmp_path / "small.spmd.hlo"
    spmd.write_text(_spmd_text(SMALL, 4))
    done = subprocess.run([sys.executable, "-m", "gspmdc", "bisect", str(spmd)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "needs the global program" in done.stderr


@pytest.mark.parametrize("name", ["mlp_megatron", "uneven_shapes", "pipeline_shift"])
def test_jax_programs_have_no_difference(name):
    folder = PROGRAMS / name
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    text = (folder / "program.hlo").read_text()
    module = api.parse(text)
    n = module.num_partitions or 8
    reference = run_pipeline(PassContext(n), module, [InlineCalls()])
    result = bisect(reference, api.parse(_spmd_text(text, n)), n,
                    io.read_inputs(folder / "inputs.npz", api.parse(text)))
    assert result.difference is None and result.divergence is None and result.checked > 10
