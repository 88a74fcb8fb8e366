"""Random sharding texts, as a user would annotate them: tiled (uneven dims included, more tiles
than elements rarely), partially replicated (`last_tile_dim_replicate` or `last_tile_dims=
{replicated}`), with an iota device order (plain, reshaped and transposed) or an explicit device
list, on one device (`maximal`), replicated, manual; tuples of those for tuple shapes."""
from __future__ import annotations

from math import prod

from .source import Source
from .values import Arr, Shape, Tup


def prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


def device_order(src: Source, n: int) -> str:
    """The tile assignment's device list for `n` devices: `<=[n]`, an iota
    reshaped and transposed (`<=[a,b]T(1,0)`), or explicit ids (a random permutation)."""
    kind = src.weighted([("iota", 5), ("transposed", 2), ("explicit", 3)])
    factors = prime_factors(n)
    if kind == "transposed" and len(factors) >= 2:
        split = src.integer(1, len(factors) - 1)
        shape = [prod(factors[:split]), prod(factors[split:])]
        if len(factors) >= 3 and src.boolean(0.4):
            shape = [factors[0], prod(factors[1:-1]), factors[-1]]
        perm = list(range(len(shape)))[::-1] if src.boolean() else \
            src.permutation(list(range(len(shape))))
        return f"<=[{','.join(map(str, shape))}]T({','.join(map(str, perm))})"
    if kind == "explicit":
        return ",".join(map(str, src.permutation(list(range(n)))))
    return f"<=[{n}]"


def tiled(src: Source, dims: tuple[int, ...], n: int, *, replicate: bool = True) -> str:
    """A tiled sharding of a rank-`len(dims)` array over all `n` devices: each prime factor of
    `n` tiles a dim (one with room for it, rarely any dim) or, when `replicate`, replicates."""
    rank = len(dims)
    counts = [1] * rank
    replication = 1
    for f in prime_factors(n):
        slots = list(range(rank))
        roomy = [d for d in slots if dims[d] >= counts[d] * f]
        if replicate and (not slots or src.boolean(0.3)):
            replication *= f
        elif roomy and not src.boolean(0.05):
            counts[src.choice(roomy)] *= f
        elif slots:
            counts[src.choice(slots)] *= f
        else:
            replication *= f
    if rank == 0 or n == 1:
        return "{replicated}" if src.boolean(0.7) else f"{{maximal device={src.integer(0, n - 1)}}}"
    layout = counts + ([replication] if replication > 1 else [])
    text = f"{{devices=[{','.join(map(str, layout))}]{device_order(src, n)}"
    if replication > 1:
        text += " last_tile_dims={replicated}" if src.boolean(0.3) else " last_tile_dim_replicate"
    return text + "}"


def array_sharding(src: Source, dims: tuple[int, ...], n: int) -> str:
    kind = src.weighted([("tiled", 7), ("replicated", 2), ("maximal", 1)])
    if kind == "replicated":
        return "{replicated}"
    if kind == "maximal":
        return f"{{maximal device={src.integer(0, n - 1)}}}"
    return tiled(src, dims, n)


def sharding(src: Source, shape: Shape, n: int) -> str:
    """A random sharding of `shape` (a tuple sharding for a tuple shape)."""
    if isinstance(shape, Tup):
        leaves = list(shape.leaves())
        if not leaves or src.boolean(0.1):    # one sharding for every leaf
            return "{replicated}" if src.boolean(0.6) else f"{{maximal device={src.integer(0, n - 1)}}}"
        return "{" + ", ".join(array_sharding(src, leaf.dims, n) for leaf in leaves) + "}"
    assert isinstance(shape, Arr)
    return array_sharding(src, shape.dims, n)
