"""Resharding: every source/target pair of a set of shardings on a 2x2 and a 2x4 mesh (tiled on
either dim or both, in both device orders, partially replicated, replicated, single-device),
on even and uneven shapes, reproduces the value exactly; and the hand-checked table of reference
docs/design/partitioning.md#worked-reshard-table (plus 2x4 cases) emits exactly the collectives
worked out by hand."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from gspmdc.passes.spmd.reshard_plan import plan_reshard, plan_staged
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape

from spmd_partition_helpers import collectives, opcodes, partition, run_global


def mesh_shardings(rows: int, cols: int) -> list[str]:
    """Shardings of a rank-2 array on a rows x cols mesh (devices row-major)."""
    n = rows * cols
    found = ["{replicated}", "{maximal device=1}"]
    for a, b in {(rows, cols), (cols, rows), (n, 1), (1, n)}:
        found.append(f"{{devices=[{a},{b}]<=[{n}]}}")
        found.append(f"{{devices=[{a},{b}]<=[{b},{a}]T(1,0)}}")
    for k in {rows, cols}:
        r = n // k
        found.append(f"{{devices=[{k},1,{r}]<=[{n}] last_tile_dim_replicate}}")
        found.append(f"{{devices=[1,{k},{r}]<=[{n}] last_tile_dim_replicate}}")
        found.append(f"{{devices=[{k},1,{r}]<=[{r},{k}]T(1,0) last_tile_dim_replicate}}")
        found.append(f"{{devices=[1,{k},{r}]<=[{r},{k}]T(1,0) last_tile_dim_replicate}}")
    return sorted(set(found))


def all_pairs_module(shape: tuple[int, int], shardings: list[str]) -> str:
    """One parameter per source sharding; the root tuple holds a copy of each parameter in each
    target sharding."""
    s = f"s32[{shape[0]},{shape[1]}]"
    lines = [f"  p{i} = {s} parameter({i}), sharding={a}" for i, a in enumerate(shardings)]
    copies, root_shardings = [], []
    for (i, _), (j, b) in itertools.product(enumerate(shardings), repeat=2):
        lines.append(f"  c{i}_{j} = {s} copy(p{i}), sharding={b}")
        copies.append(f"c{i}_{j}")
        root_shardings.append(b)
    tuple_shape = "(" + ", ".join([s] * len(copies)) + ")"
    lines.append(f"  ROOT t = {tuple_shape} tuple({', '.join(copies)}), "
                 f"sharding={{{', '.join(root_shardings)}}}")
    return "HloModule pairs\n\nENTRY e {\n" + "\n".join(lines) + "\n}\n"


@pytest.mark.parametrize("mesh", [(2, 2), (2, 4)])
@pytest.mark.parametrize("shape", [(8, 8), (10, 7), (3, 5)])
def test_every_pair_reproduces_the_value(mesh, shape):
    shardings = mesh_shardings(*mesh)
    n = mesh[0] * mesh[1]
    spmd = partition(all_pairs_module(shape, shardings), n)
    value = np.arange(shape[0] * shape[1], dtype=np.int32).reshape(shape)
    outputs = run_global(spmd, [value] * len(shardings), n)
    assert len(outputs) == len(shardings) ** 2
    for k, out in enumerate(outputs):
        a, b = shardings[k // len(shardings)], shardings[k % len(shardings)]
        np.testing.assert_array_equal(out, value, err_msg=f"{a} -> {b}")


def reshard(source: str, target: str, n: int, shape: str = "f32[10,8]"):
    text = (f"HloModule m\n\nENTRY e {{\n  x = {shape} parameter(0), sharding={source}\n"
            f"  ROOT c = {shape} copy(x), sharding={target}\n}}\n")
    return partition(text, n)


# (source, target, collectives worked out by hand) on 4 devices = a 2x2 mesh, f32[10,8]
TABLE_2X2 = [
    # replicated -> tiled: local dynamic-slices only
    ("{replicated}", "{devices=[2,2]<=[4]}", []),
    # tiled -> replicated: gather dim 1 within rows of the mesh, then dim 0 within columns
    ("{devices=[2,2]<=[4]}", "{replicated}",
     [("all-gather", [[0, 1], [2, 3]], (1,)), ("all-gather", [[0, 2], [1, 3]], (0,))]),
    ("{devices=[2,2]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     [("all-gather", [[0, 1], [2, 3]], (1,))]),
    ("{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[2,2]<=[4]}", []),
    # same tiles, transposed device order: tile idx moves from T[idx] to T'[idx]
    ("{devices=[2,2]<=[4]}", "{devices=[2,2]<=[2,2]T(1,0)}",
     [("collective-permute", [(0, 0), (1, 2), (2, 1), (3, 3)])]),
    # rows to columns: one all-to-all over everybody
    ("{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", [("all-to-all", [[0, 1, 2, 3]], (1,))]),
    # rows split over {0,1}|{2,3} (replicated within) to columns over {0,2}|{1,3}: devices 0 and 2
    # (rows 0-4 and 5-9) swap halves of their columns
    ("{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     "{devices=[1,2,2]<=[4] last_tile_dim_replicate}",
     [("all-to-all", [[0, 2], [1, 3]], (1,))]),
    # single device -> everybody: select on partition-id + all-reduce
    ("{maximal device=0}", "{replicated}", [("all-reduce", [[0, 1, 2, 3]])]),
    ("{maximal device=0}", "{maximal device=2}", [("collective-permute", [(0, 2)])]),
]

# on 8 devices = a 2x4 mesh, f32[8,16]
TABLE_2X4 = [
    ("{devices=[2,4]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
     [("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7]], (1,))]),
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[2,4]<=[8]}", []),
    # rows in 8 to a 2x4 grid: the minor row factor (4) moves to the columns in one all-to-all
    ("{devices=[8,1]<=[8]}", "{devices=[2,4]<=[8]}",
     [("all-to-all", [[0, 1, 2, 3], [4, 5, 6, 7]], (1,))]),
    # devices (x, y) -> (y, x) on the mesh
    ("{devices=[2,4]<=[8]}", "{devices=[2,4]<=[4,2]T(1,0)}",
     [("collective-permute", [(0, 0), (1, 2), (2, 4), (3, 6), (4, 1), (5, 3), (6, 5), (7, 7)])]),
    ("{devices=[1,4,2]<=[8] last_tile_dim_replicate}",
     "{devices=[4,1,2]<=[8] last_tile_dim_replicate}",
     [("all-to-all", [[0, 2, 4, 6], [1, 3, 5, 7]], (0,))]),
]


@pytest.mark.parametrize("source,target,expected", TABLE_2X2)
def test_hand_checked_table_2x2(source, target, expected):
    assert collectives(reshard(source, target, 4)) == expected


@pytest.mark.parametrize("source,target,expected", TABLE_2X4)
def test_hand_checked_table_2x4(source, target, expected):
    assert collectives(reshard(source, target, 8, "f32[8,16]")) == expected


def test_replicated_to_uneven_tiled_pads_before_slicing():
    """Partition-id tables: device 3's rows start at 9; without padding to 12 rows the dynamic-slice
    would clamp to row 7."""
    spmd = reshard("{replicated}", "{devices=[4,1]<=[4]}", 4)
    assert [o for o in opcodes(spmd) if o in ("pad", "dynamic-slice", "all-gather")] == \
        ["pad", "dynamic-slice", "dynamic-slice"]
    value = np.arange(80, dtype=np.float32).reshape(10, 8)
    np.testing.assert_array_equal(run_global(spmd, [value], 4), value)


def test_uneven_all_to_all_matches_the_reference_sequence():
    """All-to-all: f32[7,32,128] [1,2,1] -> [2,1,1]: local [7,16,128] padded to [8,16,128],
    reshaped to [2,4,16,128], exchanged, transposed, merged to [4,32,128]. The exchange of
    pieces only ties it here (device 1 lacks a full [4,16,128] of device 0's, 32768 B either
    way), so the staged plan stays. With 31 columns the staged plan (asked alone) is the same
    all-to-all of the padded halves, 32768 B from each device, but the pieces send only real
    elements, in two rounds so that neither travels at the other's size: device 1 sends rows
    0-3 of columns 16-30 ([4,15,128], 30720 B) to device 0, device 0 rows 4-6 of columns 0-15
    ([3,16,128], 24576 B) to device 1: 30720 B from the busiest device, 55296 over both
    instead of 65536, and the program takes the pieces."""
    s, t = "{devices=[1,2,1]<=[2]}", "{devices=[2,1,1]<=[2]}"
    spmd = reshard(s, t, 2, "f32[7,32,128]")
    shapes = [str(i.shape) for i in spmd.entry.instructions
              if i.opcode in ("pad", "reshape", "all-to-all", "transpose", "slice")]
    assert shapes == ["f32[8,16,128]", "f32[2,4,16,128]", "f32[2,4,16,128]", "f32[4,2,16,128]",
                      "f32[4,32,128]"]
    x = np.arange(7 * 32 * 128, dtype=np.float32).reshape(7, 32, 128)
    np.testing.assert_array_equal(run_global(spmd, [x], 2), x)
    shape = ArrayShape("f32", (7, 31, 128))
    staged = plan_staged(shape, parse_sharding(s), parse_sharding(t), 2)
    assert staged.collectives == ["all-to-all"] and (staged.cost, staged.total) == (32768, 65536)
    plan = plan_reshard(shape, parse_sharding(s), parse_sharding(t), 2)
    assert plan.collectives == ["collective-permute"] and (plan.cost, plan.total) == (30720, 55296)
    spmd = reshard(s, t, 2, "f32[7,31,128]")
    assert [c[1] for c in collectives(spmd)] == [[(1, 0)], [(0, 1)]]
    x = np.arange(7 * 31 * 128, dtype=np.float32).reshape(7, 31, 128)
    np.testing.assert_array_equal(run_global(spmd, [x], 2), x)


def test_partial_sums_reduce_scatter_when_the_target_is_tiled():
    shape = ArrayShape("f32", (8, 32))
    unreduced = parse_sharding("{unreduced}")
    plan = plan_reshard(shape, unreduced, parse_sharding("{devices=[4,1]<=[4]}"), 4)
    assert plan.collectives == ["reduce-scatter"]
    assert plan.cost == pytest.approx(3 / 4 * 8 * 32 * 4)
    plan = plan_reshard(shape, unreduced, parse_sharding("{replicated}"), 4)
    assert plan.collectives == ["all-reduce"]
    assert plan.cost == pytest.approx(2 * 3 / 4 * 8 * 32 * 4)


def test_reshard_cost_is_bytes_sent_per_device():
    """All-gather of 4 shards of f32[3,8]: each device sends its 96 bytes to 3 others."""
    plan = plan_reshard(ArrayShape("f32", (12, 8)), parse_sharding("{devices=[4,1]<=[4]}"),
                        parse_sharding("{replicated}"), 4)
    assert plan.collectives == ["all-gather"]
    assert plan.cost == 3 * 3 * 8 * 4


def test_replicated_to_partial_sums_keeps_one_addend_per_group():
    """Two annotations: the first turns the replicated value into partial sums (member 0 of each
    group keeps it, the others hold zeros), the second reduce-scatters them; any other addend
    than zero would show in the result."""
    text = """HloModule m

ENTRY e {
  x = f32[8,4] parameter(0)
  p = f32[8,4] custom-call(x), custom_call_target="Sharding", sharding={unreduced}
  ROOT t = f32[8,4] custom-call(p), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}
}
"""
    spmd = partition(text, 4)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter"]
    assert "select" in opcodes(spmd)
    value = np.arange(32, dtype=np.float32).reshape(8, 4)
    np.testing.assert_array_equal(run_global(spmd, [value], 4), value)


def test_plan_cost_counts_a_value_resharded_twice_the_same_way_once():
    """insert-reshards reshards `p` once for `concatenate(p, p)`: the plan's cost is one
    all-gather of p, not two."""
    from gspmdc import api
    from gspmdc.ir.sharding import HloSharding
    from gspmdc.passes.spmd.op_rules import OpPlan, PlanContext
    module = api.parse("""HloModule m
ENTRY e {
  p = f32[256] parameter(0), sharding={devices=[4]<=[4]}
  ROOT c = f32[512] concatenate(p, p), dimensions={0}, sharding={replicated}
}
""")
    concat = module.entry.root
    ctx = PlanContext(4)
    replicated = HloSharding.replicate()
    gather = ctx.cost(concat.operands[0].shape, concat.operands[0].sharding, replicated)
    assert gather > 0
    plan = OpPlan((replicated, replicated), replicated, "test")
    assert ctx.plan_cost(concat, plan) == gather


@pytest.mark.parametrize("shape", [(8, 8), (7, 5)])
def test_plan_figures_are_those_of_its_own_steps(shape):
    """A plan's `cost` (busiest device) and `total` (all devices) are the sums of its own steps'
    traffic, on the dims the steps work on (padded or not), for every pair of a 2x4 mesh's
    shardings (single-device sources too, whose plans start with a broadcast): the figures are
    carried from the choice between variants, not worked out again for the steps kept."""
    array = ArrayShape("f32", shape)
    shardings = [parse_sharding(s) for s in mesh_shardings(2, 4)]
    for source, target in itertools.product(shardings, repeat=2):
        plan = plan_reshard(array, source, target, 8)
        dims = plan.padded or shape
        traffic = [t for t in (step.traffic(dims, 4) for step in plan.steps) if t is not None]
        assert (plan.cost, plan.total) == (sum(t.max_sent for t in traffic),
                                           sum(t.total_sent for t in traffic)), \
            (source.to_text(False), target.to_text(False))


@pytest.mark.parametrize("source, target, moved", [
    ("{devices=[2,1,4]<=[8]}", "{replicated}", False),
    ("{devices=[2,2,2]<=[8]}", "{devices=[1,1,2,4]<=[8] last_tile_dim_replicate}", False),
    ("{devices=[2,4,1]<=[8]}", "{devices=[1,1,8]<=[8]}", True),
])
def test_dims_are_taken_last_to_first_only_where_all_to_alls_move_tiles(source, target, moved):
    """With two dims losing tiles, the planner also plans its all-to-alls taking those dims
    last to first. Where no pair of dims can trade tiles (every target here but the last one),
    the order is moot and such a variant would repeat one planned already: none is planned,
    every variant is distinct. Where tiles do move, the variants moving dim 1's tiles first are
    planned as before."""
    from gspmdc.passes.spmd.reshard_plan import AllToAll, _variants
    from gspmdc.passes.spmd.tiling import Tiling
    src, dst = (Tiling(parse_sharding(s), 3, 8) for s in (source, target))
    variants = _variants((16, 8, 32), src, dst)
    steps = [[(type(s).__name__, s.before.sharding, s.after.sharding) for s in v]
             for v in variants]
    assert all(a != b for a, b in itertools.combinations(steps, 2)) or moved
    firsts = [next((s.moves[0][0] for s in v if isinstance(s, AllToAll)), None) for v in variants]
    assert (1 in firsts) == moved and (0 in firsts) == moved
