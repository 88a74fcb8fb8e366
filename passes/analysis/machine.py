"""Machine models: what `gspmdc cost` assumes a device and its links can do.

A `Machine` gives, per device: the peak operation rate, the memory bandwidth, the memory
capacity, and for collectives the bandwidth of the link a device sends on (β) and the latency of
one message (α). The presets are real systems; `docs/cost.md` gives the source of every figure
(datasheets and vendor documentation) and says which are assumptions. `gspmdc cost --calibrate`
measures this machine and writes a machine file (`Machine.to_json`) that `--machine FILE` reads.

The time of a collective on a machine's links is the cost model's
(`gspmdc.ir.cost.collective_seconds(traffic, machine.latency, machine.link_bandwidth)`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from gspmdc.errors import GspmdcError

_FIELDS = ("name", "description", "flops_per_second", "memory_bandwidth", "memory_bytes",
           "link_bandwidth", "latency")


@dataclass(frozen=True)
class Machine:
    """One device of a system and its links (SI units: operations/s, bytes/s, bytes, s)."""

    name: str
    description: str
    flops_per_second: float
    memory_bandwidth: float
    memory_bytes: int | None
    link_bandwidth: float
    latency: float

    def __post_init__(self):
        for name in ("flops_per_second", "memory_bandwidth", "link_bandwidth"):
            if not getattr(self, name) > 0:
                raise GspmdcError(f"machine {self.name}: {name} must be positive, got "
                                  f"{getattr(self, name)}")
        if not self.latency >= 0:
            raise GspmdcError(f"machine {self.name}: latency must not be negative, got "
                              f"{self.latency}")

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict, where: str) -> "Machine":
        """A machine from `to_json`'s dictionary; GspmdcError naming `where` when a field is
        missing or not a number."""
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise GspmdcError(f"{where}: machine file lacks {', '.join(missing)}")
        try:
            return Machine(str(data["name"]), str(data["description"]),
                           float(data["flops_per_second"]), float(data["memory_bandwidth"]),
                           None if data["memory_bytes"] is None else int(data["memory_bytes"]),
                           float(data["link_bandwidth"]), float(data["latency"]))
        except (TypeError, ValueError) as e:
            raise GspmdcError(f"{where}: bad machine file: {e}") from None


def _machine(name, description, tflops, memory_gbps, memory_gib, link_gbps, latency_us):
    return Machine(name, description, tflops * 1e12, memory_gbps * 1e9,
                   None if memory_gib is None else int(memory_gib * 2 ** 30),
                   link_gbps * 1e9, latency_us * 1e-6)


#: the presets of `--machine NAME` (sources in docs/cost.md)
PRESETS = {m.name: m for m in (
    _machine("tpu-v3", "one TPU v3 core (half a chip: 61.5 of its 123 bf16 TFLOP/s, 16 of its "
             "32 GiB HBM at 450 of 900 GB/s; 2048 cores share a pod's 340 TB/s all-reduce "
             "bandwidth); the GSPMD paper's machine", 61.5, 450, 16, 166, 5),
    _machine("tpu-v4", "one TPU v4 chip (275 bf16 TFLOP/s, 32 GiB HBM at 1200 GB/s; 4096 "
             "chips share a pod's 1.1 PB/s all-reduce bandwidth)", 275, 1200, 32, 268, 5),
    _machine("a100", "one NVIDIA A100 SXM4 80GB GPU in an NVLink node (312 bf16 TFLOP/s dense, "
             "2039 GB/s HBM2e, NVLink 3: 300 GB/s each way)", 312, 2039, 80, 300, 8),
    _machine("h100", "one NVIDIA H100 SXM5 GPU in an NVLink node (989 bf16 TFLOP/s dense, "
             "3350 GB/s HBM3, NVLink 4: 450 GB/s each way)", 989, 3350, 80, 450, 8),
    _machine("h100-ib", "one NVIDIA H100 SXM5 GPU across nodes (989 bf16 TFLOP/s dense, 80 GB "
             "at 3350 GB/s; one 400 Gb/s InfiniBand NDR port per GPU: 50 GB/s)",
             989, 3350, 80, 50, 15),
)}


def load_machine(spec: str) -> Machine:
    """A preset by name, or a machine file (JSON, as `--calibrate` writes) by path."""
    if spec in PRESETS:
        return PRESETS[spec]
    if "/" not in spec and not spec.endswith(".json"):
        raise GspmdcError(f"unknown machine {spec!r}: the presets are "
                          f"{', '.join(sorted(PRESETS))}, or give a machine file (.json)")
    try:
        with open(spec) as f:
            data = json.load(f)
    except OSError as e:
        raise GspmdcError(f"{spec}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise GspmdcError(f"{spec}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise GspmdcError(f"{spec}: a machine file holds one JSON object")
    return Machine.from_json(data, spec)


__all__ = ["Machine", "PRESETS", "load_machine"]
