"""Partitioning of `convolution` (docs/design/partitioning.md#convolution-strategies): a
convolution is a dot over its
non-spatial dims, so the dot's compatibility rule (`op_rules_dot.dot_result`) decides which
operand pairs run locally and what they produce.

Dim classes (`ConvDims.of`), in the dot's terms:

| convolution               | "batch" (both operands) | contracting    | lhs free          | rhs free |
|---------------------------|-------------------------|----------------|-------------------|----------|
| plain                     | —                       | lhs f / rhs i  | lhs b, spatial    | rhs o    |
| `feature_group_count` G>1 | lhs f / rhs o (groups)  | —              | lhs b, spatial    | —        |
| `batch_group_count` B>1   | lhs b / rhs o (groups)  | lhs f / rhs i  | spatial           | —        |

- batch dim tiled (lhs b, rhs replicated): each partition convolves its batch block;
- output feature tiled (rhs o): each partition computes its output-feature block;
- input feature tiled alike on both (contracting): each partition's convolution is a *partial
  sum* of the output (the `unreduced` subgroup of its result sharding), combined by the result's
  reshard (all-reduce, or reduce-scatter into a tiled output). Uneven input-feature shards are
  masked with 0 on both operands before the local convolution;
- grouped convolutions: the group dims (lhs f with rhs o for feature groups, lhs b with rhs o for
  batch groups) are tiled alike, by a count dividing the group count or unevenly when each
  tile still holds whole groups (the last one padded), so every partition holds whole groups;
  the local convolution has `ceil(group_count / tiles)` groups. The rhs
  input-feature dim of a feature-grouped convolution stays whole;
- spatial dims (the forward case, strategy 3): an lhs spatial dim tiled n ways gives
  the output spatial dim tiled the same n ways. With a trivial window (size 1, stride 1, no
  padding or dilation) that is all; otherwise each partition first receives the halo its output
  block's windows read from its neighbours (`halo.windowed_input`: collective-permutes, a
  (dynamic-)slice, padding and garbage masked with 0, lhs dilation done locally) and runs the
  convolution with that dim's padding and lhs dilation removed;
- kernel spatial dims tiled like the input's (the weight-gradient case, strategy 2; not
  with window reversal): the spatial dims are contracted like features — each partition holds
  kernel taps `[R*i, R*(i+1))` (`R = ceil(taps / tiles)`: an uneven kernel's padded taps are
  masked to 0 like uneven input features, as XLA's partitioner does), receives the input
  window those taps read by the same halo exchange (a window of the output's size sliding by
  the window dilation per tap) and convolves it with its taps into a partial sum of the whole
  output; the result's reshard adds the partial sums. Other kernel spatial tilings are gathered.
  An input tiled on a spatial dim also tries this with the kernel resharded to its tiles there
  (`kernel_alignable_dims`), as XLA's partitioner aligns the kernel to the input.
  A spatial dim whose one window covers the whole input and kernel (`whole_window_dims`: no
  padding or dilation, one output there) is such a contracted dim whatever the kernel's tiling:
  an input tiled there is convolved in place with the kernel's matching taps (sliced) and the
  small partial result all-reduced, instead of gathering the input (XLA's partitioner treats
  that dim as a dot's contracting dim).

- parallel spatial dims (`parallel_dims`: input size `B` = window size = base dilation, a
  stride or window dilation of `B - 1`, no padding; output `o` reads input `o` with tap `o`
  alone): a dot's batch dim written as a window, which XLA's partitioner reads as one. They are
  "batch" dims here: input, kernel and output tiled alike, each partition convolves its block
  with the window rewritten to the block's size; an uneven block's padded kernel taps are
  zeroed (every tap also meets the zeros of the dilated input).

Candidates: the operands as they are, one operand aligned to the other on batch/contracting dims,
both derived from the output's tiling, everything replicated, one operand's contracting tiles
gathered with the other aligned on the batch/group dims (whole input features, no partial
sums: `op_rules_dot.gathered_contracting_pairs`) — each also with its windowed dims gathered
instead of exchanged. The fewest bytes moved by the busiest device wins (operand
reshards, the result's reshard, halo bytes), then the fewest moved by all devices together (a
halo only some shards read, as a strided window reading padding: XLA's one-directional
exchange), then the fewest halo bytes (one gather beats several permutes), then the least local
work, then the first.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import KeyValueList, Window
from gspmdc.ir.module import Instruction
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.sharding import HloSharding

from .halo import (
    HaloPlan, WindowedDim, halo_sent, plan_halo, recorded_plans,
    windowed_input,
)
from .op_rules import (
    LowerContext, OpPlan, PartitionRule, PlanContext, clone, without_partials, zero_uneven_padding,
)
from .op_rules_dot import DotDims, _inverse, aligned_operand_pairs, dot_result, \
    gathered_contracting_pairs
from .tiling import Tiling, cdiv, remap


@dataclass(frozen=True)
class ConvDims:
    """A convolution seen as a dot (see the module docstring): `dot` classifies the dims that
    may be tiled, `out_of` names the output dim of each position of the dot's result (batch,
    lhs free, rhs free), `rhs_whole` the kernel dims that must stay whole, `groups`
    the group count (1: none) and `group_sizes` the sizes of the lhs and rhs dims of the
    "batch" class, whose tiles must hold whole groups (`holds_whole_groups`), `windows` the
    lhs spatial dims with a non-trivial window (lhs dim -> `halo.WindowedDim`, one shard), and
    `kernel_tiled` the kernel spatial dims tiled like the input's (any number of ways: uneven
    tiles are masked like uneven input features, so the last shard's padded taps add 0).

    `gradient`: the window dims whose kernel dim is tiled (the weight-gradient case, strategy 2
    strategy 2): input and kernel spatial dims are contracted like features (partial sums), and
    the input's window is the kernel shard's: shard `i` of the kernel holds taps
    `[R*i, R*(i+1))`, which read input positions `o*stride - pad_low + k*dilation` — a window of
    `out` positions (dilation: the stride) sliding by `dilation` per tap, one output per tap."""

    dot: DotDims
    out_of: tuple[int, ...]
    rhs_whole: tuple[int, ...]
    groups: int
    group_sizes: tuple[int, int]
    windows: dict
    kernel_tiled: frozenset

    @classmethod
    def of(cls, inst: Instruction, gradient: frozenset = frozenset()) -> "ConvDims":
        labels = inst.attr("dim_labels")
        window = inst.attr("window")
        fgc = inst.attr("feature_group_count", 1)
        bgc = inst.attr("batch_group_count", 1)
        lb, lf, ls = labels.lhs_batch, labels.lhs_feature, labels.lhs_spatial
        ri, ro, rs = labels.rhs_input_feature, labels.rhs_output_feature, labels.rhs_spatial
        ob, of, os_ = labels.out_batch, labels.out_feature, labels.out_spatial
        lhs, rhs, out = inst.operands[0].shape, inst.operands[1].shape, inst.shape
        windows, kernel_tiled = {}, set()
        parallel = parallel_dims(inst) - gradient
        for k, w in enumerate(window.dims if window is not None else ()):
            d = ls[k]
            if k in parallel:
                continue
            if k in gradient:
                size, taps, outputs = lhs.dims[d], rhs.dims[rs[k]], out.dims[os_[k]]
                high = (taps - 1) * w.window_dilation + (outputs - 1) * w.stride + 1 - \
                    (w.base_dilation * (size - 1) + 1) - w.padding_low
                windows[d] = WindowedDim(size, 1, outputs, w.window_dilation, w.padding_low,
                                         high, w.base_dilation, w.stride)
                kernel_tiled.add(rs[k])
            elif not _trivial(w):
                windows[d] = WindowedDim(lhs.dims[d], 1, w.size, w.stride, w.padding_low,
                                         w.padding_high, w.base_dilation, w.window_dilation)
        kernel_tiled = frozenset(kernel_tiled)
        free = [k for k in range(len(ls)) if k not in gradient and k not in parallel]
        lc = tuple(ls[k] for k in sorted(gradient))
        rc = tuple(rs[k] for k in sorted(gradient))
        pl, pr = tuple(ls[k] for k in sorted(parallel)), tuple(rs[k] for k in sorted(parallel))
        po = tuple(os_[k] for k in sorted(parallel))
        whole = tuple(rs[k] for k in free)
        ls, os_ = tuple(ls[k] for k in free), tuple(os_[k] for k in free)
        if fgc > 1:
            dot = DotDims((lf,) + pl, (ro,) + pr, lc, rc, (lb,) + ls, ())
            return cls(dot, (of,) + po + (ob,) + os_, (ri,) + whole, fgc,
                       (lhs.dims[lf], rhs.dims[ro]), windows, kernel_tiled)
        if bgc > 1:
            dot = DotDims((lb,) + pl, (ro,) + pr, (lf,) + lc, (ri,) + rc, ls, ())
            return cls(dot, (of,) + po + os_, whole, bgc, (lhs.dims[lb], rhs.dims[ro]), windows,
                       kernel_tiled)
        dot = DotDims(pl, pr, (lf,) + lc, (ri,) + rc, (lb,) + ls, (ro,))
        return cls(dot, po + (ob,) + os_ + (of,), whole, 1, (0, 0), windows, kernel_tiled)

    @classmethod
    def planned(cls, inst: Instruction, rhs: Tiling) -> "ConvDims":
        """The dims of `inst` whose kernel has the tiling `rhs` (kernel-tiled spatial dims are
        weight-gradient dims)."""
        labels, window = inst.attr("dim_labels"), inst.attr("window")
        parallel = parallel_dims(inst)
        return cls.of(inst, frozenset(k for k, d in enumerate(labels.rhs_spatial)
                                      if rhs.counts[d] > 1 and k not in parallel and
                                      not window.dims[k].window_reversal))

    def halo_plans(self, lhs: Tiling) -> dict[int, HaloPlan]:
        """The halo exchanges of the lhs's tiled windowed dims under `lhs`."""
        plans = {}
        for d, window in self.windows.items():
            if lhs.counts[d] > 1:
                plan = plan_halo(replace(window, shards=lhs.counts[d]))
                if plan.needed:
                    plans[d] = plan
        return plans

    def lhs_to_output(self, lhs_rank: int) -> list[int]:
        """Output dim of each lhs dim (-1: contracting or whole)."""
        out = [-1] * lhs_rank
        for k, d in enumerate(self.dot.lhs_batch + self.dot.lhs_free):
            out[d] = self.out_of[k]
        return out

    def rhs_to_output(self, rhs_rank: int) -> list[int]:
        out = [-1] * rhs_rank
        n_batch, n_lhs_free = len(self.dot.rhs_batch), len(self.dot.lhs_free)
        for k, d in enumerate(self.dot.rhs_batch):
            out[d] = self.out_of[k]
        for k, d in enumerate(self.dot.rhs_free):
            out[d] = self.out_of[n_batch + n_lhs_free + k]
        return out


def whole_window_dims(inst: Instruction) -> frozenset:
    """The spatial dims (window positions) whose one window covers the whole input and the
    whole kernel (no padding, dilation or reversal; one output there): a dot's contracting dim
    in all but name. Tiled alike on input and kernel, each partition convolves its part of the
    window into a partial sum of the output, added by the result's all-reduce (the
    weight-gradient form with a one-element output, `ConvDims.gradient`), instead of gathering
    the input."""
    labels, window = inst.attr("dim_labels"), inst.attr("window")
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    return frozenset(
        k for k, w in enumerate(window.dims if window is not None else ())
        if w.size > 1 and
        lhs.dims[labels.lhs_spatial[k]] == rhs.dims[labels.rhs_spatial[k]] == w.size and
        (w.padding_low, w.padding_high, w.base_dilation, w.window_dilation) == (0, 0, 1, 1) and
        not w.window_reversal)


def kernel_alignable_dims(inst: Instruction, lhs: Tiling) -> list[int]:
    """The spatial dims (window positions) on which the input is tiled and the kernel, holding
    more than one tap there and not reversed, could be tiled alike: each is tried as a
    weight-gradient dim (`ConvDims.gradient`) with the kernel resharded to the input's tiles
    there, so each partition convolves its input block (and the halo its kernel taps read)
    with its taps into a partial sum of the output, added by the result's reshard, instead of
    gathering the input (XLA's partitioner aligns the kernel to a spatially tiled input)."""
    labels, window = inst.attr("dim_labels"), inst.attr("window")
    if window is None:
        return []
    rhs, parallel = inst.operands[1].shape, parallel_dims(inst)
    return [k for k, w in enumerate(window.dims)
            if lhs.counts[labels.lhs_spatial[k]] > 1 and rhs.dims[labels.rhs_spatial[k]] > 1
            and k not in parallel and not w.window_reversal]


def parallel_dims(inst: Instruction) -> frozenset:
    """The spatial dims (window positions) that are a dot's batch dim in all but name: the
    input's size `B` is the window's size and its base dilation, the stride (or the window
    dilation, the other being 1) is `max(1, B - 1)`, no padding or reversal — output `o` reads
    input `o` with kernel tap `o` alone (XLA's partitioner reads such a dim as a batch dim).
    Tiled alike on input, kernel and output, each partition convolves its block of them."""
    window = inst.attr("window")
    if window is None:
        return frozenset()
    lhs, spatial = inst.operands[0].shape, inst.attr("dim_labels").lhs_spatial
    return frozenset(k for k, w in enumerate(window.dims) if _parallel(w, lhs.dims[spatial[k]]))


def _parallel(w, size: int) -> bool:
    step = max(1, size - 1)
    return size == w.size == w.base_dilation and w.padding_low == w.padding_high == 0 and \
        not w.window_reversal and ((w.stride, w.window_dilation) == (step, 1) or
                                   (w.stride, w.window_dilation) == (1, step))


def _parallel_window(w, size: int):
    """A parallel dim's window on a block of `size`, in the same form."""
    step = max(1, size - 1)
    if w.window_dilation > 1:
        return replace(w, size=size, base_dilation=size, stride=1, window_dilation=step)
    return replace(w, size=size, base_dilation=size, stride=step, window_dilation=1)


def _trivial(w) -> bool:
    return (w.size, w.stride, w.padding_low, w.padding_high, w.base_dilation,
            w.window_dilation) == (1, 1, 0, 0, 1, 1)


def holds_whole_groups(size: int, groups: int, tiles: int) -> bool:
    """Whether a dim of `size` holding `groups` consecutive groups, tiled `tiles` ways (the
    last tiles padded when uneven), gives every tile whole groups: `ceil(groups / tiles)` of
    them, the last tile's padding included, as XLA's partitioner pads a group dim tiled unevenly
    (docs/design/partitioning.md#convolution-strategies)."""
    return cdiv(size, tiles) == size // groups * cdiv(groups, tiles)


def conv_result(lhs: Tiling, rhs: Tiling, cd: ConvDims, out_rank: int) -> Tiling | None:
    """The output tiling of the local convolution of shards of `lhs` and `rhs` (partial sums
    over tiled input features as `unreduced`), or None when the pair cannot run locally."""
    if any(rhs.counts[d] > 1 for d in cd.rhs_whole):
        return None
    if cd.groups > 1 and not all(
            holds_whole_groups(size, cd.groups, tiles.counts[dims[0]])
            for size, tiles, dims in zip(cd.group_sizes, (lhs, rhs),
                                         (cd.dot.lhs_batch, cd.dot.rhs_batch))):
        return None
    result = dot_result(lhs, rhs, cd.dot)
    if result is None:
        return None
    missing = [d for d in range(out_rank) if d not in cd.out_of]
    order = list(cd.out_of) + missing
    inserted = algebra.insert_dims(result.sharding, range(len(cd.out_of), out_rank))
    return Tiling(algebra.transpose(inserted, [order.index(d) for d in range(out_rank)]),
                  out_rank, result.num_devices)


@PARTITION_RULES.register("convolution", instance=True)
class ConvolutionRule(PartitionRule):
    def plan(self, inst, ctx: PlanContext):
        lhs_op, rhs_op = inst.operands
        lr, rr = lhs_op.shape.rank, rhs_op.shape.rank
        target = without_partials(inst.sharding)
        if target.kind == "maximal":
            return OpPlan((target, target), target, "convolution on one device")

        def usable(sharding: HloSharding, rank: int) -> Tiling | None:
            if sharding.kind not in ("tiled", "replicated") or \
                    sharding != without_partials(sharding):
                return None
            return ctx.tiling(sharding, rank)

        lt, rt = usable(lhs_op.sharding, lr), usable(rhs_op.sharding, rr)
        variants = [ConvDims.of(inst)]
        if rt is not None and ConvDims.planned(inst, rt).kernel_tiled:
            variants.append(ConvDims.planned(inst, rt))
        whole = whole_window_dims(inst)
        if whole:
            variants.append(ConvDims.of(inst, whole))
        if lt is not None:
            variants += [ConvDims.of(inst, frozenset({k}))
                         for k in kernel_alignable_dims(inst, lt)]
        candidates, seen = [], set()
        width = dtypes.byte_width(lhs_op.shape.element_type)
        for cd in variants:
            for a, b, reason in _pairs(inst, cd, ctx, target, lt, rt):
                key = (a.sharding, b.sharding)
                if key in seen:
                    continue
                seen.add(key)
                result = conv_result(a, b, cd, inst.shape.rank)
                if result is not None:
                    plans, local = cd.halo_plans(a), a.shard_dims(lhs_op.shape.dims)
                    candidates.append(OpPlan(
                        key, result.sharding, reason,
                        *halo_sent(plans, local, width, ctx.num_devices)))
        # on equal bytes for the busiest device, the fewest over all devices (a halo only
        # some shards read: XLA's one-directional exchange), then one gather beats several
        # permutes, then the least local work
        return ctx.choose(inst, candidates, lambda p: (ctx.total_of(inst, p), p.cost,
                                                       _local_work(inst, p)))

    def halo_plans(self, inst: Instruction, num_devices: int) -> list[dict[int, HaloPlan]]:
        """Per operand, the halo plans of its tiled windowed dims under its planned sharding
        (the kernel's: none); the form `op_rules_window.WindowRule.halo_plans` has."""
        lhs = inst.operands[0]
        if not lhs.sharding.is_tiled:
            return [{}, {}]
        tiling = Tiling(lhs.sharding, lhs.shape.rank, num_devices)
        rhs = inst.operands[1]
        kernel = Tiling(rhs.sharding, rhs.shape.rank, num_devices)
        return [ConvDims.planned(inst, kernel).halo_plans(tiling), {}]

    def lower(self, inst, ctx: LowerContext):
        if inst.sharding.kind == "maximal":           # whole operands on one device
            return clone(inst, ctx)
        lhs_op, rhs_op = inst.operands
        lhs, rhs = ctx.operands(inst)
        lt = Tiling(lhs_op.sharding, lhs_op.shape.rank, ctx.num_devices)
        rt = Tiling(rhs_op.sharding, rhs_op.shape.rank, ctx.num_devices)
        cd = ConvDims.planned(inst, rt)
        labels = inst.attr("dim_labels")
        parallel = sorted(parallel_dims(inst))
        lhs = zero_uneven_padding(ctx, lhs, lhs_op.shape, lt, cd.dot.lhs_contracting)
        # a parallel dim's kernel taps also meet the holes of the dilated input: its padded
        # taps are zeroed, as padded input features are
        rhs = zero_uneven_padding(ctx, rhs, rhs_op.shape, rt, cd.dot.rhs_contracting +
                           tuple(labels.rhs_spatial[k] for k in parallel))
        plans = recorded_plans(inst, ctx.num_devices)[0]
        if plans:
            with ctx.builder.scope(_halo_metadata(inst, plans)):
                lhs = windowed_input(ctx, lhs, lt, plans,
                                     ctx.builder.zero(lhs_op.shape.element_type))
        local = clone(inst, ctx, [lhs, rhs])
        parallel = [k for k in parallel if lt.counts[labels.lhs_spatial[k]] > 1]
        if plans or cd.kernel_tiled or parallel:  # windows exchanged, kernel taps or blocks split
            window = list(inst.attr("window").dims)
            for k, (d, r) in enumerate(zip(labels.lhs_spatial, labels.rhs_spatial)):
                if d in plans:
                    window[k] = replace(window[k], padding_low=0, padding_high=0,
                                        base_dilation=1)
                if r in cd.kernel_tiled:                 # the kernel shard's taps
                    window[k] = replace(window[k], size=rhs.shape.dims[r])
                if k in parallel:
                    window[k] = _parallel_window(window[k], lhs.shape.dims[d])
            local.attrs["window"] = Window(tuple(window))
        if cd.groups > 1:
            key = "feature_group_count" if inst.attr("feature_group_count", 1) > 1 else \
                "batch_group_count"
            local.attrs[key] = cdiv(cd.groups, lt.counts[cd.dot.lhs_batch[0]])
        return local


def _pairs(inst: Instruction, cd: ConvDims, ctx: PlanContext, target: HloSharding,
           lhs: Tiling | None, rhs: Tiling | None) -> list[tuple[Tiling, Tiling, str]]:
    """Candidate operand tilings (see the module docstring) for the dim classes `cd`, each
    also with the input's windowed dims gathered."""
    lr, rr, out_rank = inst.operands[0].shape.rank, inst.operands[1].shape.rank, inst.shape.rank
    rt = None if rhs is None else \
        ctx.tiling(algebra.partially_replicate_on_dims(rhs.sharding, cd.rhs_whole), rr)
    pairs: list[tuple[Tiling, Tiling, str]] = []
    if lhs is not None and rt is not None:
        pairs.append((lhs, rt, "convolution operands are compatible"))
    aligned = aligned_operand_pairs(
        None if lhs is None else lhs.sharding, None if rt is None else rt.sharding, cd.dot, lr, rr,
        ("kernel aligned to the input's batch/feature tiles",
         "kernel aligned to the input, keeping its output-feature tiling",
         "input aligned to the kernel's feature tiles",
         "input aligned to the kernel, keeping its batch/spatial tiling"))
    pairs += [(ctx.tiling(a, lr), ctx.tiling(b, rr), reason) for a, b, reason in aligned]
    out = ctx.tiling(target, out_rank).sharding
    pairs.append((ctx.tiling(remap(out, _inverse(cd.lhs_to_output(lr), out_rank), lr), lr),
                  ctx.tiling(remap(out, _inverse(cd.rhs_to_output(rr), out_rank), rr), rr),
                  "convolution operands follow the output's tiling"))
    pairs.append((Tiling.replicated(lr, ctx.num_devices), Tiling.replicated(rr, ctx.num_devices),
                  "convolution runs replicated"))
    gathered = gathered_contracting_pairs(
        None if lhs is None else lhs.sharding, None if rt is None else rt.sharding, cd.dot, lr, rr,
        ("input gathers its feature tiles, kernel aligned on batch/group dims",
         "kernel gathers its feature tiles, input aligned on group dims"))
    pairs += [(ctx.tiling(a, lr), ctx.tiling(b, rr), reason) for a, b, reason in gathered]
    windowed = [d for d in cd.windows if d not in cd.dot.lhs_contracting]
    result = []
    for a, b, reason in pairs:
        if any(a.counts[d] > 1 for d in windowed):
            result.append((a, b, reason + ", exchanging halos on its windowed dims"))
            reason += ", its windowed dims gathered"
        result.append((ctx.tiling(algebra.partially_replicate_on_dims(a.sharding, windowed), lr),
                       b, reason))
    return result


def _halo_metadata(inst: Instruction, plans: dict[int, HaloPlan]) -> KeyValueList:
    text = "; ".join(f"dim {d}: {p.describe()}" for d, p in sorted(plans.items()))
    return KeyValueList((("op_type", "halo-exchange"), ("op_name", inst.name),
                         ("spmd_value", inst.operands[0].name),
                         ("spmd_reason", f"the convolution's input windows read its neighbours' "
                                         f"elements ({text})")))


def _local_work(inst: Instruction, plan: OpPlan) -> float:
    """Output elements of the local convolution times the kernel elements each one reads."""
    out = plan.result.shard_shape(inst.shape)
    rhs = plan.operands[1].shard_shape(inst.operands[1].shape)
    labels = inst.attr("dim_labels")
    per_output = prod(n for d, n in enumerate(rhs.dims) if d != labels.rhs_output_feature)
    return float(prod(out.dims) * per_output)


__all__ = ["ConvDims", "conv_result", "whole_window_dims", "kernel_alignable_dims",
           "parallel_dims", "ConvolutionRule"]
