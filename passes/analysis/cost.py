"""The modelled cost of a partitioned program, before running it: what `gspmdc cost` prints.

For a partitioned (SPMD) module on `num_partitions` partitions and a `Machine`:

- every collective with its groups, executions per run (a loop body's collectives once per
  iteration, when the trip count is static; a conditional's branches as if each ran), the bytes
  each partition sends and receives over the run and its modelled time (`gspmdc.ir.cost`, the
  model `run --profile`, `gspmdc explain` and the reshard planner count with too);
- operations per partition (`gspmdc.ir.flops`, times executions; a conditional counts its most
  expensive branch);
- peak memory per partition (`gspmdc.ir.liveness`);
- the modelled step time: every instruction's roofline time, the larger of its operations over
  the peak rate and the bytes it reads and writes over the memory bandwidth, times its
  executions, plus the collectives' times (no overlap of communication and computation is
  assumed), split by kind (`compute` for instructions limited by the operation rate, `memory`
  for those limited by the memory bandwidth, one entry per collective opcode; a conditional
  counts its most expensive branch, so the step time is an upper bound where branches differ);
- the modelled utilization: the operations of dots and convolutions over the step time and the
  peak rate (the measure of the GSPMD paper's utilization figures);
- the loops that never terminate once entered (`endless_loops`: their condition cannot change,
  `gspmdc.ir.while_loops`); their trip count, and what depends on it, is unknown.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.ir import ops
from gspmdc.ir.cost import collective_seconds, instruction_traffic
from gspmdc.ir.cost_figures import CollectiveFigures, CostFigures
from gspmdc.ir.flops import executed_computations, instruction_flops
from gspmdc.ir.liveness import OPERAND_PRESERVING, MemoryProfile, memory_profile, shape_bytes
from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.while_loops import invariant_condition_elements
from gspmdc.passes.spmd.traffic import execution_counts, trip_count

from .machine import Machine

#: instructions that move no data of their own (references, control flow, parameters)
_NO_WORK = OPERAND_PRESERVING | ops.with_trait(
    ops.Trait.CONTROL_FLOW, ops.Trait.ASYNC, ops.Trait.TOKEN, ops.Trait.DEVICE_ID) | \
    ops.opcodes("parameter", "tuple", "get-tuple-element", "constant", "bitcast")
#: instructions whose operations count toward the utilization (the matrix units' work)
MATRIX_OPCODES = ops.opcodes("dot", "convolution")


@dataclass(frozen=True)
class InstructionTime:
    """One instruction's modelled time over a run: executions, operations, bytes read and
    written per execution, seconds in total and what limits it ("compute" or "memory")."""

    name: str
    computation: str
    opcode: str
    executions: int | None
    flops: int
    bytes_accessed: int
    seconds: float | None
    bound: str


@dataclass(frozen=True)
class ProgramCost:
    """Everything `gspmdc cost` reports: the figures in the shared layout, the memory profile
    and the per-instruction times (most expensive first)."""

    figures: CostFigures
    memory: MemoryProfile
    instructions: tuple[InstructionTime, ...]
    machine: Machine


def program_cost(module: Module, num_partitions: int, machine: Machine) -> ProgramCost:
    """The modelled cost of the partitioned `module` (see the module docstring)."""
    n = num_partitions
    counts = execution_counts(module)
    collectives = []
    times = []
    for comp in executed_computations(module):
        executions = counts.get(comp.name)
        for inst in comp.instructions:
            if inst.opcode in ops.COLLECTIVES:
                collectives.append(_collective(inst, comp.name, n, executions, machine))
            else:
                timed = _instruction_time(inst, comp.name, executions, module, machine)
                if timed is not None:
                    times.append(timed)
    run = _RunCost(module, n, machine).of(module.entry.name)
    memory = memory_profile(module)
    step = None if run is None else sum(run.seconds.values())
    utilization = None if not step or run is None else \
        run.matrix_flops / (step * machine.flops_per_second)
    figures = CostFigures(
        "modelled", module.name, n, tuple(collectives),
        flops_per_device=(None if run is None else run.flops,) * n,
        peak_memory_bytes_per_device=(memory.peak_bytes,) * n,
        parameter_bytes_per_device=(memory.parameter_bytes,) * n,
        output_bytes_per_device=(memory.output_bytes,) * n,
        modelled_step_seconds=step,
        seconds_by_kind={} if run is None else dict(run.seconds),
        extra={"machine": machine.to_json(),
               "matrix_flops_per_device": None if run is None else run.matrix_flops,
               "modelled_utilization": utilization,
               "peak_memory": {"at": memory.peak_at,
                               "parameters": memory.peak_parameter_bytes,
                               "output": memory.peak_output_bytes,
                               "loop_state": memory.peak_loop_state_bytes,
                               "temporaries": memory.peak_temporary_bytes},
               "fits_in_memory": None if machine.memory_bytes is None else
               memory.peak_bytes <= machine.memory_bytes,
               "endless_loops": _endless_loops(module)})
    ranked = sorted(times, key=lambda t: -(t.seconds or 0.0))
    return ProgramCost(figures, memory, tuple(ranked), machine)


def _endless_loops(module: Module) -> list[dict]:
    """The while loops a run executes whose condition cannot change
    (`invariant_condition_elements`): once entered, they never terminate. Each as `name`,
    `computation` and `condition_reads` (the loop-state elements its condition reads)."""
    endless = []
    for comp in executed_computations(module):
        for inst in comp.instructions:
            if inst.opcode == "while":
                read = invariant_condition_elements(inst, module)
                if read is not None:
                    endless.append({"name": inst.name, "computation": comp.name,
                                    "condition_reads": list(read)})
    return endless


@dataclass(frozen=True)
class _Totals:
    """Operations and modelled seconds (by kind) of one execution of a computation."""

    flops: int
    matrix_flops: int
    seconds: dict[str, float]

    def plus(self, other: "_Totals", times: int = 1) -> "_Totals":
        seconds = dict(self.seconds)
        for kind, value in other.seconds.items():
            seconds[kind] = seconds.get(kind, 0.0) + value * times
        return _Totals(self.flops + other.flops * times,
                       self.matrix_flops + other.matrix_flops * times, seconds)


class _RunCost:
    """The totals of one execution of each computation: its instructions' own work, a loop's
    body and condition times its trip count, a call's callee, a conditional's most expensive
    branch (an upper bound: which branch runs is only known when running)."""

    def __init__(self, module: Module, n: int, machine: Machine):
        self.module, self.n, self.machine = module, n, machine
        self._done: dict[str, _Totals | None] = {}

    def of(self, name: str) -> _Totals | None:
        if name not in self._done:
            self._done[name] = self._compute(self.module.computation(name))
        return self._done[name]

    def _compute(self, comp) -> _Totals | None:
        totals = _Totals(0, 0, {"compute": 0.0, "memory": 0.0})
        for inst in comp.instructions:
            own = self._own(inst)
            if own is not None:
                totals = totals.plus(own)
            nested = self._nested(inst)
            if nested is _UNKNOWN:
                return None
            if nested is not None:
                totals = totals.plus(nested)
        return totals

    def _own(self, inst: Instruction) -> _Totals | None:
        if inst.opcode in ops.COLLECTIVES:
            seconds, _ = collective_seconds(instruction_traffic(inst, self.n),
                                            self.machine.latency, self.machine.link_bandwidth)
            return _Totals(0, 0, {inst.opcode: seconds})
        timed = _instruction_time(inst, "", 1, self.module, self.machine)
        if timed is None:
            return None
        matrix = timed.flops if inst.opcode in MATRIX_OPCODES else 0
        return _Totals(timed.flops, matrix, {timed.bound: timed.seconds})

    def _nested(self, inst: Instruction):
        opcode = inst.opcode
        if opcode == "while":
            trips = trip_count(inst, self.module.computations)
            body, condition = self.of(inst.attr("body").name), \
                self.of(inst.attr("condition").name)
            if trips is None or body is None or condition is None:
                return _UNKNOWN
            return _Totals(0, 0, {}).plus(body, trips).plus(condition, trips + 1)
        if opcode == "conditional":
            costs = [self.of(name) for name in inst.branch_computation_names()]
            if any(c is None for c in costs):
                return _UNKNOWN
            return max(costs, key=lambda c: sum(c.seconds.values()))
        callee = {"call": "to_apply", "fusion": "calls", "call-start": "to_apply"}.get(opcode)
        if callee is not None:
            result = self.of(inst.attr(callee).name)
            return _UNKNOWN if result is None else result
        return None


#: a called computation whose cost is not known before running (a loop without a static trip
#: count inside it)
_UNKNOWN = object()


def _collective(inst: Instruction, computation: str, n: int, executions: int | None,
                machine: Machine) -> CollectiveFigures:
    traffic = instruction_traffic(inst, n)
    seconds, algorithm = collective_seconds(traffic, machine.latency, machine.link_bandwidth)
    metadata = inst.attr("metadata")
    reason = metadata.get("spmd_reason") if metadata is not None else None

    def total(values):
        return tuple(None if executions is None else int(v) * executions for v in values)
    return CollectiveFigures(
        inst.name, computation, inst.opcode, traffic.group_size, traffic.num_groups, executions,
        total(traffic.sent), total(traffic.received),
        seconds=None if executions is None else seconds * executions,
        algorithm=algorithm, reason=reason)


def _instruction_time(inst: Instruction, computation: str, executions: int | None,
                      module: Module, machine: Machine) -> InstructionTime | None:
    """The roofline time of `inst` over the run, or None for instructions that do no work."""
    if inst.opcode in _NO_WORK:
        return None
    flops = instruction_flops(inst, module)
    accessed = shape_bytes(inst.shape) + sum(shape_bytes(o.shape) for o in inst.operands)
    compute, memory = flops / machine.flops_per_second, accessed / machine.memory_bandwidth
    bound = "compute" if compute >= memory else "memory"
    seconds = None if executions is None else max(compute, memory) * executions
    return InstructionTime(inst.name, computation, inst.opcode, executions, flops, accessed,
                           seconds, bound)


__all__ = ["ProgramCost", "InstructionTime", "program_cost", "MATRIX_OPCODES"]
