"""Device assignment of while loops that contain channel instructions (XLA's
CheckAndUpdateDeviceAssignmentsInWhileBody).

A `send`/`recv` (not a host transfer) or a channel `all-reduce`/`reduce-scatter` pinned to one
device inside a loop body pins the whole loop there: every other single-device instruction of the
body must be on the same device, as must the loop itself; an unsharded body root is assigned that
device (the control-flow tie then spreads it to the loop).
"""
from __future__ import annotations

from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import opcodes
from gspmdc.ir.sharding import HloSharding

from .graph import ModuleGraph
from gspmdc.ir.sharding_algebra import for_shape

_SEND_RECV = opcodes("send", "recv")
_CHANNEL_REDUCTIONS = opcodes("all-reduce", "reduce-scatter")


def _unique_device(inst: Instruction) -> int | None:
    return None if inst.sharding is None else inst.sharding.unique_device


def _is_channel_op(inst: Instruction) -> bool:
    if inst.opcode in _SEND_RECV:
        return not inst.attrs.get("is_host_transfer", False)
    return inst.opcode in _CHANNEL_REDUCTIONS and inst.attrs.get("channel_id") is not None


def assign_while_devices(graph: ModuleGraph, loop: Instruction) -> list[tuple[Instruction, Instruction]]:
    """Check the loop's device assignment; returns `[(body root, channel op)]` when the root was
    assigned the channel op's device. Raises PropagationError on a conflict."""
    from .driver import PropagationError
    body = graph.computation(loop.attrs["body"].name)
    channel_op: Instruction | None = None
    device: int | None = None
    others: dict[int, Instruction] = {}

    def conflict(inst: Instruction, inst_device: int) -> PropagationError:
        return PropagationError(
            f"instruction {inst.name} is on device {inst_device}, which conflicts with device "
            f"{device} of channel instruction {channel_op.name} in the body of loop {loop.name}")

    for inst in body.instructions:
        d = _unique_device(inst)
        if d is None:
            continue
        if device is not None:
            if d != device:
                raise conflict(inst, d)
        elif _is_channel_op(inst):
            channel_op, device = inst, d
            for other_device, other in others.items():
                if other_device != device:
                    raise conflict(other, other_device)
        else:
            others[d] = inst
    if device is None:
        return []
    loop_device = _unique_device(loop)
    if loop_device is not None and loop_device != device:
        raise conflict(loop, loop_device)
    root = body.root
    root_device = _unique_device(root)
    if root_device is None:
        root.sharding = for_shape(HloSharding.maximal(device), root.shape)
        return [(root, channel_op)]
    if root_device != device:
        raise conflict(root, root_device)
    return []
