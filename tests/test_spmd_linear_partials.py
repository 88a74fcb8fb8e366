"""Linear elementwise ops (`copy`, `negate`, `add`, `subtract`) on partial sums: an op whose
operands are `unreduced` computes on the partial values and its result holds the partial sums
of its result, so nothing is reduced before it (XLA's partitioner likewise leaves an unreduced
dot's copy unreduced, with no all-reduce). Bytes are worked out by hand from the cost model's
formulas (all-reduce over G devices: 2(G-1)/G of the operand; reduce-scatter (G-1)/G); values
against the unpartitioned program, the partial sums of an unreduced result summed."""
from __future__ import annotations

import pytest

from spmd_partition_helpers import check_equivalent, collectives, sent_bytes

DOT = """HloModule m, num_partitions={n}

ENTRY main {{
  a = f32[4,16] parameter(0), sharding={{devices=[1,{n}]<=[{n}]}}
  b = f32[16,8] parameter(1), sharding={{devices=[{n},1]<=[{n}]}}
  c = f32[4,16] parameter(2), sharding={{devices=[1,{n}]<=[{n}]}}
  d = f32[4,8] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{unreduced}}
  e = f32[4,8] dot(c, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{unreduced}}
  {body}
}}
"""

KEPT = {
    "copy-in-tuple": "x = f32[4,8] copy(d), sharding={unreduced}\n"
                     "  t = (f32[4,8]) tuple(x), sharding={{unreduced}}\n"
                     "  ROOT g = f32[4,8] get-tuple-element(t), index=0, sharding={unreduced}",
    "negate-negate": "x = f32[4,8] negate(d), sharding={unreduced}\n"
                     "  ROOT y = f32[4,8] negate(x), sharding={unreduced}",
    "add-negate": "x = f32[4,8] add(d, e), sharding={unreduced}\n"
                  "  ROOT y = f32[4,8] negate(x), sharding={unreduced}",
}


@pytest.mark.parametrize("body", KEPT.values(), ids=KEPT.keys())
def test_linear_ops_keep_partial_sums_without_collectives(body):
    """Every value from the dots to the root is `unreduced`: the linear ops between run on the
    partial values; no collective at all (an all-reduce of the 128 B value per op before)."""
    spmd = check_equivalent(DOT.format(n=2, body=body), 2)
    assert collectives(spmd) == []


def test_a_difference_of_partial_sums_is_reduced_once():
    """d - e, both partial over 4 devices, needed in 2 row tiles held twice: the difference of
    the partials reduce-scattered into row tiles over pairs of devices (half of the 128 B: 64 B
    each), then the 64 B row tiles summed over the other pairs (all-reduce over 2: 64 B): 128 B,
    where all-reducing d and e over the 4 devices before the subtract sent 2 x 192 B."""
    body = "s = f32[4,8] subtract(d, e), sharding={unreduced}\n" \
           "  ROOT r = f32[4,8] copy(s), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    spmd = check_equivalent(DOT.format(n=4, body=body), 4)
    assert [c[0] for c in collectives(spmd)] == ["reduce-scatter", "all-reduce"]
    assert sent_bytes(spmd, 4) == 128


def test_a_sum_with_a_replicated_operand_reduces_the_partials_first():
    """add(d, p) with p replicated is not a sum of partial sums (p would count on every
    device): the partials of d are reduced first, and the values are right."""
    body = "p = f32[4,8] parameter(3), sharding={replicated}\n" \
           "  x = f32[4,8] add(d, p), sharding={replicated}\n" \
           "  ROOT y = f32[4,8] negate(x), sharding={replicated}"
    spmd = check_equivalent(DOT.format(n=2, body=body), 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
