"""Hypothesis strategies for the partitioner's property tests: random sharding texts."""
from __future__ import annotations

from math import prod

from hypothesis import strategies as st


@st.composite
def tiled_shardings(draw, rank: int, n: int) -> str:
    """A tiled sharding text of a rank-`rank` array on `n` devices: each prime factor of `n` (2s,
    then the odd rest) cuts a random data dim or joins the replication, in a random device
    order; `{replicated}` when no data dim is cut."""
    counts = [1] * (rank + 1)                # the last entry is the replication
    factors = []
    m = n
    while m % 2 == 0:
        factors.append(2)
        m //= 2
    if m > 1:
        factors.append(m)
    for f in factors:
        counts[draw(st.integers(0, rank))] *= f
    if prod(counts[:rank]) == 1:
        return "{replicated}"
    devices = draw(st.permutations(list(range(n))))
    dims = counts if counts[rank] > 1 else counts[:rank]
    text = "{devices=[" + ",".join(map(str, dims)) + "]" + ",".join(map(str, devices))
    return text + (" last_tile_dim_replicate}" if counts[rank] > 1 else "}")
