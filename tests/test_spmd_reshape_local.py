"""A reshape runs locally on the shards exactly when `op_rules_data.local_reshape_ok` says so:
XLA's pairs (HandleReshape: equal tile counts, `ReshapeSharding` either way) are checked against a
brute-force map of the elements in every position of every device's padded shard, on random
shapes with dims of size 1 (cut in tiles or not) and uneven dims."""
from __future__ import annotations

from math import prod

import numpy as np
from hypothesis import assume, given, settings, strategies as st

from gspmdc.ir import sharding_algebra
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.sharding import HloSharding, TileAssignment
from gspmdc.passes.spmd.op_rules_data import local_reshape_ok
from fuzz.shardings import prime_factors
from hlo_text import hlo_module, reducer
from spmd_partition_helpers import COLLECTIVES, check_equivalent


def shard_elements(dims, sharding, device):
    """The flat index in the whole array of every position of `device`'s padded shard (row-major),
    -1 for padding: the device's tile is its position in T, and tile i of a dim of size S cut t
    ways holds elements i * ceil(S / t) + j, j < ceil(S / t), those below S."""
    where = np.argwhere(sharding.tile_assignment.array == device)[0][:len(dims)]
    sizes = [-(-d // t) for d, t in zip(dims, sharding.tile_counts)]
    index = np.meshgrid(*[i * s + np.arange(s) for i, s in zip(where, sizes)], indexing="ij")
    valid = np.logical_and.reduce([x < d for x, d in zip(index, dims)]) if dims else True
    flat = np.ravel_multi_index([np.minimum(x, d - 1) for x, d in zip(index, dims)], dims)
    return np.where(valid, flat, -1).ravel()


def reshapes_locally(source, target, a, b) -> bool:
    """Every element of every device's result shard is where the local reshape of its operand
    shard puts it."""
    for device in range(a.tile_assignment.num_devices):
        before = shard_elements(source, a, device)
        after = shard_elements(target, b, device)
        if before.size != after.size or np.any((after >= 0) & (before != after)):
            return False
    return True


@st.composite
def reshapes(draw):
    """(source dims, target dims, a sharding of the source): both shapes group the same factors
    into dims, with dims of size 1 inserted anywhere; any dim may be cut, size-1 dims too."""
    factors = draw(st.lists(st.sampled_from([2, 3, 4, 5, 6]), min_size=1, max_size=3))

    def shape():
        dims, i = [], 0
        while i < len(factors):
            k = draw(st.integers(1, len(factors) - i))
            dims.append(prod(factors[i:i + k]))
            i += k
        for _ in range(draw(st.integers(0, 2))):
            dims.insert(draw(st.integers(0, len(dims))), 1)
        return tuple(dims)

    source, target = shape(), shape()
    counts = [draw(st.sampled_from([1, 2] if d == 1 else [1, 2, 3, 4])) for d in source]
    assume(1 < prod(counts) <= 16)
    order = draw(st.permutations(range(prod(counts))))
    return source, target, HloSharding.tiled(
        TileAssignment.explicit(counts, order))


@settings(max_examples=300, deadline=None)
@given(reshapes())
def test_xlas_reshape_pairs_reshape_locally(case):
    source, target, a = case
    b = sharding_algebra.reshape_sharding(a, source, target)
    assume(b is not None and b.is_tiled and b.num_tiles == a.num_tiles)
    in_shape, out_shape = ArrayShape("f32", source), ArrayShape("f32", target)
    # the pair either way: (a, b) forward, and (b, a) for the reshape back, where b reshaped
    # backwards gives a
    assert local_reshape_ok(in_shape, out_shape, a, b)
    assert local_reshape_ok(out_shape, in_shape, b, a)
    assert reshapes_locally(source, target, a, b)
    assert reshapes_locally(target, source, b, a)


@settings(max_examples=300, deadline=None)
@given(reshapes(), st.data())
def test_a_local_reshape_is_right_whenever_allowed(case, data):
    """Any target sharding with the operand's tile count: allowed only where the shards
    correspond (most random ones do not)."""
    source, target, a = case
    counts = [1] * len(target)
    for p in prime_factors(a.num_tiles):
        counts[data.draw(st.integers(0, len(target) - 1))] *= p
    order = data.draw(st.permutations(range(a.num_tiles)))
    b = HloSharding.tiled(TileAssignment.explicit(counts, order))
    if local_reshape_ok(ArrayShape("f32", source), ArrayShape("f32", target), a, b):
        assert reshapes_locally(source, target, a, b)


def test_a_size_one_dim_cut_beside_a_kept_dim():
    # fuzz/11200001242 on: XLA reshapes s32[4,6,1] cut [1,2,2] locally to s32[1,4,6,1] cut
    # [1,1,2,2]; the size-1 dim's second tile holds padding on both sides
    a = HloSharding.iota_tiled([1, 2, 2])
    b = HloSharding.iota_tiled([1, 1, 2, 2])
    assert local_reshape_ok(ArrayShape("s32", (4, 6, 1)), ArrayShape("s32", (1, 4, 6, 1)), a, b)
    assert reshapes_locally((4, 6, 1), (1, 4, 6, 1), a, b)
    # the same tiles with the size-1 dim first: the devices holding data differ
    c = HloSharding.iota_tiled([2, 1, 2, 1])
    assert not local_reshape_ok(ArrayShape("s32", (4, 6, 1)), ArrayShape("s32", (1, 4, 6, 1)),
                                a, c)
    assert not reshapes_locally((4, 6, 1), (1, 4, 6, 1), a, c)


@settings(max_examples=25, deadline=None)
@given(reshapes())
def test_xlas_reshape_pairs_run_locally_and_right(case):
    """The partitioned program of a reshape between XLA's pair, and a sum over its result (which
    must not read the padding), on garbage-padded shards, against the unpartitioned program."""
    source, target, a = case
    b = sharding_algebra.reshape_sharding(a, source, target)
    assume(b is not None and b.is_tiled and b.num_tiles == a.num_tiles and source != target)
    dims = ",".join(str(d) for d in target)
    spmd = check_equivalent(hlo_module(f"""
  x = f32[{",".join(str(d) for d in source)}] parameter(0), sharding={a.to_text()}
  r = f32[{dims}] reshape(x), sharding={b.to_text()}
  z = f32[] constant(0)
  s = f32[] reduce(r, z), dimensions={{{",".join(str(d) for d in range(len(target)))}}},
    to_apply=add, sharding={{replicated}}
  ROOT t = (f32[{dims}], f32[]) tuple(r, s), sharding={{{b.to_text()}, {{replicated}}}}""",
                                        reducer("add")), a.tile_assignment.num_devices)
    # local: no collective reads the operand's shard (the sum may gather the result)
    assert not [i for i in spmd.entry.instructions if i.opcode in COLLECTIVES and
                i.operands[0].opcode == "parameter"]
