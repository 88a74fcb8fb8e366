"""A slice that cuts a tiled dim and whose result is wanted whole on that dim (a pipeline
reading its last stage): each partition cuts the part in its own range, zero elsewhere, and one
all-reduce of the result replaces the all-gather of the whole dim. Checked against the
unpartitioned program with garbage padding, and the collectives by hand."""
from __future__ import annotations

import pytest

from gspmdc.passes.spmd.traffic import sent_per_device

from spmd_partition_helpers import check_equivalent, collectives


def program(n: int, shape: str, operand: str, slice_: str, result_shape: str, result: str):
    return f"""HloModule m, num_partitions={n}
ENTRY e {{
  x = f32[{shape}] parameter(0), sharding={operand}
  ROOT s = f32[{result_shape}] slice(x), slice={slice_}, sharding={result}
}}
"""


def test_reading_the_last_stage_is_one_all_reduce_of_the_stage():
    text = program(4, "4,2,32", "{devices=[4,1,1]<=[4]}", "{[3:4], [0:2], [0:32]}", "1,2,32",
                   "{replicated}")
    spmd = check_equivalent(text, 4)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3]])]


@pytest.mark.parametrize("n, rows, start, limit", [(4, 7, 2, 5), (3, 8, 1, 7), (4, 9, 8, 9),
                                                   (4, 9, 6, 9), (2, 5, 0, 5)])
def test_uneven_shards_and_slices_across_shards(n, rows, start, limit):
    """Every strategy the byte count picks agrees with the unpartitioned slice; a short slice
    of the last (uneven) shard is read by the all-reduce."""
    text = program(n, f"{rows},6", f"{{devices=[{n},1]<=[{n}]}}",
                   f"{{[{start}:{limit}], [0:6]}}", f"{limit - start},6", "{replicated}")
    spmd = check_equivalent(text, n)
    if limit - start == 1:
        assert [c[0] for c in collectives(spmd)] == ["all-reduce"]


def test_other_tiled_dims_keep_their_tiles():
    """A 2x2 mesh: dim 0 (sliced) over one axis, dim 1 over the other; the result stays tiled
    on dim 1. Row 3 is held by devices 2 (columns 0..3) and 3 (4..7), and wanted by devices 0,
    2 and 1, 3: the all-reduce within the dim-0 groups sends 16 B from every device, the
    pieces (`pad_pieces.py`) one f32[1,4] from device 2 to 0 and from 3 to 1: as many from the
    busiest device, half as many in all."""
    text = program(4, "4,8", "{devices=[2,2]<=[4]}", "{[3:4], [0:8]}", "1,8",
                   "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}")
    spmd = check_equivalent(text, 4)
    assert collectives(spmd) == [("collective-permute", [(2, 0), (3, 1)])]
    assert sent_per_device(spmd, 4).tolist() == [0, 0, 16, 16]


def test_a_slice_within_the_shards_keeps_using_halos():
    """A slice whose result stays tiled the same way is a local slice plus halo permutes, not
    an all-reduce."""
    text = program(4, "16,4", "{devices=[4,1]<=[4]}", "{[1:13], [0:4]}", "12,4",
                   "{devices=[4,1]<=[4]}")
    spmd = check_equivalent(text, 4)
    assert all(c[0] == "collective-permute" for c in collectives(spmd))
