"""Reshard planning: the cheapest sequence of steps that turns a value sharded one way into the
same value sharded another way, as pure sharding arithmetic (the steps and the alignment rules
are described in docs/partitioning.md, "Resharding"; the step arithmetic in
docs/design/sharding-algebra.md).

`plan_reshard(shape, source, target, num_devices)` returns a `ReshardPlan`: a list of steps,
each a local operation or one collective with the bytes every device sends in it (`traffic`, the
cost model of `gspmdc.ir.cost`: exactly what `gspmdc explain` and `run --profile` count for the
emitted collective). A plan costs the bytes its busiest device sends over all its steps (each
device's bytes summed over the steps: steps loading different devices cost the largest sum). The IR
for a plan is emitted by `reshard.py`; op rules use `reshard_cost` to choose strategies.
`plan_routes` gives the other plans the cheapest was chosen among, one per distinct vector of
bytes per device, for the choice of routes over the whole program (`reshard_routes.py`).

Steps between tilings (`tiling.py`), in the order a plan uses them:

| step                | when                                                | communication  |
|---------------------|-----------------------------------------------------|----------------|
| `ReduceScatter(d)`  | partial sums; the target tiles dim d by their count  | reduce-scatter |
|                     | (or by a factor of it, dim after dim: in stages)     |                |
| `AllReduce`         | partial sums otherwise                               | all-reduce     |
|                     | (after a `Slice` to the target's tiles where every   |                |
|                     | member of each partial group wants the same one, or  |                |
|                     | else laid out on the groups, a `Permute` after it)   |                |
| `AllToAll(i, j, g)` | a factor g of tiles moves from dim i to dim j        | all-to-all     |
|                     | (or several such moves on distinct dims at once)    |                |
| `Slice`             | target tiles nest in held tiles (uses replication)   | none           |
| `AllGather(d, g)`   | dim d keeps fewer tiles (minor factor g gathered)    | all-gather     |
| `MaskedGather`      | the same gathers as one sum (uneven dims, see below) | all-reduce     |
| `Permute`           | same tiles, other devices                            | permute        |
| `Exchange`          | tiles that do not nest (uneven dims): the pieces     | permutes       |
| `ZeroPartials`      | the target is unreduced: keep one partial per group  | none           |

and `BroadcastFromDevice` (maximal → replicated: select on partition-id, all-reduce) and
`SendToDevice` (maximal → other maximal: one collective-permute). Uneven dims are handled by the
alignment rules: a step that would cut a padded tile across real data falls back to gathering
that dim completely (slicing from the full dim is always exact).

An `Exchange` (`reshard_exchange.py`) is planned beside the staged variants when some dim's
tiles do not nest (where they would fall back to gathering the dim whole): every device builds
its new tile from the pieces of the source tiles it overlaps, received by a few
collective-permutes. Where they nest, the same exchange (`_direct_exchange`) replaces the
cheapest staged plan (`plan_staged`) when its busiest device sends fewer bytes: an all-to-all
landing the new tiles on other devices than the target's, then a permute, sends each piece
twice, and an all-gather whole shards where each device lacks only a part.

Where an uneven dim goes to fewer tiles that its tiles do not gather into, the *realigned*
variants (XLA's halo exchange before an all-gather to a partially replicated sharding) start
with an `Exchange` of the boundary pieces into the source's tiling laid out within the target's
tiles (`plan_exchange`'s `within`), after which those dims' gathers are aligned. They are
candidates beside the exchanges above (which send each missing piece once, fewest bytes over
all devices) since they can leave the busiest device sending less.

Where an uneven dim goes to fewer tiles and a tile count between pads it less (9 elements: 8
tiles of 2 hold 16 slots, 4 tiles of 3 hold 12), the *coarsened* variants
(`_coarsened_variants`) start with an `Exchange` of the pieces into that count, and the gathers
after it move fewer padded shards.

A `MaskedGather` replaces the all-gathers of a plan (or a leading run of them, the others
following it: `_masked_prefix`) by one all-reduce: every device places its shard (padding
zeroed) at its offset in a zero buffer of the gathered shard's shape and the group sums the
buffers. It moves about twice the gathered *real* elements instead of every member's padded
shard, so it wins when padding dominates (f32[3,3] on 8 devices: 9 real elements against 8
padded rows); on even dims the all-gathers always cost less.

A plan may also work on the array padded as XLA pads it (`_padded_dims`: each uneven dim to a
multiple of the target's tile count), where tile counts dividing the padded size split it
evenly: a slice from replicas then an all-to-all stays aligned where the unpadded tiles do not
nest. Both are planned and the cheaper kept (`ReshardPlan.padded`).

Each variant is also planned with its runs of consecutive all-to-alls on distinct dims merged
into one (`_merged_all_to_alls`: every device sends each block once instead of once per pair).

A plan closing with a permute is also planned with the permute moved back to the smallest
local shard before it (`_permuted_earlier`), where an all-to-all's padding made the shards after
it larger; the steps between run on the permuted devices and send what they sent.

Staged variants are planned (with and without reduce-scatters, all-to-alls, slicing from
replicas before them, into the dims gaining tiles first to last and last to first, slicing
before gathering, permuting before gathering, masked gathering) and the cheapest is kept (then the one
all devices together send least with, then the shortest, then the first), so the choice is
deterministic. All-gathers go cheapest first: dims that barely grow the shard (a size-1 dim split
many ways) before the others, even dims in reverse dim order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from math import gcd, prod
from typing import NamedTuple, Union

import numpy as np

from gspmdc.errors import UnsupportedError
from gspmdc.ir import cost, dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.tile_assignment import atomic_axes, from_axes

from .manual_groups import auto_equivalent, same_manual_groups
from .reshard_exchange import Round, plan_exchange
from .tiling import Tiling, cdiv


@dataclass(frozen=True, eq=False)
class Maximal:
    """A value that only one device holds meaningfully."""

    device: int


Layout = Union[Tiling, Maximal]


def local_dims(dims: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
    return dims if isinstance(layout, Maximal) else layout.shard_dims(dims)


@dataclass(frozen=True, eq=False)
class Step:
    """One step from layout `before` to layout `after`."""

    before: Layout
    after: Layout

    #: the collective the step emits ("" for local steps)
    collective = ""

    def traffic(self, dims: tuple[int, ...], width: int) -> cost.Traffic | None:
        """The bytes every device sends in this step's collective, for an array of `dims` with
        elements of `width` bytes (None: a local step)."""
        return None

    def collective_traffics(self, dims: tuple[int, ...], width: int) -> list[cost.Traffic]:
        """The traffic of each collective the step's lowering emits, in order (`traffic` is
        their sum: one collective but for an `Exchange`)."""
        found = self.traffic(dims, width)
        return [] if found is None else [found]

    def describe(self) -> str:
        return type(self).__name__


def _bytes(dims, width) -> int:
    return prod(dims) * width


@dataclass(frozen=True, eq=False)
class AllReduce(Step):
    groups: np.ndarray = None
    collective = "all-reduce"

    def traffic(self, dims, width):
        return cost.all_reduce(self.groups, prod(local_dims(dims, self.before)), width,
                               self.before.num_devices)

    def describe(self):
        return f"all-reduce partial values over groups of {self.groups.shape[1]}"


@dataclass(frozen=True, eq=False)
class ReduceScatter(Step):
    dim: int = 0
    groups: np.ndarray = None
    collective = "reduce-scatter"

    def traffic(self, dims, width):
        local = list(local_dims(dims, self.before))
        local[self.dim] = self.groups.shape[1] * self.after.shard_dims(dims)[self.dim]
        return cost.reduce_scatter(self.groups, prod(local), width, self.before.num_devices)

    def describe(self):
        return f"reduce-scatter partial values into dim {self.dim} over groups of " \
               f"{self.groups.shape[1]}"


@dataclass(frozen=True, eq=False)
class AllToAll(Step):
    """Tiles moved between dims by one all-to-all: each of `moves` `(i, j, g)` moves a factor g
    of the tiles of dim i to dim j (no dim in two moves). `groups` `[G, prod(g)]` list each
    group's members in the order of their sub-tiles of the source dims, row-major over the
    moves (member k receives the same sub-tiles of the target dims); with one move, in the
    reverse order (`reversed`: member k then receives sub-tile k of dim j as ever, and the
    pieces it receives arrive last sub-tile first)."""

    moves: tuple[tuple[int, int, int], ...] = ()
    groups: np.ndarray = None
    reversed: bool = False
    collective = "all-to-all"

    def traffic(self, dims, width):
        local = list(local_dims(dims, self.before))
        after = self.after.shard_dims(dims)
        for _, j, g in self.moves:
            local[j] = g * after[j]
        return cost.all_to_all(self.groups, prod(local), width, self.before.num_devices)

    def describe(self):
        order = " (groups in reverse order)" if self.reversed else ""
        moved = ", ".join(f"{g} tiles from dim {i} to dim {j}" for i, j, g in self.moves)
        return f"all-to-all moving {moved}{order}"


@dataclass(frozen=True, eq=False)
class AllGather(Step):
    dim: int = 0
    factor: int = 1
    groups: np.ndarray = None
    collective = "all-gather"

    def traffic(self, dims, width):
        return cost.all_gather(self.groups, _bytes(local_dims(dims, self.before), width),
                               self.before.num_devices)

    def describe(self):
        return f"all-gather dim {self.dim} over groups of {self.factor}"


@dataclass(frozen=True, eq=False)
class MaskedGather(Step):
    """All-gathers done as one sum: `groups` [G, g] are the devices whose tiles of `before`
    make up one tile of `after`. `realigned`: the dims an `Exchange` laid out within the
    target's coarser tiles (`_realigned_variants`): there member `j` of a group holds the
    `j`-th part of its coarse tile, its padding already zero."""

    groups: np.ndarray = None
    realigned: frozenset = frozenset()
    collective = "all-reduce"

    def traffic(self, dims, width):
        return cost.all_reduce(self.groups, prod(self.after.shard_dims(dims)), width,
                               self.before.num_devices)

    def describe(self):
        return f"all-reduce of zero-padded shards over groups of {self.groups.shape[1]} " \
               "(a masked gather)"


@dataclass(frozen=True, eq=False)
class Slice(Step):
    def describe(self):
        return "dynamic-slice of the local shard"


@dataclass(frozen=True, eq=False)
class Permute(Step):
    pairs: np.ndarray = None        # [P, 2] (source, target)
    collective = "collective-permute"

    def traffic(self, dims, width):
        return cost.collective_permute(self.pairs, _bytes(local_dims(dims, self.before), width),
                                       self.before.num_devices)

    def describe(self):
        moved = int((self.pairs[:, 0] != self.pairs[:, 1]).sum())
        return f"collective-permute of shards ({moved} devices receive from another)"


@dataclass(frozen=True, eq=False)
class Exchange(Step):
    """Each device's `after` tile assembled from the pieces of the `before` tiles it overlaps:
    its own piece locally, the others by one collective-permute per round
    (`reshard_exchange.py`)."""

    rounds: tuple[Round, ...] = ()
    collective = "collective-permute"

    def traffic(self, dims, width):
        parts = self.collective_traffics(dims, width)
        if not parts:
            return None
        return cost.Traffic("collective-permute", sum(p.num_groups for p in parts), 2,
                            max(p.operand_bytes for p in parts), sum(p.sent for p in parts),
                            sum(p.received for p in parts))

    def collective_traffics(self, dims, width):
        """One collective-permute per round that moves pieces, of the round's buffer (the
        rounds are sized for the dims the exchange was planned on)."""
        n = self.before.num_devices
        return [cost.collective_permute(r.pairs, prod(r.size) * width, n)
                for r in self.rounds if r.pairs is not None]

    def describe(self):
        moving = sum(r.pairs is not None for r in self.rounds)
        return f"collective-permutes of the pieces of the new tiles ({moving} rounds)"


@dataclass(frozen=True, eq=False)
class ZeroPartials(Step):
    def describe(self):
        return "keep one partial value per group, zero the others"


@dataclass(frozen=True, eq=False)
class BroadcastFromDevice(Step):
    num_devices: int = 1
    collective = "all-reduce"

    def traffic(self, dims, width):
        n = self.num_devices
        return cost.all_reduce([range(n)], prod(dims), width, n)

    def describe(self):
        return f"broadcast from device {self.before.device} (select + all-reduce)"


@dataclass(frozen=True, eq=False)
class SendToDevice(Step):
    num_devices: int = 1
    collective = "collective-permute"

    def traffic(self, dims, width):
        return cost.collective_permute([(self.before.device, self.after.device)],
                                       _bytes(dims, width), self.num_devices)

    def describe(self):
        return f"send from device {self.before.device} to device {self.after.device}"


@dataclass(frozen=True, eq=False)
class ReshardPlan:
    """Steps turning `source` into `target` for an array of `shape`; `cost` = the bytes the
    busiest device sends over all the steps (`sent_by_device`'s largest); `total` = the bytes
    all devices send."""

    shape: ArrayShape
    steps: tuple[Step, ...]
    cost: int
    total: int = 0
    #: the global dims the steps work on when they are not `shape`'s: uneven dims padded to a
    #: multiple of the tile counts (`_padded_dims`), the local shard padded before the first
    #: step and cut to the target's shard after the last
    padded: tuple[int, ...] | None = None

    @property
    def collectives(self) -> list[str]:
        return [s.collective for s in self.steps if s.collective]

    def sent_by_device(self, num_devices: int) -> np.ndarray:
        """Bytes each of the `num_devices` devices sends over the steps (their sum over the
        devices is `total`, their largest `cost`)."""
        dims = self.padded or self.shape.dims
        width = max(dtypes.byte_width(self.shape.element_type), 1)
        sent = np.zeros(num_devices, dtype=np.int64)
        for step in self.steps:
            traffic = step.traffic(dims, width)
            if traffic is not None:
                sent = sent + traffic.sent
        return sent


# ---------------------------------------------------------------------------------- planning

def layout_of(sharding: HloSharding, rank: int, num_devices: int) -> Layout:
    if sharding.kind == "maximal":
        return Maximal(sharding.device)
    return Tiling(sharding, rank, num_devices)


def plan_reshard(shape: ArrayShape, source: HloSharding, target: HloSharding,
                 num_devices: int) -> ReshardPlan:
    """The cheapest plan from `source` to `target` (leaf shardings of an array of `shape`).
    Partially manual shardings with the same manual groups reshard inside every group: the plan
    of their auto equivalents (`manual_groups.py`); other manual ones are not resharded."""
    if source.has_manual_leaf or target.has_manual_leaf:
        if source == target:
            return ReshardPlan(shape.without_layout(), (), 0.0)
        if not same_manual_groups(source, target):
            raise UnsupportedError(
                f"cannot reshard the manual value {source.to_text(False)} to "
                f"{target.to_text(False)}: manual values are per-device data")
        source, target = auto_equivalent(source), auto_equivalent(target)
    return _plan_cached(shape.without_layout(), source.with_metadata(()),
                        target.with_metadata(()), num_devices)


class Routes(NamedTuple):
    """Plans of one reshard (`plans`, the chosen one first) and the bytes each device sends in
    each (`sent`, `[len(plans), num_devices]`, read-only)."""

    plans: tuple[ReshardPlan, ...]
    sent: np.ndarray


def plan_routes(shape: ArrayShape, source: HloSharding, target: HloSharding,
                num_devices: int) -> Routes:
    """`plan_reshard`'s plan, then every other plan it was chosen among that leaves the devices
    sending other bytes (`sent_by_device`; the first of each, in planning order): the routes a
    program-wide choice may take instead (`reshard_routes.py`). From a single device every
    route starts with its broadcast, and to one every route ends replicated, as the plan does;
    only the plan itself from one device to another, and for manual values."""
    if source.has_manual_leaf or target.has_manual_leaf:
        return _routes((plan_reshard(shape, source, target, num_devices),), num_devices)
    return _routes_cached(shape.without_layout(), source.with_metadata(()),
                          target.with_metadata(()), num_devices)


@algebra.cached
def _routes_cached(shape: ArrayShape, source: HloSharding, target: HloSharding,
                   num_devices: int) -> Routes:
    plan = _plan_cached(shape, source, target, num_devices)
    rank, width = shape.rank, max(dtypes.byte_width(shape.element_type), 1)
    src, dst = layout_of(source, rank, num_devices), layout_of(target, rank, num_devices)
    if not plan.steps or isinstance(src, Maximal) and isinstance(dst, Maximal):
        return _routes((plan,), num_devices)
    first: list[Step] = []
    if isinstance(src, Maximal):
        replicated = Tiling.replicated(rank, num_devices)
        first, src = [BroadcastFromDevice(src, replicated, num_devices=num_devices)], replicated
    if isinstance(dst, Maximal):
        dst = Tiling.replicated(rank, num_devices)
    routes, seen = [plan], {plan.sent_by_device(num_devices).tobytes()}
    padded = None if first else _padded_dims(shape.dims, src, dst)
    for dims, padded in ((shape.dims, None), (padded, padded)):
        if dims is None:
            continue
        for steps in _candidates(dims, src, dst):
            steps = first + steps
            route = ReshardPlan(shape, tuple(steps), *_bytes_sent(steps, dims, width), padded)
            key = route.sent_by_device(num_devices).tobytes()
            if key not in seen:
                seen.add(key)
                routes.append(route)
    return _routes(tuple(routes), num_devices)


def _routes(plans: tuple[ReshardPlan, ...], num_devices: int) -> Routes:
    sent = np.array([plan.sent_by_device(num_devices) for plan in plans], dtype=np.int64)
    sent.setflags(write=False)
    return Routes(plans, sent)


def reshard_cost(shape: ArrayShape, source: HloSharding, target: HloSharding,
                 num_devices: int) -> int:
    return plan_reshard(shape, source, target, num_devices).cost


def plan_staged(shape: ArrayShape, source: HloSharding, target: HloSharding,
                num_devices: int) -> ReshardPlan:
    """The cheapest of the staged variants (with the exchanges they include where tiles do
    not nest) from `source` to `target`, leaf shardings without manual subgroups: the plan
    `plan_reshard` keeps unless the direct exchange of pieces (`_direct_exchange`) sends
    fewer bytes."""
    return _staged_cached(shape.without_layout(), source.with_metadata(()),
                          target.with_metadata(()), num_devices)


@algebra.cached
def _plan_cached(shape: ArrayShape, source: HloSharding, target: HloSharding,
                 num_devices: int) -> ReshardPlan:
    """`plan_staged`'s plan, or the direct exchange of pieces where its busiest device sends
    fewer bytes (not planned where the staged plan sends none)."""
    staged = _staged_cached(shape, source, target, num_devices)
    if not staged.cost or source.kind == "maximal" or target.kind == "maximal":
        return staged
    rank = len(shape.dims)
    src, dst = Tiling(source, rank, num_devices), Tiling(target, rank, num_devices)
    direct = _direct_exchange(shape.dims, src, dst)
    if direct is None:
        return staged
    width = max(dtypes.byte_width(shape.element_type), 1)
    sent = _bytes_sent(direct, shape.dims, width)
    return ReshardPlan(shape, tuple(direct), *sent) if sent[0] < staged.cost else staged


@algebra.cached
def _staged_cached(shape: ArrayShape, source: HloSharding, target: HloSharding,
                   num_devices: int) -> ReshardPlan:
    for s in (source, target):
        if s.is_tuple:
            raise UnsupportedError(f"resharding needs leaf shardings, got {s.to_text(False)}")
    dims, width = shape.dims, max(dtypes.byte_width(shape.element_type), 1)
    rank = len(dims)
    src, dst = layout_of(source, rank, num_devices), layout_of(target, rank, num_devices)
    if source == target or _same_layout(src, dst):
        return ReshardPlan(shape, (), 0)
    steps: list[Step] = []
    if isinstance(src, Maximal):
        if isinstance(dst, Maximal):
            return _finish(shape, [SendToDevice(src, dst, num_devices=num_devices)], width)
        replicated = Tiling.replicated(rank, num_devices)
        steps.append(BroadcastFromDevice(src, replicated, num_devices=num_devices))
        src = replicated
    if isinstance(dst, Maximal):
        # every device then holds the data, which serves a single-device value too
        dst = Tiling.replicated(rank, num_devices)
    best, best_sent = _cheapest(_candidates(dims, src, dst), dims, width)
    if steps:
        return _finish(shape, steps + best, width)
    padded = _padded_dims(dims, src, dst)
    if padded is not None:
        wide, wide_sent = _cheapest(_candidates(padded, src, dst), padded, width)
        if wide_sent < best_sent:
            return ReshardPlan(shape, tuple(wide), *wide_sent, padded)
    return ReshardPlan(shape, tuple(best), *best_sent)


def _candidates(dims, src: Tiling, dst: Tiling) -> list[list[Step]]:
    """Every plan from `src` to `dst` the cheapest is chosen among: the `_variants`, each also
    with its all-to-alls merged (`_merged_all_to_alls`), and every one of those with its closing
    permute moved earlier (`_with_earlier_permutes`)."""
    variants = _variants(dims, src, dst)
    variants += [merged for variant in variants
                 if (merged := _merged_all_to_alls(variant)) is not None]
    return _with_earlier_permutes(dims, variants)


def _merged_all_to_alls(variant: list[Step]) -> list[Step] | None:
    """`variant` with each run of consecutive all-to-alls on distinct dims done as one
    all-to-all (XLA's reshard moving tiles between several pairs of dims at once: every device
    sends each block once instead of once per pair), or None where no two merge. Two merge
    where the devices that trade in the first all keep their place in the second's groups and
    the other way round (`_merged`)."""
    merged, changed = [], False
    for step in variant:
        last = merged[-1] if merged else None
        both = isinstance(step, AllToAll) and isinstance(last, AllToAll)
        one = _merged(last, step) if both else None
        if one is None:
            merged.append(step)
        else:
            merged[-1], changed = one, True
    return merged if changed else None


def _merged(first: AllToAll, second: AllToAll) -> AllToAll | None:
    """`first` then `second` as one all-to-all, or None. Device D ends with the block of the
    source dims it wants from each member m of its `second` group, which m received in `first`
    from the members of its own group: one all-to-all does both when every member of a
    `second` group had D's place in `first`'s groups (so m received the blocks of D's target
    sub-tiles of `first`'s dims) and every member of a `first` group has the place in
    `second`'s groups of the device it sent to (so the block lands in the same sub-tile of
    `second`'s source dims). Member (a, b) of the merged group is the device in place a of a
    `first` group and b of a `second` one."""
    if first.reversed or second.reversed:
        return None
    taken = {d for i, j, _ in first.moves for d in (i, j)}
    if any(i in taken or j in taken for i, j, _ in second.moves):
        return None
    n = first.before.num_devices
    places = [_places(step.groups, n) for step in (first, second)]
    if places[0] is None or places[1] is None:
        return None
    (row1, place1), (_, place2) = places
    g1, g2 = first.groups, second.groups
    if not ((place1[g2] == place1[g2[:, :1]]).all() and (place2[g1] == place2[g1[:, :1]]).all()):
        return None
    # [G2, k2, k1]: the first-groups of the members of each second-group
    members = g1[row1[g2]]
    groups = np.unique(members.transpose(0, 2, 1).reshape(len(g2), -1), axis=0)
    if (np.bincount(groups.ravel(), minlength=n) != 1).any():
        return None
    return AllToAll(first.before, second.after, moves=first.moves + second.moves, groups=groups)


def _places(groups: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """For each of `n` devices, its group's row in `groups` and its place in it; None unless
    every device is in exactly one group."""
    if groups.size != n or (np.bincount(groups.ravel(), minlength=n) != 1).any():
        return None
    row, place = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    row[groups] = np.arange(len(groups))[:, None]
    place[groups] = np.arange(groups.shape[1])[None, :]
    return row, place


def _cheapest(variants: list[list[Step]], dims, width) -> tuple[list[Step], tuple[int, int]]:
    """The variant whose busiest device sends the fewest bytes (then all devices, then the
    fewest steps; the first of equals), with its `_bytes_sent` (each variant's worked out once)."""
    best, best_key = None, None
    for variant in variants:
        key = (*_bytes_sent(variant, dims, width), len(variant))
        if best_key is None or key < best_key:
            best, best_key = variant, key
    return best, best_key[:2]


def _padded_dims(dims, src: Tiling, dst: Tiling) -> tuple[int, ...] | None:
    """The dims the steps may work on instead of `dims` (None when the same), as XLA reshards
    uneven dims: each padded to `t * cdiv(size, t)` for the target's tile count t (the source's
    when the target leaves the dim whole), so that the source's shards and the target's are the
    padded array's (a whole source dim is padded locally; a whole target dim is cut back), and
    tile counts that divide it split it evenly (a slice from replicas, then an all-to-all, where
    the unpadded tiles do not nest). None where a dim tiled on both sides pads differently."""
    padded = []
    for size, t, tt in zip(dims, src.counts, dst.counts):
        held, wanted = t * cdiv(size, t), tt * cdiv(size, tt)
        if t != 1 and tt != 1 and held != wanted:
            return None
        padded.append(wanted if t == 1 else held)
    return None if tuple(padded) == tuple(dims) else tuple(padded)


def _variants(dims, src: Tiling, dst: Tiling) -> list[list[Step]]:
    """The staged variants (and the exchanges, where tiles do not nest, the realigned
    variants, where they do not gather, and the `_coarsened_variants`) from `src` to `dst`."""
    # whether to reduce-scatter only matters for partial sums
    scatter = (True, False) if src.unreduced > 1 else (True,)
    # a masked gather only pays where padding inflates the all-gathers
    uneven = any(size % count for size, count in zip(dims, src.counts))
    variants = []
    #: flag tuples of variants known to equal one already planned (flags that did nothing)
    same: set[tuple[bool, ...]] = set()
    # slicing from replicas before the all-to-alls needs replicas (or partials that become
    # replicas); planned after the same variant without it, kept where it changed something
    firsts = (False, True) if src.replication > 1 or src.unreduced > 1 else (False,)
    gaining = sum(tt > t for t, tt in zip(src.counts, dst.counts))
    #: per reduce-scatter flag, whether the all-to-alls moved no tiles (their order is moot)
    unmoved: dict[bool, bool] = {}
    for masked in ((False, True) if uneven else (False,)):
        for flags in itertools.product(scatter, *[(True, False)] * 3):
            if (masked, *flags) in same:
                continue
            inert: set[int] = set()
            variants.append(_staged(dims, src, dst, *flags, masked=masked, inert=inert))
            if flags[1]:
                unmoved.setdefault(flags[0], 2 in inert)
            same.update(_with_flags_cleared((masked, *flags), inert))
            if firsts[-1] and flags[1] and 2 not in inert:
                first = _staged(dims, src, dst, *flags, masked=masked, slice_first=True,
                                inert=inert)
                if 5 not in inert:
                    variants.append(first)
                    # the replicas also sliced into the dims gaining tiles last to first: the
                    # dims the all-to-alls then fill decide whether a permute must follow
                    if gaining > 1:
                        variants.append(_staged(dims, src, dst, *flags, masked=masked,
                                                slice_first=True, slice_last_first=True))
    # with two dims or more losing tiles, the all-to-alls also take them last to first (where
    # they moved tiles at all: when no pair of dims can trade tiles, no order of the dims makes
    # one, and the variant would repeat the steps of the same flags taken first to last)
    losing = sum(t > tt for t, tt in zip(src.counts, dst.counts))
    if losing > 1:
        for flags in itertools.product(scatter, (True,), *[(True, False)] * 2):
            if not unmoved.get(flags[0], False):
                variants.append(_staged(dims, src, dst, *flags, last_first=True))
                variants.append(_staged(dims, src, dst, *flags, last_first=True,
                                        mirrored=True))
    # the all-to-alls' groups also in reverse order, where tiles moved: which device receives
    # which new tile then differs (a permute after them may move fewer devices)
    for flags in itertools.product(scatter, (True,), *[(True, False)] * 2):
        if unmoved.get(flags[0]) is False:
            variants.append(_staged(dims, src, dst, *flags, reversed_groups=True))
    # partial sums reduce-scattered into each other dim that can take them whole: which dim
    # decides whether the devices then hold their target tiles or still need a permute
    for d in _scatter_dims(dims, src, dst)[1:]:
        for flags in itertools.product((True,), *[(True, False)] * 3):
            variants.append(_staged(dims, src, dst, *flags, scatter_dim=d))
    if src.unreduced == dst.unreduced == 1:
        variants += _exchange_variants(dims, src, dst)
        variants += _coarsened_variants(dims, src, dst)
    elif src.unreduced > 1 and dst.unreduced == 1:
        # partial sums all-reduced, then moved by exchanges too (XLA's reshard of partial sums:
        # all-reduce, then as any tiling; the staged variants all-reduce, but then only gather,
        # slice, permute and all-to-all)
        all_reduce = _all_reduce(src)
        variants += [[all_reduce, *rest]
                     for rest in _exchange_variants(dims, all_reduce.after, dst)]
        sliced = _sliced_partials(dims, src, dst)
        if sliced is None:
            sliced = _sliced_on_groups(dims, src, dst)
        if sliced is not None:
            variants += [[Slice(src, sliced), *rest] for rest in _variants(dims, sliced, dst)]
    return variants


#: the steps a permute can be moved in front of: each only regroups the tiles of its devices,
#: so on relabelled devices the same steps reach the relabelled tiling, each device sending what
#: the device it stands for sent
_RELABELLABLE = (Slice, AllToAll, AllGather, MaskedGather)


def _with_earlier_permutes(dims, variants: list[list[Step]]) -> list[list[Step]]:
    """`variants` and, for each that closes with a permute, the same plan with the permute moved
    in front of the local shard smallest among the steps before it (`_permuted_earlier`)."""
    earlier = [moved for variant in variants
               if (moved := _permuted_earlier(dims, variant)) is not None]
    return variants + earlier


def _permuted_earlier(dims, variant: list[Step]) -> list[Step] | None:
    """`variant` with its closing permute (holder h -> device p(h)) moved back to the state
    before step j, the latest whose local shard is the smallest among those before the permute
    and smaller than the one it permutes (uneven dims: an all-to-all pads the dim it splits, so
    the shard it leaves can be larger than the one it takes), or None. The steps from j on run
    with device p(h) in the part of device h: they send what they sent, and end on the
    target."""
    last = next((k for k in range(len(variant) - 1, -1, -1) if variant[k].collective), None)
    if last is None or not isinstance(variant[last], Permute):
        return None
    permute = variant[last]
    if len(permute.pairs) != permute.before.num_devices:     # not every device's target
        return None
    cut, smallest = None, prod(local_dims(dims, permute.before))
    for j in range(last - 1, -1, -1):
        if not isinstance(variant[j], _RELABELLABLE):
            break
        size = prod(local_dims(dims, variant[j].before))
        if size < smallest:
            cut, smallest = j, size
    if cut is None:
        return None
    relabel = np.empty(permute.before.num_devices, dtype=np.int64)
    relabel[permute.pairs[:, 0]] = permute.pairs[:, 1]
    start = variant[cut].before
    moved = Permute(start, _relabelled(start, relabel), pairs=permute.pairs)
    return [*variant[:cut], moved, *(_relabelled_step(step, relabel)
                                     for step in variant[cut:last]), *variant[last + 1:]]


def _relabelled(tiling: Tiling, relabel: np.ndarray) -> Tiling:
    """`tiling` with device `relabel[h]` holding what device h holds."""
    return Tiling.of_devices(relabel[tiling.devices])


def _relabelled_step(step: Step, relabel: np.ndarray) -> Step:
    """One of the `_RELABELLABLE` steps with device `relabel[h]` in the part of device h."""
    changes = {"before": _relabelled(step.before, relabel),
               "after": _relabelled(step.after, relabel)}
    if not isinstance(step, Slice):
        changes["groups"] = relabel[step.groups]
    return replace(step, **changes)


def _sliced_partials(dims, src: Tiling, dst: Tiling) -> Tiling | None:
    """`src`'s partial sums sliced locally to `dst`'s tiles of the dims where that commutes with
    summing them (XLA's dot grouped on the contracting dims computes each group's output tiled
    like the target, then all-reduces across the groups): the dims `dst` tiles by a multiple f
    of `src`'s count (the split aligned) where every device's `dst` tile nests in its `src` tile
    and all members of each partial group want the same one. The sum then moves the target
    tile instead of the held one. None where no dim qualifies or the groups do not spread
    evenly over the new tiles. Decided on the digits of the device ids where both are iota
    tilings (`_sliced_by_axes`, at any device count), else on per-device tables."""
    axes = atomic_axes(src.tiles, dst.tiles)
    if axes is not None:
        return _sliced_by_axes(dims, src, dst, *axes)
    return _sliced_by_devices(dims, src, dst)


def _sliced_by_axes(dims, src: Tiling, dst: Tiling, src_axes, dst_axes) -> Tiling | None:
    """`_sliced_partials` of iota tilings, on the digits of the device ids each tile index
    reads (`atomic_axes`): a dim's `dst` tiles nest in the `src` ones on every device exactly
    when its `dst` digits begin with its `src` digits, and all members of a partial group want
    the same one when they read none of the partial index's digits; the new tiles spread evenly
    when no digit is read twice. Groups keep their order (the digits of the `src` tile indices
    and replicas that no new tile index reads), members the partial index."""
    rank = len(dims)
    partial = set(src_axes[rank])
    sliced = [tt > t and tt % t == 0 and _slice_aligned(size, t, tt // t) and
              dst_axes[d][:len(src_axes[d])] == src_axes[d] and
              not partial.intersection(dst_axes[d])
              for d, (size, t, tt) in enumerate(zip(dims, src.counts, dst.counts))]
    if not any(sliced):
        return None
    tile_axes = [dst_axes[d] if sliced[d] else src_axes[d] for d in range(rank)]
    read = [digit for axis in tile_axes for digit in axis]
    seen = set(read)
    if len(seen) != len(read):
        return None
    rest = [digit for a, axis in enumerate(src_axes) if a != rank for digit in axis
            if digit not in seen]
    counts = [dst.counts[d] if sliced[d] else src.counts[d] for d in range(rank)]
    u = src.unreduced
    tiles = from_axes(counts + [u, src.num_devices // (prod(counts) * u)],
                      tile_axes + [src_axes[rank], rest])
    return Tiling(algebra.sharding_of_devices(tiles), rank, src.num_devices)


def _sliced_by_devices(dims, src: Tiling, dst: Tiling) -> Tiling | None:
    """`_sliced_partials` on per-device coordinate tables (explicit device orders)."""
    held, wanted = src.coordinates(), dst.coordinates()
    groups = src.partial_groups()
    sliced = np.zeros(len(dims), dtype=bool)
    for d, (size, t, tt) in enumerate(zip(dims, src.counts, dst.counts)):
        f = tt // t
        sliced[d] = tt > t and tt % t == 0 and _slice_aligned(size, t, f) and \
            bool((wanted[:, d] // f == held[:, d]).all()) and \
            bool((wanted[groups, d] == wanted[groups[:, :1], d]).all())
    if not sliced.any():
        return None
    counts = tuple(np.where(sliced, dst.counts, src.counts).tolist())
    first = groups[:, 0]
    keys = np.ravel_multi_index(tuple(np.where(sliced, wanted[first, :len(dims)],
                                               held[first, :len(dims)]).T), counts)
    replicas, spread = divmod(len(groups), prod(counts))
    if spread or (np.bincount(keys, minlength=prod(counts)) != replicas).any():
        return None
    ordered = groups[np.lexsort((np.arange(len(groups)), keys))]
    return Tiling.of_devices(ordered.reshape(counts + (replicas, -1)).swapaxes(-1, -2))


def _sliced_on_groups(dims, src: Tiling, dst: Tiling) -> Tiling | None:
    """`src`'s partial sums sliced locally to `dst`'s tiles of every dim `dst` tiles by a
    multiple f of `src`'s count (the split aligned), the new tiles laid out on the partial groups
    instead of on the devices that want them: every group takes one of the f tiles nested in
    the one it holds, the groups holding one tile spread evenly over its new ones, as many as
    can the new tile most of their members want (`_fill_by_score`). Planned where
    `_sliced_partials` slices nothing (a group's members want different tiles, or tiles outside
    the held one): the sum still moves the target tile, and a permute then brings it to the
    devices that want it (XLA's gather on an operand tiled on its trivially sliced dims: the
    masked partial results are resharded to the output's tiles within each group of the
    operand's tiles, all-reduced across the groups, then resharded to the output). None where
    no dim qualifies or the groups do not spread evenly."""
    rank = len(dims)
    factors = [tt // t if tt > t and tt % t == 0 and _slice_aligned(size, t, tt // t) else 1
               for size, t, tt in zip(dims, src.counts, dst.counts)]
    if all(f == 1 for f in factors):
        return None
    groups = src.partial_groups()
    count, room = len(groups), prod(factors)
    per_tile, spread = divmod(count, prod(src.counts))
    if spread or per_tile % room:
        return None
    held = src.coordinates()[groups[:, 0], :rank]
    f = np.asarray(factors)
    wanted = dst.coordinates()[groups, :rank]                       # [G, u, rank]
    sliced = f > 1
    nested = (wanted[..., sliced] // f[sliced] == held[:, None, sliced]).all(-1)
    within = np.ravel_multi_index(tuple(np.moveaxis(wanted % f, -1, 0)), factors)
    score = np.zeros((count, room), np.int64)
    rows = np.repeat(np.arange(count), groups.shape[1])
    np.add.at(score, (rows[nested.ravel()], within.ravel()[nested.ravel()]), 1)
    taken = _fill_by_score(score, np.ravel_multi_index(tuple(held.T), src.counts),
                           per_tile // room)
    new = held * f + np.stack(np.unravel_index(taken, factors), -1)
    counts = tuple((np.asarray(src.counts) * f).tolist())
    keys = np.ravel_multi_index(tuple(new.T), counts)
    ordered = groups[np.lexsort((np.arange(count), keys))]
    return Tiling.of_devices(ordered.reshape(counts + (per_tile // room, -1)).swapaxes(-1, -2))


def _fill_by_score(score: np.ndarray, parent: np.ndarray, capacity: int) -> np.ndarray:
    """Per group (row of `score`, `[G, k]`: how many of its members want each of the k new
    tiles of its held tile `parent`), the new tile it takes, each of a held tile's new tiles
    taken by `capacity` groups: a group takes the tile most of its members want (the first of
    equals) where it is among the `capacity` groups wanting it most (then the first), and the
    groups left take the tiles left, both in order."""
    count, room = score.shape
    best = score.argmax(1)
    bucket = parent * room + best
    order = np.lexsort((np.arange(count), -score[np.arange(count), best], bucket))
    ranked = bucket[order]
    first = np.searchsorted(ranked, ranked, side="left")
    kept = np.zeros(count, dtype=bool)
    kept[order] = np.arange(count) - first < capacity
    taken = np.where(kept, best, -1)
    left = np.flatnonzero(~kept)
    left = left[np.argsort(parent[left], kind="stable")]
    free = capacity - np.bincount(bucket[kept], minlength=(parent.max() + 1) * room)
    taken[left] = np.repeat(np.arange(free.size), free) % room
    return taken


def _direct_exchange(dims, src: Tiling, dst: Tiling) -> list[Step] | None:
    """The exchange of the pieces of the new tiles where the staged variants do not plan it
    (tiles that nest or gather, neither side with partial sums), or None: every device
    receives the real elements of its new tile it lacks from a holder, at most `MAX_ROUNDS`
    pieces (`plan_exchange`). It replaces the staged plan only where its busiest device
    sends fewer bytes: an all-to-all whose groups give the new tiles to other devices than
    the target's, then a permute (XLA's plan), sends each piece twice where the exchange
    sends it once, and an all-gather moves the tiles whole where each device lacks only a
    part."""
    if src.unreduced > 1 or dst.unreduced > 1 or _misaligned(dims, src, dst) or \
            _gathered_past_padding(dims, src, dst):
        return None
    rounds = plan_exchange(dims, src, dst)
    return None if rounds is None else [Exchange(src, dst, rounds=tuple(rounds))]


def _exchange_variants(dims, src: Tiling, dst: Tiling) -> list[list[Step]]:
    """The variants from `src` to `dst` (neither with partial sums) that begin with an exchange
    of pieces: where some dim's tiles do not nest, or gather into the target's only past
    padding (`_gathered_past_padding`), the exchange of the pieces of the new tiles; where
    some do not nest, the exchange to `_realigned`'s tiling followed by every variant from
    there; and the `_realigned_variants`."""
    variants = []
    misaligned = _misaligned(dims, src, dst)
    if misaligned or _gathered_past_padding(dims, src, dst):
        direct = plan_exchange(dims, src, dst)
        if direct is not None:
            variants.append([Exchange(src, dst, rounds=tuple(direct))])
    if misaligned:
        mid = _realigned(dims, src, dst)
        rounds = None if mid is None else plan_exchange(dims, src, mid)
        if rounds is not None:
            exchange = Exchange(src, mid, rounds=tuple(rounds))
            variants += [[exchange, *rest] for rest in _variants(dims, mid, dst)]
    return variants + _realigned_variants(dims, src, dst)


def _realigned(dims, src: Tiling, dst: Tiling) -> Tiling | None:
    """A tiling with `dst`'s tiles on the dims whose tiles do not nest (every device its `dst`
    tile there) and `src`'s counts on the others, each device keeping its `src` tile on those
    where its tile has room (the others take the free tiles in order); None where that is
    `src`'s counts or `dst` itself. An exchange of pieces realigns the misaligned dims first
    and the plan gathers or slices the others from there (XLA's reshard of such a dim, e.g.
    tiles of 2 of a dim of 6 to tiles of 3 gathered in pairs, shifts the boundary elements by
    permutes, then all-gathers)."""
    rank = len(dims)
    moved = np.array([_dim_misaligned(size, t, tt)
                      for size, t, tt in zip(dims, src.counts, dst.counts)], dtype=bool)
    counts = tuple(np.where(moved, dst.counts, src.counts).tolist())
    if counts == tuple(src.counts) or counts == tuple(dst.counts):
        return None
    n = src.num_devices
    replicas = n // prod(counts)
    wanted = np.where(moved, dst.coordinates()[:, :rank], src.coordinates()[:, :rank])
    keys = np.ravel_multi_index(tuple(wanted.T), counts)
    fill = np.zeros(prod(counts), dtype=np.int64)
    key_of = np.full(n, -1, dtype=np.int64)
    for device in range(n):
        if fill[keys[device]] < replicas:
            key_of[device] = keys[device]
            fill[keys[device]] += 1
    for device in np.flatnonzero(key_of < 0):
        # a free tile with the device's `dst` tile on the moved dims
        options = np.ravel_multi_index(tuple(np.where(
            moved[:, None], wanted[device][:, None],
            np.indices(counts).reshape(rank, -1))), counts)
        free = options[fill[options] < replicas]
        if free.size == 0:
            return None
        key_of[device] = free.min()
        fill[key_of[device]] += 1
    devices = np.argsort(key_of, kind="stable").reshape(counts + (1, replicas))
    return Tiling.of_devices(devices)


def _realigned_variants(dims, src: Tiling, dst: Tiling) -> list[list[Step]]:
    """XLA's reshard of uneven dims to fewer tiles that the held ones do not gather into (6
    elements in 4 tiles of 2 to 2 tiles of 3): an `Exchange` first moves the boundary elements
    so that each source tile holds its part of its coarse target tile (`plan_exchange`'s
    `within` layout), and the gathers that follow are aligned (the staged variants without
    all-to-alls, which would regroup the moved dims otherwise). Always a candidate beside the
    exchange of the pieces and the one realigning to `_realigned`'s tiling: those send each
    missing piece once (fewer bytes over all devices), but the realigned gathers can send fewer
    from the busiest device, which the plan's cost counts first."""
    if src.unreduced > 1 or dst.unreduced > 1:
        return []
    realigned = {d: tt for d, (size, t, tt) in enumerate(zip(dims, src.counts, dst.counts))
                 if 1 < tt < t and t % tt == 0 and not _gather_aligned(size, t, t // tt)}
    if not realigned:
        return []
    rounds = plan_exchange(dims, src, src, within=realigned)
    if rounds is None:
        return []
    exchange = Exchange(src, src, rounds=tuple(rounds))
    return [[exchange, *_staged(dims, src, dst, True, False, *flags, masked=masked,
                                realigned=realigned)]
            for masked in (False, True) for flags in itertools.product((True, False), repeat=2)]


def _coarsened_variants(dims, src: Tiling, dst: Tiling) -> list[list[Step]]:
    """Where an uneven dim goes from t tiles to tt, t a multiple of tt, and some counts c
    between (tt | c | t) pad it less (9 elements: 8 tiles of 2 hold 16 slots, 4 tiles of 3
    hold 12): an `Exchange` of the pieces into c tiles first, each device taking the coarse
    tile its own gathers into (`coarsen_tiles`), then the staged gathers from there (all-gathers,
    or one masked gather). They move c padded shards instead of t, which can cost less than
    the pieces the exchange sends (f32[9] on 8 tiles to replicated: 56 B from every device by
    one all-gather; 16 B at most by the exchange to 4 tiles, then 36 B by the all-gather). The
    counts go from the largest down (each smaller one exchanges more pieces), and stop after
    the first whose plans send no less than the larger count's (busiest device, then all).
    Only for dims where some shard is padding alone (else the exchange moves about as much as
    the padding saves, and planning it at thousands of devices takes seconds)."""
    rank, n = len(dims), src.num_devices
    variants = []
    for d, (size, t, tt) in enumerate(zip(dims, src.counts, dst.counts)):
        # only where whole shards are padding (gathering them is what coarsening saves)
        if tt >= t or t % tt or t * cdiv(size, t) - size < cdiv(size, t):
            continue
        last = None
        for c in range(t - 1, tt, -1):
            if t % c or c % tt or c * cdiv(size, c) >= t * cdiv(size, t):
                continue
            factors = [1] * rank
            factors[d] = t // c
            mid = Tiling(algebra.coarsen_tiles(src.sharding, factors, rank, n), rank, n)
            rounds = plan_exchange(dims, src, mid)
            if rounds is None:
                break
            exchange = Exchange(src, mid, rounds=tuple(rounds))
            found = [[exchange, *_staged(dims, mid, dst, True, False, False, False,
                                         masked=masked)] for masked in (False, True)]
            variants += found
            sent = min(_bytes_sent(v, dims, 1) for v in found)
            if last is not None and sent >= last:
                break
            last = sent
    return variants


def _misaligned(dims, src: Tiling, dst: Tiling) -> bool:
    """Whether some dim's tiles neither nest in the held ones nor gather into the target's."""
    return any(_dim_misaligned(size, t, tt) for size, t, tt in zip(dims, src.counts, dst.counts))


def _gathered_past_padding(dims, src: Tiling, dst: Tiling) -> bool:
    """Whether some dim's tiles gather into the target's only because the coarse tiles past
    its first hold padding alone (`_gather_aligned`: a size-1 dim in 6 tiles to 3): its gathers
    move every member's padded shard, where sending the few real pieces (an `Exchange`) may
    cost less."""
    return any(1 < tt < t and t % tt == 0 and cdiv(size, t) * (t // tt) != cdiv(size, tt)
               for size, t, tt in zip(dims, src.counts, dst.counts))


def _dim_misaligned(size: int, t: int, tt: int) -> bool:
    """Whether `t` tiles of a dim of `size` neither nest in `tt` tiles nor gather into them."""
    if t == tt:
        return False
    if tt % t == 0 and _slice_aligned(size, t, tt // t):
        return False
    return not (t % tt == 0 and _gather_aligned(size, t, t // tt))


def _with_flags_cleared(flags: tuple[bool, ...], inert: set[int]):
    """Every flag tuple obtained from `flags` by clearing some of the set flags at positions
    `inert` (flags that did nothing: clearing them plans the very same steps)."""
    positions = sorted(inert)
    for mask in range(1, 1 << len(positions)):
        cleared = list(flags)
        for k, position in enumerate(positions):
            if mask >> k & 1:
                cleared[position] = False
        yield tuple(cleared)


def _same_layout(a: Layout, b: Layout) -> bool:
    if isinstance(a, Maximal) or isinstance(b, Maximal):
        return isinstance(a, Maximal) and isinstance(b, Maximal) and a.device == b.device
    return a == b


def _bytes_sent(steps, dims, width) -> tuple[int, int]:
    """The bytes the busiest device sends over `steps` (its bytes summed over the steps, device
    by device: two steps loading different devices cost their larger one, not their sum), and
    the bytes all devices send (which breaks ties between plans whose busiest device sends the
    same); each step's traffic is worked out once. Steps every device sends the same bytes in
    only add those bytes to every device, so the per-device sums are only formed where two
    steps or more load the devices unevenly."""
    traffics = [t for step in steps if (t := step.traffic(dims, width)) is not None]
    total = sum(t.total_sent for t in traffics)
    uneven = [t for t in traffics if t.max_sent * t.num_devices != t.total_sent]
    if len(uneven) < 2:
        return sum(t.max_sent for t in traffics), total
    even = sum(t.max_sent for t in traffics if t.max_sent * t.num_devices == t.total_sent)
    return even + int(sum(t.sent for t in uneven).max()), total


def _finish(shape: ArrayShape, steps: list[Step], width: int) -> ReshardPlan:
    return ReshardPlan(shape, tuple(steps), *_bytes_sent(steps, shape.dims, width))


# ---------------------------------------------------------------------------------- alignment

def _slice_aligned(size: int, t: int, factor: int) -> bool:
    """Whether every tile of the `t * factor`-way split of a dim of `size` has its real elements
    inside its parent tile of the `t`-way split (so a local dynamic-slice is exact)."""
    if factor == 1:
        return True
    z, zf = cdiv(size, t), cdiv(size, t * factor)
    if t == 1 or z == factor * zf:
        return True
    fine = np.arange(t * factor)
    start, end = fine * zf, np.minimum((fine + 1) * zf, size)
    parent = fine // factor
    ok = (start >= size) | ((start >= parent * z) & (end <= (parent + 1) * z))
    return bool(ok.all())


def _gather_aligned(size: int, t: int, factor: int) -> bool:
    """Whether gathering `factor` adjacent tiles of a `t`-way split gives the tiles of the
    `t / factor`-way split (always true when the result is the whole dim): every coarse tile
    holding real elements starts where its first gathered tile does and ends inside the last
    (a coarse tile of padding only may start anywhere; a size-1 dim split many ways has all
    its data in the first tile of either split)."""
    if factor == 1 or factor == t:
        return True
    z, zc = cdiv(size, t), cdiv(size, t // factor)
    if z * factor == zc:
        return True
    coarse = np.arange(t // factor)
    start, end = coarse * zc, np.minimum((coarse + 1) * zc, size)
    ok = (start >= size) | ((start == coarse * factor * z) & (end <= (coarse + 1) * factor * z))
    return bool(ok.all())


def _split_aligned(size: int, t: int, factor: int) -> bool:
    """Whether a local shard of a `t`-way split cut into `factor` equal pieces (after padding)
    gives the tiles of the `t * factor`-way split (all-to-all target, reduce-scatter)."""
    return t == 1 or cdiv(size, t) == factor * cdiv(size, t * factor)


# ---------------------------------------------------------------------------------- staging

def _staged(dims, src: Tiling, dst: Tiling, scatter: bool, exchange: bool,
            early_slice: bool, early_permute: bool, masked: bool = False,
            slice_first: bool = False, inert: set[int] | None = None,
            last_first: bool = False, reversed_groups: bool = False,
            realigned: dict[int, int] | None = None, mirrored: bool = False,
            scatter_dim: int | None = None, slice_last_first: bool = False) -> list[Step]:
    """Partial sums (reduce-scattered when `scatter` and possible), slices from replicas of the
    dims gaining tiles (when `slice_first`: the all-to-alls then move smaller shards; the
    dims taken last to first when `slice_last_first`),
    all-to-alls (when `exchange`), slices before gathering (when `early_slice`), a permute
    before gathering (when `early_permute`, so the gathered groups already match the target),
    all-gathers (one masked gather when `masked`), the final slice, a permute. `inert` receives
    the positions in `(masked, scatter, exchange, early_slice, early_permute, slice_first)` of
    the set flags that added no step (the same call with them cleared gives the same steps).
    `last_first`: the all-to-alls take the dims losing tiles from the last one, `mirrored`
    each to the last dim gaining tiles (`_all_to_alls`); `reversed_groups`: their groups list
    the members in reverse order.
    `realigned`: dim -> target count for dims an `Exchange` laid out within the target's
    tiles (`_realigned_variants`): gathering them to that count is aligned. `scatter_dim`: the
    dim the partial sums are reduce-scattered into (one of `_scatter_dims`; default the first)."""
    inert = set() if inert is None else inert
    realigned = realigned or {}
    steps: list[Step] = []
    state = src
    target = _without_partials(dst)
    if state.unreduced > 1:
        state = _resolve_partials(dims, state, target, steps, scatter, scatter_dim)
    if scatter and not any(isinstance(step, ReduceScatter) for step in steps):
        inert.add(1)
    rank = len(dims)
    down, up = [1] * rank, [1] * rank
    for d in range(rank):
        t, tt = state.counts[d], target.counts[d]
        if t == tt:
            continue
        if tt % t == 0 and _slice_aligned(dims[d], t, tt // t):
            up[d] = tt // t
        elif t % tt == 0 and (_gather_aligned(dims[d], t, t // tt) or realigned.get(d) == tt):
            down[d] = t // tt
        else:
            down[d], up[d] = t, tt
    if slice_first:
        before = len(steps)
        state = _slice_from_replicas(dims, state, down, up, steps, slice_last_first)
        if len(steps) == before:
            inert.add(5)
    if exchange:
        before = len(steps)
        state = _all_to_alls(dims, state, down, up, steps, last_first, reversed_groups,
                             mirrored)
        state = _gather_to_receive(dims, state, down, up, steps, reversed_groups)
        if len(steps) == before:
            inert.add(2)
    before = len(steps)
    if early_slice and any(f > 1 for f in down):
        state = _slice_from_replicas(dims, state, down, up, steps)
    if early_slice and len(steps) == before:
        inert.add(3)
    before = len(steps)
    gathers = _gather_factors(dims, state, target, down, realigned)
    if early_permute and any(f > 1 for f in gathers):
        holders = _aligned_for_gathers(state, target, gathers)
        sources = None if holders is None else state.devices.reshape(-1)
        if sources is not None and bool((sources != holders).any()):
            aligned = Tiling.of_devices(holders.reshape(state.devices.shape))
            steps.append(Permute(state, aligned, pairs=np.column_stack([sources, holders])))
            state = aligned
    if early_permute and len(steps) == before:
        inert.add(4)
    gather_steps = []
    for d in _gather_order(dims, state, gathers):
        if gathers[d] > 1:
            after, groups = algebra.gather_tiles(state.sharding, d, gathers[d], rank,
                                                 state.num_devices)
            gathered = Tiling(after, rank, state.num_devices)
            gather_steps.append(AllGather(state, gathered, dim=d, factor=gathers[d],
                                          groups=groups))
            state = gathered
    if masked and not gather_steps:
        inert.add(0)
    if masked and gather_steps:
        steps += _masked_prefix(dims, gather_steps, frozenset(realigned))
    else:
        steps += gather_steps
    if state != target:
        compatible, pairs = compatible_subtiling(state, target)
        if compatible != state:
            steps.append(Slice(state, compatible))
        if pairs is not None and bool((pairs[:, 0] != pairs[:, 1]).any()):
            steps.append(Permute(compatible, target, pairs=pairs))
        state = target
    if dst.unreduced > 1:
        steps.append(ZeroPartials(state, dst))
    return steps


def _slice_from_replicas(dims, state: Tiling, down: list[int], up: list[int],
                         steps: list[Step], last_first: bool = False) -> Tiling:
    """Split `state`'s replicas into tiles of the dims that gain tiles (`up`, lowered by what
    is sliced) and lose none, where the slice stays aligned, first to last or last to first
    (`last_first`: the replicas may not cover every such dim): a local `Slice` step."""
    rank = len(dims)
    factors = [1] * rank
    free = state.replication
    for d in (range(rank - 1, -1, -1) if last_first else range(rank)):
        f = gcd(up[d], free) if down[d] == 1 else 1
        if f > 1 and _slice_aligned(dims[d], state.counts[d], f):
            factors[d], free, up[d] = f, free // f, up[d] // f
    if prod(factors) == 1:
        return state
    sliced = Tiling(algebra.split_replication(state.sharding, factors, rank, state.num_devices),
                    rank, state.num_devices)
    steps.append(Slice(state, sliced))
    return sliced


def _gather_order(dims, state: Tiling, gathers: list[int]) -> list[int]:
    """The dims to gather, cheapest order first. A gather of factor g sends g - 1 times the
    local shard it starts from and grows the shard by r (the gathered over the held size), so
    doing dim d before dim e costs less exactly when (r_d - 1) / (g_d - 1) is smaller: dims
    that barely grow the shard (a size-1 dim split many ways) go first. Even dims (r = g) keep
    the reverse dim order."""
    def key(d):
        t, g = state.counts[d], gathers[d]
        held, gathered = cdiv(dims[d], t), cdiv(dims[d], t // g)
        return ((gathered / held - 1) / (g - 1), -d)
    return sorted((d for d in range(len(dims)) if gathers[d] > 1), key=key)


def _masked_prefix(dims, gathers: list[AllGather],
                   realigned: frozenset = frozenset()) -> list[Step]:
    """The all-gathers `gathers` (cheapest order first) with a leading run of them done as one
    masked gather: the run whose steps send least (busiest device, then all devices; the whole
    run on a tie). As XLA replicates a dim whose size is at most half its tile count by a sum
    of zero-padded shards and gathers the others, masking pays on the dims padding inflates
    (the first in the order), and the sum grows with every dim gathered before it (f32[2,1]
    tiled [2,3]: the sum over the 3 tiles of dim 1, then an all-gather of dim 0). `realigned`:
    the dims an `Exchange` laid out within the target's tiles (`MaskedGather.realigned`)."""
    best, best_sent = None, None
    for k in range(len(gathers), 0, -1):
        run = gathers[:k]
        steps = [MaskedGather(run[0].before, run[-1].after, groups=_combined_groups(run),
                              realigned=realigned),
                 *gathers[k:]]
        sent = _bytes_sent(steps, dims, 1)
        if best_sent is None or sent < best_sent:
            best, best_sent = steps, sent
    return best


def _combined_groups(gathers: list[AllGather]) -> np.ndarray:
    """`[G, g]`: the devices whose tiles a sequence of all-gathers puts together (each device's
    group is the union of its groups' members' groups in the earlier steps)."""
    label = np.arange(gathers[0].before.num_devices)
    for step in gathers:
        merged = label[step.groups].min(axis=1)
        relabel = np.arange(label.size)
        relabel[label[step.groups]] = merged[:, None]
        label = relabel[label]
    size = prod(step.factor for step in gathers)
    return np.argsort(label, kind="stable").reshape(-1, size)


def _gather_factors(dims, state: Tiling, target: Tiling, down: list[int],
                    realigned: dict[int, int]) -> list[int]:
    """Per dim, how many tiles to gather: the planned factor, or the whole dim when the planned
    partial gather or the slice after it would cut real data across tiles (a `realigned` dim
    gathers into its target count exactly)."""
    factors = []
    for d, factor in enumerate(down):
        t, tt = state.counts[d], target.counts[d]
        if factor > 1 and not _gather_aligned(dims[d], t, factor) and \
                realigned.get(d) != t // factor:
            factor = t
        if tt % (t // factor) or not _slice_aligned(dims[d], t // factor, tt * factor // t):
            factor = t
        factors.append(factor)
    return factors


@algebra.cached
def _partials_as_replicas(s: HloSharding, rank: int, num_devices: int) -> HloSharding:
    """The sharding whose replicas are `s`'s partial values and replicas (the target of a plan
    to an unreduced value: every partial holds the data before `ZeroPartials`)."""
    devices = algebra.device_array(s, rank, num_devices)
    return algebra.sharding_of_devices(devices.reshape(devices.shape[:-2] + (1, -1)))


def _aligned_for_gathers(state: Tiling, target: Tiling,
                         gathers: list[int]) -> np.ndarray | None:
    """`state`'s tiles reassigned to devices so that gathering `gathers` leaves every device
    holding the tile its `target` tile nests in (most devices keep their tile): the holder of
    each slot of `state.devices` (flattened; read-only), or None when every device already
    does (decided on the shardings)."""
    return _holders_for_gathers(state.sharding, target.sharding, state.rank, state.num_devices,
                                tuple(gathers))


@algebra.cached
def _holders_for_gathers(source: HloSharding, target_sharding: HloSharding, rank: int,
                         num_devices: int, gathers: tuple[int, ...]) -> np.ndarray | None:
    state = Tiling(source, rank, num_devices)
    target = Tiling(target_sharding, rank, num_devices)
    gathered = np.asarray(state.counts) // np.asarray(gathers)
    up = np.asarray(target.counts) // gathered
    if _nested(source, gathers, target_sharding, tuple(int(f) for f in up), rank, num_devices):
        return None
    slot_devices = state.devices.reshape(-1)
    slot_index = np.indices(state.devices.shape, dtype=np.int64).reshape(
        state.devices.ndim, -1).T[:, :rank]
    slot_key = _keys(slot_index // np.asarray(gathers), gathered)
    device_key = _keys(target.coordinates()[:, :rank] // up, gathered)
    holders = _match(slot_key, slot_devices, device_key)
    holders.setflags(write=False)
    return holders


def _nested(source: HloSharding, source_factors, target: HloSharding, target_factors,
            rank: int, num_devices: int) -> bool:
    """Whether every device holds the same tile of `source` coarsened by `source_factors` as of
    `target` coarsened by `target_factors` (`algebra.coarsen_tiles`; no partial values on either
    side): then `_match` keeps every device where it is. Decided on the shardings, so it costs
    the same at any device count for iota tile assignments."""
    for s, factors in ((source, source_factors), (target, target_factors)):
        tiles = algebra.device_tiles(s, rank, num_devices)
        if tiles.dims[-2] > 1 or any(c % f for c, f in zip(tiles.dims, factors)):
            return False
    return algebra.coarsen_tiles(source, source_factors, rank, num_devices) == \
        algebra.coarsen_tiles(target, target_factors, rank, num_devices)


def _keys(coords: np.ndarray, counts) -> np.ndarray:
    if coords.shape[1] == 0:
        return np.zeros(coords.shape[0], dtype=np.int64)
    return np.ravel_multi_index(tuple(coords.T), tuple(int(c) for c in counts))


def _match(slot_key: np.ndarray, slot_devices: np.ndarray, device_key: np.ndarray) -> np.ndarray:
    """The device for each slot: a device whose key equals the slot's key, keeping the current
    one where it already fits and pairing the rest in ascending order (every key has as many
    slots as devices)."""
    kept = slot_key == device_key[slot_devices]
    free_slots = np.flatnonzero(~kept)
    free_devices = slot_devices[free_slots]
    slots = free_slots[np.lexsort((free_slots, slot_key[free_slots]))]
    devices = free_devices[np.lexsort((free_devices, device_key[free_devices]))]
    holders = slot_devices.copy()
    holders[slots] = devices
    return holders


def _without_partials(dst: Tiling) -> Tiling:
    """`dst` with its partial sums read as replicas (what the steps before `ZeroPartials` make)."""
    if dst.unreduced == 1:
        return dst
    return Tiling(_partials_as_replicas(dst.sharding, dst.rank, dst.num_devices), dst.rank,
                  dst.num_devices)


def _scatter_dims(dims, src: Tiling, dst: Tiling) -> list[int]:
    """The dims `src`'s partial sums can be reduce-scattered into whole: the target tiles them
    by a multiple of the held count times the partial count, and the split stays aligned."""
    if src.unreduced == 1:
        return []
    target, u = _without_partials(dst), src.unreduced
    return [d for d, (size, t, tt) in enumerate(zip(dims, src.counts, target.counts))
            if tt % (t * u) == 0 and _split_aligned(size, t, u)]


def _resolve_partials(dims, state: Tiling, target: Tiling, steps: list[Step],
                      scatter: bool, scatter_dim: int | None = None) -> Tiling:
    """Reduce-scatter into a dim the target tiles by a multiple of the partial count
    (`scatter_dim`, else the first such dim; member order chosen to match the target where it
    can) when `scatter`, else all-reduce."""
    scatter_dims = _scatter_dims(dims, state, target) if scatter else []
    if scatter_dims:
        d = scatter_dims[0] if scatter_dim is None else scatter_dim
        groups, after = _scatter_by_axes(state, target, d) or \
            _scatter_by_devices(state, target, d)
        scattered = Tiling(after, state.rank, state.num_devices)
        steps.append(ReduceScatter(state, scattered, dim=d, groups=groups))
        return scattered
    if scatter:
        state = _scatter_in_stages(dims, state, target, steps)
        if state.unreduced == 1:
            return state
    all_reduce = _all_reduce(state)
    steps.append(all_reduce)
    return all_reduce.after


def _all_reduce(state: Tiling) -> AllReduce:
    """The all-reduce of `state`'s partial sums over their groups (`after`: the sums held by
    every member)."""
    reduced = Tiling(algebra.all_reduce_partials(state.sharding, state.rank, state.num_devices),
                     state.rank, state.num_devices)
    return AllReduce(state, reduced, groups=state.partial_groups())


def _scatter_in_stages(dims, state: Tiling, target: Tiling, steps: list[Step]) -> Tiling:
    """Partial sums no one dim takes whole (a target tiling several dims): reduce-scatter a
    factor of the partial count into each dim the target tiles by a multiple of it, in dim
    order, while partials remain (f32[6,16] summed over 4 partitions into `[2,2]`: two
    reduce-scatters over pairs, the bytes of one over four). What remains is all-reduced."""
    for d in range(len(dims)):
        u = state.unreduced
        if u == 1:
            break
        t, tt = state.counts[d], target.counts[d]
        for f in range(u, 1, -1):
            if u % f == 0 and tt % (t * f) == 0 and _split_aligned(dims[d], t, f):
                state = _scatter_factor(state, target, d, f, steps)
                break
    return state


def _scatter_factor(state: Tiling, target: Tiling, d: int, f: int, steps: list[Step]) -> Tiling:
    """Reduce-scatter `f` of `state`'s partial values into dim `d` (member j of a group takes
    block j of its tile): the groups are the major or the minor `f` of the partial index, the
    one whose blocks contain the devices' `target` tiles where either does."""
    array, rank = state.devices, state.rank
    counts, (u, r) = array.shape[:rank], array.shape[rank:]
    within = target.coordinates()[:, d] // (target.counts[d] // (state.counts[d] * f))
    chosen = None
    for major in (True, False):
        split, axis = ((f, u // f), rank) if major else ((u // f, f), rank + 1)
        parts = array.reshape(counts + split + (r,))
        groups = np.moveaxis(parts, axis, -1).reshape(-1, f)
        merged = np.moveaxis(parts, axis, d + 1).reshape(
            counts[:d] + (counts[d] * f,) + counts[d + 1:] + (u // f, r))
        after = Tiling.of_devices(merged)
        fits = bool((after.coordinates()[:, d] == within).all())
        if chosen is None or fits:
            chosen = groups, after
        if fits:
            break
    groups, after = chosen
    steps.append(ReduceScatter(state, after, dim=d, groups=groups))
    return after


def _scatter_by_devices(state: Tiling, target: Tiling,
                        d: int) -> tuple[np.ndarray, HloSharding]:
    """The groups `[G, u]` of a reduce-scatter of `state`'s partial values into dim `d` (member
    j of a group receives block j: ordered so that it is the block the device's `target` tile
    is in, where every group's devices hold distinct ones) and the sharding after it."""
    u, t, tt = state.unreduced, state.counts[d], target.counts[d]
    groups = state.partial_groups()
    position = (target.coordinates()[:, d] // (tt // (t * u))) % u
    member = position[groups]
    if (np.sort(member, axis=1) == np.arange(u)).all():
        groups = np.take_along_axis(groups, np.argsort(member, axis=1), axis=1)
    return groups, algebra.reduce_scatter_partials(state.sharding, d, groups, state.rank,
                                                   state.num_devices)


def _scatter_by_axes(state: Tiling, target: Tiling,
                     d: int) -> tuple[np.ndarray, HloSharding] | None:
    """`_scatter_by_devices` for iota tilings, on the digits of the device ids (`atomic_axes`):
    the block of the target tile is read from the middle digits of the target's dim `d`; the
    groups follow them when they are the digits of the partial index, else the partial index.
    None where the digits do not tell (explicit device orders, blocks that cut a digit)."""
    axes = atomic_axes(state.tiles, target.tiles)
    if axes is None:
        return None
    state_axes, target_axes = axes
    u, rank = state.unreduced, state.rank
    digits = target_axes[d]
    end, size = len(digits), 1
    while size < target.counts[d] // (state.counts[d] * u) and end > 0:
        end -= 1
        size *= digits[end][0]
    start, block = end, 1
    while block < u and start > 0:
        start -= 1
        block *= digits[start][0]
    if size * (state.counts[d] * u) != target.counts[d] or block != u:
        return None
    partial = state_axes[rank]
    order = digits[start:end] if set(digits[start:end]) == set(partial) else partial
    others = [digit for a, axis in enumerate(state_axes) if a != rank for digit in axis]
    groups = from_axes((state.num_devices // u, u), [others, order]).array
    counts = list(state.counts)
    counts[d] *= u
    after = [axis + order if a == d else axis for a, axis in enumerate(state_axes[:rank])]
    tiles = from_axes(counts + [1, state.replication], after + [[], state_axes[-1]])
    return groups, algebra.sharding_of_devices(tiles)


def _all_to_alls(dims, state: Tiling, down: list[int], up: list[int],
                 steps: list[Step], last_first: bool = False,
                 reversed_groups: bool = False, mirrored: bool = False) -> Tiling:
    """Pair dims losing tiles with dims gaining tiles; each common factor moves in one
    all-to-all when both sides stay aligned. A dim whose tiles do not nest (it loses all its
    tiles and gains others) gives all of them away in one move, before any other dim gives
    tiles to the dims it could fill, and, whole then, gains its new ones from another dim:
    XLA's all-to-alls for, e.g., [1,3,2,1] -> [1,2,1,3]. The dims losing tiles are taken
    first to last, or last to first (`last_first`): which dim's tiles move and which are
    gathered then differ (both are planned, `_variants`). `mirrored` (with `last_first`) pairs
    each with the last dim gaining tiles instead of the first: the same pairs as first to
    last where the dims pair off alike, moved in the other order, which on uneven dims pads
    another dim first (XLA's order for [1,1,2,2] -> [2,2,1,1]: the last dims trade first).
    With `reversed_groups` each group
    lists its members in reverse order: member k still receives sub-tile k of the dim gaining
    tiles, so the devices of a group trade those sub-tiles (a permute after them may then move
    fewer devices: XLA's all-to-all for a `reverse`'s operand leaves half the devices in place
    where the forward order moved all)."""
    rank = len(dims)
    order = range(rank - 1, -1, -1) if last_first else range(rank)
    changed = True
    while changed:
        changed = False
        for i in sorted(order, key=lambda d: not (down[d] > 1 and up[d] > 1)):
            for j in (range(rank - 1, -1, -1) if mirrored else range(rank)):
                if i == j or down[i] == 1 or up[j] == 1 or down[j] > 1:
                    continue
                g = gcd(down[i], up[j])
                if up[i] > 1 and g != down[i]:
                    continue
                ti, tj = state.counts[i], state.counts[j]
                if g == 1 or not _gather_aligned(dims[i], ti, g) or \
                        not _split_aligned(dims[j], tj, g):
                    continue
                after, groups = algebra.move_tiles(state.sharding, i, j, g, rank,
                                                   state.num_devices)
                moved = Tiling(after, rank, state.num_devices)
                if reversed_groups:
                    moved, groups = _reversed_groups(moved, groups)
                steps.append(AllToAll(state, moved, moves=((i, j, g),), groups=groups,
                                      reversed=reversed_groups))
                state = moved
                down[i] //= g
                up[j] //= g
                changed = True
    return state


def _reversed_groups(moved: Tiling, groups: np.ndarray) -> tuple[Tiling, np.ndarray]:
    """An all-to-all's result tiling and groups with each group's members in reverse order:
    the device at position k of a group takes the tile the device at position g-1-k took."""
    partner = np.empty(groups.size, dtype=np.int64)
    partner[groups] = groups[:, ::-1]
    return Tiling.of_devices(partner[moved.devices]), np.ascontiguousarray(groups[:, ::-1])


def _gather_to_receive(dims, state: Tiling, down: list[int], up: list[int],
                       steps: list[Step], reversed_groups: bool = False) -> Tiling:
    """A dim whose tiles do not nest and that could give them to no other dim is gathered
    whole first where another dim losing tiles can then fill it by an all-to-all (XLA's
    all-gather to the target's partial replication followed by an all-to-all, e.g.
    [1,2,3] -> [1,1,2,3 replicated]: the 3 tiles of the last dim gathered, then the 2 of the
    middle one moved there, instead of gathering both)."""
    rank = len(dims)
    receivers = [d for d in range(rank) if down[d] > 1 and up[d] > 1 and any(
        i != d and down[i] > 1 and up[i] == 1 and gcd(down[i], up[d]) > 1 and
        _gather_aligned(dims[i], state.counts[i], gcd(down[i], up[d])) for i in range(rank))]
    if not receivers:
        return state
    for d in receivers:
        after, groups = algebra.gather_tiles(state.sharding, d, down[d], rank,
                                             state.num_devices)
        gathered = Tiling(after, rank, state.num_devices)
        steps.append(AllGather(state, gathered, dim=d, factor=down[d], groups=groups))
        state, down[d] = gathered, 1
    return _all_to_alls(dims, state, down, up, steps, reversed_groups=reversed_groups)


def compatible_subtiling(state: Tiling,
                         target: Tiling) -> tuple[Tiling, np.ndarray | None]:
    """A tiling with `target`'s tiles in which every device's tile nests in its `state` tile
    (so a local slice reaches it), agreeing with `target` on as many devices as possible; and the
    `[N, 2]` permute pairs (holder in it, device in `target`) of each target slot (read-only), or
    None when `target` itself is that tiling (no device moves: decided on the shardings)."""
    compatible, pairs = _compatible(state.sharding, target.sharding, state.rank,
                                    state.num_devices)
    return Tiling(compatible, state.rank, state.num_devices), pairs


@algebra.cached
def _compatible(source: HloSharding, target_sharding: HloSharding, rank: int,
                num_devices: int) -> tuple[HloSharding, np.ndarray | None]:
    state = Tiling(source, rank, num_devices)
    target = Tiling(target_sharding, rank, num_devices)
    up = np.asarray(target.counts) // np.asarray(state.counts)
    if _nested(source, (1,) * rank, target_sharding, tuple(int(f) for f in up), rank,
               num_devices):
        return algebra.sharding_of_devices(target.tiles), None
    slot_devices = target.devices.reshape(-1)
    slot_index = np.indices(target.devices.shape, dtype=np.int64).reshape(
        target.devices.ndim, -1).T[:, :rank]
    holders = _match(_keys(slot_index // up, state.counts), slot_devices, state.tile_keys())
    pairs = np.column_stack([holders, slot_devices])
    pairs.setflags(write=False)
    return algebra.sharding_of_devices(holders.reshape(target.devices.shape)), pairs


__all__ = ["Maximal", "Layout", "Step", "AllReduce", "ReduceScatter", "AllToAll", "AllGather",
           "MaskedGather", "Slice", "Permute", "Exchange", "ZeroPartials", "BroadcastFromDevice",
           "SendToDevice", "ReshardPlan", "Routes", "plan_reshard", "plan_routes", "plan_staged",
           "reshard_cost",
           "layout_of", "compatible_subtiling", "local_dims"]
