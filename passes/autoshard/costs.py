"""What a strategy costs: modelled seconds of local computation and of collectives, per device,
on a machine.

The measure is that of the partitioned program's modelled step time: every instruction's
roofline time (the larger of its operations over the device's operation rate and the bytes it
reads and writes over its memory bandwidth) plus every collective's time on the device's link
(`gspmdc.ir.cost.collective_seconds`, the one time model of `gspmdc cost`: latency per message
step plus the busiest device's bytes over the link bandwidth, ring or tree, whichever is faster),
with no overlap of communication and computation. Machines are `gspmdc cost`'s
(`passes/analysis/machine.py`).

- `instruction_seconds`: the roofline time of an instruction run on its local shapes (the shard
  shapes of the shardings a strategy gives its operands and result);
- `reshard`: the time and bytes per device of the reshard planner's plan between two
  shardings (`passes/spmd/reshard_plan.py`): each collective step timed as the collectives it
  emits on their groups (an exchange of pieces one collective-permute per round), each local
  step (a slice) as the memory it touches;
- `own_traffic`: bytes a rule's local computation sends itself (halo exchanges), timed as one
  collective-permute.
"""
from __future__ import annotations

from math import prod

from gspmdc.ir import dtypes, ops
from gspmdc.ir.cost import Traffic, collective_permute, collective_seconds
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.analysis.machine import PRESETS, Machine
from gspmdc.passes.spmd import reshard_plan as rp


#: the GSPMD paper's machine, `gspmdc cost`'s default (`passes/analysis/machine.py`)
DEFAULT_MACHINE = PRESETS["tpu-v3"]


#: opcodes whose instruction computes nothing itself (a loop's or branch's work is its body's)
_FREE = ops.with_trait(ops.Trait.CONTROL_FLOW, ops.Trait.TOKEN, ops.Trait.DEVICE_ID) | \
    ops.opcodes("parameter", "tuple", "get-tuple-element", "constant", "bitcast", "custom-call")


def instruction_flops(inst: Instruction, operands: list[ArrayShape], result: list[ArrayShape],
                      computations: dict) -> int:
    """Operations of one execution of `inst` on the given local shapes: 2 per multiply-add of
    a dot or convolution, the reducer's operations per reduced element, one per element of
    elementwise results, none for data movement."""
    opcode = inst.opcode
    out = sum(prod(s.dims) for s in result)
    if opcode == "dot":
        lhs = operands[0]
        return 2 * out * prod(lhs.dims[d] for d in inst.attr("lhs_contracting_dims", ()))
    if opcode == "convolution":
        labels = inst.attr("dim_labels")
        kernel = operands[1]
        return 2 * out * prod(kernel.dims) // max(kernel.dims[labels.rhs_output_feature], 1)
    if opcode in ("reduce", "reduce-window"):
        reducer = computations[inst.attr("to_apply").name]
        per = max(sum(1 for i in reducer.instructions
                      if i.opcode not in ("parameter", "constant", "tuple")), 1)
        if opcode == "reduce":
            return max(prod(operands[0].dims) - prod(result[0].dims), 0) * per
        window = inst.attr("window")
        size = prod(d.size for d in window.dims) if window is not None else 1
        return out * max(size - 1, 0) * per
    if opcode in ops.ELEMENTWISE:
        return out
    return 0


class CostModel:
    """Costs on `machine` for `num_devices` partitions (see the module docstring)."""

    def __init__(self, machine: Machine, num_devices: int, computations: dict):
        self.machine = machine
        self.num_devices = num_devices
        self.computations = computations
        self._reshards: dict = {}

    def instruction_seconds(self, inst: Instruction, operands: tuple[HloSharding, ...],
                            results: tuple[HloSharding, ...]) -> float:
        """Roofline seconds of `inst` run locally with operand leaves sharded as `operands` and
        result leaves as `results`."""
        if inst.opcode in _FREE:
            return 0.0
        leaves = [leaf for o in inst.operands for leaf in o.shape.leaves()]
        local_in = [_local(s, h) for s, h in zip(leaves, operands)]
        local_out = [_local(s, h) for s, h in zip(inst.shape.leaves(), results)]
        flops = instruction_flops(inst, local_in, local_out, self.computations)
        accessed = sum(_bytes(s) for s in local_in) + sum(_bytes(s) for s in local_out)
        return max(flops / self.machine.flops_per_second,
                   accessed / self.machine.memory_bandwidth)

    def reshard(self, shape: ArrayShape, have: HloSharding, want: HloSharding
                ) -> tuple[float, float]:
        """(seconds, bytes sent per device) of resharding a value of `shape`."""
        if have == want:
            return 0.0, 0.0
        key = (shape.without_layout(), have, want)
        found = self._reshards.get(key)
        if found is None:
            plan = self.plan(shape, have, want)
            steps = plan.steps
            # a plan on padded dims pads the uneven ones, which planning kept as they are
            dims = shape.dims if plan.padded is None else tuple(
                p if d % self.num_devices else d for d, p in zip(shape.dims, plan.padded))
            width = max(dtypes.byte_width(shape.element_type), 1)
            seconds = sum(self._step_seconds(step, shape.with_dims(dims)) for step in steps)
            traffic = (s.traffic(dims, width) for s in steps)
            found = self._reshards[key] = (seconds, sum(t.max_sent for t in traffic
                                                        if t is not None))
        return found

    def plan(self, shape: ArrayShape, have: HloSharding, want: HloSharding) -> rp.ReshardPlan:
        """The planner's plan for `shape`, planned once for all shapes of the same rank whose
        dims divide alike: a dim that every tile count divides (a multiple of the device
        count) is planned as the device count, since every step then moves a fixed fraction
        of the whole array and the planner's choice does not depend on its size. An exchange
        of pieces sizes its rounds for the dims it is planned on, though: a plan with one is
        planned again on `shape`'s own dims."""
        n = self.num_devices
        dims = tuple(n if d % n == 0 and d > 0 else d for d in shape.dims)
        plan = rp.plan_reshard(ArrayShape("u8", dims), have, want, n)
        if dims != shape.dims and any(isinstance(s, rp.Exchange) for s in plan.steps):
            plan = rp.plan_reshard(ArrayShape("u8", shape.dims), have, want, n)
        return plan

    def own_traffic(self, sent_bytes: float) -> tuple[float, float]:
        """(seconds, bytes) of a local computation's own sends, as one collective-permute."""
        if not sent_bytes:
            return 0.0, 0.0
        return self._seconds(collective_permute([(0, 1)], int(sent_bytes), 2)), sent_bytes

    def _step_seconds(self, step: rp.Step, shape: ArrayShape) -> float:
        width = max(dtypes.byte_width(shape.element_type), 1)
        dims = shape.dims
        collectives = step.collective_traffics(dims, width)
        if collectives:
            return sum(self._seconds(traffic) for traffic in collectives)
        before = prod(rp.local_dims(dims, step.before)) * width
        after = prod(rp.local_dims(dims, step.after)) * width
        return (before + after) / self.machine.memory_bandwidth

    def _seconds(self, traffic: Traffic) -> float:
        """Seconds of one collective on the machine's links."""
        return collective_seconds(traffic, self.machine.latency, self.machine.link_bandwidth)[0]


def _local(shape: ArrayShape, sharding: HloSharding) -> ArrayShape:
    return sharding.shard_shape(shape)


def _bytes(shape: ArrayShape) -> int:
    return prod(shape.dims) * max(dtypes.byte_width(shape.element_type), 1)


__all__ = ["Machine", "DEFAULT_MACHINE", "CostModel", "instruction_flops"]
