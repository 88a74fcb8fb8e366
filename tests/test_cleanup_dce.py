"""Dead-code elimination after partitioning (`passes/spmd/cleanup.py`): what the root does not
use goes, except parameters and ops with effects; checked by hand on small computations and on
the collectives of a partitioned program whose only communication feeds a dead value."""
from gspmdc.ir.parser import parse_module
from gspmdc.passes.spmd.cleanup import eliminate_dead_code

from hlo_text import hlo_module
from spmd_partition_helpers import check_equivalent, collectives, partition


def _dce(body: str) -> list[str]:
    comp = parse_module(hlo_module(body), "<test>").entry
    eliminate_dead_code(comp)
    return [i.name for i in comp.instructions]


def test_unused_values_go_parameters_and_effects_stay():
    assert _dce("""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  s = u64[2] parameter(2)
  dead = f32[4] exponential(q)
  bits = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_three_fry
  state = u64[2] get-tuple-element(bits), index=0
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  drawn = f32[4] rng(lo, hi), distribution=rng_uniform
  ROOT r = f32[4] negate(p)""") == ["p", "q", "s", "lo", "hi", "drawn", "r"]


def test_an_unused_rng_bit_generator_sends_nothing():
    # the state is split over 4 devices and the generator needs it whole: an all-gather (or a
    # masked all-reduce) if the generator stayed; its bits are never read
    text = hlo_module("""
  s = u64[2] parameter(0), sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  x = f32[8] parameter(1), sharding={devices=[4]<=[4]}
  bits = (u64[2], u32[8]) rng-bit-generator(s), algorithm=rng_philox
  state = u64[2] get-tuple-element(bits), index=0
  ROOT y = f32[8] negate(x), sharding={devices=[4]<=[4]}""", header=", num_partitions=4")
    spmd = partition(text, 4)
    assert collectives(spmd) == []
    assert "rng-bit-generator" not in [i.opcode for i in spmd.entry.instructions]
    check_equivalent(text, 4)


def test_a_used_rng_bit_generator_stays_and_gives_the_unpartitioned_bits():
    text = hlo_module("""
  s = u64[2] parameter(0), sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  bits = (u64[2], u32[8]) rng-bit-generator(s), algorithm=rng_philox
  ROOT b = u32[8] get-tuple-element(bits), index=1, sharding={devices=[4]<=[4]}""",
                      header=", num_partitions=4")
    spmd = partition(text, 4)
    assert collectives(spmd)            # the state is gathered for the generator
    check_equivalent(text, 4)
