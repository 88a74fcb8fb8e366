"""Random kernels: Philox/ThreeFry against the Random123 known-answer vectors, rng-bit-generator
against values produced by XLA's CPU backend (jax 0.10.2, jax_enable_x64), the shard property of
Philox, and the distributions and state handling of rng / rng-get-and-update-state."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import Ident
from gspmdc.ir.module import Instruction
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.runtime.kernels import KERNELS
from gspmdc.runtime.kernels.random import philox4x32, philox_bits, threefry2x32

KEY = 0x9ABCDEF012345678


def words(*values):
    return tuple(np.array([v], np.uint32) for v in values)


@pytest.mark.parametrize("counter, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox4x32_10_known_answers(counter, key, expected):
    assert tuple(int(w[0]) for w in philox4x32(words(*counter), key)) == expected


@pytest.mark.parametrize("counter, key, expected", [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 2, (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
])
def test_threefry2x32_20_known_answers(counter, key, expected):
    assert tuple(int(w[0]) for w in threefry2x32(words(*counter), key)) == expected


def rbg(algorithm, state, element_type, dims):
    inst = Instruction("r", "rng-bit-generator",
                       TupleShape((ArrayShape("u64", (len(state),)), ArrayShape(element_type, dims))),
                       attrs={"algorithm": Ident(algorithm)})
    new_state, bits = KERNELS["rng-bit-generator"](inst, [np.array(state, np.uint64)], None)
    assert new_state.dtype == np.uint64 and bits.shape == tuple(dims)
    return [int(x) for x in new_state], bits


# (algorithm, state, type, dims) -> (new state, bits) as XLA's CPU backend computes them
XLA_GOLDEN = [
    ("rng_philox", [KEY, 0], "u32", (2, 3), [KEY, 2],
     [[4040540039, 3025188720, 1290591008], [4154193649, 417335301, 1086026735]]),
    ("rng_default", [KEY, 2**64 - 1], "u32", (2, 4), [KEY, 1],
     [[529953504, 751516774, 3962810239, 2353479234],
      [3938551892, 1342516440, 2991998059, 4187146839]]),
    ("rng_philox", [KEY, 5], "u64", (3,), [KEY, 7],
     [2465398011852076486, 9391883446478605305, 6338042173838555051]),
    ("rng_philox", [KEY, 5], "u8", (5,), [KEY, 7], [198, 109, 249, 59, 171]),
    ("rng_three_fry", [KEY, 0], "u32", (2, 3), [KEY, 3],
     [[3978822521, 420485989, 1580406350], [2696639427, 1647470385, 2031222694]]),
    ("rng_three_fry", [KEY, 0], "u32", (3, 5), [KEY, 9],
     [[3978822521, 2696639427, 420485989, 1647470385, 1580406350],
      [1132217343, 1821537050, 1011212531, 1707533992, 934438394],
      [187114590, 359805782, 3617977412, 4019623732, 4021049218]]),
    ("rng_three_fry", [KEY, 0], "u32", (5,), [KEY, 3],
     [3978822521, 2696639427, 420485989, 1647470385, 1580406350]),
    ("rng_three_fry", [KEY, 7], "u64", (2,), [KEY, 9],
     [17264152474783446084, 1391991624685082498]),
    ("rng_three_fry", [KEY, 0], "u16", (2, 3), [KEY, 3], [[889, 7013, 5710], [29635, 26417, 65446]]),
    ("rng_three_fry", [KEY, 0], "u32", (), [KEY, 1], 3978822521),
]


@pytest.mark.parametrize("algorithm, state, element_type, dims, new_state, bits", XLA_GOLDEN)
def test_rng_bit_generator_matches_xla(algorithm, state, element_type, dims, new_state, bits):
    got_state, got_bits = rbg(algorithm, state, element_type, dims)
    assert got_state == new_state
    np.testing.assert_array_equal(got_bits, np.array(bits, dtype=got_bits.dtype))


def test_philox_elements_depend_only_on_state_and_global_index():
    full = rbg("rng_philox", [KEY, 10], "u32", (4, 6))[1].reshape(-1)
    # the shard starting at element 8 = block 2: generate it alone from counter 10 + 2
    shard, _ = philox_bits(KEY, (12, KEY), 16, 32)
    np.testing.assert_array_equal(shard, full[8:])
    wide = rbg("rng_philox", [KEY, 10], "u64", (6,))[1]
    np.testing.assert_array_equal(philox_bits(KEY, (11, KEY), 4, 64)[0], wide[2:])


def test_rng_bit_generator_three_word_state_carries_into_the_high_word():
    state, bits = rbg("rng_philox", [KEY, 2**64 - 1, 7], "u32", (8,))
    assert state == [KEY, 1, 8]
    np.testing.assert_array_equal(bits[:4], [int(w[0]) for w in philox4x32(
        words(0xFFFFFFFF, 0xFFFFFFFF, 7, 0), (KEY & 0xFFFFFFFF, KEY >> 32))])


def test_rng_bit_generator_float_and_signed_results_are_bitcast_bits():
    _, unsigned = rbg("rng_philox", [KEY, 3], "u32", (5,))
    _, floats = rbg("rng_philox", [KEY, 3], "f32", (5,))
    _, signed = rbg("rng_philox", [KEY, 3], "s32", (5,))
    np.testing.assert_array_equal(floats.view(np.uint32), unsigned)
    np.testing.assert_array_equal(signed.view(np.uint32), unsigned)


def test_rng_bit_generator_empty_result_keeps_state():
    state, bits = rbg("rng_three_fry", [KEY, 4], "u32", (0, 3))
    assert state == [KEY, 4] and bits.shape == (0, 3)


def test_rng_bit_generator_rejects_unknown_algorithm():
    with pytest.raises(UnsupportedError):
        rbg("rng_mersenne", [KEY, 0], "u32", (2,))


# ------------------------------------------------------------------------------------------ rng

def context():
    return SimpleNamespace(cache={})


def rng(ctx, distribution, element_type, dims, a, b):
    inst = Instruction("r", "rng", ArrayShape(element_type, dims),
                       attrs={"distribution": Ident(distribution)})
    dtype = np.asarray(a).dtype
    with np.errstate(all="ignore"):
        out = KERNELS["rng"](inst, [np.array(a, dtype), np.array(b, dtype)], ctx)
    assert out.shape == tuple(dims)
    return out


def test_rng_uniform_float_in_half_open_range():
    out = rng(context(), "rng_uniform", "f32", (4000,), np.float32(-2), np.float32(3))
    assert out.dtype == np.float32
    assert out.min() >= -2 and out.max() < 3
    assert abs(out.mean() - 0.5) < 0.15 and len(np.unique(out)) > 3900


def test_rng_uniform_integer_covers_range():
    out = rng(context(), "rng_uniform", "s32", (5000,), np.int32(-3), np.int32(4))
    assert out.dtype == np.int32
    assert set(np.unique(out)) == set(range(-3, 4))


def test_rng_uniform_integer_full_range_wraps_like_xla():
    low, high = np.int32(-2**31), np.int32(2**31 - 1)
    out = rng(context(), "rng_uniform", "s32", (1000,), low, high)
    assert out.min() < -2**30 and out.max() > 2**30


def test_rng_normal_moments():
    out = rng(context(), "rng_normal", "f32", (20001,), np.float32(1.5), np.float32(2.0))
    assert abs(out.mean() - 1.5) < 0.1 and abs(out.std() - 2.0) < 0.1
    half = rng(context(), "rng_normal", "bf16", (64,), np.float32(0), np.float32(1))
    assert str(half.dtype) == "bfloat16" and np.isfinite(half.astype(np.float32)).all()


def test_rng_is_deterministic_per_evaluation_and_advances_between_calls():
    first = context()
    a = rng(first, "rng_uniform", "f32", (8,), np.float32(0), np.float32(1))
    b = rng(first, "rng_uniform", "f32", (8,), np.float32(0), np.float32(1))
    assert not np.array_equal(a, b)
    again = rng(context(), "rng_uniform", "f32", (8,), np.float32(0), np.float32(1))
    np.testing.assert_array_equal(a, again)


def test_rng_get_and_update_state_shares_the_global_state():
    ctx = context()
    inst = Instruction("s", "rng-get-and-update-state", ArrayShape("u64", (2,)), attrs={"delta": 5})
    first = KERNELS["rng-get-and-update-state"](inst, [], ctx)
    second = KERNELS["rng-get-and-update-state"](inst, [], ctx)
    assert first.dtype == np.uint64 and int(second[0]) - int(first[0]) == 5
    rng(ctx, "rng_uniform", "u32", (8,), np.uint32(0), np.uint32(10))  # draws 2 Philox blocks
    third = KERNELS["rng-get-and-update-state"](inst, [], ctx)
    assert int(third[0]) - int(second[0]) == 5 + 2


def test_rng_bit_generator_with_an_array_shape_returns_the_bits_alone():
    inst = Instruction("r", "rng-bit-generator", ArrayShape("u32", (2, 3)),
                       attrs={"algorithm": Ident("rng_default")})
    bits = KERNELS["rng-bit-generator"](inst, [np.array([KEY, 0], np.uint64)], None)
    np.testing.assert_array_equal(bits, XLA_GOLDEN[0][5])


@pytest.mark.parametrize("distribution, element_type, count, blocks", [
    ("rng_uniform", "f32", 10, 3),      # ten 32-bit values, four to a Philox block
    ("rng_uniform", "u8", 4, 1),        # narrow values still take one 32-bit word each
    ("rng_uniform", "s64", 3, 2),       # 64-bit values take two words
    ("rng_normal", "f32", 5, 2),        # Box-Muller pairs: six 32-bit values
    ("rng_normal", "f64", 1, 1),        # two 64-bit values: four words
])
def test_rng_state_delta_counts_the_philox_blocks_of_the_whole_draw(distribution, element_type,
                                                                    count, blocks):
    from gspmdc.ir.random_shards import rng_state_delta
    assert rng_state_delta(distribution, element_type, count) == blocks
