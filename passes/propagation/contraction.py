"""Dot and convolution as dimension mappings, and the shardings they induce
(docs/design/propagation.md#dot-and-convolution;
XLA's dot_as_convolution_util and InferDot*Sharding).

A contraction is described by `DimMap`s `(lhs, rhs, output)` (-1 where a dim is absent):
batch dims (in lhs, rhs and output), contracting dims (lhs and rhs; a convolution's contracting
spatial dim also has a size-1 output dim), lhs/rhs non-contracting dims, and genuine convolution
spatial dims (`conv_spatial`), which have no dot interpretation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import (
    cached, is_more_specific, is_spatially_partitioned, merge_if_compatible,
)



@dataclass(frozen=True, slots=True)
class DimMap:
    lhs: int
    rhs: int
    output: int

    def side(self, operand: int) -> int:
        return self.lhs if operand == 0 else self.rhs


@dataclass(frozen=True, slots=True)
class ContractionDims:
    """A contraction's dim maps; a key of the candidates' memo tables, so its hash is computed
    once (and `_interned` makes equal values one object, compared by identity)."""

    batch: tuple[DimMap, ...]
    contracting: tuple[DimMap, ...]
    lhs_non_contracting: tuple[DimMap, ...]
    rhs_non_contracting: tuple[DimMap, ...]
    conv_spatial: tuple[DimMap, ...] = ()
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.batch, self.contracting,
                                                self.lhs_non_contracting,
                                                self.rhs_non_contracting, self.conv_spatial)))

    def __hash__(self) -> int:
        return self._hash

    def non_contracting(self, operand: int) -> tuple[DimMap, ...]:
        return self.lhs_non_contracting if operand == 0 else self.rhs_non_contracting


def dot_dims(dot: Instruction) -> ContractionDims:
    """XLA's ParseDotGeneralFromDot: output dims are batch, lhs free, rhs free, in order."""
    attrs = dot.attrs
    return _dot_dims(tuple(attrs.get("lhs_batch_dims", ())),
                     tuple(attrs.get("rhs_batch_dims", ())),
                     tuple(attrs.get("lhs_contracting_dims", ())),
                     tuple(attrs.get("rhs_contracting_dims", ())),
                     dot.operands[0].shape.rank, dot.operands[1].shape.rank)


@cached
def _dot_dims(lhs_batch: tuple[int, ...], rhs_batch: tuple[int, ...],
              lhs_contracting: tuple[int, ...], rhs_contracting: tuple[int, ...],
              lhs_rank: int, rhs_rank: int) -> ContractionDims:
    """`dot_dims` of a dot with these dimension numbers and operand ranks (the same few for
    every layer of a model)."""
    batch = tuple(DimMap(l, r, i) for i, (l, r) in enumerate(zip(lhs_batch, rhs_batch)))
    contracting = tuple(DimMap(l, r, -1) for l, r in zip(lhs_contracting, rhs_contracting))
    lhs_free = [d for d in range(lhs_rank) if d not in lhs_batch and d not in lhs_contracting]
    rhs_free = [d for d in range(rhs_rank) if d not in rhs_batch and d not in rhs_contracting]
    lhs_nc = tuple(DimMap(d, -1, len(batch) + k) for k, d in enumerate(lhs_free))
    rhs_nc = tuple(DimMap(-1, d, len(batch) + len(lhs_free) + k) for k, d in enumerate(rhs_free))
    return _interned(ContractionDims(batch, contracting, lhs_nc, rhs_nc))


def _spatial_is_parallel(wd, lhs_size: int) -> bool:
    """A dot batch dim written as a convolution spatial dim (XLA's ConvSpatialDimensionIsParallel)."""
    if lhs_size == wd.size and lhs_size == wd.base_dilation and \
            ((max(1, lhs_size - 1) == wd.stride and wd.window_dilation == 1) or
             (max(1, lhs_size - 1) == wd.window_dilation and wd.stride == 1)) and \
            wd.padding_high == 0 and wd.padding_low == 0 and not wd.window_reversal:
        return True
    return wd.size == lhs_size and wd.padding_high == lhs_size - 1 and \
        wd.padding_low == lhs_size - 1 and wd.window_reversal and wd.window_dilation == 1 and \
        wd.stride == lhs_size and wd.base_dilation == lhs_size - 1


def convolution_dims(conv: Instruction) -> ContractionDims:
    """XLA's ParseConvolutionDimsInfo: batch/feature dims map like a dot's; each spatial dim is a
    batch, contracting, lhs or rhs non-contracting dim when its window makes it one, else a
    genuine convolution spatial dim."""
    labels = conv.attrs["dim_labels"]
    window = conv.attrs.get("window")
    lhs_shape, rhs_shape = conv.operands[0].shape, conv.operands[1].shape
    batch, contracting, conv_spatial = [], [DimMap(labels.lhs_feature, labels.rhs_input_feature, -1)], []
    lhs_nc = [DimMap(labels.lhs_batch, -1, labels.out_batch)]
    rhs_nc = [DimMap(-1, labels.rhs_output_feature, labels.out_feature)]
    for i, (lhs, rhs, out) in enumerate(zip(labels.lhs_spatial, labels.rhs_spatial,
                                            labels.out_spatial)):
        wd = window.dims[i]
        lhs_size, rhs_size = lhs_shape.dims[lhs], rhs_shape.dims[rhs]
        dim = DimMap(lhs, rhs, out)
        plain = wd.stride == 1 and wd.window_dilation == 1 and wd.base_dilation == 1
        if _spatial_is_parallel(wd, lhs_size):
            batch.append(dim)
        elif lhs_size == wd.size and wd.base_dilation == 1 and wd.window_dilation == 1 and \
                wd.padding_high == 0 and wd.padding_low == 0 and not wd.window_reversal:
            contracting.append(dim)
        elif plain and rhs_size == 1 and wd.size == 1 and wd.padding_high == 0 and \
                wd.padding_low == 0 and not wd.window_reversal:
            lhs_nc.append(dim)
        elif plain and lhs_size == 1 and wd.size == rhs_size and \
                wd.padding_high == rhs_size - 1 and wd.padding_low == rhs_size - 1 and \
                wd.window_reversal:
            rhs_nc.append(dim)
        else:
            conv_spatial.append(dim)
    return _interned(ContractionDims(tuple(batch), tuple(contracting), tuple(lhs_nc),
                                     tuple(rhs_nc), tuple(conv_spatial)))


@cached
def _interned(dims: ContractionDims) -> ContractionDims:
    """The first of the equal values built (the repeated layers of a model share one)."""
    return dims


@cached
def output_candidate(dims: ContractionDims, operand: int, sharding: HloSharding,
                     operand_rank: int, output_rank: int) -> HloSharding:
    """The output sharding one operand suggests (XLA's InferDotShardingFromOperands `from_operand`):
    its contracting dims (and dims that pair with the other operand's free dims) replicated, then
    batch and its own free dims mapped to the output."""
    if sharding.is_tile_maximal or not sharding.is_tiled:
        return sharding
    other_free = dims.non_contracting(1 - operand)
    replicate = [d.side(operand) for d in dims.contracting] + \
        [d.side(operand) for d in other_free if d.side(operand) >= 0]
    reduced = algebra.partially_replicate_on_dims(sharding, replicate)
    src_to_tgt, tgt_to_src = [-1] * operand_rank, [-1] * output_rank
    for d in dims.batch + dims.non_contracting(operand):
        src_to_tgt[d.side(operand)] = d.output
        tgt_to_src[d.output] = d.side(operand)
    return algebra.transpose_with_collapsed_dims(reduced, src_to_tgt, tgt_to_src)


@cached
def operand_candidate(dims: ContractionDims, operand: int, output_sharding: HloSharding | None,
                      other_sharding: HloSharding | None, operand_rank: int, other_rank: int,
                      output_rank: int) -> HloSharding:
    """XLA's InferDotOperandSharding: the sharding operand `operand` should have, from the output
    (the other operand's free dims replicated, batch and own free dims mapped back) merged with the
    one from the other operand (its free dims replicated, batch and contracting dims mapped
    across); the merge if compatible, else the more specific of the two (the output's on a tie)."""
    output_dims_to_replicate = [d.output for d in dims.non_contracting(1 - operand)] + \
        [d.output for d in dims.contracting if d.output >= 0]
    other_dims_to_replicate = [d.side(1 - operand) for d in dims.non_contracting(1 - operand)] + \
        [d.side(1 - operand) for d in dims.non_contracting(operand) if d.side(1 - operand) >= 0]
    sharding = HloSharding.replicate()
    if output_sharding is not None:
        reduced = algebra.partially_replicate_on_dims(output_sharding, output_dims_to_replicate) \
            if output_sharding.is_tiled else output_sharding
        out_to_op, op_to_out = [-1] * output_rank, [-1] * operand_rank
        for d in dims.batch + dims.non_contracting(operand):
            out_to_op[d.output] = d.side(operand)
            op_to_out[d.side(operand)] = d.output
        mapped = algebra.transpose_with_collapsed_dims(reduced, out_to_op, op_to_out) \
            if reduced.is_tiled else reduced
        sharding = mapped if mapped is not None else HloSharding.replicate()
    if other_sharding is None or not is_spatially_partitioned(other_sharding) or \
            not other_sharding.is_tiled:
        return sharding
    reduced = algebra.partially_replicate_on_dims(other_sharding, other_dims_to_replicate)
    other_to_op, op_to_other = [-1] * other_rank, [-1] * operand_rank
    for d in dims.batch + dims.contracting:
        other_to_op[d.side(1 - operand)] = d.side(operand)
        op_to_other[d.side(operand)] = d.side(1 - operand)
    from_other = algebra.transpose_with_collapsed_dims(reduced, other_to_op, op_to_other) \
        if reduced.is_tiled else reduced
    if from_other is None:
        return sharding
    merged = merge_if_compatible(from_other, sharding)
    if merged is not None:
        return merged
    return from_other if is_more_specific(from_other, sharding) else sharding


def conv_spatial_partitions(dims: ContractionDims, operand: int, sharding: HloSharding | None) -> int:
    """How many tiles `sharding` puts on the operand's genuine convolution spatial dims."""
    if sharding is None or not sharding.is_tiled:
        return 1
    total = 1
    for d in dims.conv_spatial:
        total *= sharding.tile_counts[d.side(operand)]
    return total


def is_kernel_small(conv: Instruction) -> bool:
    """XLA's IsConvolutionKernelSmall: every spatial kernel dim is smaller than the output dim (a
    kernel dim up to 3 is allowed past the first two spatial dims while the kernel volume stays
    below the output volume)."""
    labels = conv.attrs["dim_labels"]
    rhs = conv.operands[1].shape
    kernel_volume = output_volume = 1
    for i, (k, o) in enumerate(zip(labels.rhs_spatial, labels.out_spatial)):
        kernel, output = rhs.dims[k], conv.shape.dims[o]
        kernel_volume *= kernel
        output_volume *= output
        if kernel >= output and (i < 2 or kernel > 3 or kernel_volume >= output_volume):
            return False
    return True


def lhs_aligned_output(conv: Instruction, sharding: HloSharding) -> HloSharding:
    """The lhs sharding moved onto the output dims (batch->batch, feature->feature,
    spatial i->spatial i)."""
    labels = conv.attrs["dim_labels"]
    perm = [0] * conv.shape.rank
    perm[labels.out_batch] = labels.lhs_batch
    perm[labels.out_feature] = labels.lhs_feature
    for lhs, out in zip(labels.lhs_spatial, labels.out_spatial):
        perm[out] = lhs
    return algebra.transpose(sharding, perm)
