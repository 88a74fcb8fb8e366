"""A reshape splitting or merging its one tiled dim unevenly realigns the shards by a halo
exchange (XLA's HandleReshape, docs/design/partitioning.md#reshape-by-halo-exchange) instead
of gathering the operand: values against the unpartitioned program on garbage-padded shards,
bytes and collectives computed by hand, and XLA's bytes with the `[xla]` extra."""
from __future__ import annotations

import pytest

from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.parser import parse_sharding
from gspmdc.passes.spmd.reshape_halo import plan_reshape_halo

from conformance.oracle import xla_available
from spmd_partition_helpers import check_equivalent, collectives, compared_with_xla

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")


def reshape_module(n: int, source: tuple, target: tuple, a: str, b: str,
                   element: str = "f32") -> str:
    """`p` sharded `a` reshaped to `target` sharded `b`, then negated (its reads of the result's
    padding would show in the values) and summed over every dim (a read of garbage anywhere
    shows too)."""
    src = ",".join(map(str, source))
    dst = ",".join(map(str, target))
    dims = ",".join(map(str, range(len(target))))
    return f"""HloModule m, num_partitions={n}

add {{
  x = {element}[] parameter(0)
  y = {element}[] parameter(1)
  ROOT s = {element}[] add(x, y)
}}

ENTRY main {{
  p = {element}[{src}] parameter(0), sharding={a}
  r = {element}[{dst}] reshape(p), sharding={b}
  n = {element}[{dst}] negate(r), sharding={b}
  z = {element}[] constant(0)
  s = {element}[] reduce(n, z), dimensions={{{dims}}}, to_apply=add, sharding={{replicated}}
  ROOT t = ({element}[{dst}], {element}[]) tuple(n, s), sharding={{{b}, {{replicated}}}}
}}
"""


# (devices, source, target, operand sharding, result sharding): splits and merges of the one
# tiled dim, with halos of one and several hops, major dims before it, a partially replicated
# result, and devices in another order on the two sides (the operand is permuted first)
CASES = [
    (4, (10, 4), (2, 5, 4), "{devices=[4,1]<=[4]}", "{devices=[4,1,1]<=[4]}"),
    (4, (7, 7, 8), (49, 8), "{devices=[4,1,1]<=[4]}", "{devices=[4,1]<=[4]}"),
    (4, (2, 5, 3, 8), (2, 15, 8), "{devices=[1,4,1,1]<=[4]}", "{devices=[1,4,1]<=[4]}"),
    (4, (3, 14, 2), (3, 2, 7, 2), "{devices=[1,4,1]<=[4]}", "{devices=[1,4,1,1]<=[4]}"),
    (8, (9, 2), (3, 3, 2), "{devices=[8,1]<=[8]}", "{devices=[8,1,1]<=[8]}"),
    (8, (5, 3), (15,), "{devices=[4,1,2]<=[8] last_tile_dim_replicate}",
     "{devices=[4,2]<=[8] last_tile_dim_replicate}"),
    (4, (6, 5), (30,), "{devices=[4,1]0,2,1,3}", "{devices=[4]<=[4]}"),
    (6, (15,), (5, 3), "{devices=[6]<=[6]}", "{devices=[6,1]<=[6]}"),
    (4, (5, 2, 3), (5, 6), "{devices=[1,4,1]<=[4]}", "{devices=[1,4]<=[4]}"),
    # devices grouped on a dim the reshape keeps whole, tiled alike on both sides (unevenly,
    # before or after the split or merged dim, or replicated too)
    (8, (10, 4, 6), (2, 5, 4, 6), "{devices=[4,1,2]<=[8]}", "{devices=[4,1,1,2]<=[8]}"),
    (8, (6, 7, 7, 8), (6, 49, 8), "{devices=[2,4,1,1]<=[8]}", "{devices=[2,4,1]<=[8]}"),
    (8, (5, 7, 7, 3), (5, 49, 3), "{devices=[2,4,1,1]<=[2,4]T(1,0)}",
     "{devices=[2,4,1]<=[2,4]T(1,0)}"),
    (8, (3, 9, 2), (3, 3, 3, 2), "{devices=[2,2,1,2]<=[8] last_tile_dim_replicate}",
     "{devices=[2,2,1,1,2]<=[8] last_tile_dim_replicate}"),
    # devices grouped on dims the reshape splits or merges whose tiling survives on the major
    # part (the operand's tiling propagated through the reshape), on either side of the
    # unevenly split or merged dim
    (8, (4, 10, 6), (2, 2, 2, 5, 6), "{devices=[2,4,1]<=[8]}", "{devices=[2,1,4,1,1]<=[8]}"),
    (8, (2, 2, 7, 7, 3), (4, 49, 3), "{devices=[2,1,4,1,1]<=[8]}", "{devices=[2,4,1]<=[8]}"),
    (16, (4, 14, 6), (2, 2, 2, 7, 2, 3), "{devices=[2,4,2]<=[16]}",
     "{devices=[2,1,4,1,2,1]<=[16]}"),
]


@pytest.mark.parametrize("n,source,target,a,b", CASES)
def test_uneven_split_and_merge_compute_the_unpartitioned_values(n, source, target, a, b):
    spmd = check_equivalent(reshape_module(n, source, target, a, b), n)
    gathers = [c for c in collectives(spmd) if c[0] in ("all-gather", "all-to-all")]
    assert gathers == [], gathers


@pytest.mark.parametrize("element", ["s32", "f16"])
def test_other_element_types(element):
    """(f16: the sum rounds in another order on the shards.)"""
    tolerance = 1e-2 if element == "f16" else 1e-5
    check_equivalent(reshape_module(4, (7, 7, 2), (49, 2), "{devices=[4,1,1]<=[4]}",
                                    "{devices=[4,1]<=[4]}", element), 4,
                     rtol=tolerance, atol=tolerance)


def test_split_sends_each_shard_its_rows_from_the_right():
    """f32[10,4] in shards of 3 rows to f32[2,5,4] in shards of 1: shard i needs rows
    [5i, 5i+5); 0 takes rows 3-4 from 1 (hop 1), 1 rows 6-8 from 2 (hop 1) and row 9 from 3
    (hop 2); shards 2 and 3 hold padding only. A hop's piece is the span its receivers read:
    3 rows (48 B) from 1 and 2, 1 row from 3; gathering the operand sent 144 B from each."""
    text = reshape_module(4, (10, 4), (2, 5, 4), "{devices=[4,1]<=[4]}",
                          "{devices=[4,1,1]<=[4]}")
    spmd = check_equivalent(text, 4)
    assert collectives(spmd) == [("collective-permute", [(1, 0), (2, 1)]),
                                 ("collective-permute", [(3, 1)]),
                                 ("all-reduce", [[0, 1, 2, 3]])]
    pieces = [i.shape.dims for i in spmd.entry.instructions if i.opcode == "collective-permute"]
    assert pieces == [(3, 4), (1, 4)]


def test_merge_sends_each_shard_its_first_positions_from_the_left():
    """f32[7,7,8] in shards of 2 rows to f32[49,8] in shards of 13: each shard reshapes to 14
    positions [14i, 14i+14) and needs [13i, 13i+13): i positions from its left neighbour (the
    last 3 of a shard travel, 96 B), where gathering the operand sent 1,344."""
    text = reshape_module(4, (7, 7, 8), (49, 8), "{devices=[4,1,1]<=[4]}",
                          "{devices=[4,1]<=[4]}")
    spmd = check_equivalent(text, 4)
    assert collectives(spmd)[0] == ("collective-permute", [(0, 1), (1, 2), (2, 3)])
    permute = next(i for i in spmd.entry.instructions if i.opcode == "collective-permute")
    assert "reshape merges its tiled dim unevenly" in str(permute.attr("metadata"))
    halo = plan_reshape_halo(ArrayShape("f32", (7, 7, 8)), ArrayShape("f32", (49, 8)),
                             parse_sharding("{devices=[4,1,1]<=[4]}"),
                             parse_sharding("{devices=[4,1]<=[4]}"), 4)
    assert (halo.split, halo.dim, halo.merged, halo.cost) == (False, 0, (14, 8), 96)


def test_devices_group_on_a_split_dim_whose_tiling_survives():
    """f32[4,10,6] [2,4,1] to f32[2,2,2,5,6] [2,1,4,1,1] on 8 devices: dim 0 splits into (2,2)
    keeping its 2 tiles on the major part, so the devices group on it (2 groups of 4) and each
    group splits its f32[2,10,6] as f32[10,4] to f32[2,5,4] above, rows of 2·6 floats (48 B):
    the busiest device sends 3 rows, 144 B, where gathering dim 1 sent 3 shards of 3 rows,
    432."""
    halo = plan_reshape_halo(ArrayShape("f32", (4, 10, 6)), ArrayShape("f32", (2, 2, 2, 5, 6)),
                             parse_sharding("{devices=[2,4,1]<=[8]}"),
                             parse_sharding("{devices=[2,1,4,1,1]<=[8]}"), 8)
    assert (halo.split, halo.dim, halo.cost) == (True, 1, 144)


@pytest.mark.parametrize("source,target,a,b", [
    ((10, 4), (4, 10), "{devices=[4,1]<=[4]}", "{devices=[4,1]<=[4]}"),       # 10 vs 4
    ((2, 5, 3), (5, 2, 3), "{devices=[1,4,1]<=[4]}", "{devices=[4,1,1]<=[4]}"),  # majors 2, 1
    ((10, 4), (2, 5, 4), "{devices=[2,2]<=[4]}", "{devices=[4,1,1]<=[4]}"),   # dim 1 not alike
    ((2, 10, 4), (2, 2, 5, 4), "{devices=[2,2,1]<=[4]}",
     "{devices=[1,4,1,1]<=[4]}"),                                             # nor dim 0
    ((10, 4), (2, 5, 4), "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     "{devices=[4,1,1]<=[4]}"),                                               # 2 tiles vs 4
])
def test_no_halo_plan_outside_xlas_conditions(source, target, a, b):
    assert plan_reshape_halo(ArrayShape("f32", source), ArrayShape("f32", target),
                             parse_sharding(a), parse_sharding(b), 4) is None


@needs_xla
@pytest.mark.parametrize("n,source,target,a,b", CASES[:3] + CASES[9:11] + CASES[-3:])
def test_no_more_bytes_than_xla(n, source, target, a, b):
    result = compared_with_xla(reshape_module(n, source, target, a, b), n)
    assert result.our_busiest <= result.xla_busiest
