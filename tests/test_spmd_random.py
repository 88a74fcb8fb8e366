"""Random ops under partitioning: `rng-bit-generator` and `rng` give the unpartitioned values bit
for bit whatever the sharding (tiled, uneven, partially replicated, on one device), their new
state included, and later random ops stay in step; the partitioned rng-bit-generator still
reproduces XLA's CPU values."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_text import hlo_module as module
from same_bits import assert_same_bits
from spmd_partition_helpers import collectives, partition, reference, run_global
from test_kernels_random import KEY, XLA_GOLDEN


def run_both(text: str, n: int, inputs: list):
    spmd = partition(text, n)
    got = run_global(spmd, inputs, n)
    assert_same_bits(got, reference(text, inputs))
    return spmd


SHARDINGS = [
    (2, "{devices=[2,1]<=[2]}"),
    (3, "{devices=[3,1]<=[3]}"),                                   # uneven rows
    (3, "{devices=[1,3]<=[3]}"),                                   # uneven columns
    (4, "{devices=[2,2]<=[4]}"),
    (8, "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    (8, "{devices=[4,2]<=[2,4]T(1,0)}"),
    (8, "{devices=[1,8]<=[8]}"),                                   # uneven, some shards empty
    (4, "{maximal device=2}"),
    (4, "{replicated}"),
]


@pytest.mark.parametrize("algorithm, element_type", [
    ("rng_philox", "u32"), ("rng_default", "u64"), ("rng_philox", "u8"),
    ("rng_three_fry", "u32"), ("rng_three_fry", "u16"), ("rng_three_fry", "u64"),
])
@pytest.mark.parametrize("n, sharding", SHARDINGS)
def test_rng_bit_generator_shards_equal_the_unpartitioned_bits(n, sharding, algorithm,
                                                               element_type):
    text = module(f"""
  s = u64[2] parameter(0), sharding={{replicated}}
  r = (u64[2], {element_type}[5,7]) rng-bit-generator(s), algorithm={algorithm}, sharding={{{{replicated}}, {sharding}}}
  b = {element_type}[5,7] get-tuple-element(r), index=1, sharding={sharding}
  t = u64[2] get-tuple-element(r), index=0, sharding={{replicated}}
  r2 = (u64[2], {element_type}[5,7]) rng-bit-generator(t), algorithm={algorithm}, sharding={{{{replicated}}, {sharding}}}
  b2 = {element_type}[5,7] get-tuple-element(r2), index=1, sharding={sharding}
  t2 = u64[2] get-tuple-element(r2), index=0, sharding={{replicated}}
  ROOT o = (u64[2], {element_type}[5,7], {element_type}[5,7]) tuple(t2, b, b2), sharding={{{{replicated}}, {sharding}, {sharding}}}""")
    spmd = run_both(text, n, [np.array([KEY, 2**64 - 3], np.uint64)])
    assert collectives(spmd) == []


@pytest.mark.parametrize("algorithm, state, element_type, dims, new_state, bits",
                         [g for g in XLA_GOLDEN if len(g[3]) == 2])
def test_partitioned_rng_bit_generator_reproduces_xla(algorithm, state, element_type, dims,
                                                      new_state, bits):
    shape = f"{element_type}[{dims[0]},{dims[1]}]"
    text = module(f"""
  s = u64[2] parameter(0), sharding={{replicated}}
  ROOT r = (u64[2], {shape}) rng-bit-generator(s), algorithm={algorithm}, sharding={{{{replicated}}, {{devices=[1,3]<=[3]}}}}""")
    got_state, got_bits = run_global(partition(text, 3), [np.array(state, np.uint64)], 3)
    np.testing.assert_array_equal(got_state, np.array(new_state, np.uint64))
    np.testing.assert_array_equal(got_bits, np.array(bits, got_bits.dtype))


@pytest.mark.parametrize("distribution, element_type, low, high", [
    ("rng_uniform", "f32", "f32[] constant(-2)", "f32[] constant(3)"),
    ("rng_uniform", "s32", "s32[] constant(-5)", "s32[] constant(1000)"),
    ("rng_normal", "f32", "f32[] constant(1)", "f32[] constant(2)"),
    ("rng_normal", "bf16", "bf16[] constant(0)", "bf16[] constant(1)"),
])
@pytest.mark.parametrize("n, sharding", SHARDINGS)
def test_rng_shards_equal_the_unpartitioned_values(n, sharding, distribution, element_type, low,
                                                   high):
    """Three draws in a row, the middle one unused: each partition advances the global state by
    whole draws, so the last one is in step too."""
    text = module(f"""
  a = {low}, sharding={{replicated}}
  b = {high}, sharding={{replicated}}
  r1 = {element_type}[5,7] rng(a, b), distribution={distribution}, sharding={sharding}
  unused = {element_type}[9] rng(a, b), distribution={distribution}, sharding={{devices=[{n}]<=[{n}]}}
  r3 = {element_type}[5,7] rng(a, b), distribution={distribution}, sharding={sharding}
  ROOT o = ({element_type}[5,7], {element_type}[5,7]) tuple(r1, r3), sharding={{{sharding}, {sharding}}}""")
    spmd = run_both(text, n, [])
    assert collectives(spmd) == []


def test_rng_draws_differ_between_elements_and_calls():
    """The check above is not vacuous: shards hold distinct values, and calls differ."""
    text = module("""
  a = f32[] constant(0)
  b = f32[] constant(1)
  r1 = f32[6] rng(a, b), distribution=rng_uniform, sharding={devices=[3]<=[3]}
  r2 = f32[6] rng(a, b), distribution=rng_uniform, sharding={devices=[3]<=[3]}
  ROOT o = (f32[6], f32[6]) tuple(r1, r2), sharding={{devices=[3]<=[3]}, {devices=[3]<=[3]}}""")
    first, second = run_global(partition(text, 3), [], 3)
    assert len(set(first.tolist())) == 6 and not np.array_equal(first, second)


def test_rng_in_a_partitioned_loop_body_stays_in_step():
    """Each iteration draws a tiled rng inside the partitioned while body: every partition
    advances the global state by the whole draw, iteration after iteration."""
    text = """HloModule m

cond {
  p = (s32[], f32[9,6]) parameter(0)
  c = s32[] get-tuple-element(p), index=0
  k = s32[] constant(3)
  ROOT lt = pred[] compare(c, k), direction=LT
}

body {
  p = (s32[], f32[9,6]) parameter(0), sharding={{replicated}, {devices=[4,1]<=[4]}}
  c = s32[] get-tuple-element(p), index=0, sharding={replicated}
  x = f32[9,6] get-tuple-element(p), index=1, sharding={devices=[4,1]<=[4]}
  a = f32[] constant(0)
  b = f32[] constant(1)
  r = f32[9,6] rng(a, b), distribution=rng_normal, sharding={devices=[4,1]<=[4]}
  y = f32[9,6] add(x, r), sharding={devices=[4,1]<=[4]}
  one = s32[] constant(1)
  c1 = s32[] add(c, one), sharding={replicated}
  ROOT t = (s32[], f32[9,6]) tuple(c1, y), sharding={{replicated}, {devices=[4,1]<=[4]}}
}

ENTRY e {
  z = s32[] constant(0), sharding={replicated}
  x = f32[9,6] parameter(0), sharding={devices=[4,1]<=[4]}
  t = (s32[], f32[9,6]) tuple(z, x), sharding={{replicated}, {devices=[4,1]<=[4]}}
  w = (s32[], f32[9,6]) while(t), condition=cond, body=body, sharding={{replicated}, {devices=[4,1]<=[4]}}
  ROOT o = f32[9,6] get-tuple-element(w), index=1, sharding={devices=[4,1]<=[4]}
}
"""
    run_both(text, 4, [np.zeros((9, 6), np.float32)])
