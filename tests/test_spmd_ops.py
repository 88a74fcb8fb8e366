"""Per-op partitioning: every op of the partitioner's rule tables, on even and uneven shapes, run
on the local backend (padding filled with NaN / integer maxima) must reproduce the unpartitioned
program; where the communication is known by hand (docs/design/partitioning.md), the collectives are
checked too."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc.errors import GspmdcError, ShardingError, UnsupportedError

from hlo_text import hlo_module, reducer
from spmd_partition_helpers import (
    COLLECTIVES, check_equivalent, collectives, opcodes, partition,
)

REDUCERS = reducer("add") + reducer("max") + reducer("min_s32", "minimum", "s32") + \
    reducer("mul_s32", "multiply", "s32") + reducer("or", element_type="pred") + """
argmax {
  v0 = f32[] parameter(0)
  i0 = s32[] parameter(1)
  v1 = f32[] parameter(2)
  i1 = s32[] parameter(3)
  gt = pred[] compare(v0, v1), direction=GT
  eq = pred[] compare(v0, v1), direction=EQ
  lt = pred[] compare(i0, i1), direction=LT
  tie = pred[] and(eq, lt)
  first = pred[] or(gt, tie)
  v = f32[] select(first, v0, v1)
  i = s32[] select(first, i0, i1)
  ROOT r = (f32[], s32[]) tuple(v, i)
}
"""


def module(body: str) -> str:
    return hlo_module(body, REDUCERS)


# ---- elementwise ---------------------------------------------------------------------------------

def test_elementwise_in_a_shared_sharding_needs_no_communication():
    spmd = check_equivalent(module("""
  x = f32[10,7] parameter(0), sharding={devices=[4,1]<=[4]}
  y = f32[10,7] parameter(1), sharding={devices=[4,1]<=[4]}
  a = f32[10,7] add(x, y), sharding={devices=[4,1]<=[4]}
  p = pred[10,7] compare(a, y), direction=GT, sharding={devices=[4,1]<=[4]}
  s = f32[10,7] select(p, a, x), sharding={devices=[4,1]<=[4]}
  c = s32[10,7] convert(s), sharding={devices=[4,1]<=[4]}
  ROOT n = s32[10,7] negate(c), sharding={devices=[4,1]<=[4]}"""), 4)
    assert collectives(spmd) == []
    assert spmd.entry.root.shape.dims == (3, 7)


def test_elementwise_computes_where_its_operands_already_agree():
    """Both operands are split by rows; the result wants columns: one all-to-all of the result
    beats two of the operands."""
    spmd = check_equivalent(module("""
  x = f32[8,8] parameter(0), sharding={devices=[2,1]<=[2]}
  y = f32[8,8] parameter(1), sharding={devices=[2,1]<=[2]}
  ROOT a = f32[8,8] multiply(x, y), sharding={devices=[1,2]<=[2]}"""), 2)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all"]


def test_clamp_with_scalar_bounds():
    check_equivalent(module("""
  lo = f32[] parameter(0)
  x = f32[9,5] parameter(1), sharding={devices=[2,2]<=[4]}
  hi = f32[] constant(0.5)
  ROOT c = f32[9,5] clamp(lo, x, hi), sharding={devices=[2,2]<=[4]}"""), 4)


# ---- broadcast, transpose, reshape ----------------------------------------------------------------

def test_broadcast_slices_its_replicated_operand_locally():
    spmd = check_equivalent(module("""
  x = f32[7] parameter(0)
  ROOT b = f32[6,7,3] broadcast(x), dimensions={1}, sharding={devices=[2,2,1]<=[4]}"""), 4)
    assert collectives(spmd) == []
    assert spmd.entry.root.shape.dims == (3, 4, 3)


def test_broadcast_keeps_the_operand_tiling_on_old_dims():
    spmd = check_equivalent(module("""
  x = f32[10,3] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT b = f32[10,5,3] broadcast(x), dimensions={0,2}, sharding={devices=[4,1,1]<=[4]}"""), 4)
    assert collectives(spmd) == []


@pytest.mark.parametrize("perm,source,target", [
    ("1,0", "{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}"),
    # T [[[0,1],[2,3]]] transposed (2,0,1) is [[[0,2]],[[1,3]]]
    ("2,0,1", "{devices=[1,2,2]<=[4]}", "{devices=[2,1,2]<=[2,2]T(1,0)}"),
])
def test_transpose_moves_the_tiling_with_the_dims(perm, source, target):
    dims = {"1,0": ("f32[10,6]", "f32[6,10]"), "2,0,1": ("f32[3,6,5]", "f32[5,3,6]")}[perm]
    spmd = check_equivalent(module(f"""
  x = {dims[0]} parameter(0), sharding={source}
  ROOT t = {dims[1]} transpose(x), dimensions={{{perm}}}, sharding={target}"""), 4)
    assert collectives(spmd) == []


RESHAPES = [
    ("f32[4,6]", "{devices=[4,1]<=[4]}", "f32[24]", "{devices=[4]<=[4]}", 4, []),
    ("f32[24]", "{devices=[4]<=[4]}", "f32[4,6]", "{devices=[4,1]<=[4]}", 4, []),
    ("f32[10,2,3]", "{devices=[4,1,1]<=[4]}", "f32[10,6]", "{devices=[4,1]<=[4]}", 4, []),
    ("f32[4,6]", "{devices=[1,2]<=[2]}", "f32[24]", "{devices=[2]<=[2]}", 2, ["all-to-all"]),
    # tiles of 3 to tiles of 5 do not nest: the pieces of the new tiles are exchanged, largest
    # first, in four permute rounds (16 B from the busiest device, 44 B in all), where
    # realigning the tiles by one permute and gathering over pairs sent 16 B and 56 B, the
    # exchange filled tile by tile 20 B from device 1 and gathering the dim 36 B per device
    ("f32[10]", "{devices=[4]<=[4]}", "f32[2,5]", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     4, ["collective-permute"] * 4),
    ("f32[6,4,2]", "{devices=[2,1,1]<=[2]}", "f32[24,2]", "{devices=[2,1]<=[2]}", 2, []),
    # merging [6,4] tiled [2,2]: a device's rows of the merged dim are not contiguous, so the
    # minor dim is gathered first (then each device slices its quarter of the merged rows)
    ("f32[6,4,2]", "{devices=[2,2,1]<=[4]}", "f32[24,2]", "{devices=[4,1]<=[4]}", 4,
     ["all-gather"]),
    # one element split in tiles (every dim of size 1): it lies in the first tile on both sides,
    # the other tiles are padding, so the shards reshape locally, as XLA does (fuzz/11100000266
    # on gathered the two tiles to run the reshape replicated)
    ("bf16[1]", "{devices=[2,4]<=[8] last_tile_dim_replicate}", "bf16[1,1]",
     "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", 8, []),
    ("f32[1,1]", "{devices=[1,4]<=[4]}", "f32[1]", "{devices=[4]<=[4]}", 4, []),
    ("f32[1,6]", "{devices=[2,2]<=[4]}", "f32[1,1,6]", "{devices=[2,1,2]<=[4]}", 4, []),
    # a dim of size 1 cut in 2 beside a kept dim cut in 2: XLA's pair (its element in tile 0 on
    # both sides, the other tile padding), local as XLA's (fuzz/11200001242 on gathered both dims
    # to reshape replicated: 124 B from the busiest device, XLA 28)
    ("s32[4,6,1]", "{devices=[1,2,2,2]<=[8] last_tile_dim_replicate}", "s32[1,4,6,1]",
     "{devices=[1,1,2,2,2]<=[8] last_tile_dim_replicate}", 8, []),
    # XLA's pair read backwards: the result's sharding reshaped to the operand's shape gives the
    # operand's (the forward reshape gives [2,2,1], the size-1 dims' tiles in another place)
    ("f32[6,1]", "{devices=[2,2]<=[4]}", "f32[6,1,1]", "{devices=[2,1,2]<=[4]}", 4, []),
]


@pytest.mark.parametrize("source,source_sharding,target,target_sharding,n,expected", RESHAPES)
def test_reshape_cases(source, source_sharding, target, target_sharding, n, expected):
    spmd = check_equivalent(module(f"""
  x = {source} parameter(0), sharding={source_sharding}
  ROOT r = {target} reshape(x), sharding={target_sharding}"""), n)
    assert [c[0] for c in collectives(spmd)] == expected


# ---- reduce --------------------------------------------------------------------------------------

@pytest.mark.parametrize("reducer,element,init", [
    ("add", "f32", "0"), ("max", "f32", "-inf"), ("min_s32", "s32", "2147483647"),
    ("mul_s32", "s32", "1"), ("or", "pred", "false"),
])
def test_reduce_over_an_uneven_tiled_dim_masks_padding_with_the_init(reducer, element, init):
    """Rows split 4 ways over 10: the last device holds 1 real row and 2 of garbage, which must
    not reach the result; partial results are combined with the reduce's own computation."""
    spmd = check_equivalent(module(f"""
  x = {element}[10,6] parameter(0), sharding={{devices=[4,1]<=[4]}}
  i = {element}[] constant({init})
  ROOT r = {element}[6] reduce(x, i), dimensions={{0}}, to_apply={reducer}, sharding={{replicated}}"""), 4)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3]])]
    reducer_of = [i.attr("to_apply").name for i in spmd.entry.instructions
                  if i.opcode == "all-reduce"]
    assert reducer_of == [reducer]
    assert "select" in opcodes(spmd)           # the mask


def test_reduce_result_tiled_by_the_reducing_devices_is_a_reduce_scatter():
    spmd = check_equivalent(module("""
  x = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  i = f32[] constant(0)
  ROOT r = f32[8] reduce(x, i), dimensions={1}, to_apply=add, sharding={devices=[4]<=[4]}"""), 4)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter"]


def test_reduce_over_untiled_dims_is_local():
    spmd = check_equivalent(module("""
  x = f32[9,5] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  i = f32[] constant(0)
  ROOT r = f32[9] reduce(x, i), dimensions={1}, to_apply=add,
    sharding={devices=[2,2]<=[4] last_tile_dim_replicate}"""), 4)
    assert collectives(spmd) == []


def test_variadic_reduce_gathers_its_reduced_dim():
    check_equivalent(module("""
  v = f32[10,4] parameter(0), sharding={devices=[4,1]<=[4]}
  idx = s32[10,4] iota(), iota_dimension=0, sharding={devices=[4,1]<=[4]}
  vi = f32[] constant(-inf)
  ii = s32[] constant(0)
  ROOT r = (f32[4], s32[4]) reduce(v, idx, vi, ii), dimensions={0}, to_apply=argmax,
    sharding={{replicated}, {replicated}}"""), 4)


# ---- dot -----------------------------------------------------------------------------------------

def test_dot_batch_partitioned_is_local():
    spmd = check_equivalent(module("""
  a = f32[4,6,8] parameter(0), sharding={devices=[4,1,1]<=[4]}
  b = f32[4,8,5] parameter(1), sharding={devices=[4,1,1]<=[4]}
  ROOT d = f32[4,6,5] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
    lhs_contracting_dims={2}, rhs_contracting_dims={1}, sharding={devices=[4,1,1]<=[4]}"""), 4)
    assert collectives(spmd) == []


def test_dot_contracting_partitioned_all_reduces_partial_sums():
    spmd = check_equivalent(module("""
  a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  b = f32[16,32] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT d = f32[8,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={replicated}"""), 4)
    assert collectives(spmd) == [("all-reduce", [[0, 1, 2, 3]])]


def test_dot_contracting_partitioned_with_a_tiled_output_reduce_scatters():
    """Dot: local f32[8,4] x f32[4,32], then one reduce-scatter to rows [0,2,4,6][pid]."""
    spmd = check_equivalent(module("""
  a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  b = f32[16,32] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT d = f32[8,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[4,1]<=[4]}"""), 4)
    assert collectives(spmd) == [("reduce-scatter", [[0, 1, 2, 3]], (0,))]
    assert str(spmd.entry.root.shape) == "f32[2,32]"


def test_dot_uneven_contracting_masks_both_operands():
    spmd = check_equivalent(module("""
  a = f32[5,13] parameter(0), sharding={devices=[1,4]<=[4]}
  b = f32[13,3] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT d = f32[5,3] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={replicated}"""), 4, rtol=1e-4)
    assert opcodes(spmd).count("select") == 2


@pytest.mark.parametrize("size, n, selects", [
    (13, 4, 1),     # tiles of 4: every tile starts inside the dim; the whole weight pads with 0
    (9, 4, 2),      # tiles of 3: the fourth is wholly padding, given a clamped window of data
])
def test_dot_does_not_mask_a_replicated_operand_resharded_with_zero_padding(size, n, selects):
    spmd = check_equivalent(module(f"""
  a = f32[5,{size}] parameter(0), sharding={{devices=[1,{n}]<=[{n}]}}
  b = f32[{size},3] parameter(1), sharding={{replicated}}
  c = f32[{size},3] copy(b), sharding={{devices=[{n},1]<=[{n}]}}
  ROOT d = f32[5,3] dot(a, c), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}},
    sharding={{replicated}}"""), n, rtol=1e-4)
    assert opcodes(spmd).count("select") == selects


def test_dot_non_contracting_partitioned_output_follows_the_lhs():
    spmd = check_equivalent(module("""
  a = f32[12,8] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[8,6] parameter(1)
  ROOT d = f32[12,6] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[4,1]<=[4]}"""), 4)
    assert collectives(spmd) == []


def test_megatron_mlp_on_a_2x2_mesh():
    """Dot worked example: the first dot needs no communication, the second one all-reduce of
    f32[4,16] over {{0,1},{2,3}}."""
    spmd = check_equivalent(module("""
  x = f32[8,16] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  w1 = f32[16,32] parameter(1), sharding={devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}
  h = f32[8,32] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[2,2]<=[4]}
  w2 = f32[32,16] parameter(2), sharding={devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}
  ROOT o = f32[8,16] dot(h, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}"""), 4, rtol=1e-4)
    assert collectives(spmd) == [("all-reduce", [[0, 1], [2, 3]])]
    (reduce,) = [i for i in spmd.entry.instructions if i.opcode == "all-reduce"]
    assert str(reduce.shape) == "f32[4,16]"


def test_dot_partial_contracting_sums_over_the_devices_with_different_halves():
    """XLA's DotPartialContracting (docs/design/partitioning.md#dot): all-reduce(dot(param0,
    param1)) over {{0,2},{1,3}}."""
    spmd = check_equivalent(module("""
  a = f32[24,100] parameter(0), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  b = f32[32,100] parameter(1), sharding={devices=[1,2,2]<=[4] last_tile_dim_replicate}
  ROOT d = f32[24,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1},
    sharding={replicated}"""), 4, rtol=1e-4)
    assert collectives(spmd) == [("all-reduce", [[0, 2], [1, 3]])]
    assert [o for o in opcodes(spmd) if o not in ("parameter",)] == ["dot", "all-reduce"]


def test_dot_batch_and_contracting_on_a_2x2_mesh():
    spmd = check_equivalent(module("""
  a = f32[4,6,8] parameter(0), sharding={devices=[2,1,2]<=[4]}
  b = f32[4,8,5] parameter(1), sharding={devices=[2,2,1]<=[4]}
  ROOT d = f32[4,6,5] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
    lhs_contracting_dims={2}, rhs_contracting_dims={1}, sharding={devices=[2,1,1,2]<=[4] last_tile_dim_replicate}"""),
        4, rtol=1e-4)
    assert collectives(spmd) == [("all-reduce", [[0, 1], [2, 3]])]


# ---- iota, constant, tuple, custom-call, single device ---------------------------------------------

def test_iota_along_an_uneven_tiled_dim_adds_the_partition_offset():
    spmd = check_equivalent(module("""
  ROOT i = s32[10,3] iota(), iota_dimension=0, sharding={devices=[4,1]<=[4]}"""), 4, inputs=[])
    assert collectives(spmd) == [] and "partition-id" in opcodes(spmd)


def test_non_uniform_constant_is_sliced_from_the_whole_literal():
    values = np.arange(15, dtype=np.float32).reshape(5, 3)
    literal = "{" + ",".join("{" + ",".join(str(v) for v in row) + "}" for row in values) + "}"
    spmd = check_equivalent(module(f"""
  c = f32[5,3] constant({literal}), sharding={{devices=[4,1]<=[4]}}
  ROOT n = f32[5,3] negate(c), sharding={{devices=[4,1]<=[4]}}"""), 4, inputs=[])
    assert collectives(spmd) == []
    assert "dynamic-slice" in opcodes(spmd)


def test_splat_constant_is_built_shard_shaped():
    spmd = partition(module("""
  c = f32[8,6] constant({{1,1,1,1,1,1},{1,1,1,1,1,1},{1,1,1,1,1,1},{1,1,1,1,1,1},{1,1,1,1,1,1},{1,1,1,1,1,1},{1,1,1,1,1,1},{1,1,1,1,1,1}}), sharding={devices=[2,2]<=[4]}
  ROOT n = f32[8,6] negate(c), sharding={devices=[2,2]<=[4]}"""), 4)
    (constant,) = [i for i in spmd.entry.instructions if i.opcode == "constant"]
    assert str(constant.shape) == "f32[4,3]"


def test_tuple_and_get_tuple_element_keep_leaf_shardings():
    spmd = check_equivalent(module("""
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  y = f32[6] parameter(1), sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  t = (f32[8,4], f32[6]) tuple(x, y), sharding={{devices=[4,1]<=[4]}, {devices=[2,2]<=[4] last_tile_dim_replicate}}
  a = f32[8,4] get-tuple-element(t), index=0, sharding={devices=[4,1]<=[4]}
  b = f32[6] get-tuple-element(t), index=1, sharding={replicated}
  ROOT r = (f32[8,4], f32[6]) tuple(a, b), sharding={{devices=[1,4]<=[4]}, {replicated}}"""), 4)
    assert sorted(c[0] for c in collectives(spmd)) == ["all-gather", "all-to-all"]


def test_sharding_custom_call_is_a_reshard():
    spmd = check_equivalent(module("""
  x = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}
  c = f32[8,8] custom-call(x), custom_call_target="Sharding", sharding={devices=[1,4]<=[4]}
  ROOT n = f32[8,8] negate(c), sharding={devices=[1,4]<=[4]}"""), 4)
    assert [c[0] for c in collectives(spmd)] == ["all-to-all"]


def test_single_device_values():
    """XLA's SingleDeviceToReplicated: select on partition-id and an all-reduce (of a
    parameter: XLA's test reshards a constant, which gspmdc materialises where it is needed
    without any collective)."""
    spmd = check_equivalent(module("""
  p = s32[2,3] parameter(0), sharding={maximal device=0}
  ROOT r = s32[2,3] copy(p), sharding={replicated}"""), 2)
    assert collectives(spmd) == [("all-reduce", [[0, 1]])]
    spmd = check_equivalent(module("""
  c = s32[2,3] constant({{1,1,1},{1,1,1}}), sharding={maximal device=0}
  ROOT r = s32[2,3] copy(c), sharding={replicated}"""), 2, inputs=[])
    assert collectives(spmd) == []


# ---- pass-through dims ----------------------------------------------------------------------------

PASS_THROUGH = {
    "sort": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT s = f32[10,6] sort(x), dimensions={1}, is_stable=true, to_apply=less,
    sharding={devices=[4,1]<=[4]}""",
    "concatenate": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  y = f32[10,3] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT c = f32[10,9] concatenate(x, y), dimensions={1}, sharding={devices=[4,1]<=[4]}""",
    "slice": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT s = f32[10,2] slice(x), slice={[0:10], [1:5:2]}, sharding={devices=[4,1]<=[4]}""",
    "pad": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(1.5)
  ROOT p = f32[10,9] pad(x, z), padding=0_0x1_2, sharding={devices=[4,1]<=[4]}""",
    "reverse": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT r = f32[10,6] reverse(x), dimensions={1}, sharding={devices=[4,1]<=[4]}""",
    "reduce-window": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0)
  ROOT c = f32[10,6] reduce-window(x, z), window={size=1x6 pad=0_0x5_0}, to_apply=add,
    sharding={devices=[4,1]<=[4]}""",
    "dynamic-slice": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  i = s32[] parameter(1)
  z = s32[] constant(0)
  ROOT d = f32[10,3] dynamic-slice(x, z, i), dynamic_slice_sizes={10,3},
    sharding={devices=[4,1]<=[4]}""",
    "dynamic-update-slice": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  u = f32[10,2] parameter(1), sharding={devices=[4,1]<=[4]}
  i = s32[] parameter(2)
  z = s32[] constant(0)
  ROOT d = f32[10,6] dynamic-update-slice(x, u, z, i), sharding={devices=[4,1]<=[4]}""",
    "topk": """
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  t = (f32[10,2], s32[10,2]) custom-call(x), custom_call_target="TopK",
    sharding={{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}
  ROOT v = f32[10,2] get-tuple-element(t), index=0, sharding={devices=[4,1]<=[4]}""",
    "convolution": """
  x = f32[10,5,3] parameter(0), sharding={devices=[4,1,1]<=[4]}
  k = f32[3,3,8] parameter(1)
  ROOT c = f32[10,3,8] convolution(x, k), window={size=3}, dim_labels=b0f_0io->b0f,
    sharding={devices=[4,1,1]<=[4]}""",
}


@pytest.mark.parametrize("op", sorted(PASS_THROUGH))
def test_ops_work_locally_along_their_pass_through_dims(op):
    """Rows split 4 ways over 10 (uneven); each op acts along other dims only: no
    communication."""
    text = module(PASS_THROUGH[op]).replace("ENTRY e", LESS + "\nENTRY e")
    spmd = check_equivalent(text, 4, rtol=1e-4)
    assert collectives(spmd) == []


LESS = """less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LT
}
"""


def test_a_tiled_reversed_dim_swaps_shards():
    """The operand takes the result's tiling in reversed device order: one permute, no
    gather."""
    spmd = check_equivalent(module("""
  x = f32[8,6] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT r = f32[8,6] reverse(x), dimensions={0}, sharding={devices=[2,1]<=[2]}"""), 2)
    assert collectives(spmd) == [("collective-permute", [(0, 1), (1, 0)])]


def test_ops_without_a_rule_run_replicated():
    spmd = check_equivalent(module("""
  x = f32[8,6] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT h = f32[8,6] custom-call(x), custom_call_target="LayoutConstraint", sharding={devices=[2,1]<=[2]}"""),
        2)
    (gather,) = [i for i in spmd.entry.instructions if i.opcode == "all-gather"]
    assert gather.attr("metadata").get("spmd_reason") == \
        "no partitioning rule for custom-call: it runs on replicated operands"


# ---- clean rejections ------------------------------------------------------------------------------

def test_partition_dependent_ops_are_rejected():
    with pytest.raises(UnsupportedError, match="rng-get-and-update-state"):
        partition(module("""
  ROOT r = u64[2] rng-get-and-update-state(), delta=4"""), 2)
    cross_partition = module("""
  x = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  ROOT r = f32[8] all-reduce(x), channel_id=1, replica_groups={}, use_global_device_ids=true,
    to_apply=add, sharding={devices=[2]<=[2]}""")
    # without a recorded stage, such a module is taken for a partitioned one
    with pytest.raises(GspmdcError, match="already partitioned"):
        partition(cross_partition, 2)
    with pytest.raises(UnsupportedError, match="across partitions"):
        partition(cross_partition.replace(
            "HloModule m", 'HloModule m, frontend_attributes={gspmdc.stage="global"}'), 2)


def test_a_cross_replica_all_reduce_is_elementwise():
    """No channel_id: it sums over the replicas (one here), partition by partition (XLA's
    HandleAllReduce); it stays in the program and moves nothing between partitions."""
    spmd = check_equivalent(module("""
  x = f32[8,5] parameter(0), sharding={devices=[2,1]<=[2]}
  r = f32[8,5] all-reduce(x), to_apply=add, sharding={devices=[2,1]<=[2]}
  ROOT n = f32[8,5] negate(r), sharding={devices=[2,1]<=[2]}"""), 2)
    (reduce,) = [i for i in spmd.entry.instructions if i.opcode in COLLECTIVES]
    assert reduce.opcode == "all-reduce" and reduce.attr("channel_id") is None
    assert str(reduce.shape) == "f32[4,5]"


def test_a_cross_replica_all_reduce_inside_a_fusion_runs_with_it():
    # found by fuzzing: a fusion (run unpartitioned by the default action) whose computation
    # holds a cross-replica all-reduce was refused as partition-dependent
    text = module("""
  x = f32[8,5] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT f = f32[8,5] fusion(x), kind=kLoop, calls=fused, sharding={devices=[2,1]<=[2]}""").replace(
        "ENTRY", """fused {
  p = f32[8,5] parameter(0)
  r = f32[8,5] all-reduce(p), to_apply=add
  ROOT n = f32[8,5] negate(r)
}

ENTRY""")
    check_equivalent(text, 2)


def test_resharding_a_manual_value_is_rejected():
    with pytest.raises(UnsupportedError, match="manual"):
        partition(module("""
  x = f32[4] parameter(0), sharding={manual}
  ROOT n = f32[4] negate(x), sharding={replicated}"""), 2)


def test_shardings_for_other_device_counts_are_rejected():
    with pytest.raises(ShardingError, match="x"):
        partition(module("""
  ROOT x = f32[8] parameter(0), sharding={devices=[8]<=[8]}"""), 4)


def test_bitcast_convert_of_one_width_is_elementwise():
    spmd = check_equivalent(module("""
  x = f32[10,4] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT b = s32[10,4] bitcast-convert(x), sharding={devices=[4,1]<=[4]}"""), 4)
    assert collectives(spmd) == []
    spmd = check_equivalent(module("""
  x = f32[10,4] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT b = u8[10,4,4] bitcast-convert(x), sharding={devices=[4,1,1]<=[4]}"""), 4)
    assert collectives(spmd) == []          # the width change adds an untiled trailing dim


def test_shard_groups_are_hints_not_layouts():
    spmd = check_equivalent(module("""
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4] shard_as 0}
  ROOT n = f32[8,4] negate(x), sharding={devices=[4,1]<=[4] shard_as 0}"""), 4)
    assert opcodes(spmd) == ["parameter", "negate"]


def test_unreduced_annotations_in_the_middle_of_a_program():
    """A value annotated as partial sums (one member per group keeps the value, the others
    zeros): a user needing the whole value takes it from before that reshard, for free."""
    spmd = check_equivalent(module("""
  x = f32[8,4] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  u = f32[8,4] copy(x), sharding={devices=[2,1,2]<=[4] last_tile_dims={unreduced}}
  ROOT n = f32[8,4] negate(u), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}"""), 4)
    assert opcodes(spmd) == ["parameter", "copy", "negate"]


def test_tuple_copy_keeps_each_leafs_sharding():
    """`copy` of a tuple copies leaf by leaf: no leaf is gathered (found crashing on XLA's
    GatherParallelDimFromOutsideWhilePositive)."""
    text = """HloModule m, num_partitions=4
ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[4,8] parameter(1), sharding={devices=[1,4]<=[4]}
  t = (f32[8,4], f32[4,8]) tuple(a, b), sharding={{devices=[4,1]<=[4]}, {devices=[1,4]<=[4]}}
  c = (f32[8,4], f32[4,8]) copy(t), sharding={{devices=[4,1]<=[4]}, {devices=[1,4]<=[4]}}
  x = f32[8,4] get-tuple-element(c), index=0, sharding={devices=[4,1]<=[4]}
  y = f32[4,8] get-tuple-element(c), index=1, sharding={devices=[1,4]<=[4]}
  s = f32[4,8] transpose(x), dimensions={1,0}, sharding={devices=[1,4]<=[4]}
  ROOT r = f32[4,8] add(s, y), sharding={devices=[1,4]<=[4]}
}
"""
    spmd = check_equivalent(text, 4)
    assert collectives(spmd) == []


@pytest.mark.parametrize("text", [
    # narrow to wide drops the trailing dim of 2: the leading dims keep their tiling
    """HloModule m, num_partitions=4
ENTRY e {
  p0 = s32[6,2] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT r = f64[6] bitcast-convert(p0), sharding={devices=[4]<=[4]}
}
""",
    # XLA's BitcastConvertInputRankGreaterThanOutputRank: the trailing dim is tiled: gathered
    """HloModule m, num_partitions=4
ENTRY e {
  p0 = s32[4,2] parameter(0), sharding={devices=[2,2]<=[4]}
  ROOT r = f64[4] bitcast-convert(p0), sharding={devices=[2,2]<=[2,2]T(1,0) last_tile_dim_replicate}
}
""",
    # wide to narrow adds a trailing dim of 4
    """HloModule m, num_partitions=2
ENTRY e {
  p0 = f32[5,3] parameter(0), sharding={devices=[1,2]<=[2]}
  ROOT r = u8[5,3,4] bitcast-convert(p0), sharding={devices=[1,2,1]<=[2]}
}
""",
])
def test_width_changing_bitcast_convert_keeps_shared_dims_tiled(text):
    spmd = check_equivalent(text, 4 if "num_partitions=4" in text else 2,
                            inputs=None)
    gathers = [c for c in collectives(spmd) if c[0] == "all-gather"]
    if "[4,2] parameter" in text:
        assert gathers and all(g[2] == (1,) for g in gathers)   # only the trailing dim
    else:
        assert collectives(spmd) == []
