"""Windowed einsum (passes/spmd/windowed_einsum.py): with a threshold, a dot that would all-gather
an operand (on a free or a contracting dim) or reduce-scatter its partial sums runs as a `while`
loop of partial dots and collective-permutes. Checked against the unpartitioned interpreter and
the non-windowed program on 2, 4 and 8 partitions (uneven dims, garbage padding), with the
collective structure: permutes inside the loop, no all-gather / reduce-scatter left."""
from __future__ import annotations

import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.traffic import collective_traffic

from spmd_partition_helpers import assert_close, inputs_for, reference, run_global

DEVICES = [2, 4, 8]


def dot_module(lhs: str, rhs: str, out: str, lhs_sharding: str, rhs_sharding: str,
               out_sharding: str) -> str:
    return f"""HloModule m
ENTRY e {{
  x = f32[{lhs}] parameter(0), sharding={lhs_sharding}
  y = f32[{rhs}] parameter(1), sharding={rhs_sharding}
  ROOT d = f32[{out}] dot(x, y), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={out_sharding}
}}
"""


def rows(n: int) -> str:
    return f"{{devices=[{n},1]<=[{n}]}}"


def cols(n: int) -> str:
    return f"{{devices=[1,{n}]<=[{n}]}}"


def compile_text(text: str, n: int, threshold: int | None):
    spmd = compile_spmd(api.parse(text), n, propagate=False,
                        windowed_einsum_threshold=threshold)
    return api.parse(api.to_text(spmd))


def all_opcodes(module) -> list[str]:
    return [inst.opcode for _, inst in module.all_instructions()]


def check(text: str, n: int, marker: str):
    """The windowed program equals the reference and the plain program; returns both."""
    inputs = inputs_for(text)
    windowed = compile_text(text, n, 0)
    plain = compile_text(text, n, None)
    got = run_global(windowed, inputs, n)
    assert_close(got, reference(text, inputs), rtol=1e-4, atol=1e-4)
    assert_close(got, run_global(plain, inputs, n), rtol=1e-4, atol=1e-4)
    dot = next(i for i in compile_spmd(api.parse(text), n, propagate=False,
                                       windowed_einsum_threshold=0).entry.instructions
               if i.opcode == "while")
    assert marker in str(dot.attr("metadata"))
    ops = all_opcodes(windowed)
    assert "while" in ops and "collective-permute" in ops
    return windowed, plain


def traffic(module, n: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for t in collective_traffic(module, n):
        totals[t.opcode] = totals.get(t.opcode, 0.0) + t.total_sent_bytes
    return totals


@pytest.mark.parametrize("n", DEVICES)
def test_ag_on_a_free_dim_passes_rhs_blocks_around_the_ring(n):
    """x rows tiled, y columns tiled (uneven), result rows tiled: plain gathers y; windowed
    passes y's column blocks and writes each block's dot into its columns."""
    text = dot_module(f"{8 * n},4", f"4,{2 * n + 1}", f"{8 * n},{2 * n + 1}",
                      rows(n), cols(n), rows(n))
    windowed, plain = check(text, n, "ag operand 1 dim 1")
    assert "all-gather" in all_opcodes(plain)
    assert "all-gather" not in all_opcodes(windowed)
    moved = traffic(windowed, n)
    assert set(moved) == {"collective-permute"}
    # each of the n - 1 steps passes every device's f32[4, cdiv(2n+1, n)] block on
    assert moved["collective-permute"] == (n - 1) * 4 * -(-(2 * n + 1) // n) * 4


@pytest.mark.parametrize("n", DEVICES)
def test_ag_on_a_contracting_dim_accumulates_block_products(n):
    """y tiled on its (uneven) contracting dim, x whole on it: each step multiplies the received
    y block with the matching columns of x and adds."""
    k = 2 * n + 1
    text = dot_module(f"{8 * n},{k}", f"{k},3", f"{8 * n},3", rows(n), rows(n), rows(n))
    windowed, plain = check(text, n, "ag operand 1 dim 0")
    assert "all-gather" in all_opcodes(plain)
    assert set(traffic(windowed, n)) == {"collective-permute"}


@pytest.mark.parametrize("n", DEVICES)
def test_rs_passes_partial_sums_and_ends_on_the_own_block(n):
    """Both operands tiled on the (uneven) contracting dim, result rows tiled (uneven): plain
    reduce-scatters the partial sums; windowed passes an accumulator around the ring."""
    k, m = 2 * n + 1, 3 * n - 1
    text = dot_module(f"{m},{k}", f"{k},5", f"{m},5", cols(n), rows(n), rows(n))
    windowed, plain = check(text, n, "rs operand 0 dim 0")
    assert "reduce-scatter" in all_opcodes(plain)
    assert set(traffic(windowed, n)) == {"collective-permute"}


def test_threshold_above_the_operand_keeps_the_all_gather():
    n = 4
    text = dot_module(f"{8 * n},4", f"4,{2 * n + 1}", f"{8 * n},{2 * n + 1}",
                      rows(n), cols(n), rows(n))
    program = compile_text(text, n, 4 * (2 * n + 1) * 4 + 1)      # y has 144 bytes
    assert "while" not in all_opcodes(program) and "all-gather" in all_opcodes(program)
    assert "while" in all_opcodes(compile_text(text, n, 4 * (2 * n + 1) * 4))


def test_cli_compile_and_run_take_the_threshold(tmp_path, capsys):
    from gspmdc.cli import main
    n = 4
    source = tmp_path / "dot.hlo"
    source.write_text(dot_module(f"{8 * n},4", f"4,{2 * n + 1}", f"{8 * n},{2 * n + 1}",
                                 rows(n), cols(n), rows(n)))
    out = tmp_path / "spmd.hlo"
    assert main(["compile", str(source), "-n", str(n), "-o", str(out),
                 "--windowed-einsum-threshold", "0"]) == 0
    assert "while" in all_opcodes(api.load(out))
    assert main(["run", str(source), "-n", str(n), "--backend", "local", "--check", "-q",
                 "--garbage-padding", "--windowed-einsum-threshold", "0"]) == 0
    with pytest.raises(SystemExit) as refused:           # an argparse error
        main(["compile", str(source), "-n", str(n), "--windowed-einsum-threshold", "-1"])
    assert refused.value.code == 2
