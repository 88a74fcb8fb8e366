"""Per-partition execution profiles: where the time of one SPMD partition goes, and what it sends.

A `ProfileRecorder` is the interpreter's step hook (`evaluate(..., on_step=recorder.on_step)`) for
one partition. It sorts the exclusive time of every instruction into

- *collectives*: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute (waiting for
  slower partitions included);
- *kernels*: every other instruction except control flow;
- *interpretation*: the rest of the wall time (plan building, dispatch, value bookkeeping, the
  control-flow instructions themselves, argument checks).

For each collective instruction it counts executions, time and the bytes this partition sends, as
the cost model (`gspmdc.ir.cost`, docs/design/cost-model.md) counts them for this partition's
position in its group: the bytes of the ring algorithms, exact to the byte and the same numbers
the reshard planner and `gspmdc explain` give. The bytes an MPI library really moves depend on its
algorithm.

`recorder.timed(fn)` measures the evaluation's wall time; given `started_at` (the wall-clock time
`gspmdc run` started), it also records the start-up: the seconds from then until the evaluation
began (the first instruction). `recorder.reset()` forgets what was recorded so far except the
start-up (`run --repeat` profiles the runs after the first).

`format_run_times(seconds)` describes the times of repeated runs (`run --repeat`): median,
quartiles and extremes per run.

`recorder.profile()` gives a picklable `RankProfile`; `format_profiles` prints a table of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter, time
from typing import Callable, Sequence

from gspmdc.ir.cost import instruction_traffic
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import COLLECTIVES, opcodes

#: instructions whose own (exclusive) time is interpretation: they only call computations
CONTROL_OPCODES = opcodes("while", "call", "conditional", "fusion", "call-start", "call-done",
                          "async-start", "async-done", "map")


@dataclass
class CollectiveStats:
    """One collective instruction on one partition: executions, seconds, bytes sent."""

    opcode: str
    group_size: int
    calls: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0


@dataclass
class RankProfile:
    """The profile of one partition (times in seconds)."""

    partition: int
    wall: float = 0.0
    kernel_seconds: float = 0.0
    collective_seconds: float = 0.0
    collectives: dict[str, CollectiveStats] = field(default_factory=dict)
    #: seconds from the start of `gspmdc run` to this partition's first instruction
    startup: float | None = None

    @property
    def interpretation_seconds(self) -> float:
        return max(self.wall - self.kernel_seconds - self.collective_seconds, 0.0)

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.collectives.values())


class ProfileRecorder:
    """The step hook of one partition's evaluation; `timed(fn)` measures the wall time."""

    def __init__(self, partition: int, num_partitions: int, started_at: float | None = None):
        self._profile = RankProfile(partition)
        self._started_at = started_at
        self._num_partitions = num_partitions
        self._models: dict[int, tuple[CollectiveStats, int]] = {}

    def on_step(self, inst: Instruction, seconds: float) -> None:
        opcode = inst.opcode
        if opcode in COLLECTIVES:
            stats, sent = self._model(inst)
            stats.calls += 1
            stats.seconds += seconds
            stats.bytes_sent += sent
            self._profile.collective_seconds += seconds
        elif opcode not in CONTROL_OPCODES:
            self._profile.kernel_seconds += seconds

    def reset(self) -> None:
        """Forget the times, calls and bytes recorded so far; keep the start-up."""
        self._profile = RankProfile(self._profile.partition, startup=self._profile.startup)
        self._models.clear()

    def timed(self, fn: Callable[[], object]) -> object:
        """Call `fn()` and add its duration to the wall time (the first call records the
        start-up)."""
        if self._started_at is not None and self._profile.startup is None:
            self._profile.startup = time() - self._started_at
        start = perf_counter()
        try:
            return fn()
        finally:
            self._profile.wall += perf_counter() - start

    def profile(self) -> RankProfile:
        return self._profile

    def _model(self, inst: Instruction) -> tuple[CollectiveStats, int]:
        model = self._models.get(id(inst))
        if model is None:
            size, sent = self._cost(inst)
            stats = self._profile.collectives.setdefault(
                inst.name, CollectiveStats(inst.opcode, size))
            model = self._models[id(inst)] = (stats, sent)
        return model

    def _cost(self, inst: Instruction) -> tuple[int, int]:
        """(group size, bytes this partition sends per execution); a collective-permute's "group
        size" is its number of pairs."""
        traffic = instruction_traffic(inst, self._num_partitions)
        return traffic.group_size, int(traffic.sent[self._profile.partition])


def format_profiles(profiles: Sequence[RankProfile]) -> str:
    """A per-partition time table, the start-up of the slowest partition when recorded, then one
    line per collective instruction (calls, group size, bytes sent per partition per call and in
    total, the slowest partition's time)."""
    lines = ["partition     wall(s)  kernels(s)  collectives(s)  interpretation(s)  interp%  "
             "bytes sent"]
    for p in profiles:
        share = 100.0 * p.interpretation_seconds / p.wall if p.wall else 0.0
        lines.append(f"{p.partition:>9}  {p.wall:>10.4f}  {p.kernel_seconds:>10.4f}  "
                     f"{p.collective_seconds:>14.4f}  {p.interpretation_seconds:>17.4f}  "
                     f"{share:>6.1f}%  {_bytes(p.bytes_sent):>10}")
    startups = [p.startup for p in profiles if p.startup is not None]
    if startups:
        lines.append(f"start-up: {max(startups):.3f} s from the start of `gspmdc run` to the "
                     "first instruction (slowest partition)")
    names = sorted({name for p in profiles for name in p.collectives})
    if names:
        lines.append("")
        lines.append(f"{'collective':<32} {'opcode':<19} {'group':>5} {'calls':>6} "
                     f"{'bytes/call':>10} {'bytes total':>11} {'max time(s)':>11}")
        for name in names:
            stats = [p.collectives[name] for p in profiles if name in p.collectives]
            first = stats[0]
            per_call = max(s.bytes_sent // s.calls if s.calls else 0 for s in stats)
            lines.append(f"{name[:32]:<32} {first.opcode:<19} {first.group_size:>5} "
                         f"{first.calls:>6} {_bytes(per_call):>10} "
                         f"{_bytes(max(s.bytes_sent for s in stats)):>11} "
                         f"{max(s.seconds for s in stats):>11.4f}")
    return "\n".join(lines)


def format_run_times(seconds: Sequence[float]) -> str:
    """One line on the times of the runs after the first of `run --repeat`: the median, the
    quartiles, the fastest and the slowest run."""
    ordered = sorted(seconds)
    k = len(ordered)

    def quantile(q: float) -> float:
        position = q * (k - 1)
        low = int(position)
        high = min(low + 1, k - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
    return (f"repeat: {k} run{'s' if k > 1 else ''} after the first: median {_ms(quantile(0.5))} "
            f"per run, quartiles {_ms(quantile(0.25))} - {_ms(quantile(0.75))}, fastest "
            f"{_ms(ordered[0])}, slowest {_ms(ordered[-1])}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    exponent = min((n.bit_length() - 1) // 10, 3)
    return f"{n / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"
