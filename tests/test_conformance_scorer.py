"""The partitioner scorer's buckets (`tests/conformance/score_partition.classify`), on cases written
here: each case runs `gspmdc run --check` in a child process under the machine limits."""
from __future__ import annotations

import pytest

from conformance.score import MachineLimits
from conformance.score_partition import classify

LIMITS = MachineLimits(memory_bytes=4 << 30, storage_bytes=8 << 30, timeout_seconds=60)


def case(hlo: str, n: int = 2, **extra) -> dict:
    return {"name": "C", "line": 1, "hlo": hlo, "num_devices": n, **extra}


EQUIVALENT = """HloModule m
ENTRY e {
  x = f32[8,4] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT n = f32[8,4] negate(x), sharding={devices=[2,1]<=[2]}
}
"""


@pytest.mark.parametrize("hlo, bucket, reason", [
    (EQUIVALENT, "equivalent", None),
    (EQUIVALENT.replace("negate(x)", "negate(y)"), "cleanly rejected", "HloSyntaxError"),
    ("""HloModule m
ENTRY e {
  t = token[] after-all()
  x = f32[4] parameter(0)
  o = token[] outfeed(x, t)
  ROOT n = f32[4] negate(x)
}
""", "excluded: no reference", "I/O instructions"),
    ("""HloModule m
ENTRY e {
  x = f32[4] parameter(0), sharding={manual}
  ROOT n = f32[4] negate(x), sharding={manual}
}
""", "excluded: no reference", "manual sharding"),
    ("""HloModule m
ENTRY e {
  x = f32[1073741824,2] parameter(0)
  ROOT n = f32[1073741824,2] negate(x)
}
""", "excluded: too large here", "too large for this machine"),
])
def test_buckets(hlo, bucket, reason):
    got, why, _ = classify(case(hlo), LIMITS)
    assert got == bucket
    assert (why is None) if reason is None else (reason in why)


def test_out_of_memory_in_the_child_is_too_large():
    """A case needing more than the child's memory cap stops alone, as too large."""
    hlo = """HloModule m
ENTRY e {
  x = f32[64,2097152] parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT n = f32[64,2097152] negate(x), sharding={devices=[2,1]<=[2]}
}
"""
    got, why, _ = classify(case(hlo), MachineLimits(memory_bytes=512 << 20,
                                                    storage_bytes=8 << 30, timeout_seconds=60))
    assert got == "excluded: too large here" and "out of memory" in why


def test_out_of_memory_inside_a_kernel_is_too_large():
    """A kernel's MemoryError reaches the run wrapped (a partition's RuntimeFailure): still
    counted as too large, not as a rejection."""
    from conformance.score import CaseOutOfMemory, run_isolated
    from gspmdc.errors import RuntimeFailure

    def wrapped():
        try:
            raise MemoryError("Unable to allocate 3.00 GiB")
        except MemoryError as e:
            raise RuntimeFailure("partition 6: convolution failed") from e
    with pytest.raises(CaseOutOfMemory):
        run_isolated(LIMITS, wrapped)
