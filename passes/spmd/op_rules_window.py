"""Partitioning of windowed ops along their windowed dims by halo exchange
(docs/design/partitioning.md#halo-exchange).

Every op here reads, for each result dim, a window of the same dim of its array operands
(`halo.WindowedDim`):

| op | window on dim d of each array operand |
|---|---|
| `reduce-window` | its `window={...}` entry (padding and dilation holes: the reducer's identity |
|   | when it is one associative opcode, else the init value) |
| `pad` | size 1, padding `low_high`, base dilation `interior + 1` (the pad value fills) |
| `slice` | size 1, stride, padding `-start` / `limit - size` (never reads padding) |
| `concatenate` (concat dim) | operand k: size 1, padding `offset_k` / the rest; only its own |
|   | output range matters; the local pieces are merged by output position |
| `reverse` (reversed dims) | the operand takes the result's tiling in reversed device order; |
|   | uneven dims shift their padding to the front (size 1, padding `n*I - S` / 0) |
| `select-and-scatter` | its window on the operand; the source takes the same tiling; per dim |
|   | the windows overlapping each shard's data (source halos in) or its own source elements' |
|   | (the scattered result's halo back to its owners) (`SelectAndScatterRule`) |

Candidates (the fewest bytes moved wins, halo bytes counted by `OpPlan.cost`): the annotated
result tiling and the first operand's tiling carried through, each either *kept* on windowed dims
(the operands take the same tiling and exchange halos: `collective-permute`s, no gather) or with
the windowed dims *gathered* (no halo), and everything replicated. So a halo larger than a gather
is never chosen. On equal bytes for the busiest device the candidate all devices together send
fewer bytes with wins (a halo only some shards need: `halo.halo_sent`), then the gather
(one collective instead of several permutes). A candidate's halos are priced per device with
the operand reshards it pays in full: what they add to those reshards' busiest device
(`WindowRule._beside_reshards`). A `pad` without interior padding and a `slice` without
strides may exchange pieces instead of halos (`PiecesRule`, `pad_pieces.py`): in the kept
candidate where they send fewer bytes, and from the operand's own tiling as one more candidate
(`direct_candidates`).

The `halo-exchange` pass computes each operand's `HaloPlan`s from its planned sharding
(`halo_plans`) and records them in `frontend_attributes={halo="..."}` (`describe_plans`);
lowering (lower-spmd) reads them back (`recorded_plans`), replaces each exchanged dim by the
shard's window input
(`halo.windowed_input`) and runs the op locally with that dim's padding and base dilation
removed (they are materialised by the exchange). A reduce-window whose window covers the whole
prefix of a tiled dim (a cumulative sum) is a prefix scan instead (`prefix_scan.py`).
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import KeyValueList, PadDim, SliceDim, Window, WindowDim
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .halo import (
    HaloPlan, WindowedDim, busiest_and_total, describe_plans, exchange_order, halo_sent,
    plan_halo, recorded_plans, return_halo, returned_per_partition, sent_per_partition,
    windowed_input,
)
from .op_rules import (
    LowerContext, OpPlan, PartitionRule, clone, reshards_paid_in_full, without_partials,
)
from .op_rules_indexed import masked_window
from .op_rules_passthrough import tiles_moved
from .pad_pieces import emit_pad_pieces, pieces_plan
from .prefix_scan import (
    associative_reducer, cumulative_dims, describe_scan, emit_prefix_scan, identity, scan_bytes,
    scan_opcode,
)
from .reshard_nodes import is_inserted_reshard
from .reshard_plan import plan_reshard
from .tiling import Tiling, cdiv

Computations = dict[str, Computation]


class WindowRule(PartitionRule):
    """Shared planning and lowering; subclasses describe their windows and local op."""

    def windows(self, inst: Instruction) -> list[dict[int, WindowedDim] | None]:
        """Per operand: the window on each of its dims (`shards=1` templates), or None for
        operands that are not windowed arrays (scalars: replicated)."""
        raise NotImplementedError

    def pad_values(self, inst: Instruction, ctx: LowerContext) -> list[Instruction | None]:
        """Per operand: the local scalar filling masked positions (None: never masked)."""
        return [None] * len(inst.operands)

    def scalar_need(self, inst: Instruction, k: int) -> HloSharding:
        """The sharding a plan reads operand `k`, one that is not windowed (a scalar), in:
        replicated, as every partition fills masked positions with it."""
        return HloSharding.replicate()

    def operand_tiling(self, inst: Instruction, tiling: Tiling) -> Tiling:
        """The tiling a windowed operand takes when the result has `tiling`."""
        return tiling

    def windowed_dims(self, inst: Instruction) -> list[int]:
        """Result dims that need a halo (or a gather) when tiled."""
        return sorted({d for w in self.windows(inst) if w is not None for d, wd in w.items()
                       if not _trivial(wd)})

    def shard_window(self, inst: Instruction, k: int, dim: int, window: WindowedDim,
                     tiling: Tiling) -> WindowedDim:
        """The window of `dim` of operand `k` when that operand has `tiling`."""
        return replace(window, shards=tiling.counts[dim])

    #: whether a result annotated onto one device is also planned in its tiled operand's
    #: tiling (then moved to the device): XLA's partitioner slices in the operand's sharding
    #: when that has more tiles than the result's
    tiled_for_one_device = False

    #: whether the tiles of tiled windowed dims may move into a pass-through dim instead of
    #: being gathered (XLA's concatenate replicates its concat dim so,
    #: `HandleElementwiseWithDimsToReplicate`: the reshards are all-to-alls)
    moves_windowed_tiles = False

    def supports_halo(self, inst: Instruction, computations: Computations) -> bool:
        """Whether the op can run on halo-extended shards (else windowed dims are gathered)."""
        return True

    def scan_dims(self, inst: Instruction, computations: Computations) -> list[int]:
        """Windowed dims computed without a halo (`prefix_scan.py`)."""
        return []

    def halo_cost(self, inst: Instruction, tiling: Tiling, scans: list[int], num_devices: int
                  ) -> tuple[float, float]:
        """Bytes the busiest partition sends and all partitions together send when the windowed
        operands take `tiling`: each operand's halos (`halo_sent`; `scans` exchange none), and
        whatever else the rule sends (its override)."""
        cost = total = 0.0
        for plans, local, width in self._exchanges(inst, tiling, scans):
            busiest, every = halo_sent(plans, local, width, num_devices)
            cost, total = cost + busiest, total + every
        return cost, total

    def _exchanges(self, inst: Instruction, tiling: Tiling, scans: list[int]):
        """(halo plans, exchanged local shard, element bytes) of each windowed operand that
        exchanges halos when the windowed operands take `tiling`."""
        for k, (operand, window) in enumerate(zip(inst.operands, self.windows(inst))):
            if window is None:
                continue
            plans = self._plans(inst, k, window, tiling, scans)
            if plans:
                local = self.exchanged_shard(inst, tiling, tiling.shard_dims(operand.shape.dims))
                yield plans, local, dtypes.byte_width(operand.shape.element_type)

    def direct_candidates(self, inst: Instruction, ctx, tiling: Tiling) -> list[OpPlan]:
        """Plans computing the result in `tiling` (the result's) from the first operand in its
        own tiled sharding, without resharding it first (none by default)."""
        return []

    def halo_by_tile(self, inst: Instruction, tiling: Tiling, scans: list[int]
                     ) -> np.ndarray | None:
        """Bytes the partitions of each tile send in `halo_cost`'s halos (an array of
        `tiling`'s counts indexed by shard ordinals, `halo.sent_per_partition`); None where
        the rule sends what is not priced per tile."""
        sent = np.zeros(tiling.counts, dtype=np.int64)
        for plans, local, width in self._exchanges(inst, tiling, scans):
            sent = sent + sent_per_partition(plans, local, tiling.counts) * width
        return sent

    def exchanged_shard(self, inst: Instruction, tiling: Tiling,
                        local: tuple[int, ...]) -> tuple[int, ...]:
        """The dims of the local operand shard (`local`, under `tiling`) whose halos travel:
        the shard itself unless the rule cuts dims before the exchange."""
        return local

    def halo_description(self, inst: Instruction, num_devices: int,
                         computations: Computations) -> str:
        """The plan the halo-exchange pass records and lowering reads."""
        return describe_plans(self.halo_plans(inst, num_devices, computations))

    def local_op(self, inst: Instruction, ctx: LowerContext, inputs: list[Instruction],
                 plans: list[dict[int, HaloPlan]]) -> Instruction:
        raise NotImplementedError

    # ---- planning -----------------------------------------------------------------------------

    def plan(self, inst, ctx):
        windows = self.windows(inst)
        rank = _result_leaf(inst).rank
        leaves = sum(1 for _ in inst.shape.leaves())
        target = without_partials(inst.sharding.leaf_shardings(inst.shape)[0])
        first = inst.operands[0]
        carry = first.sharding is not None and first.sharding.is_tiled and \
            first.sharding == without_partials(first.sharding) and windows[0] is not None
        on_device = None
        if target.kind == "maximal":
            on_device = OpPlan((target,) * len(inst.operands),
                               HloSharding.tuple([target] * leaves) if leaves > 1 and
                               isinstance(inst.shape, TupleShape) else target,
                               f"{inst.opcode} on one device")
            if not (self.tiled_for_one_device and carry):
                return on_device

        def candidate(tiling: Tiling, reason: str) -> OpPlan:
            operand_tiling = self.operand_tiling(inst, tiling)
            shardings = tuple(self.scalar_need(inst, k) if window is None
                              else operand_tiling.sharding for k, window in enumerate(windows))
            cost, total = self.halo_cost(inst, operand_tiling, scans, ctx.num_devices)
            result = tiling.sharding
            if isinstance(inst.shape, TupleShape):
                result = HloSharding.tuple([result] * leaves)
            plan = OpPlan(shardings, result, reason, cost, total)
            return plan._replace(cost=self._beside_reshards(inst, ctx, plan, operand_tiling,
                                                            scans)) if cost else plan

        bases = [] if on_device else [(ctx.tiling(target, rank), "the result's tiling")]
        if carry:
            carried = self.operand_tiling(inst, ctx.tiling(first.sharding, rank))
            bases.append((carried, "its operand's tiling"))
        windowed = self.windowed_dims(inst)
        scans = self.scan_dims(inst, ctx.computations)
        halo = self.supports_halo(inst, ctx.computations) and not any(
            _whole_for_free(o) for o, w in zip(inst.operands, windows)
            if w is not None and not all(_trivial(wd) for wd in w.values()))
        candidates = [on_device] if on_device else []
        if carry and bases and not on_device:
            candidates += self.direct_candidates(inst, ctx, bases[0][0])
        for tiling, source in bases:
            if halo and any(tiling.counts[d] > 1 for d in windowed):
                candidates.append(candidate(tiling, f"{inst.opcode} keeps {source} and "
                                                    "exchanges halos on its windowed dims"))
            folded = algebra.partially_replicate_on_dims(tiling.sharding, windowed)
            candidates.append(candidate(ctx.tiling(folded, rank),
                                        f"{inst.opcode} keeps {source} on its pass-through "
                                        "dims"))
            moved = tiles_moved(tiling.sharding, _result_leaf(inst).dims, windowed,
                                [d for d in range(rank) if d not in windowed]) \
                if self.moves_windowed_tiles else None
            if moved is not None:
                candidates.append(candidate(ctx.tiling(moved, rank),
                                            f"{inst.opcode} moves the tiles of {source} on its "
                                            "windowed dims into its pass-through dims"))
        candidates.append(candidate(Tiling.replicated(rank, ctx.num_devices),
                                    f"{inst.opcode} runs replicated"))
        # on a tie, the fewest bytes over all devices (halos trimmed to the shards that read
        # them), then one gather beats many permutes
        return ctx.choose(inst, candidates,
                          tie_break=lambda plan: (ctx.total_of(inst, plan), plan.cost))

    def _beside_reshards(self, inst: Instruction, ctx, plan: OpPlan, tiling: Tiling,
                         scans: list[int]) -> float:
        """The bytes `plan`'s halos (under the operands' `tiling`) add to its busiest device:
        the halos of all operands and the operand reshards the plan pays in full summed per
        device, less those reshards' busiest device (the plan's cost adds that; a halo often
        leaves from partitions a reshard leaves idle). `plan.cost` itself (each operand's
        halos' busiest partition, summed) where the halos are not priced per tile."""
        by_tile = self.halo_by_tile(inst, tiling, scans)
        if by_tile is None:
            return plan.cost
        halos = by_tile.reshape(-1)[tiling.tile_keys()]
        reshards = np.zeros(ctx.num_devices, dtype=np.int64)
        for k in reshards_paid_in_full(ctx.signature(inst, (plan,), users=False), plan):
            operand = inst.operands[k]
            for shape, source, need in zip(operand.shape.leaves(),
                                           operand.sharding.leaf_shardings(operand.shape),
                                           plan.operands[k].leaf_shardings(operand.shape)):
                reshards = reshards + plan_reshard(shape, source, need,
                                                   ctx.num_devices).sent_by_device(
                                                       ctx.num_devices)
        return float((reshards + halos).max(initial=0) - reshards.max(initial=0))

    # ---- lowering -----------------------------------------------------------------------------

    def halo_plans(self, inst: Instruction, num_devices: int,
                   computations: Computations | None = None) -> list[dict[int, HaloPlan]]:
        """Per operand, the non-trivial halo plans of its tiled dims under its (planned)
        sharding (the module's `computations` tell scans apart)."""
        scans = self.scan_dims(inst, computations or {})
        result = []
        for k, (operand, window) in enumerate(zip(inst.operands, self.windows(inst))):
            if window is None or not operand.sharding.is_tiled:
                result.append({})
                continue
            tiling = Tiling(operand.sharding, operand.shape.rank, num_devices)
            result.append(self._plans(inst, k, window, tiling, scans))
        return result

    def _plans(self, inst: Instruction, k: int, window: dict[int, WindowedDim], tiling: Tiling,
               scans: list[int]) -> dict[int, HaloPlan]:
        windowed = set(self.windowed_dims(inst)) - set(scans)
        plans = {}
        for d, wd in window.items():
            n = tiling.counts[d]
            if n > 1 and d in windowed:
                plan = plan_halo(self.shard_window(inst, k, d, wd, tiling))
                if plan.needed:
                    plans[d] = plan
        return plans

    def lower(self, inst, ctx: LowerContext):
        plans = recorded_plans(inst, ctx.num_devices)
        pads = self.pad_values(inst, ctx)
        inputs = []
        for k, operand in enumerate(inst.operands):
            value = ctx.local[operand]
            if plans[k]:
                tiling = Tiling(operand.sharding, operand.shape.rank,
                                              ctx.num_devices)
                with ctx.builder.scope(_metadata(inst, k, plans[k])):
                    value = windowed_input(ctx, value, tiling, plans[k], pads[k])
            inputs.append(value)
        return self.local_op(inst, ctx, inputs, plans)




def _metadata(inst: Instruction, k: int, plans: dict[int, HaloPlan]) -> KeyValueList:
    text = "; ".join(f"dim {d}: {p.describe()}" for d, p in sorted(plans.items()))
    return KeyValueList((("op_type", "halo-exchange"), ("op_name", inst.name),
                         ("spmd_value", inst.operands[k].name),
                         ("spmd_reason", f"operand {k} of {inst.opcode} reads its neighbours' "
                                         f"elements ({text})")))


def _pieces_metadata(inst: Instruction, rounds) -> KeyValueList:
    moving = sum(r.pairs is not None for r in rounds)
    return KeyValueList((("op_type", f"{inst.opcode}-pieces"), ("op_name", inst.name),
                         ("spmd_value", inst.operands[0].name),
                         ("spmd_reason", f"each tile of {inst.name} receives the pieces of its "
                                         f"operand it reads ({moving} rounds of "
                                         "collective-permutes)")))


def _trivial(wd: WindowedDim) -> bool:
    return (wd.window, wd.stride, wd.padding_low, wd.padding_high, wd.base_dilation,
            wd.window_dilation, wd.outputs) == (1, 1, 0, 0, 1, 1, None)


def _result_leaf(inst: Instruction) -> ArrayShape:
    shape = inst.shape
    return shape.elements[0] if isinstance(shape, TupleShape) else shape


def _dims(shape: ArrayShape) -> dict[int, WindowedDim]:
    """Trivial windows on every dim of `shape`."""
    return {d: WindowedDim(size, 1) for d, size in enumerate(shape.dims)}


# ---- the ops ----------------------------------------------------------------------------------

@PARTITION_RULES.register("reduce-window", instance=True)
class ReduceWindowRule(WindowRule):
    def windows(self, inst):
        count = len(inst.operands) // 2
        window = inst.attr("window")
        result = []
        for operand in inst.operands[:count]:
            result.append({d: WindowedDim(size, 1, w.size, w.stride, w.padding_low,
                                          w.padding_high, w.base_dilation, w.window_dilation)
                           for d, (size, w) in enumerate(zip(operand.shape.dims, window.dims))})
        return result + [None] * count

    def pad_values(self, inst, ctx):
        """The reducer's identity where it is known (exact whatever the init value: the local
        reduce-window combines the init once per window), else the init value."""
        count = len(inst.operands) // 2
        opcode = associative_reducer(inst, ctx.module.computations) if count == 1 else None
        if opcode is not None:
            t = inst.operands[1].shape.element_type
            with ctx.builder.scope(None):
                return [ctx.builder.constant(identity(opcode, t), t), None]
        return [ctx.local[i] for i in inst.operands[count:]] + [None] * count

    def scan_dims(self, inst, computations):
        return cumulative_dims(inst) if scan_opcode(inst, computations) else []

    def halo_cost(self, inst, tiling, scans, num_devices):
        """The halos, and the shard totals the tiled prefix scans exchange (`scan_bytes`)."""
        cost, total = super().halo_cost(inst, tiling, scans, num_devices)
        operand = inst.operands[0]
        busiest, every = scan_bytes(tiling.shard_dims(operand.shape.dims), tiling,
                                    [d for d in scans if tiling.counts[d] > 1],
                                    dtypes.byte_width(operand.shape.element_type))
        return cost + busiest, total + every

    def halo_by_tile(self, inst, tiling, scans):
        """None where some prefix scan runs over a tiled dim (its shard totals)."""
        if any(tiling.counts[d] > 1 for d in scans):
            return None
        return super().halo_by_tile(inst, tiling, scans)

    def halo_description(self, inst, num_devices, computations):
        text = super().halo_description(inst, num_devices, computations)
        tiling = _tiling(inst.operands[0], num_devices)
        scans = [f"operand 0 dim {d}: {describe_scan(tiling, d)}"
                 for d in self._tiled_scans(inst, computations, tiling)]
        return "; ".join(([text] if text else []) + scans)

    def _tiled_scans(self, inst, computations, tiling):
        if tiling is None:
            return []
        return [d for d in self.scan_dims(inst, computations) if tiling.counts[d] > 1]

    def local_op(self, inst, ctx, inputs, plans):
        exchanged = {d for p in plans for d in p}
        tiling = _tiling(inst.operands[0], ctx.num_devices)
        scans = self._tiled_scans(inst, ctx.module.computations, tiling)
        window = inst.attr("window")
        local = clone(inst, ctx, operands=inputs)
        shard = inputs[0].shape.dims
        local.attrs["window"] = Window(tuple(
            WindowDim(shard[d], padding_low=shard[d] - 1) if d in scans else
            replace(w, padding_low=0, padding_high=0, base_dilation=1) if d in exchanged else w
            for d, w in enumerate(window.dims)))
        if not scans:
            return local
        with ctx.builder.scope(_scan_metadata(inst, scans)):
            return emit_prefix_scan(ctx, local, tiling, scans, ctx.local[inst.operands[1]],
                                    scan_opcode(inst, ctx.module.computations))


class PiecesRule(WindowRule):
    """A window rule that may also move the pieces of its operand's tiles each result tile reads
    (`pad_pieces.py`: a pad without interior padding, a slice without strides): in the kept
    candidate where they send fewer bytes than the halos, and from the operand's own tiling as
    one more candidate (`direct_candidates`)."""

    def halo_cost(self, inst, tiling, scans, num_devices):
        """The halos, or the exchange of pieces where that sends fewer bytes
        (`pieces`)."""
        halo = super().halo_cost(inst, tiling, scans, num_devices)
        pieces = pieces_plan(inst, tiling.sharding, tiling.sharding, num_devices)
        return halo if pieces is None else min(halo, pieces.sent)

    def direct_candidates(self, inst, ctx, tiling):
        """The result in `tiling` by the exchange of pieces from the operand's own tiling
        (`pad_pieces.py`), where that is another tiling and the users' needs are known: not
        while the operand looks ahead at how its users read it (this plan reads it in whatever
        tiling it has, so it tells the operand nothing, and its result would be priced without
        its own users' reshards)."""
        source = inst.operands[0].sharding
        if Tiling(source, tiling.rank, ctx.num_devices) == tiling:
            return []
        pieces = pieces_plan(inst, source, tiling.sharding, ctx.num_devices)
        if pieces is None or not ctx.users_needs(inst):
            return []
        scalars = tuple(self.scalar_need(inst, k) for k in range(1, len(inst.operands)))
        return [OpPlan((source, *scalars), tiling.sharding,
                       f"{inst.opcode} exchanges the pieces of its operand's tiles that the "
                       "result's tiles read", *pieces.sent)]

    def pieces(self, inst: Instruction, num_devices: int):
        """The rounds of the exchange of pieces the planned shardings of `inst` call for
        (None: halos): its operand in another tiling than its result, or in the same one where
        the pieces send fewer bytes than the halos (busiest device, then all)."""
        source, target = inst.operands[0].sharding, inst.sharding
        pieces = pieces_plan(inst, source, target, num_devices)
        if pieces is None:
            return None
        rank = inst.shape.rank
        tiling = Tiling(target, rank, num_devices)
        if Tiling(source, rank, num_devices) == tiling and \
                not self._pieces_win(inst, pieces, tiling, []):
            return None
        return pieces.rounds

    def _pieces_win(self, inst: Instruction, pieces, tiling: Tiling, scans: list[int]) -> bool:
        """Whether the exchange of `pieces` (None: none possible) sends fewer bytes than the
        halos with the operand and the result in `tiling` (busiest device, then all)."""
        return pieces is not None and \
            pieces.sent < super().halo_cost(inst, tiling, scans, tiling.num_devices)

    def halo_plans(self, inst, num_devices, computations=None):
        if self.pieces(inst, num_devices) is not None:
            return [{} for _ in inst.operands]
        return super().halo_plans(inst, num_devices, computations)

    def halo_by_tile(self, inst, tiling, scans):
        """None where the exchange of pieces sends fewer bytes than the halos (`halo_cost`
        prices the pieces, not per tile)."""
        pieces = pieces_plan(inst, tiling.sharding, tiling.sharding, tiling.num_devices)
        if self._pieces_win(inst, pieces, tiling, scans):
            return None
        return super().halo_by_tile(inst, tiling, scans)

    def lower_pieces(self, inst: Instruction, ctx) -> Instruction | None:
        """The result tile by the exchange of pieces where the planned shardings call for it
        (`pieces`), else None."""
        rounds = self.pieces(inst, ctx.num_devices)
        if rounds is None:
            return None
        with ctx.builder.scope(_pieces_metadata(inst, rounds)):
            return emit_pad_pieces(ctx, inst, ctx.local[inst.operands[0]],
                                   [ctx.local[o] for o in inst.operands[1:]], rounds)


@PARTITION_RULES.register("pad", instance=True)
class PadRule(PiecesRule):
    def windows(self, inst):
        operand = inst.operands[0]
        return [{d: WindowedDim(size, 1, 1, 1, p.low, p.high, p.interior + 1)
                 for d, (size, p) in enumerate(zip(operand.shape.dims, inst.attr("padding")))},
                None]

    def pad_values(self, inst, ctx):
        return [ctx.local[inst.operands[1]], None]

    def scalar_need(self, inst, k):
        """A pad that only crops (no positive edge padding, no interior padding) never reads
        its pad value: it is read as it is, replicated or on one device (XLA's partitioned
        program moves it nowhere either)."""
        value = inst.operands[k].sharding
        if value is not None and value.kind in ("replicated", "maximal") and all(
                p.low <= 0 and p.high <= 0 and p.interior == 0 for p in inst.attr("padding")):
            return value
        return super().scalar_need(inst, k)

    def exchanged_shard(self, inst, tiling, local):
        """The dims the tiling leaves whole lose the elements their negative edge padding
        crops before the halos travel (`crop_padding`)."""
        return tuple(n if tiling.counts[d] > 1 else len(range(*crop_padding(n, p)[:2]))
                     for d, (n, p) in enumerate(zip(local, inst.attr("padding"))))

    def lower(self, inst, ctx):
        """Where halos travel, the dims the operand's tiling leaves whole are cropped first
        (`exchanged_shard`); the local pad then keeps the rest of their padding. The exchange
        of pieces (`pieces`) where the planned shardings call for it."""
        pieces = self.lower_pieces(inst, ctx)
        if pieces is not None:
            return pieces
        plans = recorded_plans(inst, ctx.num_devices)
        if not plans[0]:
            return super().lower(inst, ctx)
        b = ctx.builder
        operand = inst.operands[0]
        tiling = Tiling(operand.sharding, operand.shape.rank, ctx.num_devices)
        local = ctx.local[operand]
        tiled = _tiled_dims(operand, ctx)
        padding = list(inst.attr("padding"))
        cut = []
        for d, (n, p) in enumerate(zip(local.shape.dims, inst.attr("padding"))):
            start, limit, rest = (0, n, p) if d in tiled else crop_padding(n, p)
            cut.append(SliceDim(start, limit))
            padding[d] = rest
        if any((c.start, c.limit) != (0, n) for c, n in zip(cut, local.shape.dims)):
            local = b.add("slice", local.shape.with_dims([c.limit - c.start for c in cut]),
                          [local], {"slice": tuple(cut)})
        with b.scope(_metadata(inst, 0, plans[0])):
            local = windowed_input(ctx, local, tiling, plans[0], self.pad_values(inst, ctx)[0])
        return self._padded(inst, ctx, local, tiled, padding)

    def local_op(self, inst, ctx, inputs, plans):
        return self._padded(inst, ctx, inputs[0], _tiled_dims(inst.operands[0], ctx),
                            inst.attr("padding"))

    def _padded(self, inst, ctx, value, tiled, padding):
        """The local pad of `value`: `padding` on the dims not `tiled` (the halo exchange
        made the tiled dims' padding)."""
        padding = tuple(PadDim(0, 0) if d in tiled else p for d, p in enumerate(padding))
        if all((p.low, p.high, p.interior) == (0, 0, 0) for p in padding):
            return value
        local = clone(inst, ctx, operands=[value, ctx.local[inst.operands[1]]])
        local.attrs["padding"] = padding
        return local


def crop_padding(size: int, pad: PadDim) -> tuple[int, int, PadDim]:
    """The elements `[start, limit)` of a dim of `size` that `pad`'s negative edge padding
    leaves (some of) in the result, and the padding that makes the same result from them
    (its edges then never negative where elements were cropped: a crop ending in an interior
    hole leaves that hole as low or high padding). Nothing is cropped where the padding would
    crop every element."""
    step = pad.interior + 1
    front = -(-max(-pad.low, 0) // step)
    back = -(-max(-pad.high, 0) // step)
    if front + back >= size:
        return 0, size, pad
    return front, size - back, PadDim(pad.low + front * step, pad.high + back * step,
                                      pad.interior)


@PARTITION_RULES.register("slice", instance=True)
class SliceRule(PiecesRule):
    tiled_for_one_device = True

    def windows(self, inst):
        operand = inst.operands[0]
        return [{d: WindowedDim(size, 1, 1, s.stride, -s.start, s.limit - size)
                 for d, (size, s) in enumerate(zip(operand.shape.dims, inst.attr("slice")))}]

    def exchanged_shard(self, inst, tiling, local):
        """The dims the tiling leaves whole are sliced before the halos travel."""
        return tuple(out if tiling.counts[d] == 1 else n
                     for d, (n, out) in enumerate(zip(local, inst.shape.dims)))

    def local_op(self, inst, ctx, inputs, plans):
        """The tiled dims' strides over the window inputs; a dim the tiling leaves whole is
        sliced as written unless `lower` already cut it (it then has the result's size)."""
        tiled = _tiled_dims(inst.operands[0], ctx)
        whole = inst.operands[0].shape.dims
        local = clone(inst, ctx, operands=inputs)
        local.attrs["slice"] = tuple(
            SliceDim(0, n, s.stride) if d in tiled else s if n == whole[d] else SliceDim(0, n)
            for d, (n, s) in enumerate(zip(inputs[0].shape.dims, inst.attr("slice"))))
        return local

    # A strategy beside halos, pieces and gathering (XLA's for a stage read in pipelining): the
    # operand stays tiled on the sliced dims, each partition cuts the part of the slice in its
    # own range (zero elsewhere), and the result is a partial value the reshard sums. It moves
    # about twice the result instead of the whole sliced dims. A strided dim cuts the range
    # the slice spans, then takes every stride-th element of it locally (both are linear, so
    # the partial values still sum to the slice).

    def plan(self, inst, ctx):
        chosen = super().plan(inst, ctx)
        operand = inst.operands[0]
        source = operand.sharding
        if not source.is_tiled or source != without_partials(source):
            return chosen
        tiling = ctx.tiling(source, operand.shape.rank)
        sliced = _sliced_tiled_dims(inst, tiling)
        if not sliced:
            return chosen
        masked = OpPlan((source,), algebra.unreduce_on_dims(tiling.sharding, sliced),
                        "slice keeps its operand tiled on sliced dims: each partition cuts "
                        "its part, the parts are summed")
        # on a tie, the fewest bytes over all devices (a halo only some shards receive)
        return ctx.choose(inst, [chosen, masked],
                          tie_break=lambda plan: (ctx.total_of(inst, plan), plan.cost))

    def halo_plans(self, inst, num_devices, computations=None):
        if _partial(inst):
            return [{}]
        return super().halo_plans(inst, num_devices, computations)

    def lower(self, inst, ctx: LowerContext):
        # the dims the tiling leaves whole are sliced locally first (with their strides: the
        # halos and the masked window then carry only what the slice keeps of them)
        # (or, where the planned shardings call for it, the exchange of pieces)
        pieces = self.lower_pieces(inst, ctx)
        if pieces is not None:
            return pieces
        b = ctx.builder
        operand = inst.operands[0]
        if not operand.sharding.is_tiled:
            return super().lower(inst, ctx)
        tiling = Tiling(operand.sharding, operand.shape.rank, ctx.num_devices)
        slices = inst.attr("slice")
        whole = [tiling.counts[d] == 1 for d in range(len(slices))]
        local = ctx.local[operand]
        if any(w and (s.start, s.limit, s.stride) != (0, n, 1)
               for w, s, n in zip(whole, slices, operand.shape.dims)):
            cut = tuple(s if w else SliceDim(0, n)
                        for w, s, n in zip(whole, slices, local.shape.dims))
            local = b.add("slice", local.shape.with_dims([len(range(c.start, c.limit, c.stride))
                                                          for c in cut]), [local], {"slice": cut})
        if not _partial(inst):
            plans = recorded_plans(inst, ctx.num_devices)
            if plans[0]:
                with b.scope(_metadata(inst, 0, plans[0])):
                    local = windowed_input(ctx, local, tiling, plans[0],
                                           self.pad_values(inst, ctx)[0])
            return self.local_op(inst, ctx, [local], plans)
        starts = [b.constant(0 if w else s.start, "s32") for w, s in zip(whole, slices)]
        spans = [n if w else (out - 1) * s.stride + 1
                 for w, s, n, out in zip(whole, slices, local.shape.dims, inst.shape.dims)]
        window = masked_window(inst, ctx, local, starts, spans, tiling,
                               _sliced_tiled_dims(inst, tiling))
        if all(w or s.stride == 1 for w, s in zip(whole, slices)):
            return window
        window.name = b.names(f"{inst.name}.span")     # the strided slice stands for `inst`
        strided = tuple(SliceDim(0, n, 1 if w else s.stride)
                        for w, s, n in zip(whole, slices, window.shape.dims))
        return b.append(Instruction(inst.name, "slice", inst.sharding.shard_shape(inst.shape),
                                    [window], {**({"metadata": inst.attrs["metadata"]}
                                                  if "metadata" in inst.attrs else {}),
                                               "slice": strided},
                                    sharding=inst.sharding))


def _sliced_tiled_dims(inst: Instruction, tiling: Tiling) -> list[int]:
    """The dims a slice cuts (not the whole dim) that `tiling` tiles."""
    dims = inst.operands[0].shape.dims
    return [d for d, s in enumerate(inst.attr("slice"))
            if tiling.counts[d] > 1 and (s.start, s.limit, s.stride) != (0, dims[d], 1)]


def _partial(inst: Instruction) -> bool:
    """Whether the planned result of `inst` is a partial value (the masked strategy)."""
    return inst.sharding.has_unreduced


@PARTITION_RULES.register("concatenate", instance=True)
class ConcatenateRule(WindowRule):
    moves_windowed_tiles = True

    def windows(self, inst):
        (dim,) = inst.attr("dimensions")
        total = inst.shape.dims[dim]
        result, offset = [], 0
        for operand in inst.operands:
            window = _dims(operand.shape)
            size = operand.shape.dims[dim]
            window[dim] = WindowedDim(size, 1, 1, 1, offset, total - offset - size,
                                      outputs=(offset, offset + size))
            result.append(window)
            offset += size
        return result

    def local_op(self, inst, ctx, inputs, plans):
        (dim,) = inst.attr("dimensions")
        if not any(plans):
            return clone(inst, ctx, operands=inputs)
        b = ctx.builder
        dims = inputs[0].shape.dims
        tiling = Tiling(inst.sharding, inst.shape.rank, ctx.num_devices)
        starts = tiling.offsets(inst.shape.dims)[:, dim]
        with b.scope(_metadata(inst, 0, plans[0])):
            position = b.binary("add", b.iota("s32", dims, dim),
                                b.broadcast(ctx.tables.lookup(starts, f"offset.{dim}"), dims))
            value, offset = inputs[0], inst.operands[0].shape.dims[dim]
            for operand, piece in zip(inst.operands[1:], inputs[1:]):
                before = b.compare(position, b.broadcast(b.constant(offset, "s32"), dims), "LT")
                value = b.select(before, value, piece)
                offset += operand.shape.dims[dim]
        return value


@PARTITION_RULES.register("reverse", instance=True)
class ReverseRule(WindowRule):
    """A reversed dim needs no window, but its operand takes the result's tiling in reversed
    device order, and a tiled uneven dim first moves its padding to the front (size 1, padding
    `n*I - S` low, real outputs after it) so the local reverse puts it back at the end."""

    def windows(self, inst):
        return [_dims(inst.operands[0].shape)]

    def windowed_dims(self, inst):
        return sorted(inst.attr("dimensions"))

    def shard_window(self, inst, k, dim, window, tiling):
        shards = tiling.counts[dim]
        shift = shards * cdiv(window.size, shards) - window.size
        return WindowedDim(window.size, shards, padding_low=shift,
                           outputs=(shift, window.size + shift))

    def operand_tiling(self, inst, tiling):
        return Tiling(algebra.reverse(tiling.sharding, inst.attr("dimensions")), tiling.rank,
                      tiling.num_devices)

    def local_op(self, inst, ctx, inputs, plans):
        return clone(inst, ctx, operands=inputs)


@PARTITION_RULES.register("select-and-scatter", instance=True)
class SelectAndScatterRule(WindowRule):
    """Each tiled windowed dim runs one of two ways, the dims together taking the choice that
    sends the fewest bytes from the busiest partition (its halos in and its results' halos
    back priced together, `_sent_by_partition`; on a tie, the most dims overlapping;
    `_overlapping_dims`):

    - *overlapping windows* (XLA's partitioner): shard `i` runs every window overlapping its
      own operand shard, windows `[first(i), first(i) + W)` (`first(i)` the first window
      reaching into its data, negative for a first shard whose windows reach before the data
      as XLA computes it, `W` the most any shard needs; a stride larger than the window
      counts as the window, so the windows cover the data); its operand's window input and
      the `source` elements of those windows come by halo exchange (`WindowedDim.firsts`) and
      it keeps its own shard of what it scattered. Windows that do not exist (before the
      first, past the last, the padding of an uneven `source`) scatter 0;
    - *own windows*: shard `i` runs the windows of its own `source` elements on its operand's
      window input, and the parts of the result lying on neighbours' shards go back by the
      reverse permutes and are added (`halo.return_halo`).

    Either way each shard scatters into zeros and the init value is added last; operand
    positions outside the data (padding, uneven garbage) read a value the `select` never
    prefers (the lowest for `GE`/`GT`, the highest for `LE`/`LT`). Needs `select` =
    `compare(a, b)` and `scatter` = `add` (max/min-pool gradients)."""

    def windows(self, inst):
        operand, source = inst.operands[:2]
        window = inst.attr("window")
        return [{d: WindowedDim(size, 1, w.size, w.stride, w.padding_low, w.padding_high,
                                w.base_dilation, w.window_dilation)
                 for d, (size, w) in enumerate(zip(operand.shape.dims, window.dims))},
                _dims(source.shape), None]

    def shard_window(self, inst, k, dim, window, tiling):
        if dim not in _overlapping_dims(inst, tiling):
            return replace(window, shards=tiling.counts[dim])
        return _overlapping_windows(inst.operands[0].shape.dims[dim],
                                    inst.operands[1].shape.dims[dim],
                                    inst.attr("window").dims[dim], tiling.counts[dim])[k]

    def supports_halo(self, inst, computations):
        return _select_direction(inst, computations) is not None and \
            associative_reducer(inst, computations, "scatter") == "add" and \
            all((w.base_dilation, w.window_dilation) == (1, 1) for w in inst.attr("window").dims)

    def halo_cost(self, inst, tiling, scans, num_devices):
        """The operand's and the source's halos in and, on the dims running their own windows,
        the results' halos back, priced on one partition together (`_sent_by_partition`)."""
        return busiest_and_total(self._sent_elements(inst, tiling),
                                 dtypes.byte_width(inst.operands[0].shape.element_type),
                                 num_devices)

    def halo_by_tile(self, inst, tiling, scans):
        return self._sent_elements(inst, tiling) * \
            dtypes.byte_width(inst.operands[0].shape.element_type)

    def _sent_elements(self, inst, tiling):
        """The elements each tile's partitions send in `halo_cost`'s halos, indexed by their
        shard ordinals (`_sent_by_partition`)."""
        windows = self.windows(inst)
        data, source = (self._plans(inst, k, windows[k], tiling, []) for k in (0, 1))
        return _sent_by_partition(inst.operands[0].shape, inst.operands[1].shape, tiling, data,
                                  source, _overlapping_dims(inst, tiling))

    def pad_values(self, inst, ctx):
        t = inst.operands[0].shape.element_type
        direction = _select_direction(inst, ctx.module.computations)
        limits = np.finfo if dtypes.is_float(t) else np.iinfo
        dtype = dtypes.numpy_dtype(t)
        if dtypes.is_float(t):
            value = -np.inf if direction in ("GE", "GT") else np.inf
        else:
            value = limits(dtype).min if direction in ("GE", "GT") else limits(dtype).max
        with ctx.builder.scope(None):
            return [ctx.builder.constant(value, t), None, None]

    def local_op(self, inst, ctx, inputs, plans):
        b = ctx.builder
        operand, source = inst.operands[:2]
        t = operand.shape.element_type
        tiling = _tiling(operand, ctx.num_devices)
        tiled = [] if tiling is None else [d for d, n in enumerate(tiling.counts) if n > 1]
        overlapping = [] if tiling is None else sorted(_overlapping_dims(inst, tiling))
        # without halos, a partition's windows are its own source elements; still, a padding
        # source element (an uneven tiled dim) has no window and must scatter nothing
        if not plans[0] and not overlapping and \
                all(source.shape.dims[d] % tiling.counts[d] == 0 for d in tiled):
            return clone(inst, ctx, operands=inputs)
        with b.scope(_metadata(inst, 0, plans[0])):
            zero = b.zero(t)
            values = _mask_windows(ctx, inputs[1], source, tiling, plans[1], zero)
            local = clone(inst, ctx, operands=[inputs[0], values, zero],
                          shape=inputs[0].shape)
            local.attrs["window"] = Window(tuple(
                replace(w, padding_low=0, padding_high=0) if d in plans[0] or
                d in overlapping else w for d, w in enumerate(inst.attr("window").dims)))
            result = local
            own = [d for d in overlapping if d in plans[0]]
            if own:                    # the shard's own part of the overlapping windows' result
                starts = [ctx.tables.zero()] * operand.shape.rank
                sizes = list(local.shape.dims)
                ordinals = tiling.coordinates()
                shard = tiling.shard_dims(operand.shape.dims)
                for d in own:
                    starts[d] = ctx.tables.lookup(plans[0][d].left[ordinals[:, d]],
                                                  f"own.{d}")
                    sizes[d] = shard[d]
                result = b.dynamic_slice(local, starts, sizes)
            for d in _returned(plans[0], tiling.shard_dims(operand.shape.dims), overlapping):
                result = return_halo(ctx, result, d, tiling, plans[0][d], zero)
            init = ctx.local[inst.operands[2]]
            return b.binary("add", result, b.broadcast(init, result.shape.dims))


def _overlapping_windows(size: int, windows: int, w: WindowDim,
                         shards: int) -> list[WindowedDim]:
    """The operand's and the source's windows on a dim of `size` elements and `windows`
    windows (`w`) tiled `shards` ways when every shard runs the windows overlapping its data
    (`SelectAndScatterRule`)."""
    extent = max(w.size, w.stride)
    shard = cdiv(size, shards)
    i = np.arange(shards, dtype=np.int64)
    # window j covers [stride*j - pad_low, stride*j - pad_low + extent): the first reaching
    # past the shard's start (negative before the first shard: windows there scatter 0 and
    # read the padding, so that shard's windows end no later than the data it needs), and the
    # first starting at or after its end
    first = (shard * i + w.padding_low - extent + w.stride) // w.stride
    limit = -(-(shard * (i + 1) + w.padding_low) // w.stride)
    firsts, per_shard = tuple(int(f) for f in first), int((limit - first).max())
    return [WindowedDim(size, shards, extent, w.stride, w.padding_low, w.padding_high,
                        firsts=firsts, per_shard=per_shard, outputs=(0, windows)),
            WindowedDim(windows, shards, firsts=firsts, per_shard=per_shard)]


def _overlapping_dims(inst: Instruction, tiling: Tiling) -> frozenset[int]:
    """The tiled windowed dims of `inst` that run overlapping windows under the operand
    `tiling`: of the choices per dim, the one whose halos (operand and source, and the own
    windows' returned results) send the fewest bytes from the busiest partition (all of them
    priced on one partition, `_sent_by_partition`, as the candidates are, each dim's halo
    widened by the earlier dims'); on a tie, the most dims overlapping."""
    operand, source = inst.operands[:2]
    window = inst.attr("window")
    dims = tuple(d for d, (n, w) in enumerate(zip(tiling.counts, window.dims))
                 if n > 1 and (w.size, w.stride, w.padding_low, w.padding_high, w.base_dilation,
                               w.window_dilation) != (1, 1, 0, 0, 1, 1))
    if not dims:
        return frozenset()
    return _cheapest_overlap(operand.shape, source.shape, window, tiling.sharding,
                             tiling.num_devices, dims)


@algebra.cached
def _cheapest_overlap(operand: ArrayShape, source: ArrayShape, window: Window,
                      sharding: HloSharding, num_devices: int,
                      dims: tuple[int, ...]) -> frozenset[int]:
    """`_overlapping_dims` of a select-and-scatter of these shapes and window, `dims` its
    tiled windowed dims (a few: every subset is priced)."""
    tiling = Tiling(sharding, operand.rank, num_devices)
    own, overlapping = {}, {}
    for d in dims:
        w, n = window.dims[d], tiling.counts[d]
        own[d] = plan_halo(WindowedDim(operand.dims[d], n, w.size, w.stride, w.padding_low,
                                       w.padding_high))
        overlapping[d] = [plan_halo(x) for x in
                          _overlapping_windows(operand.dims[d], source.dims[d], w, n)]
    best = None
    for count in range(len(dims), -1, -1):
        for chosen in itertools.combinations(dims, count):
            data = {d: overlapping[d][0] if d in chosen else own[d] for d in dims}
            data = {d: plan for d, plan in data.items() if not plan.identity}
            windows = {d: overlapping[d][1] for d in chosen if not overlapping[d][1].identity}
            bytes_ = _sent_by_partition(operand, source, tiling, data, windows,
                                        frozenset(chosen)).max(initial=0)
            if best is None or bytes_ < best[0]:
                best = (bytes_, frozenset(chosen))
    return best[1]


def _sent_by_partition(operand: ArrayShape, source: ArrayShape, tiling: Tiling,
                       data: dict[int, HaloPlan], windows: dict[int, HaloPlan],
                       overlapping: frozenset[int]) -> np.ndarray:
    """Elements each partition sends (an array of `tiling`'s counts, `sent_per_partition`) for
    a select-and-scatter whose operand exchanges the halos `data` and its source `windows`,
    the dims of `data` not `overlapping` sending their results' halos back (`_returned`)."""
    local, source_local = tiling.shard_dims(operand.dims), tiling.shard_dims(source.dims)
    order = _returned(data, local, overlapping)
    value = [data[d].window_input if d in order else n for d, n in enumerate(local)]
    return sent_per_partition(data, local, tiling.counts) + \
        sent_per_partition(windows, source_local, tiling.counts) + \
        returned_per_partition(data, value, tiling.counts, order)


def _returned(data: dict[int, HaloPlan], local: Sequence[int],
              overlapping: Iterable[int]) -> list[int]:
    """The dims of the operand's halos `data` (on a shard of `local` dims) whose scattered
    results go back to their owners, in the order they go: the reverse of the exchange's."""
    return [d for d in reversed(exchange_order(data, local)) if d not in overlapping]


def _select_direction(inst: Instruction, computations: Computations) -> str | None:
    """`GE`/`GT`/`LE`/`LT` when `select` is `compare(first, second)` in that direction."""
    comp = computations.get(inst.attr("select").name)
    if comp is None or len(comp.instructions) != 3:
        return None
    root, params = comp.root, comp.parameters
    direction = root.attr("direction")
    if root.opcode != "compare" or root.operands != params or direction is None:
        return None
    name = getattr(direction, "name", str(direction))
    return name if name in ("GE", "GT", "LE", "LT") else None


def _mask_windows(ctx: LowerContext, values: Instruction, source: Instruction,
                  tiling: Tiling, plans: dict[int, HaloPlan], fill: Instruction) -> Instruction:
    """`values` (this partition's `source` elements: its shard under `tiling`, or on a dim of
    `plans` the window input starting at source element `plan.start`) with the elements of
    windows that do not exist (outside `[0, size)`: a range running past an edge, the padding
    of an uneven dim) replaced by `fill`."""
    b = ctx.builder
    dims = values.shape.dims
    offsets = tiling.offsets(source.shape.dims)
    ordinals = tiling.coordinates()
    valid = None
    for d, (size, n) in enumerate(zip(source.shape.dims, tiling.counts)):
        starts = plans[d].start[ordinals[:, d]] if d in plans else offsets[:, d]
        if n == 1 or (starts >= 0).all() and (starts + dims[d] <= size).all():
            continue
        index = b.binary("add", b.iota("s32", dims, d),
                         b.broadcast(ctx.tables.lookup(starts, f"window.{d}"), dims))
        inside = b.binary("and", b.compare(index, b.broadcast(ctx.tables.zero(), dims), "GE"),
                          b.compare(index, b.broadcast(b.constant(size, "s32"), dims), "LT"))
        valid = inside if valid is None else b.binary("and", valid, inside)
    return values if valid is None else b.select(valid, values, b.broadcast(fill, dims))


def _whole_for_free(operand: Instruction) -> bool:
    """A constant, or a value just resharded from a replicated one: taking it whole costs
    nothing (whatever the reshard cost says), so its halos are never worth exchanging (asked
    of the operands read through a window; one read elementwise, a select-and-scatter's
    `source`, is sliced in any tiling for free)."""
    return operand.opcode == "constant" or (
        is_inserted_reshard(operand) and operand.operands[0].sharding is not None and
        operand.operands[0].sharding.is_replicated)


def _tiling(operand: Instruction, num_devices: int) -> Tiling | None:
    if not operand.sharding.is_tiled:
        return None
    return Tiling(operand.sharding, operand.shape.rank, num_devices)


def _scan_metadata(inst: Instruction, dims: list[int]) -> KeyValueList:
    return KeyValueList((("op_type", "prefix-scan"), ("op_name", inst.name),
                         ("spmd_value", inst.operands[0].name),
                         ("spmd_reason", f"{inst.opcode} covers the whole prefix of tiled dims "
                                         f"{dims}: local scans combined with the scan of the "
                                         "shard totals")))


def _tiled_dims(operand: Instruction, ctx: LowerContext) -> set[int]:
    if not operand.sharding.is_tiled:
        return set()
    counts = operand.sharding.tile_counts_for_rank(operand.shape.rank)
    return {d for d, n in enumerate(counts) if n > 1}


__all__ = ["WindowRule"]
