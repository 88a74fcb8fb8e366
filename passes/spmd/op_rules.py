"""The contract of the partitioning rules insert-reshards and lower-spmd share, and the default
action. The rules live in the catalogue's `PARTITION_RULES` (`ir/ops.py`); `partition_rules.py`
picks the rule for an instruction.

A rule answers two questions about an instruction `h` of the global program:

- `plan(h, ctx) -> OpPlan`: which sharding each operand must have and which sharding the local
  computation then produces (insert-reshards reshards operands to the former and the result from
  the latter to `h`'s annotated sharding). Rules list candidate strategies (the per-op cases of
  docs/design/partitioning.md) and `PlanContext.choose` keeps the one with the fewest bytes moved,
  counting operand reshards and the result reshard; ties keep the first candidate (XLA's order).
- `lower(h, ctx) -> Instruction`: the local instruction(s) computing `h`'s shard, given operands
  that already have the planned shardings. Most ops lower to themselves on shard shapes.

Ops without a rule of their own use the *default action* (docs/design/partitioning.md#per-op-rules)
when they are pure: operands
replicated (or on the op's single device), the op run unchanged, the result resharded. Ops whose
meaning depends on the partition (the catalogue's `PARTITION_DEPENDENT`: I/O, `partition-id`,
collectives written by the user) are rejected with UnsupportedError outside manual regions;
instructions with manual shardings and the region boundaries use the rules of
`op_rules_manual.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import (
    PARTITION_DEPENDENT, PARTITION_RULES, RNG_STATE, SIDE_EFFECTING, Trait, opcodes, with_trait,
)
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, Shape, TupleShape

from .reshard import EmitContext
from .reshard_nodes import is_inserted_reshard
from .reshard_plan import plan_reshard, reshard_cost
from .tiling import Tiling


class OpPlan(NamedTuple):
    """Operand shardings an instruction's local form needs, the sharding of its local result,
    a one-line reason (recorded in the metadata of the reshards this plan causes), and the bytes
    the local computation sends itself, counted with the reshards when choosing. An immutable
    named tuple: rules build, hash and compare thousands per compile."""

    operands: tuple[HloSharding, ...]
    result: HloSharding
    reason: str
    #: bytes per device the local computation itself sends (e.g. a halo exchange)
    cost: float = 0.0
    #: bytes all devices together send in it (None: `cost` on every device)
    total: float | None = None


class Signature(NamedTuple):
    """What a plan's cost depends on: the instruction's shape and sharding, and its operands'
    shapes and shardings, with `operand_ids` telling which operands are one value (a value used
    twice is resharded once). Rules whose plan depends on nothing else plan once per signature
    (`sharding_algebra.cached`), so the repeated layers of a model are planned once. An
    immutable named tuple, like `OpPlan` (one is made and hashed for every plan)."""

    shape: Shape
    sharding: HloSharding
    operand_shapes: tuple[Shape, ...]
    operand_shardings: tuple[HloSharding, ...]
    operand_ids: tuple[int, ...]
    #: per operand, whether it is computed again in the sharding a plan needs instead of
    #: being resharded (`recomputed_for_free`)
    operand_free: tuple[bool, ...] = ()
    #: the shardings the instruction's users read it in (their plans', and the annotation
    #: where it is the root); empty: not known, the result is priced to the annotation
    result_needs: tuple[HloSharding, ...] = ()
    #: per operand, the shardings insert-reshards already resharded it to for an earlier
    #: user (a reshard node every later user shares: no more bytes); empty: none known
    operand_had: tuple[frozenset, ...] = ()
    #: per operand on one device, whether insert-reshards broadcasts it to every partition
    #: for another user (made for an earlier user, or asked by a later user's plan for it
    #: replicated or tiled, whose reshard broadcasts first: `broadcast_first`): a shared
    #: replicated node, read whole, sliced to any tiling or copied onto any one device at no
    #: cost; empty: none
    operand_broadcast: tuple[bool, ...] = ()
    #: per operand that is a result's reshard to its annotation nobody reads yet, the sharding
    #: of the result it was made from (its bytes are paid only by a plan reading it, from that
    #: result where cheaper: `_unread_bytes`), else None; empty: none
    operand_sources: tuple[HloSharding | None, ...] = ()
    #: per operand, (sharding, (busiest, total)) pairs: the share of the reshard to that
    #: sharding that insert-reshards' later users of the operand pay for by what it saves them
    #: (their plans read the shared node instead of moving bytes of their own), of its busiest
    #: device's bytes and of all devices' bytes; empty: none
    operand_credit: tuple[tuple[tuple[HloSharding, tuple[float, float]], ...], ...] = ()
    #: the bytes the plans of the instruction's users (priced with what their own users read
    #: them in) save when its result is computed replicated: each such user is then computed
    #: again whole from it for free; 0.0: none
    users_recomputed: float = 0.0
    #: per operand of a contraction, whether it is a pure op computed again whole for free
    #: (`recomputed_for_free`; not so in `operand_free`): free only in a plan that reads some
    #: operand tiled, so that the contraction's own work stays split; empty: none
    operand_split_free: tuple[bool, ...] = ()

    @classmethod
    def of(cls, inst: Instruction) -> "Signature":
        ids: dict[int, int] = {}
        whole = inst.opcode not in CONTRACTIONS
        shapes, shardings, numbers, free = [], [], [], []
        for o in inst.operands:         # one loop: asked for every plan of every instruction
            shapes.append(o.shape)
            shardings.append(o.sharding)
            numbers.append(ids.setdefault(id(o), len(ids)))
            free.append(recomputed_for_free(o, whole))
        split_free = () if whole else \
            tuple([not f and recomputed_for_free(o) for o, f in zip(inst.operands, free)])
        return cls(inst.shape, inst.sharding, tuple(shapes), tuple(shardings), tuple(numbers),
                   tuple(free), operand_split_free=split_free if any(split_free) else ())

    def without_metadata(self) -> "Signature":
        """The same signature with metadata-free shardings (a plan made for it carries no
        instruction's metadata): itself when none has any."""
        # the fields a signature seldom has are looked into only when not empty (every plan
        # of a dot asks this)
        if self.sharding.memo_key is self.sharding and \
                all([s.memo_key is s for s in self.operand_shardings]) and \
                (not self.result_needs or all([s.memo_key is s for s in self.result_needs])) and \
                (not self.operand_had or
                 all([s.memo_key is s for had in self.operand_had for s in had])) and \
                (not self.operand_sources or
                 all([s is None or s.memo_key is s for s in self.operand_sources])) and \
                (not self.operand_credit or
                 all([s.memo_key is s for credit in self.operand_credit for s, _ in credit])):
            return self
        return Signature(self.shape, self.sharding.with_metadata(()), self.operand_shapes,
                         tuple(s.with_metadata(()) for s in self.operand_shardings),
                         self.operand_ids, self.operand_free,
                         tuple(s.with_metadata(()) for s in self.result_needs),
                         tuple(frozenset(s.with_metadata(()) for s in had)
                               for had in self.operand_had), self.operand_broadcast,
                         tuple(s if s is None else s.with_metadata(())
                               for s in self.operand_sources),
                         tuple(tuple((s.with_metadata(()), share) for s, share in credit)
                               for credit in self.operand_credit), self.users_recomputed,
                         self.operand_split_free)


#: opcodes whose value on one device may differ between partitions that compute it: their
#: inputs or effects depend on the partition, they draw random numbers, they run called
#: computations as control flow, or their rules run them on the device only
NOT_EVERYWHERE = PARTITION_DEPENDENT | SIDE_EFFECTING | RNG_STATE | \
    with_trait(Trait.CONTROL_FLOW) | opcodes(
    "parameter", "custom-call", "rng", "rng-bit-generator")

#: ops doing far more work than their result's size, never recomputed whole to save a reshard
CONTRACTIONS = opcodes("dot", "convolution", "ragged-dot", "fft", "cholesky", "triangular-solve")

#: ops never computed again whole on every partition (either of the two above)
NOT_RECOMPUTED = NOT_EVERYWHERE | CONTRACTIONS

#: opcodes of the values that may be free leaves or reshard nodes (`recomputed_for_free`)
_LEAF_OPCODES = frozenset({"constant", "iota", "broadcast", "custom-call"})


def recomputed_for_free(value: Instruction, whole: bool = True, deep: bool = True) -> bool:
    """Whether insert-reshards computes `value` again in any sharding a user needs
    (`free_target`) instead of resharding it, moving no bytes: a constant (every partition
    has it whole), an iota, a broadcast of a replicated value or of a constant (each partition
    broadcasts its part), or a pure array op (not a contraction) whose operands are all replicated or one of
    those (computed again whole on every partition, then sliced), or an element of such a
    tuple-shaped op (a sort's, a topk's), or a reshard node of a replicated value (the
    value it was sliced from); when `deep`, also a pure op some of whose operands are such
    pure ops themselves (insert-reshards computes each of them again whole first:
    `_replicated_source`), not deeper. XLA reaches the same for
    values it resharded from replicated ones through its reshard cache. Rules' costs count
    such operands' reshards as free; a contraction's (`whole=False`) only the first three, so
    that its operands computed whole do not make running the whole contraction on every
    partition look free."""
    # by opcode first (asked of every operand of every plan): an op that is no free leaf
    # nor reshard node is free only as a pure non-contraction op of a `whole` user
    maybe_leaf = value.opcode in _LEAF_OPCODES
    if not maybe_leaf:
        if not whole or value.opcode in NOT_RECOMPUTED:
            return False
        if value.opcode != "get-tuple-element":
            # its operands first: they are seldom all had replicated
            return _whole_of_free_operands(value, deep) and _free_value(value)
    if not _free_value(value):
        return False
    if maybe_leaf and (_free_leaf(value) or _reshard_of_replicated(value)):
        return True
    if not whole:
        return False
    if value.opcode == "get-tuple-element":
        whole_tuple = value.operands[0]
        sharding = whole_tuple.sharding
        return sharding is not None and not sharding.has_manual_leaf and \
            not any(leaf.has_unreduced for leaf in sharding.leaves()) and \
            _whole_of_free_operands(whole_tuple, deep)
    return _whole_of_free_operands(value, deep)


def _whole_of_free_operands(value: Instruction, deep: bool) -> bool:
    """Whether `value` (an array or a tuple, e.g. a sort's) is a pure op, not a contraction,
    whose operands are all had replicated without communication (`_replicated_for_free`,
    `deep` as `recomputed_for_free`'s): every partition can compute it again whole (if its
    own sharding holds no per-device or partial data)."""
    if value.opcode in NOT_RECOMPUTED or not value.operands:
        return False
    for operand in value.operands:
        if not _replicated_for_free(operand, deep):
            return False
    return True


def _replicated_for_free(operand: Instruction, deep: bool) -> bool:
    """Whether insert-reshards has `operand` replicated without communication: it is
    replicated, a reshard node of a replicated value, or a free leaf (`_free_leaf`); when
    `deep`, also a pure op of such values (`recomputed_for_free` not `deep`), computed again
    whole."""
    sharding = operand.sharding
    if sharding is None or isinstance(operand.shape, TupleShape):
        return False
    if sharding.is_replicated:
        return True
    # by opcode first (asked of every operand's operands): a reshard node and a free leaf
    # are among `_LEAF_OPCODES`
    if operand.opcode not in _LEAF_OPCODES:
        return deep and recomputed_for_free(operand, deep=False)
    return _reshard_of_replicated(operand) or (_free_value(operand) and _free_leaf(operand))


def _reshard_of_replicated(value: Instruction) -> bool:
    """Whether `value` is a reshard node of a replicated value (insert-reshards takes any
    sharding of it from that value, sliced locally)."""
    if not is_inserted_reshard(value):
        return False
    source = value.operands[0].sharding
    return source is not None and source.is_replicated


def _free_value(value: Instruction) -> bool:
    return not isinstance(value.shape, TupleShape) and value.sharding is not None and \
        not value.sharding.has_manual_leaf and not value.sharding.has_unreduced


def _free_leaf(value: Instruction) -> bool:
    """A constant, an iota or a broadcast of a value every partition has: a replicated value
    or a constant (whatever its sharding), or a reshard node of one."""
    if value.opcode in ("constant", "iota"):
        return True
    if value.opcode == "broadcast":
        operand = value.operands[0]
        if is_inserted_reshard(operand):
            operand = operand.operands[0]
        return operand.opcode == "constant" or operand.sharding is None or \
            operand.sharding.is_replicated
    return False


def _with_reshard_bytes(own: float, signature: "Signature", plan: OpPlan,
                        measure: Callable[[Shape, HloSharding, HloSharding], float],
                        bound: float | None = None, totals: bool = False) -> float:
    """`own` plus the bytes `measure` gives for the reshards `plan` asks of an instruction
    described by `signature`: its result's, and each distinct operand reshard once (insert-reshards
    reshards a value used twice the same way once), none for an operand computed again for
    free in a free target or already resharded to the sharding needed for an earlier user, or
    read whole, sliced or copied onto one device from its broadcast made for another user
    (`operand_broadcast`), nor for a contraction's operand computed again whole for free where
    the plan reads some operand tiled (`operand_split_free`); of a
    reshard later users pay a share of (`operand_credit`: of its busiest device's bytes, or
    with `totals`, `measure` then giving all devices' bytes, of theirs), the rest; less what the users
    save where the plan computes a replicated result (`users_recomputed`). With a
    `bound`, the sum stops once it passes the bound (no term is negative): a value above
    `bound`, then, not the whole sum."""
    total = own + _result_bytes(signature, plan.result, measure, plan.operands)
    if signature.users_recomputed and plan.result.is_replicated:
        total -= signature.users_recomputed
    if bound is not None and total > bound:
        return total
    count = len(signature.operand_ids)
    free = signature.operand_free or (False,) * count
    had = signature.operand_had or (frozenset(),) * count
    broadcast = signature.operand_broadcast or (False,) * count
    sources = signature.operand_sources or (None,) * count
    credits = signature.operand_credit or ((),) * count
    if signature.operand_split_free and any([need.is_tiled for need in plan.operands]):
        free = tuple([a or b for a, b in zip(free, signature.operand_split_free)])
    operands = zip(signature.operand_ids, signature.operand_shapes,
                   signature.operand_shardings, free, had, broadcast, sources, credits)
    for (_, shape, sharding, recomputed, earlier, whole, source, credit), need in \
            dict.fromkeys(zip(operands, plan.operands)):
        if source is not None:
            total += _unread_bytes(shape, source, sharding, need, measure)
        else:
            paid = _share_paid(sharding, need, recomputed, earlier, whole, credit, totals)
            if paid:
                total += measure(shape, sharding, need) * paid
        if bound is not None and total > bound:
            return total
    return total


def _share_paid(sharding: HloSharding, need: HloSharding, recomputed: bool,
                earlier: frozenset, whole: bool, credit: tuple, totals: bool = False) -> float:
    """The share of an operand's reshard from `sharding` to `need` a plan pays
    (`_with_reshard_bytes`; the operand's `Signature` fields as named there): none where it is
    computed again for free, had already or read from its broadcast, else all less the later
    users' credit (of the busiest device's bytes, or with `totals` of all devices')."""
    if (recomputed and free_target(need)) or need in earlier or \
            (whole and (need.is_replicated or need.kind == "maximal" or
                        broadcast_first(sharding, need))):
        return 0.0
    return 1.0 - dict(credit).get(need, (0.0, 0.0))[1 if totals else 0] if credit else 1.0


def reshards_paid_in_full(signature: "Signature", plan: OpPlan) -> list[int]:
    """The operands (their indices, one per distinct value and sharding needed) whose reshards
    `plan` pays in full by `_with_reshard_bytes`: needed in another sharding than theirs and
    not shared with another user, credited, computed again for free or left unread."""
    count = len(signature.operand_ids)
    free = signature.operand_free or (False,) * count
    if signature.operand_split_free and any([need.is_tiled for need in plan.operands]):
        free = tuple([a or b for a, b in zip(free, signature.operand_split_free)])
    had = signature.operand_had or (frozenset(),) * count
    broadcast = signature.operand_broadcast or (False,) * count
    sources = signature.operand_sources or (None,) * count
    credits = signature.operand_credit or ((),) * count
    paid, seen = [], set()
    for k, (value, sharding, need) in enumerate(zip(signature.operand_ids,
                                                    signature.operand_shardings, plan.operands)):
        if need == sharding or (value, need) in seen:
            continue
        seen.add((value, need))
        if sources[k] is None and \
                _share_paid(sharding, need, free[k], had[k], broadcast[k], credits[k]) == 1.0:
            paid.append(k)
    return paid


def _unread_bytes(shape: Shape, source: HloSharding, node: HloSharding, need: HloSharding,
                  measure: Callable[[Shape, HloSharding, HloSharding], float]) -> float:
    """The bytes of reading in `need` a result's reshard from `source` to `node` that nobody
    reads yet: from the result itself where that moves fewer bytes than the node's own
    reshard and the reshard from it (insert-reshards then reshards from the source, and the
    unread node is removed; XLA's reshard cache also maps the resharded value back to the one
    it was made from), else those two."""
    if need == source:
        return 0.0
    via = measure(shape, source, node) + measure(shape, node, need)
    return min(measure(shape, source, need), via)


def broadcast_first(source: HloSharding, target: HloSharding) -> bool:
    """Whether resharding a value on one device (`source`) to `target` broadcasts it to every
    partition first and then takes `target` from the replicated value (as the reshard plan
    does, `BroadcastFromDevice`): `target` an array sharding other than replicated or one
    device. insert-reshards makes that replicated value a node of its own, shared by every
    user needing the value in another sharding (so the value is broadcast once)."""
    return source.kind == "maximal" and target.kind == "tiled" and \
        not target.has_manual_leaf

def result_chain(result: HloSharding, annotated: HloSharding) -> tuple[HloSharding, ...]:
    """The shardings insert-reshards may have a result computed in `result` in, each a reshard
    of the one before: `result`, its summed form where it holds partial values (one all-reduce
    every user can slice or permute from; made only where a user reads it), or its broadcast
    where it lives on one device and the annotation is tiled (`broadcast_first`: the reshard
    goes through that replicated node, which any user slices from), and the annotation users
    see."""
    chain = [result]
    summed = without_partials(result)
    if summed != result and summed != annotated:
        chain.append(summed)
    elif broadcast_first(result, annotated) and not annotated.is_replicated:
        chain.append(HloSharding.replicate())
    if annotated != chain[-1]:
        chain.append(annotated)
    return tuple(chain)


def _result_bytes(signature: "Signature", result: HloSharding,
                  measure: Callable[[Shape, HloSharding, HloSharding], float],
                  operand_needs: Sequence[HloSharding]) -> float:
    """The bytes `measure` gives for having a result computed in `result` where its users
    need it (`signature.result_needs`): each need is read from the last sharding of
    `result_chain`, or from an earlier one where that moves fewer bytes (as insert-reshards
    reshards a reshard node from its source), or from an earlier user's need where that moves
    fewer still (insert-reshards reshards from a node another user reads: `_cheaper_sibling`),
    and the chain's reshards up to the last one read are paid once. With no needs known, the
    reshard to the annotation. Where every user reads an array result replicated, computed
    in place (each operand read as it is: `operand_needs` are the plan's) in another sharding
    than its annotation (not replicated), the reshard to the annotation is made for that one
    gather alone, which insert-reshards then makes straight from the result where that moves
    no more bytes (its chain cleanup; XLA's reshard cache gives the users the replicated form
    its reshard to the annotation went through,
    docs/design/partitioning.md#a-result-read-through-its-annotation): the cheaper of the two."""
    shape, annotated = signature.shape, signature.sharding
    if not signature.result_needs:
        return measure(shape, result, annotated)
    annotated = seen_by_users(shape, annotated, result, signature.result_needs)
    needs = [read_as(shape, need, annotated) for need in signature.result_needs]
    chain = result_chain(result, annotated)
    if len(chain) == 3 and not summed_first(shape, chain, needs, measure):
        chain = chain[0], chain[2]                # the middle step is made only when it pays
    total = _chain_bytes(shape, chain, needs, measure)
    if len(chain) == 2 and isinstance(shape, ArrayShape) and not chain[1].is_replicated and \
            all(need.is_replicated for need in needs) and \
            all([s == need for s, need in zip(signature.operand_shardings, operand_needs)]):
        total = min(total, measure(shape, result, needs[0]))
    return total


def _chain_bytes(shape: Shape, chain: Sequence[HloSharding], needs: Sequence[HloSharding],
                 measure: Callable[[Shape, HloSharding, HloSharding], float]) -> float:
    """The bytes `measure` gives for having a result in each of `needs` through the reshards of
    `chain` (a `result_chain`, or one without its middle step): each need read from the
    sharding `read_from` picks, or from an earlier need where that moves fewer bytes, and the
    chain's reshards up to the last one read paid once."""
    reads = [read_from(shape, chain, need, measure) for need in needs]
    costs = [measure(shape, chain[k], need) for k, need in zip(reads, needs)]
    for i, need in enumerate(needs):
        for earlier in needs[:i]:
            if not any(leaf.has_unreduced for leaf in earlier.leaf_shardings(shape)):
                costs[i] = min(costs[i], measure(shape, earlier, need))
    used = max(reads)
    return sum(costs) + sum(measure(shape, a, b) for a, b in zip(chain[:used], chain[1:used + 1]))


def summed_first(shape: Shape, chain: Sequence[HloSharding], needs: Sequence[HloSharding],
                 measure: Callable[[Shape, HloSharding, HloSharding], float]) -> bool:
    """Whether insert-reshards makes the middle step of a three-step `result_chain` (the
    summed form of partial values, or the broadcast of a value on one device) for users
    reading the result in `needs`: some need reads it (`read_from`) and the reads through it
    move fewer bytes than without it (the partial values resharded straight to the
    annotation, each need read from that or from them). XLA's partitioner sums partial values
    into the annotation itself (a reduce-scatter where it is tiled); the summed form is
    worth making only where its users' reads gain more than that costs."""
    if len(chain) != 3 or not any(read_from(shape, chain, need, measure) == 1
                                  for need in needs):
        return False
    return _chain_bytes(shape, chain, needs, measure) < \
        _chain_bytes(shape, (chain[0], chain[2]), needs, measure)


def seen_by_users(shape: Shape, annotated: HloSharding, result: HloSharding,
                  needs: Sequence[HloSharding]) -> HloSharding:
    """The sharding users see of a result computed in `result`: its annotation, except that
    an element of a tuple that no user reads (an `{unknown}` leaf in every one of its users'
    `needs`, `PlanContext.result_needs`) stays as computed: nothing reshards it (XLA's
    partitioner reshards only the elements its users read too)."""
    if not needs or not isinstance(shape, TupleShape) or \
            not all(need.is_tuple for need in needs):
        return annotated
    leaves = list(annotated.leaf_shardings(shape))
    computed = list(result.leaf_shardings(shape))
    need_leaves = [need.leaf_shardings(shape) for need in needs]
    unread = [all(leaf_needs[i].kind == "unknown" for leaf_needs in need_leaves)
              for i in range(len(leaves))]
    if not any(unread):
        return annotated
    return HloSharding.tuple([c if u else a for a, c, u in zip(leaves, computed, unread)])


def read_as(shape: Shape, need: HloSharding, seen: HloSharding) -> HloSharding:
    """`need` with each element no user reads (`{unknown}`) as `seen` has it."""
    if not need.is_tuple:
        return need
    return HloSharding.tuple([s if n.kind == "unknown" else n for n, s in
                              zip(need.leaf_shardings(shape), seen.leaf_shardings(shape))])


def read_from(shape: Shape, chain: Sequence[HloSharding], need: HloSharding,
              measure: Callable[[Shape, HloSharding, HloSharding], float]) -> int:
    """Which sharding of a `result_chain` a user needing `need` reads: the last, or an
    earlier one while that moves fewer bytes (stopping at one equal to `need`)."""
    k = len(chain) - 1
    while k > 0:
        if chain[k - 1] == need:
            return k - 1
        if measure(shape, chain[k - 1], need) >= measure(shape, chain[k], need):
            return k
        k -= 1
    return k


def _needs_by_operand(plans: Sequence[OpPlan], count: int) -> list[tuple[HloSharding, ...]]:
    """Per operand position below `count`, the shardings `plans` read that operand in, in
    plan order (a plan with fewer operands reads none there)."""
    needs = [p.operands for p in plans]
    if needs and all([len(n) == count for n in needs]):
        return list(zip(*needs))            # the usual case: one per operand in every plan
    return [tuple([n[i] for n in needs if len(n) > i]) for i in range(count)]


def free_target(target: HloSharding) -> bool:
    """Whether `target` is a sharding a `recomputed_for_free` value is computed again in: an
    array sharding, tiled, replicated or on one device, without unreduced or manual subgroups."""
    return not target.is_tuple and target.kind in ("replicated", "tiled", "maximal") and \
        not target.has_unreduced and not target.has_manual_leaf


class PlanContext:
    """Costs and choices for planning on `num_devices` partitions."""

    def __init__(self, num_devices: int, computations: dict | None = None,
                 result_needs: Callable[[Instruction], tuple[HloSharding, ...]] | None = None,
                 had: Callable[[Instruction, tuple[HloSharding, ...]], frozenset] | None
                 = None, unread: dict[Instruction, HloSharding] | None = None,
                 broadcast: Callable[[Instruction, frozenset], bool] | None = None,
                 credit: Callable[[Instruction, Sequence[tuple[HloSharding, ...]],
                                   Sequence[frozenset]], tuple] | None = None,
                 users_recomputed: Callable[[Instruction], float] | None = None,
                 unread_elements: Callable[[Instruction], tuple[HloSharding, ...]] | None
                 = None):
        self.num_devices = num_devices
        #: the module's computations by name (for rules that read called computations)
        self.computations = {} if computations is None else computations
        #: the shardings an instruction's users read it in (insert-reshards' look-ahead);
        #: an empty tuple where they are not known
        self.result_needs = result_needs
        #: the shardings insert-reshards already resharded a value to (for earlier users)
        self.had = had
        #: whether insert-reshards broadcasts a value on one device for another live user,
        #: given the shardings `had` gives it (`Signature.operand_broadcast`)
        self.broadcast = broadcast
        #: per operand of an instruction, the shares of its reshards that its later users
        #: pay for, given the needs of the plans asked about and the shardings `had` gives
        #: each operand (`Signature.operand_credit`; empty: none)
        self.credit = credit
        #: what the users of an instruction save when it is computed replicated
        #: (`Signature.users_recomputed`)
        self.users_recomputed = users_recomputed
        #: where an instruction's users' needs are not known, its annotation with each
        #: element of a tuple no user reads as `{unknown}` (a one-element tuple; empty: every
        #: element is read, or the result is no tuple)
        self.unread_elements = unread_elements
        #: insert-reshards' result reshards nobody reads yet, with the sharding of the result
        #: each was made from (`Signature.operand_sources`)
        self.unread = {} if unread is None else unread
        self._needs: dict[Instruction, tuple[HloSharding, ...]] = {}
        self._costs: dict[tuple, float] = {}
        #: `choose_for` without tie-break: the index of the candidate chosen, by (signature,
        #: candidates) (equal questions, e.g. every layer of a model, have the same answer)
        self._chosen: dict[tuple, int] = {}

    def known_needs(self, inst: Instruction) -> tuple[HloSharding, ...]:
        """The needs of `inst`'s users, where a plan of it asked for them (else empty)."""
        return self._needs.get(inst, ())

    def users_needs(self, inst: Instruction) -> tuple[HloSharding, ...]:
        """The needs of `inst`'s users (`result_needs`), asked now and kept for its later
        plans (`signature`)."""
        needs = self._needs.get(inst)
        if needs is None and self.result_needs is not None:
            needs = self.result_needs(inst)
            if needs:
                self._needs[inst] = needs
        return needs or ()

    def forget_needs(self, inst: Instruction) -> None:
        """Ask `inst`'s users' needs again the next time a plan of it asks for them."""
        self._needs.pop(inst, None)

    def signature(self, inst: Instruction, plans: Sequence[OpPlan], users: bool = True,
                  own: "Signature | None" = None) -> "Signature":
        """`inst`'s signature, with its users' needs (`result_needs`) once some plan asked of
        it computes a result in another sharding than `inst`'s (before that the users'
        reshards are the same for all its plans); every later question about `inst` gets the
        same needs, so that its plans are compared alike. Where those needs are not known
        (`inst` planned ahead for an operand's choice), a tuple's elements no user reads are
        still priced as computed (`unread_elements`; asked again each time, not kept). The
        operands' shared reshards
        (`operand_had`, `operand_credit`) are asked for every opcode, a contraction's too: a
        node another user reads is had without bytes whatever the user does with it
        (docs/design/partitioning.md#contract-and-steps). Without `users`, the operands'
        side alone: the result is priced to the annotation (no needs, no users computed
        again). `own`: `inst`'s `Signature.of` where the caller has it already (the shared
        reshards are added to it; it is returned itself where there are none)."""
        signature = Signature.of(inst) if own is None else own
        operands = inst.operands
        had = broadcast = needs = credits = ()
        if self.had is not None:
            operand_needs = _needs_by_operand(plans, len(operands))
            operand_had = tuple(map(self.had, operands, operand_needs))
            if self.credit is not None:
                credits = self.credit(inst, operand_needs, operand_had)
            if any(operand_had):
                had = operand_had
                if self.broadcast is not None:
                    flags = tuple([bool(h) and o.sharding.kind == "maximal" and
                                   self.broadcast(o, h) for o, h in zip(operands, operand_had)])
                    if any(flags):
                        broadcast = flags
        if self.result_needs is not None and users:
            needs = self._needs.get(inst)
            sharding = inst.sharding
            if needs is None and any([p.result is not sharding and p.result != sharding
                                      for p in plans]):
                needs = self.users_needs(inst)
                if not needs and self.unread_elements is not None:
                    needs = self.unread_elements(inst)
            needs = needs or ()
        recomputed = 0.0
        if self.users_recomputed is not None and users and not inst.sharding.is_replicated and \
                any([p.result.is_replicated for p in plans]):
            recomputed = self.users_recomputed(inst)
        sources = ()
        if self.unread:
            sources = tuple(map(self.unread.get, operands))
            if all([s is None for s in sources]):
                sources = ()
        if not (had or broadcast or needs or sources or credits or recomputed):
            return signature
        return Signature(signature.shape, signature.sharding, signature.operand_shapes,
                         signature.operand_shardings, signature.operand_ids,
                         signature.operand_free, result_needs=needs, operand_had=had,
                         operand_broadcast=broadcast, operand_sources=sources,
                         operand_credit=credits, users_recomputed=recomputed,
                         operand_split_free=signature.operand_split_free)

    def cost(self, shape: Shape, source: HloSharding, target: HloSharding) -> float:
        """Bytes per device of resharding a value of `shape` (tuples: the sum over leaves)."""
        if source == target:
            return 0.0
        key = (shape, source, target)
        cost = self._costs.get(key)
        if cost is None:
            leaves = list(shape.leaves())
            cost = self._costs[key] = sum(
                reshard_cost(s, a, b, self.num_devices) for s, a, b in
                zip(leaves, source.leaf_shardings(shape), target.leaf_shardings(shape)))
        return cost

    def plan_cost(self, inst: Instruction, plan: OpPlan) -> float:
        """Bytes per device of `plan`: its own traffic, each distinct operand reshard once
        (insert-reshards reshards a value used twice the same way once) and the result's."""
        return self.cost_of(self.signature(inst, (plan,)), plan)

    def result_cost(self, inst: Instruction, plan: OpPlan, totals: bool = False) -> float:
        """The part of `plan_cost` (with `totals`, of `total_of`) that has the result where
        the users read it."""
        return _result_bytes(self.signature(inst, (plan,)), plan.result,
                             self.total if totals else self.cost, plan.operands)

    def cost_of(self, signature: "Signature", plan: OpPlan) -> float:
        """`plan_cost` for an instruction described by its `signature`."""
        return _with_reshard_bytes(plan.cost, signature, plan, self.cost)

    def total(self, shape: Shape, source: HloSharding, target: HloSharding) -> float:
        """Bytes all devices together send resharding a value of `shape`."""
        if source == target:
            return 0.0
        leaves = list(shape.leaves())
        return sum(plan_reshard(s, a, b, self.num_devices).total for s, a, b in
                   zip(leaves, source.leaf_shardings(shape), target.leaf_shardings(shape)))

    def total_of(self, inst: Instruction, plan: OpPlan) -> float:
        """Bytes all devices together send for `plan` of `inst` (as `plan_cost`, summed over
        the devices instead of the busiest one's): breaks ties between plans whose busiest
        device sends the same."""
        return self.total_for(self.signature(inst, (plan,)), plan)

    def total_for(self, signature: "Signature", plan: OpPlan) -> float:
        """`total_of` for an instruction described by its `signature`."""
        own = plan.cost * self.num_devices if plan.total is None else plan.total
        return _with_reshard_bytes(own, signature, plan, self.total, totals=True)

    def choose(self, inst: Instruction, candidates: Sequence[OpPlan],
               tie_break: Callable[[OpPlan], float] | None = None,
               totals: bool = False) -> OpPlan:
        """The candidate moving the fewest bytes (then the smallest `tie_break`, or with
        `totals` the fewest bytes all devices together send, then the first). A lone
        candidate without a tie-break that computes the result in `inst`'s own sharding is
        returned before `inst`'s signature is built: nothing is compared, and its operands'
        shared reshards are asked by the questions that compare plans (one with a result in
        another sharding still asks for its users' needs, which `signature` keeps for `inst`'s
        later plans)."""
        if tie_break is None and len(candidates) == 1 and \
                candidates[0].result == inst.sharding:
            return candidates[0]
        return self.choose_for(self.signature(inst, candidates), candidates, tie_break, totals)

    def choose_for(self, signature: "Signature", candidates: Sequence[OpPlan],
                   tie_break: Callable[[OpPlan], float] | None = None,
                   totals: bool = False) -> OpPlan:
        """`choose` for an instruction described by its `signature`. Costs are functions of
        the signature and the plans (shardings compared without metadata), so without a
        tie-break (or with `totals`, the signature's too) the choice is remembered by its
        index, and the plan returned is always one of `candidates`."""
        if tie_break is None and len(candidates) == 1:
            return candidates[0]            # nothing to compare (over half the questions)
        if tie_break is not None:
            return candidates[self._cheapest(signature, candidates, tie_break)]
        question = (signature, tuple(candidates), totals)
        index = self._chosen.get(question)
        if index is None:
            index = self._chosen[question] = self._cheapest(
                signature, candidates,
                (lambda plan: self.total_for(signature, plan)) if totals else None)
        return candidates[index]

    def _cheapest(self, signature: "Signature", candidates: Sequence[OpPlan],
                  tie_break: Callable[[OpPlan], float] | None) -> int:
        """The index of the candidate moving the fewest bytes (`cost_of`), then the smallest
        `tie_break`, then the first. A candidate's bytes are summed only until they pass the
        fewest so far (such a candidate cannot be chosen): fewer reshards are planned."""
        best: tuple[float, int] | None = None
        #: the best candidate's tie-break, asked only once another candidate ties with it
        best_tie = None
        for index, plan in enumerate(candidates):
            cost = _with_reshard_bytes(plan.cost, signature, plan, self.cost,
                                       None if best is None else best[0])
            if best is None or cost < best[0]:
                best, best_tie = (cost, index), None
            elif cost == best[0] and tie_break is not None:
                if best_tie is None:
                    best_tie = tie_break(candidates[best[1]])
                tie = tie_break(plan)
                if tie < best_tie:
                    best, best_tie = (cost, index), tie
        return best[1]

    def tiling(self, sharding: HloSharding, rank: int) -> Tiling:
        return Tiling(sharding, rank, self.num_devices)



@dataclass
class LowerContext(EmitContext):
    """Emission context of lower-spmd plus the map from global to local instructions and the
    uniform dims of the global values (`uniform_dims.UniformDims`)."""

    local: dict
    uniform: Callable[[Instruction], frozenset[int]]
    #: the reshard nodes lowered so far (`reshard_routes.LoweredReshard`), for the choice of
    #: their routes over the whole program
    reshards: list = field(default_factory=list)

    def operands(self, inst: Instruction) -> list[Instruction]:
        return [self.local[o] for o in inst.operands]


class PartitionRule:
    """Base rule: subclasses implement `plan`; the default `lower` clones the instruction onto
    its operands' local values with the shard shape of its sharding. Rules register in the
    catalogue's `PARTITION_RULES` (`@PARTITION_RULES.register(opcode, ..., instance=True)`)."""

    def plan(self, inst: Instruction, ctx: PlanContext) -> OpPlan:
        raise NotImplementedError

    def lower(self, inst: Instruction, ctx: LowerContext) -> Instruction:
        return clone(inst, ctx)


def clone(inst: Instruction, ctx: LowerContext, operands: list[Instruction] | None = None,
          shape: Shape | None = None) -> Instruction:
    """`inst` on local operands with the shard shape of its sharding, keeping its name,
    attributes and sharding (informational)."""
    operands = ctx.operands(inst) if operands is None else operands
    shape = inst.sharding.shard_shape(inst.shape) if shape is None else shape
    local = Instruction(inst.name, inst.opcode, shape, operands, inst.attrs,     # copied
                        sharding=inst.sharding, literal=inst.literal,
                        parameter_number=inst.parameter_number)
    return ctx.builder.append(local)


def zero_uneven_padding(ctx: LowerContext, value: Instruction, shape: ArrayShape,
                        tiling: Tiling, dims) -> Instruction:
    """The local `value` of a global `shape` laid out as `tiling`, with the padding of its
    uneven tiled `dims` replaced by zeros (`iota + this partition's offset < size`)."""
    uneven = [d for d in dims if tiling.counts[d] > 1 and shape.dims[d] % tiling.counts[d]]
    if not uneven:
        return value
    b = ctx.builder
    local_dims = value.shape.dims
    offsets = tiling.offsets(shape.dims)
    valid = None
    for d in uneven:
        index = b.binary("add", b.iota("s32", local_dims, d),
                         b.broadcast(ctx.tables.lookup(offsets[:, d], f"offset.{d}"),
                                     local_dims))
        inside = b.compare(index, b.broadcast(b.constant(shape.dims[d], "s32"), local_dims), "LT")
        valid = inside if valid is None else b.binary("and", valid, inside)
    zero = b.broadcast(b.zero(value.shape.element_type), local_dims)
    return b.select(valid, value, zero)


# ---- sharding helpers shared by the rules ------------------------------------------------------

def without_partials(sharding: HloSharding) -> HloSharding:
    """The sharding with any unreduced subgroup turned into replication."""
    if sharding.kind == "unreduced":
        return HloSharding.replicate()
    if sharding.kind != "tiled" or "unreduced" not in sharding.subgroup_types:
        return sharding
    types = tuple("replicated" if t == "unreduced" else t for t in sharding.subgroup_types)
    return HloSharding.tiled(sharding.tile_assignment, types)


def replicated_for(shape: Shape) -> HloSharding:
    """`{replicated}` for an array, a tuple of `{replicated}` leaves for a tuple."""
    if isinstance(shape, TupleShape):
        return HloSharding.tuple([HloSharding.replicate()] * sum(1 for _ in shape.leaves()))
    return HloSharding.replicate()


def maximal_for(shape: Shape, device: int) -> HloSharding:
    if isinstance(shape, TupleShape):
        return HloSharding.tuple([HloSharding.maximal(device)] * sum(1 for _ in shape.leaves()))
    return HloSharding.maximal(device)


# ---- the default action ------------------------------------------------------------------------

class DefaultRule(PartitionRule):
    """Default action: every operand replicated (or on the instruction's single device), the op
    run unchanged on whole values, the result resharded."""

    def plan(self, inst, ctx):
        device = inst.sharding.unique_device
        if device is not None:
            return OpPlan(tuple(maximal_for(o.shape, device) for o in inst.operands),
                          maximal_for(inst.shape, device),
                          f"{inst.opcode} runs unpartitioned on device {device}")
        return OpPlan(tuple(replicated_for(o.shape) for o in inst.operands),
                      replicated_for(inst.shape),
                      f"no partitioning rule for {inst.opcode}: it runs on replicated operands")


DEFAULT_RULE = DefaultRule()
PARTITION_RULES.set_default(DEFAULT_RULE)


def has_manual_leaf(sharding: HloSharding | None) -> bool:
    """Whether some leaf of `sharding` is manual or has a manual subgroup (per-device data)."""
    return sharding is not None and sharding.has_manual_leaf


__all__ = ["NOT_EVERYWHERE", "CONTRACTIONS", "NOT_RECOMPUTED", "recomputed_for_free",
           "result_chain", "read_from", "summed_first", "free_target", "OpPlan",
           "Signature", "PlanContext", "LowerContext", "PartitionRule", "clone", "without_partials",
           "replicated_for", "maximal_for", "DEFAULT_RULE", "has_manual_leaf"]
