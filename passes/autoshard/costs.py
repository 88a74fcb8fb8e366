"""What a strategy costs: modelled seconds of local computation and of collectives, per device,
on a machine.

The measure is that of the partitioned program's modelled step time: every instruction's
roofline time (the larger of its operations over the device's operation rate and the bytes it
reads and writes over its memory bandwidth) plus every collective's time on the device's link
(latency per message step plus bytes over bandwidth, ring or tree, whichever is faster), with no
overlap of communication and computation.

- `instruction_seconds`: the roofline time of an instruction run on its local shapes (the shard
  shapes of the shardings a strategy gives its operands and result);
- `reshard`: the time and bytes per device of the reshard planner's plan between two
  shardings (`passes/spmd/reshard_plan.py`): each collective step timed as that collective on
  its group, each local step (a slice) as the memory it touches;
- `own_traffic`: bytes a rule's local computation sends itself (halo exchanges), timed as one
  collective-permute.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil, log2, prod

from gspmdc.ir import dtypes, ops
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.passes.spmd import reshard_plan as rp


@dataclass(frozen=True)
class Machine:
    """One device and its link (SI units): operation rate, memory bandwidth, memory capacity
    (None: unknown), link bandwidth each way, latency of one message."""

    name: str
    flops_per_second: float
    memory_bandwidth: float
    memory_bytes: int | None
    link_bandwidth: float
    latency: float


#: one TPU v3 core (61.5 TFLOP/s, 450 GB/s of HBM, 16 GiB, 166 GB/s links, 5 µs): the GSPMD
#: paper's machine
DEFAULT_MACHINE = Machine("tpu-v3", 61.5e12, 450e9, 16 * 2**30, 166e9, 5e-6)


def collective_seconds(kind: str, operand_bytes: float, group_size: int,
                       machine: Machine) -> float:
    """Seconds of one collective of `kind` over groups of `group_size`, each member holding
    `operand_bytes` of operand: ring or tree, whichever is faster."""
    g, b = group_size, operand_bytes
    alpha, beta = machine.latency, machine.link_bandwidth
    if g <= 1 or b == 0:
        return 0.0
    if kind == "collective-permute":
        return alpha + b / beta
    steps = ceil(log2(g))
    if kind == "all-gather":
        return min((g - 1) * (alpha + b / beta), steps * alpha + (g - 1) * b / beta)
    if kind == "all-reduce":
        return min(2 * (g - 1) * (alpha + b / (g * beta)), 2 * steps * (alpha + b / beta))
    if kind == "reduce-scatter":
        return min((g - 1) * (alpha + b / (g * beta)), steps * alpha + (g - 1) * b / (g * beta))
    return (g - 1) * (alpha + b / (g * beta))


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
            steps = self._steps(shape, have, want)
            width = max(dtypes.byte_width(shape.element_type), 1)
            seconds = sum(self._step_seconds(step, shape) for step in steps)
            traffic = (s.traffic(shape.dims, width) for s in steps)
            found = self._reshards[key] = (seconds, sum(t.max_sent for t in traffic
                                                        if t is not None))
        return found

    def _steps(self, shape: ArrayShape, have: HloSharding, want: HloSharding):
        """The planner's steps for `shape`, planned once for all shapes of the same rank whose
        dims divide alike: a dim that every tile count divides (a multiple of the device
        count) is planned as the device count, since every step then moves a fixed fraction
        of the whole array and the planner's choice does not depend on its size."""
        n = self.num_devices
        dims = tuple(n if d % n == 0 and d > 0 else d for d in shape.dims)
        return rp.plan_reshard(ArrayShape("u8", dims), have, want, n).steps

    def own_traffic(self, sent_bytes: float) -> tuple[float, float]:
        """(seconds, bytes) of a local computation's own sends, as one collective-permute."""
        if not sent_bytes:
            return 0.0, 0.0
        return collective_seconds("collective-permute", sent_bytes, 2, self.machine), sent_bytes

    def _step_seconds(self, step: rp.Step, shape: ArrayShape) -> float:
        width = max(dtypes.byte_width(shape.element_type), 1)
        dims = shape.dims
        before = prod(rp.local_dims(dims, step.before)) * width
        m = self.machine
        if isinstance(step, (rp.AllReduce, rp.ReduceScatter)):
            return collective_seconds(step.collective, before, step.groups.shape[1], m)
        if isinstance(step, (rp.AllGather, rp.AllToAll)):
            return collective_seconds(step.collective, before, step.factor, m)
        if isinstance(step, rp.BroadcastFromDevice):
            return collective_seconds("all-reduce", prod(dims) * width, self.num_devices, m)
        if isinstance(step, (rp.Permute, rp.SendToDevice)):
            return collective_seconds("collective-permute", before, 2, m)
        after = prod(rp.local_dims(dims, step.after)) * width
        return (before + after) / m.memory_bandwidth


def _local(shape: ArrayShape, sharding: HloSharding) -> ArrayShape:
    return sharding.shard_shape(shape)


def _bytes(shape: ArrayShape) -> int:
    return prod(shape.dims) * max(dtypes.byte_width(shape.element_type), 1)


__all__ = ["Machine", "DEFAULT_MACHINE", "CostModel", "collective_seconds",
           "instruction_flops"]
