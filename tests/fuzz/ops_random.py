"""Random numbers: rng (uniform floats and integers, normal floats) and rng-bit-generator (every
algorithm, both state sizes, unsigned results of 8 to 64 bits). gspmdc's generators are
counter-based on global indices, so their values do not depend on the partitioning: exact."""
from __future__ import annotations

from . import choices
from .program import Comp
from .values import Arr, Tup, Value


def rng(c: Comp) -> Value | None:
    src = c.src
    distribution = src.choice(["rng_uniform", "rng_normal"])
    t = "f32" if distribution == "rng_normal" or src.boolean(0.7) else \
        src.choice(["s32", "u32", "f64"])
    if t in ("s32", "u32"):
        a, b = c.scalar(t, 0), c.scalar(t, src.choice([3, 8, 100]))
        bound = 100.0
    elif distribution == "rng_uniform":
        a, b = c.scalar(t, -1.0), c.scalar(t, src.choice([1.0, 0.5]))
        bound = 1.0
    else:
        a, b = c.scalar(t, 0.0), c.scalar(t, src.choice([1.0, 0.25]))
        bound = 8.0
    shape = Arr(t, choices.dims(src, src.integer(0, 3)))
    return c.emit("rng", shape, "rng", [a, b], f"distribution={distribution}", bound=bound)


def rng_bit_generator(c: Comp) -> Value | None:
    src = c.src
    algorithm = src.choice(["rng_default", "rng_philox", "rng_three_fry"])
    words = 3 if algorithm != "rng_three_fry" and src.boolean(0.4) else 2
    state = c.need(Arr("u64", (words,)), exact=True)
    bits = Arr(src.weighted([("u32", 4), ("u64", 1), ("u8", 1), ("u16", 1)]),
               choices.dims(src, src.integer(0, 3)))
    shape = Tup((state.arr, bits))
    value = c.emit("rng-bit-generator", shape, "rng-bit-generator", [state],
                   f"algorithm={algorithm}", parts=[state, Value("", bits, True, float("inf"))],
                   keep=False)
    return c.unpack(value, src.choice([[1], [0, 1]]))[-1]


GENERATORS = [(rng, 2), (rng_bit_generator, 2)]
