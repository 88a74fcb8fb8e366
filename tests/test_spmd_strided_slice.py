"""Strided slices of sharded operands, against numpy's own slicing: the regression of a slice
whose selected range on the sharded dim is whole shards while another dim is strided (the
masked strategy lost the stride), then random shapes, ranges, strides and shardings of the
operand and the result on 2 and 4 partitions, run with garbage in every padding element."""
from __future__ import annotations

from math import prod

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gspmdc.cli import main
from sharding_strategies import tiled_shardings
from spmd_partition_helpers import partition, run_global


def slice_program(n: int, dims, slices, operand: str, result: str | None) -> str:
    out = [len(range(a, b, s)) for a, b, s in slices]
    spec = ", ".join(f"[{a}:{b}:{s}]" for a, b, s in slices)
    result_sharding = "" if result is None else f", sharding={result}"
    return (f"HloModule m, num_partitions={n}\nENTRY e {{\n"
            f"  p = f32[{','.join(map(str, dims))}] parameter(0), sharding={operand}\n"
            f"  ROOT s = f32[{','.join(map(str, out))}] slice(p), slice={{{spec}}}"
            f"{result_sharding}\n}}\n")


def check_against_numpy(text: str, n: int, dims, slices, *, propagate: bool = False) -> None:
    x = np.arange(prod(dims), dtype=np.float32).reshape(dims) + 1
    got = run_global(partition(text, n, propagate=propagate), [x], n)
    np.testing.assert_array_equal(got, x[tuple(slice(a, b, s) for a, b, s in slices)])


def test_strided_slice_of_whole_shards_keeps_its_stride():
    dims, slices = (4, 2), [(0, 4, 2), (1, 2, 1)]
    text = slice_program(2, dims, slices, "{devices=[1,2]<=[2]}", None)
    check_against_numpy(text, 2, dims, slices)


def test_strided_slice_of_whole_shards_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "s.hlo"
    path.write_text(slice_program(2, (4, 2), [(0, 4, 2), (1, 2, 1)], "{devices=[1,2]<=[2]}",
                                  None))
    assert main(["run", str(path), "--backend", "local", "--check", "-q"]) == 0, \
        capsys.readouterr().err


@st.composite
def strided_slices(draw):
    n = draw(st.sampled_from([2, 4]))
    rank = draw(st.integers(1, 3))
    dims = tuple(draw(st.integers(1, 9)) for _ in range(rank))
    slices = []
    for size in dims:
        start = draw(st.integers(0, size - 1))
        limit = draw(st.integers(start + 1, size))
        slices.append((start, limit, draw(st.integers(1, 4))))
    operand = draw(tiled_shardings(rank, n))
    result = draw(st.one_of(st.none(), st.just("{replicated}"), tiled_shardings(rank, n)))
    return n, dims, slices, operand, result, draw(st.booleans())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_slices())
def test_random_strided_slices_of_sharded_operands(case):
    n, dims, slices, operand, result, propagate = case
    text = slice_program(n, dims, slices, operand, result)
    check_against_numpy(text, n, dims, slices, propagate=propagate)


def test_an_inconsistent_lowering_is_an_internal_error_not_bad_input(tmp_path, capsys,
                                                                     monkeypatch):
    """A lowering whose local shape is not the shard shape is gspmdc's bug: exit 3 and the
    internal-error wording, never exit 2 as if the input were wrong."""
    from gspmdc.passes.spmd import op_rules_window
    path = tmp_path / "s.hlo"
    path.write_text(slice_program(2, (4, 2), [(0, 4, 1), (0, 2, 1)], "{devices=[1,2]<=[2]}",
                                  "{devices=[1,2]<=[2]}"))
    monkeypatch.setattr(op_rules_window.SliceRule, "local_op",
                        lambda self, inst, ctx, inputs, plans:
                        ctx.builder.broadcast(ctx.builder.zero("f32"), (3, 1)))
    code = main(["compile", "-n", "2", str(path)])
    err = capsys.readouterr().err
    assert code == 3
    assert "gspmdc: internal error: lowering s (slice) gave f32[3,1], expected the shard " \
           "shape f32[4,1]" in err and "this is a bug in gspmdc" in err
