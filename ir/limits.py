"""The limits of the programs gspmdc accepts, checked where a program is read (the parser reports
a violation at its `file:line:col`, exit code 2), so that no later stage meets a program it cannot
handle.

- Array sizes: every dimension and every array's byte size fit in a signed 64-bit integer, as in
  XLA (whose shapes hold `int64` dimensions and whose byte sizes must not overflow). Larger sizes
  describe no array any machine can hold.
- Nesting: tuple shapes nest at most `MAX_TUPLE_DEPTH` levels (`Shape.tuple_depth`), and
  computations (calls, loop bodies, branches, reducers, fusions, ...) at most
  `MAX_COMPUTATION_DEPTH` levels, counting the computation they start from. The shapes, the call graph and the values of a program are
  walked recursively by the verifier, the passes and the interpreter; these bounds keep those
  walks within Python's recursion limit together (real programs nest a handful of levels).
- Devices: device ids in shardings are below `MAX_DEVICES` (2^24, far beyond any machine's
  partition count); the partition count is derived from them, and per-device tables are built
  for every device up to it.
"""
from __future__ import annotations

#: the largest dimension size and array byte size (XLA's int64)
MAX_SIZE = 2**63 - 1
#: the deepest tuple nesting accepted: `((f32[2]))` nests 2 levels
MAX_TUPLE_DEPTH = 64
#: the deepest computation nesting accepted, counting the calling computation: an entry calling
#: a reducer nests 2 levels
MAX_COMPUTATION_DEPTH = 64
#: one more than the largest device id a sharding may name
MAX_DEVICES = 2**24


def size_problem(dims: tuple[int, ...], byte_width: float) -> str | None:
    """Why an array with `dims` of elements `byte_width` bytes wide cannot exist, or None."""
    for d, size in enumerate(dims):
        if size > MAX_SIZE:
            return f"dimension {d} has size {size}, more than the largest size (2^63-1)"
    count = 1
    for size in dims:
        count *= size
    if count * byte_width > MAX_SIZE:
        return (f"the array would have {count} elements ({count * byte_width:.3g} bytes), "
                f"more than the largest array size {MAX_SIZE} (2^63-1) bytes")
    return None


__all__ = ["MAX_SIZE", "MAX_DEVICES", "MAX_TUPLE_DEPTH", "MAX_COMPUTATION_DEPTH", "size_problem"]
