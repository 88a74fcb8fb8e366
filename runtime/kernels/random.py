"""Random-number kernels: rng-bit-generator, rng, rng-get-and-update-state.

rng-bit-generator reproduces XLA's CPU backend bit for bit (checked against it for Philox and
ThreeFry, 8- to 64-bit types, scalar/empty/odd shapes and counter wrap-around). The state is
`u64[n]`: `state[0]` is the key, the rest the counter; the result is `(new_state, bits)` where
only the counter advances, by the number of generator blocks used. Float and signed results are
the unsigned bits of the same width, bit-cast.

- `rng_philox` and `rng_default` (XLA's CPU and GPU default): Philox-4x32-10 keyed by the
  (low, high) 32-bit halves of the key. Block j hashes the 128-bit counter `C + j` whose low word
  is `state[1]` and high word `state[2]` (u64[3] state) or the key itself (u64[2] state; the
  carry out of the low word reaches the hash but not the new state). 32-bit element `i` is word
  `i % 4` of block `i // 4`; 64-bit element `i` is words (0, 1) or (2, 3) (low first) of block
  `i // 2`; 8/16-bit elements are 32-bit elements truncated. An element's value depends only on
  the state and its global row-major index, so any shard of the result can be generated alone.
- `rng_three_fry`: ThreeFry-2x32-20; block j hashes the 64-bit `state[1] + j` as (low, high)
  words. 64-bit element `i` is block `i` (`y0 | y1 << 32`). 32-bit (and truncated narrower)
  elements pair the two words of a block along one dim `d` chosen from the result SHAPE (see
  `threefry_bits`), so their values depend on the global shape as well as the index.

`rng` (distribution `rng_uniform` on [a, b), or `rng_normal` with mean a and standard deviation
b) follows XLA's RngExpander formulas on Philox bits: uniform floats from the top
mantissa-width bits scaled into [a, b), uniform integers `a + d/2 + (d - d/2)` with
`d = bits mod (b - a)`, normals by Box-Muller pairing the two halves of a uniform draw. Its Philox
key is 0 and its counter a global 128-bit state kept per evaluation in `ctx.cache`, starting at
0x7012395 and shared with `rng-get-and-update-state`; an `rng` advances it by the Philox blocks of
its whole result (`rng_state_delta`), and element i reads the Philox value(s) at row-major index i
(normals: the pair `i mod p`, `p + i mod p` with p = ceil(count / 2)), so every element depends only
on the state, the element count and i. XLA keys `rng` with a per-compilation seed, so only the
distribution, not the values, can match XLA.

Shards (the partitioner's local forms, custom-calls with `frontend_attributes={global_dims="..."}`
and the shard's s32 global offsets as trailing operands; padding beyond the global dims repeats
the last real element):

- `gspmdc.RngBitGeneratorShard(state, offsets...)`, `algorithm=A`: the shard of the bits of
  `rng-bit-generator(state)` with the global dims, and the global new state;
- `gspmdc.RngShard(a, b, state, offsets...)`, `distribution=D`: the shard of an `rng(a, b)` with
  the global dims that read the global state value `state` (from `rng-get-and-update-state`).
"""
from __future__ import annotations

import numpy as np

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir import dtypes
from gspmdc.ir.custom_call_targets import RNG_BIT_GENERATOR_SHARD, RNG_SHARD
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.random_shards import draw_plan, global_dims_of, random_bit_width, rng_state_delta
from gspmdc.ir.shapes import TupleShape

from .custom_call import CUSTOM_CALL_TARGETS

_U32 = np.uint32
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)

#: initial value of the per-evaluation global rng state (low 64 bits of a 128-bit counter)
INITIAL_RNG_STATE = 0x7012395
_STATE_KEY = ("rng-state",)


def _split64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u64 -> (low u32, high u32)."""
    x = x.astype(np.uint64, copy=False)
    return (x & _MASK32).astype(_U32), (x >> _SHIFT32).astype(_U32)


def _join64(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return low.astype(np.uint64) | (high.astype(np.uint64) << _SHIFT32)


def philox4x32(counter: tuple[np.ndarray, ...], key: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Philox-4x32 with 10 rounds on four u32 counter words (arrays), key (k0, k1)."""
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    x0, x1, x2, x3 = (np.asarray(c, _U32) for c in counter)
    k0, k1 = key
    for _ in range(10):
        p0 = x0.astype(np.uint64) * m0
        p1 = x2.astype(np.uint64) * m1
        hi0, lo0 = (p0 >> _SHIFT32).astype(_U32), (p0 & _MASK32).astype(_U32)
        hi1, lo1 = (p1 >> _SHIFT32).astype(_U32), (p1 & _MASK32).astype(_U32)
        x0, x1, x2, x3 = hi1 ^ x1 ^ _U32(k0), lo1, hi0 ^ x3 ^ _U32(k1), lo0
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return x0, x1, x2, x3


def _rotl(v: np.ndarray, r: int) -> np.ndarray:
    return (v << _U32(r)) | (v >> _U32(32 - r))


def threefry2x32(counter: tuple[np.ndarray, np.ndarray], key: tuple[int, int]):
    """ThreeFry-2x32 with 20 rounds on two u32 counter words (arrays), key (k0, k1)."""
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    ks = (_U32(key[0]), _U32(key[1]), _U32(0x1BD11BDA) ^ _U32(key[0]) ^ _U32(key[1]))
    x0 = np.asarray(counter[0], _U32) + ks[0]
    x1 = np.asarray(counter[1], _U32) + ks[1]
    for block in range(5):
        for r in rotations[block % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + _U32(block + 1)
    return x0, x1


def _add128(low: int, high: int, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) + n as 128-bit unsigned arithmetic on u64 arrays."""
    new_low = np.uint64(low) + n.astype(np.uint64)
    carry = (new_low < np.uint64(low)).astype(np.uint64)
    return new_low, np.uint64(high) + carry


def philox_bits(key: int, counter: tuple[int, int], count: int, width: int):
    """`count` unsigned integers of `width` bits (8, 16, 32, 64) from Philox keyed by the u64
    `key`, block j hashing the 128-bit `counter + j` (counter = (low, high) u64 words); returns
    (bits in row-major order, number of blocks used)."""
    k = (key & 0xFFFFFFFF, key >> 32)
    words = 2 * count if width == 64 else count
    blocks = -(-words // 4)
    low, high = _add128(counter[0], counter[1], np.arange(blocks, dtype=np.uint64))
    out = philox4x32((*_split64(low), *_split64(high)), k)
    if width == 64:
        pairs = np.stack([_join64(out[0], out[1]), _join64(out[2], out[3])], axis=1)
        return pairs.reshape(-1)[:count], blocks
    bits = np.stack(out, axis=1).reshape(-1)[:count]
    return _narrow(bits, width), blocks


def threefry_bits(key: int, counter: int, dims: tuple[int, ...], width: int):
    """An array of shape `dims` of `width`-bit unsigned integers from ThreeFry-2x32 keyed by the
    u64 `key`, block j hashing the 64-bit `counter + j`; returns (bits, number of blocks used).

    64-bit elements are one block each, in row-major order. Narrower elements pair the two output
    words of a block along one dim `d` (positions 2m and 2m+1 of dim d hold words y0 and y1 of the
    block at index m over the other dims, row-major); `d` minimises the blocks used,
    `ceil(dims[d] / 2) * count / dims[d]`, lowest dim first on ties."""
    k = (key & 0xFFFFFFFF, key >> 32)
    count = int(np.prod(dims))
    if width == 64 or count == 0:
        inputs = np.uint64(counter) + np.arange(count, dtype=np.uint64)
        y0, y1 = threefry2x32(_split64(inputs), k)
        return _join64(y0, y1).astype(np.uint64).reshape(dims), count
    shape = tuple(dims) or (1,)
    d = _threefry_pair_dim(shape)
    halves = shape[:d] + (-(-shape[d] // 2),) + shape[d + 1:]
    blocks = int(np.prod(halves))
    inputs = np.uint64(counter) + np.arange(blocks, dtype=np.uint64)
    y0, y1 = threefry2x32(_split64(inputs), k)
    paired = np.stack([y0.reshape(halves), y1.reshape(halves)], axis=d + 1)
    paired = paired.reshape(shape[:d] + (2 * halves[d],) + shape[d + 1:])
    bits = np.take(paired, np.arange(shape[d]), axis=d).reshape(dims)
    return _narrow(bits, width), blocks


def _threefry_pair_dim(shape: tuple[int, ...]) -> int:
    count = int(np.prod(shape))
    return min(range(len(shape)), key=lambda i: (-(-shape[i] // 2) * (count // shape[i]), i))


def _threefry_blocks(dims: tuple[int, ...], width: int) -> int:
    """The blocks `threefry_bits` uses for a result of shape `dims`."""
    count = int(np.prod(dims))
    if width == 64 or count == 0:
        return count
    shape = tuple(dims) or (1,)
    d = _threefry_pair_dim(shape)
    return count // shape[d] * -(-shape[d] // 2)


def philox_bits_at(key: int, counter: tuple[int, int], index: np.ndarray, width: int):
    """The elements at row-major positions `index` (int64 array) of `philox_bits(key, counter,
    count, width)` for any `count` covering them, shaped like `index`."""
    k = (key & 0xFFFFFFFF, key >> 32)
    index = index.astype(np.uint64)
    per_block = np.uint64(2 if width == 64 else 4)
    low, high = _add128(counter[0], counter[1], index // per_block)
    out = np.stack(philox4x32((*_split64(low), *_split64(high)), k))
    slot = (index % per_block).astype(np.int64)
    if width == 64:
        first = np.take_along_axis(out, (2 * slot)[None], 0)[0]
        second = np.take_along_axis(out, (2 * slot + 1)[None], 0)[0]
        return _join64(first, second)
    return _narrow(np.take_along_axis(out, slot[None], 0)[0], width)


def threefry_bits_at(key: int, counter: int, dims: tuple[int, ...], coords: tuple, width: int):
    """The elements at coordinates `coords` (one int64 array per dim of `dims`, all of one shape)
    of `threefry_bits(key, counter, dims, width)`, shaped like the coordinate arrays."""
    k = (key & 0xFFFFFFFF, key >> 32)
    shape = tuple(dims) or (1,)
    coords = tuple(coords) or (np.zeros((), np.int64),)
    if width == 64:
        block = np.ravel_multi_index(coords, shape).astype(np.uint64)
        y0, y1 = threefry2x32(_split64(np.uint64(counter) + block), k)
        return _join64(y0, y1)
    d = _threefry_pair_dim(shape)
    halves = shape[:d] + (-(-shape[d] // 2),) + shape[d + 1:]
    half = coords[:d] + (coords[d] // 2,) + coords[d + 1:]
    block = np.ravel_multi_index(half, halves).astype(np.uint64)
    y0, y1 = threefry2x32(_split64(np.uint64(counter) + block), k)
    return _narrow(np.where(coords[d] % 2 == 0, y0, y1), width)


def _narrow(bits32: np.ndarray, width: int) -> np.ndarray:
    return bits32.astype(np.dtype(f"u{width // 8}"), copy=False)


def _bits_as(bits: np.ndarray, element_type: str, dims) -> np.ndarray:
    """Unsigned bits reinterpreted as `element_type` (same width), shaped `dims`."""
    return bits.view(dtypes.numpy_dtype(element_type)).reshape(dims)


def generate_bits(algorithm: str, state: np.ndarray, element_type: str, dims: tuple[int, ...],
                  coords: tuple | None = None, name: str = "rng-bit-generator"):
    """rng-bit-generator on a result of global shape `element_type[dims]`: `(new state, bits)`.
    `coords`: one int64 array per dim (all of one shape) selecting the elements to generate (the
    bits then have that shape); None: the whole result."""
    words = [int(w) for w in np.asarray(state, np.uint64).reshape(-1)]
    width = random_bit_width(element_type)
    count = int(np.prod(dims))
    if algorithm in ("rng_default", "rng_philox"):
        if len(words) not in (2, 3):
            raise VerificationError(f"{name}: Philox needs a u64[2] or u64[3] state")
        high = words[2] if len(words) == 3 else words[0]
        if coords is None:
            bits, _ = philox_bits(words[0], (words[1], high), count, width)
        else:
            index = np.ravel_multi_index(coords, dims) if dims else np.zeros((), np.int64)
            bits = philox_bits_at(words[0], (words[1], high), np.asarray(index), width)
        blocks = -(-count * (2 if width == 64 else 1) // 4)
        low, high = _add128(words[1], high, np.asarray(blocks))
        counter = [int(low), int(high)] if len(words) == 3 else [int(low)]
    elif algorithm == "rng_three_fry":
        if len(words) != 2:
            raise VerificationError(f"{name}: ThreeFry needs a u64[2] state")
        if coords is None:
            bits, blocks = threefry_bits(words[0], words[1], dims, width)
        else:
            bits = threefry_bits_at(words[0], words[1], dims, coords, width)
            blocks = _threefry_blocks(dims, width)
        counter = [(words[1] + blocks) % 2**64]
    else:
        raise UnsupportedError(f"{name}: unknown rng algorithm {algorithm}")
    new_state = np.array([words[0], *counter], np.uint64).reshape(np.shape(state))
    shape = dims if coords is None else np.shape(coords[0]) if coords else ()
    return new_state, _bits_as(np.asarray(bits), element_type, shape)


@KERNELS.register("rng-bit-generator")
def rng_bit_generator(inst, args, ctx):
    """`rng-bit-generator(state), algorithm=...` -> (new state, random bits); see module doc. An
    instruction whose shape is an array rather than the tuple yields the random bits alone."""
    (state,) = args
    bits_only = not isinstance(inst.shape, TupleShape)
    bits_shape = inst.shape if bits_only else inst.shape.elements[1]
    new_state, bits = generate_bits(str(inst.attr("algorithm", "rng_default")), state,
                                    bits_shape.element_type, bits_shape.dims, name=inst.name)
    return bits if bits_only else (new_state, bits)


def _take_state(ctx, delta: int) -> tuple[int, int]:
    """Get-and-update of the per-evaluation 128-bit global rng state (kept in `ctx.cache`)."""
    low, high = ctx.cache.get(_STATE_KEY, (INITIAL_RNG_STATE, 0))
    total = ((high << 64) | low) + delta
    ctx.cache[_STATE_KEY] = (total & (2**64 - 1), (total >> 64) & (2**64 - 1))
    return low, high


@KERNELS.register("rng-get-and-update-state")
def rng_get_and_update_state(inst, args, ctx):
    """The global rng state as `u64[2]` (low, high), then advanced by `delta`."""
    low, high = _take_state(ctx, int(inst.attr("delta", 0)))
    return np.array([low, high], np.uint64)


_MANTISSA_BITS = {"bf16": 7, "f16": 10, "f32": 23, "f64": 52}


def _uniform_unit(bits: np.ndarray, element_type: str) -> np.ndarray:
    """XLA's ConvertRandomBitsToUniformFloatingPoint on [0, 1): the top mantissa-width bits."""
    width, mantissa = random_bit_width(element_type), _MANTISSA_BITS[element_type]
    top = bits >> np.array(width - mantissa, bits.dtype)
    dtype = dtypes.numpy_dtype(element_type)
    return top.astype(dtype) * dtype.type(np.ldexp(1.0, -mantissa))


@KERNELS.register("rng")
def rng(inst, args, ctx):
    """`rng(a, b), distribution=rng_uniform|rng_normal`; see module doc."""
    shape = inst.shape
    distribution = str(inst.attr("distribution"))
    state = _take_state(ctx, rng_state_delta(distribution, shape.element_type,
                                             shape.num_elements))
    index = np.arange(shape.num_elements, dtype=np.int64).reshape(shape.dims)
    return rng_values(inst.name, distribution, shape.element_type, shape.num_elements, index,
                      state, *args)


def rng_values(name: str, distribution: str, element_type: str, count: int, index: np.ndarray,
               state: tuple[int, int], a, b) -> np.ndarray:
    """The elements at row-major positions `index` of an `rng` of `count` elements drawing from
    the global state value `state` (low, high): element i depends only on `state`, `count` and
    i."""
    a, b = np.asarray(a), np.asarray(b)
    t = element_type
    dtype = dtypes.numpy_dtype(t)
    values, width = draw_plan(distribution, t, count)

    def draw(at):
        return philox_bits_at(0, state, at, width)

    if distribution == "rng_uniform" and dtypes.is_integer(t):
        bits = draw(index)
        unsigned = np.dtype(f"u{width // 8}")
        span = np.asarray(b.astype(dtype).view(unsigned) - a.astype(dtype).view(unsigned))
        dist = np.where(span == 0, bits, bits % np.where(span == 0, 1, span).astype(unsigned))
        half = dist >> np.array(1, unsigned)
        value = a.astype(dtype) + half.view(dtype) + (dist - half).view(dtype)
        return value.astype(dtype)
    if not dtypes.is_float(t):
        raise UnsupportedError(f"{name}: {distribution} of type {t} is not supported")
    if distribution == "rng_uniform":
        unit = _uniform_unit(draw(index), t)
        low, high = a.astype(dtype), b.astype(dtype)
        return (unit * (high - low) + low).astype(dtype)
    if distribution == "rng_normal":
        work = "f64" if t == "f64" else "f32"
        wtype = dtypes.numpy_dtype(work).type
        pairs = values // 2
        pair = index % max(pairs, 1)
        u1 = np.maximum(_uniform_unit(draw(pair), work), wtype(1e-7))
        v1 = wtype(2 * np.pi) * _uniform_unit(draw(pair + pairs), work)
        radius = np.sqrt(wtype(-2) * np.log(u1))
        normal = np.where(index < pairs, np.sin(v1) * radius, np.cos(v1) * radius)
        return (a.astype(dtype) + b.astype(dtype) * normal.astype(dtype)).astype(dtype)
    raise UnsupportedError(f"{name}: unknown rng distribution {distribution}")


# ---- shards of random results (the partitioner's local forms) ----------------------------------

def shard_coordinates(local_dims: tuple[int, ...], offsets, dims: tuple[int, ...]) -> tuple:
    """Per dim, the global coordinate of every element of a shard of shape `local_dims` starting
    at `offsets`; padding beyond `dims` repeats the last real coordinate."""
    grid = np.indices(local_dims, dtype=np.int64)
    return tuple(np.minimum(grid[d] + int(offsets[d]), max(dims[d] - 1, 0))
                 for d in range(len(dims)))


def _rng_bit_generator_shard(inst, args, ctx):
    """`custom-call(state, offset_0, ..., offset_{r-1}), custom_call_target=
    "gspmdc.RngBitGeneratorShard", algorithm=A, frontend_attributes={global_dims="..."}`: this
    shard (at the given s32 offsets) of `rng-bit-generator(state)` with the global dims, and the
    global new state; equal bit for bit to the same elements of the unpartitioned op."""
    state, *offsets = args
    bits_only = not isinstance(inst.shape, TupleShape)
    local = inst.shape if bits_only else inst.shape.elements[1]
    dims = global_dims_of(inst)
    coords = shard_coordinates(local.dims, offsets, dims)
    new_state, bits = generate_bits(str(inst.attr("algorithm", "rng_default")), state,
                                    local.element_type, dims, coords, inst.name)
    return bits if bits_only else (new_state, bits)


def _rng_shard(inst, args, ctx):
    """`custom-call(a, b, state, offset_0, ..., offset_{r-1}), custom_call_target=
    "gspmdc.RngShard", distribution=D, frontend_attributes={global_dims="..."}`: this shard of
    the `rng(a, b)` with the global dims that read the global state value `state` (`u64[2]`, from
    `rng-get-and-update-state`)."""
    a, b, state, *offsets = args
    shape = inst.shape
    dims = global_dims_of(inst)
    coords = shard_coordinates(shape.dims, offsets, dims)
    index = np.ravel_multi_index(coords, dims) if dims else np.zeros((), np.int64)
    words = np.asarray(state, np.uint64).reshape(-1)
    return rng_values(inst.name, str(inst.attr("distribution")), shape.element_type,
                      int(np.prod(dims)), np.asarray(index), (int(words[0]), int(words[1])), a, b)


CUSTOM_CALL_TARGETS[RNG_BIT_GENERATOR_SHARD] = _rng_bit_generator_shard
CUSTOM_CALL_TARGETS[RNG_SHARD] = _rng_shard
