"""The order the instructions of a computation execute in, on every partition alike.

The order is chosen for memory, then collectives are issued early where memory allows:

1. *Base order*: of two orders, the one whose peak of live buffers is lower (program order
   when they tie): program order, and the *free-first* order of list scheduling, which runs
   next, among the instructions whose operands have run (a collective or a barrier also
   after the collective or barrier before it, so that they keep their order), the one that
   frees the most bytes less the bytes it makes if one frees at least what it makes, and
   otherwise the one whose first user comes first in program order (the first in program
   order on ties). Free first, an instruction that frees its large operands runs as soon as
   it can, and one that only adds (a broadcast, a gathered weight) runs when it is next
   needed.
2. *Early issue*: every collective is then moved up towards the last of the instructions
   computing its operands, the previous collective and the previous *barrier* (an instruction
   with effects, a custom-call, or one calling a computation that has collectives or
   effects), as far as the base order's peak allows: its result is live from its issue, so a
   collective that holds more than it frees (an all-gather) stops where the live bytes plus
   its result would exceed that peak; one that frees as much as it holds (an all-reduce or a
   reduce-scatter of an operand only it reads) goes all the way. Collectives keep their
   relative order and never pass a barrier, so every partition issues the same collectives in
   the same order, and communication overlaps the computation between a collective's issue
   and its first use.

Live buffers, for choosing: each instruction's result bytes (`result_bytes`: none for the
instructions whose value is their operands', such as tuples, get-tuple-element and the
operand-preserving copies) from the instruction to the last instruction reading it (through
those aliases); results nothing reads live to the end. Called computations are not looked
into: the choice is the same wherever the computation runs.

The interpreter executes computations in this order (`runtime/interpreter.py`) and the liveness
analysis counts memory in it (`ir/liveness.py`): a collective issued early holds its result from
its issue on, so the two must agree on where it runs. Both also fuse a pad into its only user,
a dynamic-slice (`fused_pads`): the padded array is never built.
"""
from __future__ import annotations

import heapq
from math import prod
from typing import Callable, Iterable, Mapping, Sequence

from . import dtypes
from .custom_call_targets import ANNOTATIONS, MANUAL_BOUNDARIES
from .module import Computation, Instruction, Module
from .ops import COLLECTIVES, SIDE_EFFECTING, opcodes
from .shapes import Shape, TupleShape

#: instructions no collective is issued before (besides calls of computations with collectives)
BARRIER_OPCODES = SIDE_EFFECTING | opcodes("custom-call")

#: instructions whose value is their first operand's (no new buffer)
OPERAND_PRESERVING = opcodes("copy", "opt-barrier", "add-dependency", "domain")


def fused_pads(comp: Computation) -> dict[Instruction, Instruction]:
    """`{pad: dynamic-slice}` for every pad of `comp` (no interior padding, not the root) whose
    only user is a dynamic-slice of it (as its sliced operand only): the slice reads its
    window from the pad's operand."""
    users = comp.users()
    return {inst: users[inst][0] for inst in comp.instructions
            if inst.opcode == "pad" and inst is not comp.root and len(users[inst]) == 1
            and users[inst][0].opcode == "dynamic-slice" and users[inst][0].operands[0] is inst
            and inst not in users[inst][0].operands[1:]
            and all(p.interior == 0 for p in inst.attrs["padding"])}


def is_identity_call(inst: Instruction) -> bool:
    """Whether `inst` (a custom-call) is an annotation or a manual-region boundary whose result
    is its operand (or the tuple of its operands, or nothing) with the same shapes: it makes no
    new buffer (the runtime returns the operands themselves)."""
    if inst.attr("custom_call_target") not in ANNOTATIONS | MANUAL_BOUNDARIES:
        return False
    if isinstance(inst.shape, TupleShape) and not inst.shape.elements:
        return True
    shapes = [o.shape for o in inst.operands]
    if len(shapes) == 1:
        return _same_arrays(shapes[0], inst.shape)
    return isinstance(inst.shape, TupleShape) and len(inst.shape.elements) == len(shapes) and \
        all(_same_arrays(a, b) for a, b in zip(shapes, inst.shape.elements))


def _same_arrays(a: Shape, b: Shape) -> bool:
    """Same dimensions and element types, leaf by leaf (layouts aside)."""
    leaves_a, leaves_b = list(a.leaves()), list(b.leaves())
    return a.is_tuple == b.is_tuple and len(leaves_a) == len(leaves_b) and \
        all(x.dims == y.dims and x.element_type == y.element_type
            for x, y in zip(leaves_a, leaves_b))


def result_bytes(inst: Instruction) -> int:
    """Bytes of the new buffers `inst`'s result makes, for choosing the order: none for the
    instructions whose value is their operands' (tuple, get-tuple-element, the
    operand-preserving ones, identity custom-calls), the bytes of its arrays otherwise."""
    opcode = inst.opcode
    if opcode in ("tuple", "get-tuple-element") or opcode in OPERAND_PRESERVING or \
            (opcode == "custom-call" and is_identity_call(inst)):
        return 0
    return sum(prod(leaf.dims) * dtypes.byte_width(leaf.element_type)
               for leaf in inst.shape.leaves() if not leaf.is_token)


def issue_order(order: Sequence[int], reads: Mapping[int, Iterable[int]],
                sizes: Mapping[int, int], collectives: set[int], barriers: set[int]
                ) -> list[int]:
    """The execution order of the nodes `order` (ids in program order; see the module
    docstring): `reads[node]` the nodes it reads (those not in `order` are ignored),
    `sizes[node]` the bytes of its result's new buffers."""
    order = list(order)
    present = set(order)
    reads = {node: [s for s in reads.get(node, ()) if s in present] for node in order}
    live = _Liveness(reads, sizes)
    pinned = collectives | barriers
    base = min((order, _free_first(order, reads, sizes, live, pinned)),
               key=lambda o: max(live.profile(o), default=0))
    return _issue_early(base, reads, sizes, live, collectives, barriers)


class _Liveness:
    """Live bytes at each position of an order (see the module docstring)."""

    def __init__(self, reads: Mapping[int, list[int]], sizes: Mapping[int, int]):
        self.sizes = sizes
        self.reads = reads
        self._holds: dict[int, tuple[int, ...]] = {}

    def holds(self, node: int) -> tuple[int, ...]:
        """The nodes whose buffers `node`'s value refers to (itself unless it makes none)."""
        found = self._holds.get(node)
        if found is None:
            if self.sizes.get(node, 0):
                found = (node,)
            else:
                found = tuple(dict.fromkeys(b for r in self.reads[node] for b in self.holds(r)))
            self._holds[node] = found
        return found

    def last_reads(self, order: Sequence[int]) -> dict[int, int]:
        """Position of the last read of each buffer (`len(order)`, the end, for the buffers
        of a value nothing reads)."""
        last: dict[int, int] = {}
        read: set[int] = set()
        for k, node in enumerate(order):
            for r in self.reads[node]:
                read.add(r)
                for b in self.holds(r):
                    last[b] = k
        for node in order:
            if node not in read:
                for b in self.holds(node):
                    last[b] = len(order)
        return last

    def profile(self, order: Sequence[int]) -> list[int]:
        """Bytes live while each position of `order` runs (its result included)."""
        last = self.last_reads(order)
        change = [0] * (len(order) + 2)
        for k, node in enumerate(order):
            size = self.sizes.get(node, 0)
            if size:
                change[k] += size
                change[last[node] + 1] -= size
        profile, held = [], 0
        for k in range(len(order)):
            held += change[k]
            profile.append(held)
        return profile


def _free_first(order: list[int], reads: Mapping[int, list[int]], sizes: Mapping[int, int],
                live: _Liveness, pinned: set[int]) -> list[int]:
    """List scheduling (see the module docstring): among the nodes whose operands have run (a
    pinned node also after the pinned node before it), the one that frees the most bytes less
    the bytes it makes, when one frees at least what it makes; otherwise the one whose first
    reader comes first in program order. Ties: program order."""
    needs = {node: set(reads[node]) for node in order}
    previous = None
    for node in order:
        if node in pinned:
            if previous is not None:
                needs[node].add(previous)
            previous = node
    index = {node: k for k, node in enumerate(order)}
    users: dict[int, list[int]] = {node: [] for node in order}
    for node in order:
        for s in needs[node]:
            users[s].append(node)
    wanted = {node: min((index[u] for u in users[node]), default=index[node])
              for node in order}
    held = {node: tuple(dict.fromkeys(b for r in reads[node] for b in live.holds(r)))
            for node in order}
    readers: dict[int, list[int]] = {}
    for node in order:
        for b in held[node]:
            readers.setdefault(b, []).append(node)
    remaining = {b: len(r) for b, r in readers.items()}

    def gain(node: int) -> int:
        return sum(sizes.get(b, 0) for b in held[node] if remaining[b] == 1) - \
            sizes.get(node, 0)

    freeing: list[tuple[int, int, int]] = []
    urgent: list[tuple[int, int, int]] = []

    def became_ready(node: int) -> None:
        heapq.heappush(urgent, (wanted[node], index[node], node))
        if gain(node) >= 0:
            heapq.heappush(freeing, (-gain(node), index[node], node))

    waiting = {node: len(needs[node]) for node in order}
    for node in order:
        if not waiting[node]:
            became_ready(node)
    done: set[int] = set()
    out: list[int] = []
    while len(out) < len(order):
        node = None
        while freeing:
            stored, k, candidate = heapq.heappop(freeing)
            if candidate in done:
                continue
            current = gain(candidate)
            if current == -stored:
                node = candidate
                break
            if current >= 0:
                heapq.heappush(freeing, (-current, k, candidate))
        while node is None:
            _, _, candidate = heapq.heappop(urgent)
            if candidate not in done:
                node = candidate
        done.add(node)
        out.append(node)
        for b in held[node]:
            remaining[b] -= 1
            if remaining[b] == 1:
                last = next(r for r in readers[b] if r not in done)
                if not waiting[last] and gain(last) >= 0:
                    heapq.heappush(freeing, (-gain(last), index[last], last))
        for user in users[node]:
            waiting[user] -= 1
            if not waiting[user]:
                became_ready(user)
    return out


def _issue_early(order: list[int], reads: Mapping[int, list[int]], sizes: Mapping[int, int],
                 live: _Liveness, collectives: set[int], barriers: set[int]) -> list[int]:
    """`order` with every collective moved up towards the last of the nodes it reads, the
    previous collective and the previous barrier, as far as the peak of `order` allows (see
    the module docstring)."""
    profile = live.profile(order)
    budget = max(profile, default=0)
    last = live.last_reads(order)
    index = {node: k for k, node in enumerate(order)}
    keys = []
    floor = -1
    for k, node in enumerate(order):
        if node not in collectives:
            keys.append((k, 0, k))
            if node in barriers:
                floor = k
            continue
        anchor = max([index[s] for s in reads[node]] + [floor])
        freed = sum(sizes.get(b, 0) for b in
                    dict.fromkeys(b for r in reads[node] for b in live.holds(r))
                    if last.get(b) == k)
        grows = sizes.get(node, 0) - freed
        at = anchor
        if grows > 0:
            at = k - 1
            while at > anchor and profile[at] + grows <= budget:
                at -= 1
        for t in range(at + 1, k):
            profile[t] += grows
        keys.append((at, 1, k))
        floor = at
    return [node for _, node in sorted(zip(keys, order))]


def ordered_computations(module: Module) -> Callable[[str], bool]:
    """Whether a computation of `module` (by name) has collectives or instructions with effects
    (such as `rng`, which advances the program's random state), itself or in a computation it
    calls (memoized): an instruction calling it is a barrier, so it keeps its place among the
    collectives and the other barriers."""
    known: dict[str, bool] = {}

    def ordered(name: str) -> bool:
        if name not in known:
            known[name] = False                 # a call cycle adds nothing
            known[name] = any(inst.opcode in COLLECTIVES or inst.opcode in SIDE_EFFECTING or
                              any(ordered(c) for c in inst.called_computation_names())
                              for inst in module.computation(name).instructions)
        return known[name]
    return ordered


def execution_order(comp: Computation, ordered: Callable[[str], bool]) -> list[Instruction]:
    """`comp`'s instructions other than its parameters and fused pads (`fused_pads`) in the
    order they execute (see the module docstring; `ordered`: see `ordered_computations`); a
    dynamic-slice of a fused pad reads the pad's operand."""
    fused = fused_pads(comp)
    windows = {ds: pad for pad, ds in fused.items()}
    order = [inst for inst in comp.instructions
             if inst.opcode != "parameter" and inst not in fused]
    collectives = {id(inst) for inst in order if inst.opcode in COLLECTIVES}
    barriers = {id(inst) for inst in order if inst.opcode in BARRIER_OPCODES or
                any(ordered(name) for name in inst.called_computation_names())}
    by_id = {id(inst): inst for inst in order}
    reads = {id(inst): [id(op) for op in (windows[inst].operands + inst.operands[1:]
                                          if inst in windows else inst.operands)]
             for inst in order}
    ids = issue_order([id(inst) for inst in order], reads,
                      {id(inst): result_bytes(inst) for inst in order}, collectives, barriers)
    return [by_id[node] for node in ids]


__all__ = ["BARRIER_OPCODES", "OPERAND_PRESERVING", "issue_order", "ordered_computations",
           "execution_order", "fused_pads", "is_identity_call", "result_bytes"]
