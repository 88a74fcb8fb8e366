"""Helpers for the multi-partition runtime tests: hand-written SPMD modules with one collective,
their per-partition inputs, and the replica-group spellings with their groups worked out by hand."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hlo_text import reducer

SHARED = Path(__file__).resolve().parents[2] / "shared"

#: the three spellings of the same kind of replica groups on 8 partitions, with the groups they
#: mean (worked out by hand from XLA's definitions)
GROUP_FORMS = {
    "explicit": ("{{0,2,4,6},{1,3,5,7}}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    # iota [2,4] transposed to [4,2]: rows are the groups
    "iota": ("[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    # mesh (axis_0, axis_1) holds device 4*a1 + a0 ([2,4] transposed); groups vary axis_0
    "mesh": ("mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}",
             [[0, 1, 2, 3], [4, 5, 6, 7]]),
}

REDUCERS = reducer("add", element_type="s32") + reducer("max", element_type="s32") + \
    reducer("addf", "add") + reducer("maxf", "maximum") + reducer("addbf", "add", "bf16") + \
    reducer("addc", "add", "c64") + reducer("orp", "or", "pred") + \
    reducer("andp", "and", "pred") + """
shift_add {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ten = s32[] constant(10)
  t = s32[] multiply(a, ten)
  ROOT r = s32[] add(t, b)
}
"""


def spmd_module(n: int, params: list[str], body: str, root: str, header: str = "") -> str:
    """`HloModule` text with `num_partitions=n` (and `header` attributes), the shared reducers,
    and an entry computation with the given parameter shapes (named p0, p1, ...), body lines, and
    root line."""
    lines = [f"  p{i} = {shape} parameter({i})" for i, shape in enumerate(params)]
    lines += [f"  {line}" for line in body.strip().splitlines() if line.strip()]
    lines.append(f"  ROOT {root}")
    return (f"HloModule spmd_test, num_partitions={n}{header}\n{REDUCERS}\nENTRY main {{\n"
            + "\n".join(lines) + "\n}\n")


def ring_loop(n: int, iterations: int) -> str:
    """A module whose `while` loop passes an `s32[3]` around the ring of `n` partitions
    (partition p sends to p+1 mod n) `iterations` times."""
    pairs = ",".join(f"{{{p},{(p + 1) % n}}}" for p in range(n))
    return f"""HloModule ring, num_partitions={n}

cond {{
  s = (s32[], s32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  limit = s32[] constant({iterations})
  ROOT lt = pred[] compare(i, limit), direction=LT
}}

body {{
  s = (s32[], s32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = s32[3] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = s32[3] collective-permute(x), channel_id=1, source_target_pairs={{{pairs}}}
  ROOT t = (s32[], s32[3]) tuple(j, y)
}}

ENTRY main {{
  x = s32[3] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], s32[3]) tuple(zero, x)
  w = (s32[], s32[3]) while(init), condition=cond, body=body
  ROOT r = s32[3] get-tuple-element(w), index=1
}}
"""


def partition_values(n: int, shape: tuple[int, ...], dtype=np.int32) -> list[np.ndarray]:
    """Distinct values per partition: element e of partition p is `100 * p + e`."""
    size = int(np.prod(shape))
    return [(100 * p + np.arange(size)).reshape(shape).astype(dtype) for p in range(n)]


def group_of(groups: list[list[int]], p: int) -> tuple[list[int], int]:
    for g in groups:
        if p in g:
            return g, g.index(p)
    raise AssertionError(f"{p} in no group")


def fold_shift_add(values: list[np.ndarray]) -> np.ndarray:
    """The `shift_add` reducer (`10 a + b`) folded left to right: order-sensitive on purpose."""
    result = values[0]
    for v in values[1:]:
        result = result * 10 + v
    return result
