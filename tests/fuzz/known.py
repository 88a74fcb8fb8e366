"""Failures the fuzz checks know to come from open, reported product defects (each with the
place it is tracked), so the CI sample marks them as expected failures instead of hiding them:
a case that fails any other way fails its test. Remove an entry when its defect is fixed (the
test then reports an unexpected pass)."""
from __future__ import annotations

import re

#: (pattern of the failure detail, the defect)
KNOWN_DEFECTS: list[tuple[re.Pattern, str]] = [
    (re.compile(r"sharding \{maximal device=\d+\} has no tiling"),
     "a convolution with a {maximal} result is refused (issue 12, defects: rel-defects)"),
    (re.compile(r"lowering \S+ \(slice\) gave .*expected the shard shape"),
     "a strided slice over whole shards loses its stride in lowering (issue 12, defects: "
     "rel-defects)"),
    (re.compile(r"OverflowError"),
     "huge dimensions overflow (issue 12, defects: a dimension of 10^23; rel-defects)"),
    (re.compile(r"RecursionError"),
     "deep nesting raises RecursionError (issue 12, defects: rel-defects)"),
    (re.compile(r"gspmdc explain \S+ \S+ -> exit 2\ngspmdc: error: explain: no instruction "
                r"named '[^']+'"),
     "explain of a sharding barrier (ShardBarrierFrom/To, which propagation removes) says no "
     "such instruction exists (reported by fuzz-gen)"),
]


def known_defect(detail: str) -> str | None:
    """The known defect a failure's detail shows, or None."""
    for pattern, defect in KNOWN_DEFECTS:
        if pattern.search(detail):
            return defect
    return None
