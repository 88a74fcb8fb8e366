"""The figures of a program's cost, as `gspmdc cost --json` writes them (modelled before running)
and `gspmdc run --profile-json` writes them (measured while running), under the same keys:

```
{"kind": "modelled" | "measured", "module": ..., "num_partitions": N,
 "collectives": [{"name", "computation", "opcode", "group_size", "groups", "calls",
                  "bytes_sent_per_device": [N], "bytes_received_per_device": [N],
                  "seconds", "algorithm", "reason"}, ...],
 "total_bytes_sent_per_device": [N], "total_bytes_received_per_device": [N],
 "flops_per_device": [N], "peak_memory_bytes_per_device": [N],
 "parameter_bytes_per_device": [N], "output_bytes_per_device": [N],
 "modelled_step_seconds": s, "seconds_by_kind": {...}, ...}
```

Per-device lists have one entry per partition. A collective's bytes are per run (every execution
counted: a collective in a loop body once per iteration); `calls` is its executions per run,
null when a loop's trip count is not known before running (then its bytes are null as well).
`seconds` is the modelled time of all its executions (measured: the slowest partition's time);
`modelled_step_seconds` the modelled time of one run (measured: the slowest partition's wall
time). `seconds_by_kind` splits the step time (compute, memory-bound, each collective kind;
measured: kernels, collectives, interpretation). Entries a kind has no figure for are null.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CollectiveFigures:
    """One collective instruction's figures over a run (see the module docstring)."""

    name: str
    computation: str
    opcode: str
    group_size: int
    groups: int
    calls: int | None
    bytes_sent_per_device: tuple[int | None, ...]
    bytes_received_per_device: tuple[int | None, ...]
    seconds: float | None = None
    algorithm: str | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "computation": self.computation, "opcode": self.opcode,
                "group_size": self.group_size, "groups": self.groups, "calls": self.calls,
                "bytes_sent_per_device": list(self.bytes_sent_per_device),
                "bytes_received_per_device": list(self.bytes_received_per_device),
                "seconds": self.seconds, "algorithm": self.algorithm, "reason": self.reason}


@dataclass(frozen=True)
class CostFigures:
    """A program's cost on `num_partitions` partitions (see the module docstring); `extra`
    holds what only one kind has (the machine of a model, the wall times of a measurement)."""

    kind: str
    module: str
    num_partitions: int
    collectives: tuple[CollectiveFigures, ...]
    flops_per_device: tuple[int | None, ...]
    peak_memory_bytes_per_device: tuple[int, ...]
    parameter_bytes_per_device: tuple[int, ...]
    output_bytes_per_device: tuple[int, ...]
    modelled_step_seconds: float | None
    seconds_by_kind: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes_sent_per_device(self) -> tuple[int | None, ...]:
        return _totals(self.collectives, "bytes_sent_per_device", self.num_partitions)

    @property
    def total_bytes_received_per_device(self) -> tuple[int | None, ...]:
        return _totals(self.collectives, "bytes_received_per_device", self.num_partitions)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "module": self.module, "num_partitions": self.num_partitions,
                "collectives": [c.to_json() for c in self.collectives],
                "total_bytes_sent_per_device": list(self.total_bytes_sent_per_device),
                "total_bytes_received_per_device": list(self.total_bytes_received_per_device),
                "flops_per_device": list(self.flops_per_device),
                "peak_memory_bytes_per_device": list(self.peak_memory_bytes_per_device),
                "parameter_bytes_per_device": list(self.parameter_bytes_per_device),
                "output_bytes_per_device": list(self.output_bytes_per_device),
                "modelled_step_seconds": self.modelled_step_seconds,
                "seconds_by_kind": dict(self.seconds_by_kind), **self.extra}


def _totals(collectives, key: str, n: int) -> tuple[int | None, ...]:
    totals: list[int | None] = [0] * n
    for c in collectives:
        for p, value in enumerate(getattr(c, key)):
            totals[p] = None if value is None or totals[p] is None else totals[p] + value
    return tuple(totals)


__all__ = ["CostFigures", "CollectiveFigures"]
