"""Collective traffic of an SPMD program per run: every collective with its bytes and how many
times one run executes it.

A collective in the entry runs once; one in a `while` body runs once per iteration of every
execution of the loop, so its count is the enclosing count times the loop's trip count when that
is static (a counter started from a constant, stepped by a constant and compared with a constant
in the condition, the form JAX's `fori_loop`/`scan` and the partitioner's own loops take), and
unknown (`None`) otherwise. Branches of a `conditional` are counted as if each ran (an upper
bound); other called computations (call, async wrappers) inherit their caller's count.
XLA's collective reports (`reference.json` of the JAX programs) use the same measure: the
`dynamic_bytes` of a collective is its result bytes times its executions. The bytes sent are the
cost model's (`gspmdc.ir.cost`): per collective as a mean per device of the program (XLA's reports
use the same mean for the ring collectives, but count a collective-permute's operand on every
device where the cost model counts it only on the devices that send), and per device over the
run (`sent_per_device`), whose largest total is the program's busiest device.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from gspmdc.ir.cost import Traffic, instruction_traffic
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape

from .explain import collective_result_bytes


@dataclass(frozen=True)
class CollectiveTraffic:
    """One collective: its bytes per execution (`traffic`: every device's, exact), its result
    bytes per device, and executions per run (None when it sits in a loop without a static trip
    count)."""

    name: str
    computation: str
    opcode: str
    result_bytes: int
    traffic: Traffic
    executions: int | None

    @property
    def sent_bytes(self) -> Fraction:
        """Bytes sent per execution, per device of the program (a mean)."""
        return self.traffic.mean_sent

    @property
    def total_result_bytes(self) -> int | None:
        return None if self.executions is None else self.result_bytes * self.executions

    @property
    def total_sent_bytes(self) -> Fraction | None:
        return None if self.executions is None else self.sent_bytes * self.executions


def collective_traffic(module: Module, num_partitions: int) -> list[CollectiveTraffic]:
    """Every collective of `module` that moves data (program order, callers before callees;
    an async collective once, at its start)."""
    counts = execution_counts(module)
    found = []
    for comp in module.computations.values():
        if comp.name not in counts:
            continue
        for inst in comp.instructions:
            traffic = instruction_traffic(inst, num_partitions, module.computations)
            if traffic is not None:
                found.append(CollectiveTraffic(inst.name, comp.name, inst.opcode,
                                               collective_result_bytes(inst), traffic,
                                               counts[comp.name]))
    return found


def sent_per_device(module: Module, num_partitions: int) -> np.ndarray | None:
    """Bytes each device sends in one run of `module` (`[num_partitions]` integers): for every
    device, the sum over the collectives of its bytes per execution (`Traffic.sent`) times the
    collective's executions; None when some collective's executions are unknown. The busiest
    device of a program is the one with the largest total (its `max`), which can be less than
    the sum of each collective's busiest device's bytes when different devices are the busiest
    in different collectives (docs/design/cost-model.md#a-programs-bytes)."""
    total = np.zeros(num_partitions, dtype=np.int64)
    for t in collective_traffic(module, num_partitions):
        if t.executions is None:
            return None
        total += t.traffic.sent * t.executions
    return total


def execution_counts(module: Module) -> dict[str, int | None]:
    """Executions per run of each computation reachable from the entry (see the module
    docstring); computations only used as reducers or comparators are included too."""
    counts: dict[str, int | None] = {module.entry_name: 1}
    order = [module.entry]
    for comp in order:                      # grows while iterating: a breadth-first walk
        count = counts[comp.name]
        for inst in comp.instructions:
            for callee, times in _callees(inst, module.computations):
                total = None if count is None or times is None else count * times
                if callee not in counts:
                    counts[callee] = total
                    order.append(module.computations[callee])
                elif counts[callee] is not None:
                    counts[callee] = None if total is None else counts[callee] + total
    return counts


def _callees(inst: Instruction, computations: dict[str, Computation]):
    """(callee name, executions per execution of `inst`) for each computation `inst` calls."""
    if inst.opcode == "while":
        trips = trip_count(inst, computations)
        yield inst.attr("body").name, trips
        yield inst.attr("condition").name, None if trips is None else trips + 1
        return
    for name in inst.called_computation_names():
        yield name, 1


def trip_count(loop: Instruction, computations: dict[str, Computation]) -> int | None:
    """The static trip count of `while` instruction `loop`, or None (see the module
    docstring)."""
    cond = computations[loop.attr("condition").name]
    body = computations[loop.attr("body").name]
    compare = cond.root
    if compare.opcode != "compare" or len(compare.operands) != 2:
        return None
    direction = str(compare.attr("direction"))
    lhs, rhs = compare.operands
    index, bound = _counter_index(lhs), _constant(rhs)
    if index is None or bound is None:                  # `bound OP counter`: mirror it
        index, bound = _counter_index(rhs), _constant(lhs)
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    if index is None or bound is None:
        return None
    start, step = _initial(loop.operands[0], index), _step(body, index)
    if start is None or not step:
        return None
    return _count(start, step, bound, direction)


def _count(start: int, step: int, bound: int, direction: str) -> int | None:
    """Iterations of `for (i = start; i DIRECTION bound; i += step)`."""
    if direction in ("LE", "GE"):
        bound, direction = bound + (1 if direction == "LE" else -1), direction[0] + "T"
    if direction == "LT":
        return 0 if start >= bound else (None if step < 0 else -(-(bound - start) // step))
    if direction == "GT":
        return 0 if start <= bound else (None if step > 0 else -(-(start - bound) // -step))
    if direction == "NE":
        distance = bound - start
        return distance // step if distance % step == 0 and distance // step >= 0 else None
    return None


def _counter_index(inst: Instruction) -> int | None:
    """The tuple index when `inst` is `get-tuple-element(parameter(0))` of an integer scalar."""
    if (inst.opcode == "get-tuple-element" and inst.operands[0].opcode == "parameter"
            and isinstance(inst.shape, ArrayShape) and inst.shape.rank == 0):
        return inst.attr("index")
    return None


def _constant(inst: Instruction) -> int | None:
    """The value of an integer scalar constant (through converts and copies)."""
    while inst.opcode in ("convert", "copy") and inst.operands:
        inst = inst.operands[0]
    if inst.opcode != "constant" or inst.literal is None:
        return None
    value = inst.literal.value
    if value is None or value.shape != () or value.dtype.kind not in "iu":
        return None
    return int(value)


def _initial(init: Instruction, index: int) -> int | None:
    if init.opcode != "tuple" or index >= len(init.operands):
        return None
    return _constant(init.operands[index])


def _step(body: Computation, index: int) -> int | None:
    """The constant added to tuple element `index` by the body, or None."""
    root = body.root
    if root.opcode != "tuple" or index >= len(root.operands):
        return None
    update = root.operands[index]
    if update.opcode not in ("add", "subtract"):
        return None
    a, b = update.operands
    if _counter_index(a) == index and (c := _constant(b)) is not None:
        return c if update.opcode == "add" else -c
    if update.opcode == "add" and _counter_index(b) == index and (c := _constant(a)) is not None:
        return c
    return None


__all__ = ["CollectiveTraffic", "collective_traffic", "execution_counts", "sent_per_device",
           "trip_count"]
