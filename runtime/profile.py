"""Per-partition execution profiles: where the time of one SPMD partition goes, and what it sends.

A `ProfileRecorder` is the interpreter's step hook (`evaluate(..., on_step=recorder.on_step)`) for
one partition. It sorts the exclusive time of every instruction into

- *collectives*: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute (waiting for
  slower partitions included);
- *kernels*: every other instruction except control flow;
- *interpretation*: the rest of the wall time (plan building, dispatch, value bookkeeping, the
  control-flow instructions themselves, argument checks).

For each collective instruction it counts executions, time, and the bytes this partition sends
and receives in each execution, as the cost model (`gspmdc.ir.cost`, docs/design/cost-model.md)
counts them for this partition's position in its group: exact to the byte, the numbers `gspmdc
cost` predicts and the reshard planner and `gspmdc explain` give (an MPI library's own algorithm
may move other amounts). Given the module, it also counts the operations of every instruction run
as a program step (`gspmdc.ir.flops`), and its `live_arrays` (`runtime/live_arrays.py`, passed to
`evaluate(..., live_arrays=...)`) measure the peak of the partition's live arrays.

`recorder.timed(fn)` measures the evaluation's wall time; given `started_at` (the wall-clock time
`gspmdc run` started), it also records the start-up: the seconds from then until the evaluation
began (the first instruction). `recorder.reset()` forgets what was recorded so far except the
start-up and the peak of live arrays (`run --repeat` profiles the runs after the first).

`format_run_times(seconds)` describes the times of repeated runs (`run --repeat`): median,
quartiles and extremes per run.

`recorder.profile()` gives a picklable `RankProfile`; `format_profiles` prints a table of them,
`measured_figures` turns them into the figures `gspmdc run --profile-json` writes (the layout of
`gspmdc.ir.cost_figures`, shared with `gspmdc cost --json`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter, time
from typing import TYPE_CHECKING, Callable, Sequence

from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.ops import COLLECTIVES, opcodes

from .live_arrays import LiveArrays

if TYPE_CHECKING:       # the cost model is imported when the profile is read, after the run
    from gspmdc.ir.cost_figures import CostFigures

#: instructions whose own (exclusive) time is interpretation: they only call computations
CONTROL_OPCODES = opcodes("while", "call", "conditional", "fusion", "call-start", "call-done",
                          "async-start", "async-done", "map")


@dataclass
class CollectiveStats:
    """One collective instruction on one partition: executions, seconds, bytes sent and
    received."""

    opcode: str
    group_size: int
    computation: str = ""
    groups: int = 1
    calls: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0


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
    #: the most bytes the partition's live arrays held at once
    peak_live_bytes: int = 0
    #: operations of the instructions run (None: not counted, the recorder had no module)
    flops: int | None = None

    @property
    def interpretation_seconds(self) -> float:
        return max(self.wall - self.kernel_seconds - self.collective_seconds, 0.0)

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.collectives.values())


class ProfileRecorder:
    """The step hook of one partition's evaluation; `timed(fn)` measures the wall time,
    `live_arrays` the live arrays (hand it to `evaluate`). Given `module` (the program it
    profiles), it counts operations too."""

    def __init__(self, partition: int, num_partitions: int, started_at: float | None = None,
                 module: Module | None = None):
        self._partition = partition
        self._started_at = started_at
        self._startup: float | None = None
        self._num_partitions = num_partitions
        self._module = module
        self.live_arrays = LiveArrays()
        self.reset()

    def on_step(self, inst: Instruction, seconds: float) -> None:
        # counts and seconds only: bytes and operations per execution are looked up once, in
        # `profile()`, so that nothing of the cost model runs before or during the evaluation
        opcode = inst.opcode
        if opcode in COLLECTIVES:
            record = self._collectives.get(id(inst))
            if record is None:
                record = self._collectives[id(inst)] = [inst, 0, 0.0]
            record[1] += 1
            record[2] += seconds
            self._collective_seconds += seconds
        elif opcode not in CONTROL_OPCODES:
            self._kernel_seconds += seconds
        if self._module is not None:
            key = id(inst)
            self._steps[key] = self._steps.get(key, 0) + 1

    def reset(self) -> None:
        """Forget the times, calls, bytes and operations recorded so far; keep the start-up (and
        the peak of live arrays, which repeated runs of one program share)."""
        self._wall = self._kernel_seconds = self._collective_seconds = 0.0
        self._collectives: dict[int, list] = {}     # id -> [instruction, calls, seconds]
        self._steps: dict[int, int] = {}            # id -> executions

    def timed(self, fn: Callable[[], object]) -> object:
        """Call `fn()` and add its duration to the wall time (the first call records the
        start-up)."""
        if self._started_at is not None and self._startup is None:
            self._startup = time() - self._started_at
        start = perf_counter()
        try:
            return fn()
        finally:
            self._wall += perf_counter() - start

    def profile(self) -> RankProfile:
        """What was recorded, with each collective's bytes by the cost model and the operations
        of the instructions run (given the module)."""
        from gspmdc.ir.cost import instruction_traffic
        me = self._partition
        profile = RankProfile(me, self._wall, self._kernel_seconds, self._collective_seconds,
                              startup=self._startup, peak_live_bytes=self.live_arrays.peak)
        where = {} if self._module is None else \
            {id(inst): comp.name for comp in self._module.computations.values()
             for inst in comp.instructions}
        for inst, calls, seconds in self._collectives.values():
            traffic = instruction_traffic(inst, self._num_partitions)
            stats = profile.collectives.setdefault(
                inst.name, CollectiveStats(inst.opcode, traffic.group_size,
                                           where.get(id(inst), ""), traffic.num_groups))
            stats.calls += calls
            stats.seconds += seconds
            stats.bytes_sent += calls * int(traffic.sent[me])
            stats.bytes_received += calls * int(traffic.received[me])
        module = self._module
        if module is not None:
            from gspmdc.ir.flops import executed_computations, instruction_flops
            profile.flops = sum(self._steps[id(inst)] * instruction_flops(inst, module)
                                for comp in executed_computations(module)
                                for inst in comp.instructions if id(inst) in self._steps)
        return profile


def format_profiles(profiles: Sequence[RankProfile]) -> str:
    """A per-partition table (times, bytes sent, peak of live arrays), the start-up of the
    slowest partition when recorded, then one
    line per collective instruction (calls, group size, bytes sent per partition per call and in
    total, the slowest partition's time)."""
    lines = ["partition     wall(s)  kernels(s)  collectives(s)  interpretation(s)  interp%  "
             "bytes sent  peak live"]
    for p in profiles:
        share = 100.0 * p.interpretation_seconds / p.wall if p.wall else 0.0
        lines.append(f"{p.partition:>9}  {p.wall:>10.4f}  {p.kernel_seconds:>10.4f}  "
                     f"{p.collective_seconds:>14.4f}  {p.interpretation_seconds:>17.4f}  "
                     f"{share:>6.1f}%  {_bytes(p.bytes_sent):>10}  "
                     f"{_bytes(p.peak_live_bytes):>9}")
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


def measured_figures(module: Module, profiles: Sequence[RankProfile]) -> CostFigures:
    """The measured counterparts of `gspmdc cost`'s figures (`gspmdc.ir.cost_figures`): per
    partition, the bytes each collective sent and received over the run, the operations run,
    the peak of live arrays; a collective's `seconds` and the step's are the slowest
    partition's."""
    from gspmdc.ir.cost_figures import CollectiveFigures, CostFigures
    from gspmdc.ir.liveness import shape_bytes
    n = len(profiles)
    ordered = sorted(profiles, key=lambda p: p.partition)
    names = sorted({name for p in ordered for name in p.collectives})
    collectives = []
    for name in names:
        stats = [p.collectives.get(name) for p in ordered]
        first = next(s for s in stats if s is not None)
        collectives.append(CollectiveFigures(
            name, first.computation, first.opcode, first.group_size, first.groups,
            max(s.calls for s in stats if s is not None),
            tuple(s.bytes_sent if s is not None else 0 for s in stats),
            tuple(s.bytes_received if s is not None else 0 for s in stats),
            seconds=max(s.seconds for s in stats if s is not None)))
    slowest = max(ordered, key=lambda p: p.wall)
    entry = module.entry
    return CostFigures(
        "measured", module.name, n, tuple(collectives),
        flops_per_device=tuple(p.flops for p in ordered),
        peak_memory_bytes_per_device=tuple(p.peak_live_bytes for p in ordered),
        parameter_bytes_per_device=(sum(shape_bytes(p.shape) for p in entry.parameters),) * n,
        output_bytes_per_device=(shape_bytes(entry.root.shape),) * n,
        modelled_step_seconds=slowest.wall,
        seconds_by_kind={"kernels": slowest.kernel_seconds,
                         "collectives": slowest.collective_seconds,
                         "interpretation": slowest.interpretation_seconds},
        extra={"wall_seconds_per_device": [p.wall for p in ordered]})


def format_run_times(seconds: Sequence[float], blas: tuple[str, int] | None = None) -> str:
    """One line on the times of the runs after the first of `run --repeat`: the median, the
    quartiles, the fastest and the slowest run; with `blas` (the kernels an OpenBLAS ran and
    its threads per partition, `blas.blas_in_use`), those too: what a product costs depends on
    both, and the thread count on the machine's load when the run started."""
    ordered = sorted(seconds)
    k = len(ordered)

    def quantile(q: float) -> float:
        position = q * (k - 1)
        low = int(position)
        high = min(low + 1, k - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
    line = (f"repeat: {k} run{'s' if k > 1 else ''} after the first: median "
            f"{_ms(quantile(0.5))} per run, quartiles {_ms(quantile(0.25))} - "
            f"{_ms(quantile(0.75))}, fastest {_ms(ordered[0])}, slowest {_ms(ordered[-1])}")
    if blas is None:
        return line
    kernels, threads = blas
    return (f"{line}; BLAS: OpenBLAS's {kernels} kernels, {threads} thread"
            f"{'s' if threads != 1 else ''} per partition")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    exponent = min((n.bit_length() - 1) // 10, 3)
    return f"{n / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"
