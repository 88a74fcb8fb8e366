"""Communication cost, the one model of gspmdc: the bytes every device sends and receives in one
execution of a collective, exactly, and its modelled time on a machine's links (the model is
described in docs/design/cost-model.md). The reshard planner, `gspmdc explain`, `gspmdc cost` and
`run --profile` all count with it.

`instruction_traffic(inst, num_partitions)` reads a collective instruction: its kind, its groups
(`collective_groups`: XLA's group modes) or source-target pairs, and its operand and result
shapes. The functions named after the collectives (`all_gather`, `all_reduce`, ...) compute the
same `Traffic` from groups and sizes, for callers that plan collectives before they exist (the
reshard planner). Every count is an integer number of bytes per device:

| kind                 | bytes member r of a group of g sends (E elements of w bytes each)         |
|----------------------|---------------------------------------------------------------------------|
| all-gather           | `(g-1) b`, `b` its operand's bytes                                        |
| reduce-scatter       | `(E - c_r) w`: every chunk but its own                                    |
| all-reduce           | `(2E - c_r - c_{r+1}) w`: a ring reduce-scatter, then a ring all-gather   |
| all-to-all           | `(E - c_r) w`: every block but its own (tuple form: all operands but its) |
| collective-permute   | `b` when it is the source of a pair with another target, else 0           |
| collective-broadcast | `b` for members 0..g-2 (a chain from member 0, the source), else 0        |

with chunks `c_k = E // g + (1 if k < E % g else 0)` (indices mod g). An `async-start` costs as the
collective it wraps, its `async-done` nothing. Devices in no group send nothing.
"""
from __future__ import annotations

from fractions import Fraction
from math import ceil, log2
from typing import Sequence

import numpy as np

from .collective_groups import participant_groups, permute_pairs
from .module import Instruction
from .ops import COLLECTIVES
from .shapes import Shape


class Traffic:
    """The bytes one execution of a collective moves: `sent[d]` and `received[d]` for every device
    d of the program (read-only int64 arrays). `num_groups` groups of `group_size` members (a
    collective-permute: its pairs, groups of two, or of one when no pair moves data);
    `operand_bytes` the bytes of one member's operands.

    A collective over groups is stored by group member (`by_member`): the member at position k of
    every group sends and receives the same bytes, so `max_sent` and `total_sent` (what the reshard
    planner compares) cost the same at 8 and at 4096 devices; the per-device arrays are built on
    first use."""

    __slots__ = ("kind", "num_groups", "group_size", "operand_bytes", "num_devices", "_groups",
                 "_member_sent", "_member_received", "_sent", "_received")

    def __init__(self, kind: str, num_groups: int, group_size: int, operand_bytes: int,
                 sent: np.ndarray, received: np.ndarray):
        for name, value in (("kind", kind), ("num_groups", num_groups),
                            ("group_size", group_size), ("operand_bytes", operand_bytes),
                            ("num_devices", sent.size), ("_groups", None),
                            ("_member_sent", None), ("_member_received", None),
                            ("_sent", sent), ("_received", received)):
            object.__setattr__(self, name, value)
        for array in (sent, received):
            array.setflags(write=False)

    @classmethod
    def by_member(cls, kind: str, groups: np.ndarray, operand_bytes: int, member_sent,
                  member_received, num_devices: int) -> "Traffic":
        """A collective over `groups` (`[G, g]`, disjoint) whose member at position k sends
        `member_sent[k]` and receives `member_received[k]` bytes; devices in no group send
        nothing."""
        traffic = object.__new__(cls)
        count, g = groups.shape
        for name, value in (("kind", kind), ("num_groups", count), ("group_size", g),
                            ("operand_bytes", operand_bytes), ("num_devices", num_devices),
                            ("_groups", groups),
                            ("_member_sent", np.asarray(member_sent, dtype=np.int64)),
                            ("_member_received", np.asarray(member_received, dtype=np.int64)),
                            ("_sent", None), ("_received", None)):
            object.__setattr__(traffic, name, value)
        return traffic

    def __setattr__(self, name, value):
        raise AttributeError("Traffic is immutable")

    @property
    def sent(self) -> np.ndarray:
        if self._sent is None:
            object.__setattr__(self, "_sent", _per_device(self._groups, self._member_sent,
                                                          self.num_devices))
        return self._sent

    @property
    def received(self) -> np.ndarray:
        if self._received is None:
            object.__setattr__(self, "_received", _per_device(
                self._groups, self._member_received, self.num_devices))
        return self._received

    @property
    def total_sent(self) -> int:
        """Bytes sent by all devices together."""
        if self._sent is None:
            return self.num_groups * int(self._member_sent.sum())
        return int(self._sent.sum())

    @property
    def max_sent(self) -> int:
        """Bytes sent by the busiest device."""
        if self._sent is None:
            return int(self._member_sent.max()) if self._groups.size else 0
        return int(self._sent.max()) if self._sent.size else 0

    @property
    def mean_sent(self) -> Fraction:
        """Bytes sent per device of the program, on average (what XLA's estimates report)."""
        return Fraction(self.total_sent, max(self.num_devices, 1))

    def describe(self) -> str:
        """`sends 1024 bytes per device`, `sends 256 bytes from each of 2 devices`, or
        `sends 28 to 32 bytes per device (120 in total)`."""
        values = np.unique(self.sent)
        if values.size == 1:
            return f"sends {int(values[0])} bytes per device"
        senders = int((self.sent > 0).sum())
        if values.size == 2 and values[0] == 0:
            return f"sends {int(values[1])} bytes from each of {senders} devices"
        return f"sends {int(values.min())} to {int(values.max())} bytes per device " \
               f"({self.total_sent} in total)"


def _chunks(elements: int, parts: int) -> np.ndarray:
    """Sizes of `elements` cut into `parts` nearly equal chunks, the larger ones first."""
    sizes = np.full(parts, elements // parts, dtype=np.int64)
    sizes[:elements % parts] += 1
    return sizes


def _per_device(groups: np.ndarray, per_member: np.ndarray, num_devices: int) -> np.ndarray:
    """`[N]` array: `per_member[k]` for the member at position k of its group, 0 elsewhere
    (read-only)."""
    out = np.zeros(num_devices, dtype=np.int64)
    out[groups] = per_member[None, :]
    out.setflags(write=False)
    return out


def _groups(groups) -> np.ndarray:
    return np.asarray(groups, dtype=np.int64).reshape(len(groups), -1)


def all_gather(groups, operand_bytes: int, num_devices: int) -> Traffic:
    """Every member sends its operand to the g-1 others (around a ring) and receives theirs."""
    groups = _groups(groups)
    g = groups.shape[1]
    each = np.full(g, (g - 1) * operand_bytes, dtype=np.int64)
    return Traffic.by_member("all-gather", groups, operand_bytes, each, each, num_devices)


def reduce_scatter(groups, elements: int, width: int, num_devices: int) -> Traffic:
    """A ring reduce-scatter of an operand of `elements` elements: member r ends with chunk r and
    sends every other chunk once; it receives what member r-1 sends."""
    groups = _groups(groups)
    g = groups.shape[1]
    sent = (elements - _chunks(elements, g)) * width
    return Traffic.by_member("reduce-scatter", groups, elements * width, sent,
                             np.roll(sent, 1), num_devices)


def all_reduce(groups, elements: int, width: int, num_devices: int) -> Traffic:
    """A ring reduce-scatter, then a ring all-gather of the reduced chunks: member r sends every
    chunk but its own, then every chunk but member r+1's."""
    groups = _groups(groups)
    g = groups.shape[1]
    c = _chunks(elements, g)
    sent = (2 * elements - c - np.roll(c, -1)) * width
    return Traffic.by_member("all-reduce", groups, elements * width, sent,
                             np.roll(sent, 1), num_devices)


def all_to_all(groups, elements: int, width: int, num_devices: int) -> Traffic:
    """Member r splits its operand of `elements` elements into g blocks and sends block j to member
    j: every block but its own; it receives block r of every other member."""
    groups = _groups(groups)
    g = groups.shape[1]
    c = _chunks(elements, g)
    return Traffic.by_member("all-to-all", groups, elements * width, (elements - c) * width,
                             (g - 1) * c * width, num_devices)


def all_to_all_tuple(groups, operand_bytes: Sequence[int], num_devices: int) -> Traffic:
    """The tuple form: member r sends its operand j to member j (every operand but its own r-th)
    and receives operand r of every other member."""
    groups = _groups(groups)
    g = groups.shape[1]
    sizes = np.asarray(operand_bytes, dtype=np.int64)
    return Traffic.by_member("all-to-all", groups, int(sizes.sum()), sizes.sum() - sizes,
                             (g - 1) * sizes, num_devices)


def collective_permute(pairs, operand_bytes: int, num_devices: int) -> Traffic:
    """Each pair `(source, target)` with two different devices moves the operand once."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    moving = pairs[pairs[:, 0] != pairs[:, 1]]
    sent = np.zeros(num_devices, dtype=np.int64)
    received = np.zeros(num_devices, dtype=np.int64)
    sent[moving[:, 0]] = operand_bytes
    received[moving[:, 1]] = operand_bytes
    return Traffic("collective-permute", len(pairs), 2 if len(moving) else 1, operand_bytes, sent,
                   received)


def collective_broadcast(groups, operand_bytes: int, num_devices: int) -> Traffic:
    """Member 0 of each group is the source; the operand travels down the chain of members."""
    groups = _groups(groups)
    g = groups.shape[1]
    sent = np.where(np.arange(g) < g - 1, operand_bytes, 0)
    received = np.where(np.arange(g) > 0, operand_bytes, 0)
    return Traffic.by_member("collective-broadcast", groups, operand_bytes, sent,
                             received, num_devices)


def instruction_traffic(inst: Instruction, num_partitions: int,
                        computations: dict | None = None) -> Traffic | None:
    """The traffic of one execution of `inst` on `num_partitions` partitions, or None when it
    moves no data between devices (not a collective, or an `async-done`). An
    `async-start` costs as the collective its computation wraps (`computations` by name)."""
    if inst.opcode == "async-start":
        wrapped = _wrapped(inst, computations)
        return None if wrapped is None else instruction_traffic(wrapped, num_partitions)
    kind = inst.opcode
    if kind not in COLLECTIVES:
        return None
    n = num_partitions
    operands = [o.shape for o in inst.operands]
    if kind == "collective-permute":
        return collective_permute(permute_pairs(inst, n) or np.zeros((0, 2), np.int64),
                                  _bytes(operands[:1]), n)
    groups = participant_groups(inst, n)
    if kind == "all-gather":
        return all_gather(groups, _bytes(operands), n)
    if kind == "collective-broadcast":
        return collective_broadcast(groups, _bytes(operands), n)
    if kind == "all-to-all" and inst.attr("dimensions") is None and len(operands) > 1:
        return all_to_all_tuple(groups, [_bytes([s]) for s in operands], n)
    return _sum([{"all-reduce": all_reduce, "reduce-scatter": reduce_scatter,
                  "all-to-all": all_to_all}[kind](groups, leaf.num_elements,
                                                  leaf.byte_size // max(leaf.num_elements, 1), n)
                 for shape in operands for leaf in shape.leaves()], kind, groups, n)


def _bytes(shapes: Sequence[Shape]) -> int:
    return sum(shape.byte_size for shape in shapes)


def _sum(parts: list[Traffic], kind: str, groups, n: int) -> Traffic:
    """One collective of several operands (each reduced or exchanged on its own)."""
    count, size = _groups(groups).shape
    sent = sum((p.sent for p in parts), np.zeros(n, dtype=np.int64))
    received = sum((p.received for p in parts), np.zeros(n, dtype=np.int64))
    return Traffic(kind, count, size, sum(p.operand_bytes for p in parts), sent, received)


def _wrapped(inst: Instruction, computations: dict | None) -> Instruction | None:
    """The collective an `async-start` wraps (the root of its called computation), if any."""
    if computations is None:
        return None
    for name in inst.called_computation_names():
        root = computations[name].root
        if root.opcode in COLLECTIVES:
            return root
    return None


# ---- time ----------------------------------------------------------------------------------------

def collective_seconds(traffic: Traffic, latency: float, bandwidth: float) -> tuple[float, str]:
    """Seconds one execution takes on links of `bandwidth` bytes per second each way with
    `latency` seconds per message, and the algorithm that gives them: "ring", "tree",
    "pairwise" (all-to-all, collective-permute) or "none" (groups of one). A ring moves the
    busiest device's bytes (`max_sent`, the byte model's algorithm) in `g-1` message steps
    (`2(g-1)` for all-reduce); the tree forms (recursive doubling for all-gather, halving for
    reduce-scatter, reduce then broadcast for all-reduce, a binomial tree for broadcast) take
    `ceil(log2 g)` steps and are chosen when faster, as collective libraries choose by message
    size."""
    g, wire = traffic.group_size, traffic.max_sent / bandwidth
    if g <= 1:
        return 0.0, "none"
    if traffic.kind == "collective-permute":
        return latency + wire, "pairwise"
    if traffic.kind == "all-to-all":
        return (g - 1) * latency + wire, "pairwise"
    steps = ceil(log2(g))
    whole = latency + traffic.operand_bytes / bandwidth
    options = {
        "all-gather": {"ring": (g - 1) * latency + wire, "tree": steps * latency + wire},
        "reduce-scatter": {"ring": (g - 1) * latency + wire, "tree": steps * latency + wire},
        "all-reduce": {"ring": 2 * (g - 1) * latency + wire, "tree": 2 * steps * whole},
        "collective-broadcast": {"ring": (g - 1) * latency + wire, "tree": steps * whole},
    }[traffic.kind]
    best = min(options, key=options.get)
    return options[best], best


__all__ = ["Traffic", "all_gather", "reduce_scatter", "all_reduce", "all_to_all",
           "all_to_all_tuple", "collective_permute", "collective_broadcast", "instruction_traffic",
           "collective_seconds"]
