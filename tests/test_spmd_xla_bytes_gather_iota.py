"""No more collective bytes than XLA (issue 13) for gathers whose indices hold an iota.

An index component that is an iota along an indices dim of the size of the operand dim it
addresses (slice size 1) makes that operand dim parallel to the indices dim (XLA's implicit
batch dims, found as propagation finds them: `IndexedOp.implicit_parallel`): row k of the
indices reads row k of the operand, so the operand, the indices and the result tiled alike on
those dims need nothing moved; each partition shifts the iota component by its offset.
Values against the unpartitioned program, uneven shapes included; with the `[xla]` extra,
against XLA's own partitioned program."""
from __future__ import annotations

import pytest

from conformance.oracle import xla_available

from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla, sent_bytes

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def iota_rows(rows: int = 8, iota_rows: int | None = None, n: int = 4) -> str:
    """A gather of `f32[rows,16]` row-tiled `n` ways whose index vectors (row-tiled alike) are
    (an iota along the indices' rows, a data column), reading a `[1,4]` window at each: row k
    of the result reads operand row k (when the iota has the operand's row count) at the data
    column."""
    k = rows if iota_rows is None else iota_rows
    return f"""HloModule m, num_partitions={n}

ENTRY e {{
  o = f32[{rows},16] parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  r = s32[{k},1] iota(), iota_dimension=0
  c = s32[{k},1] parameter(1), sharding={{devices=[{n},1]<=[{n}]}}
  i = s32[{k},2] concatenate(r, c), dimensions={{1}}, sharding={{devices=[{n},1]<=[{n}]}}
  ROOT g = f32[{k},4] gather(o, i), offset_dims={{1}}, collapsed_slice_dims={{0}},
    start_index_map={{0,1}}, index_vector_dim=1, slice_sizes={{1,4}},
    sharding={{devices=[{n},1]<=[{n}]}}
}}
"""


def test_iota_rows_make_a_parallel_dim():
    """Operand, data indices and result all row-tiled 4 ways, the rows read by an iota:
    each partition gathers its own 2 rows from its own 2 rows of the operand, nothing moves.
    Before, the rows were an indexed dim: masked local gathers of the whole indices summed by
    a reduce-scatter (or the operand gathered whole)."""
    spmd = check_equivalent(iota_rows(), 4)
    assert collectives(spmd) == []


@pytest.mark.parametrize("rows", [7, 5, 6])
def test_iota_rows_uneven(rows):
    """Rows that do not split evenly (a padding row on some partitions, whatever it holds):
    the real rows still read their own partition's rows, nothing moves."""
    spmd = check_equivalent(iota_rows(rows), 4)
    assert collectives(spmd) == []


def test_iota_of_another_size_is_no_parallel_dim():
    """An iota along 4 rows of indices into an operand of 8 rows: row k of the indices reads
    operand row k, but the operand's row tiles do not line up with the indices' (XLA finds no
    parallel dim); the values still match, through the masked gathers."""
    spmd = check_equivalent(iota_rows(8, 4), 4)
    assert collectives(spmd) != []


@needs_xla
@pytest.mark.parametrize("text", [iota_rows(), iota_rows(7)])
def test_no_more_bytes_than_xla(text):
    """XLA's import turns the `s32[k,1]` iota into a reshape of an `s32[k]` one, which neither
    compiler reads as an iota (XLA's GetDimensionForIota does not look through reshapes): both
    send bytes there, gspmdc no more (120 B per device against 240)."""
    compared_with_xla(text, 4)
