"""Windowed einsum (collective matmul, docs/design/partitioning.md#windowed-einsum): a dot whose
operand would be all-gathered,
or whose partial result would be reduce-scattered, runs as a loop of `t` steps over the `t` tiles
of that dim instead, each step a partial dot on one block while a `collective-permute` passes
blocks to the neighbour on the ring (device with ordinal `o` sends to `o - 1`), so the
communication of a step can overlap the dot of the same step. Same bytes as the collective it
replaces, in `t - 1` messages of one block.

The `windowed-einsum` pass (only in the pipeline when a threshold is given:
`compile_spmd(..., windowed_einsum_threshold=BYTES)`, `gspmdc compile/run
--windowed-einsum-threshold BYTES`; off by default, as XLA's default threshold is very high)
runs after insert-reshards on the global IR and rewrites two patterns whose global value exceeds
the threshold:

- **AG**: `dot(reshard(x), y)` (or mirrored) where the reshard only all-gathers one free or
  contracting dim `f` of `x`: the dot takes `x` as it is and is marked
  `frontend_attributes={windowed_einsum="ag operand K dim F"}`;
- **RS**: `reshard(dot)` where the dot leaves partial sums over one tiled contracting dim and the
  reshard reduce-scatters them into an output dim `g` whose operand dim (`e` of the operand that
  has it) is whole: the dot takes the reshard's sharding and is marked `"rs operand K dim E"`.

The module still evaluates to the same result (only shardings changed); lower-spmd lowers a
marked dot with `lower_windowed` (called by the dot rule):

| pattern | before the loop | step for block `q` | after |
|---|---|---|---|
| AG, `f` free | buffer: the result with output dim of `f` holding `t` blocks | `dynamic-update-slice(buffer, dot(x block, y), q * shard)` | slice off padding |
| AG, `f` contracting | `y`'s matching dim padded with zeros to `t` blocks | `acc + dot(x block, dynamic-slice(y, q))` | — |
| RS | the operand's dim `e` padded to `t` blocks | `permute(acc) + dot(x, dynamic-slice(y, q))` | — |

AG steps `i = 0..t-1` use block `q = (o + i) mod t`, the block received after `i` permutes; RS
step `i` computes block `q = (o + i + 1) mod t` and ends on the device's own block. The loop is a
real `while` (state: counter, circulating block, fixed operand, accumulator; the counter runs
from a constant by 1 to a constant, so trip counts are static): the first RS step and the last
AG step are peeled out of it, so no iteration sends a block nobody reads. Uneven tiles: blocks are
shard-sized; padding of a contracting dim is masked by pad-uneven (the tiled operand) or zeros
(the padded one), padding of a free dim lands in the result's padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir import dtypes
from gspmdc.ir import sharding_algebra as algebra
from gspmdc.ir.attributes import ComputationRef, KeyValueList
from gspmdc.ir.frontend_attributes import (
    WINDOWED_EINSUM, frontend_attribute, set_frontend_attribute,
)
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .builder import Builder, NameUniquer, add_computation
from .call_graph import partitioned_computations
from .op_rules import LowerContext
from .op_rules_dot import DotDims, dot_result
from .partition_ids import PartitionTables
from .reshard_nodes import is_inserted_reshard
from .tiling import Tiling, cdiv


@dataclass(frozen=True)
class Windowing:
    """`kind` "ag": operand `operand` circulates, tiled on its dim `dim`; "rs": the partial
    results circulate, operand `operand` is sliced along its whole dim `dim`."""

    kind: str
    operand: int
    dim: int

    def describe(self) -> str:
        return f"{self.kind} operand {self.operand} dim {self.dim}"

    @classmethod
    def of(cls, inst: Instruction) -> "Windowing | None":
        text = frontend_attribute(inst, WINDOWED_EINSUM)
        if text is None:
            return None
        kind, _, operand, _, dim = text.split()
        return cls(kind, int(operand), int(dim))


@dataclass(frozen=True)
class WindowedEinsum(ModulePass):
    """Mark big dots to run as windowed einsums (loops of partial dots and permutes).

    `threshold`: the global bytes the gathered operand (AG) or the result (RS) must reach (see
    the module docstring)."""

    name = "windowed-einsum"
    accepts = frozenset({Stage.RESHARDED})
    threshold: int = 0

    def __post_init__(self):
        if self.threshold < 0:
            raise GspmdcError(f"the windowed einsum threshold must not be negative, got "
                              f"{self.threshold}")

    def apply(self, ctx: PassContext, module: Module) -> Module:
        for comp in partitioned_computations(module):
            _rewrite(comp, ctx.num_partitions, self.threshold)
        return module


def _rewrite(comp: Computation, n: int, threshold: int) -> None:
    users = comp.users()
    replaced: dict[Instruction, Instruction] = {}
    for inst in comp.instructions:
        inst.operands = [replaced.get(o, o) for o in inst.operands]
        if inst.opcode != "dot" or inst.shape.element_type == "pred":
            continue
        windowing = _all_gather(inst, n, threshold)
        if windowing is None:
            windowing, reshard = _reduce_scatter(inst, users, n, threshold)
            if windowing is not None:
                inst.sharding = reshard.sharding
                replaced[reshard] = inst
        if windowing is not None:
            set_frontend_attribute(inst, WINDOWED_EINSUM, windowing.describe())
    comp.root = replaced.get(comp.root, comp.root)
    while True:                                          # detached reshards (and their chains)
        live = {comp.root} | {o for i in comp.instructions for o in i.operands}
        dead = [i for i in comp.instructions if i not in live and is_inserted_reshard(i)]
        if not dead:
            return
        comp.instructions = [i for i in comp.instructions if i not in dead]


def _plain(sharding: HloSharding) -> bool:
    return sharding.kind in ("tiled", "replicated") and (
        sharding.kind == "replicated" or "unreduced" not in sharding.subgroup_types)


def _bytes(shape: ArrayShape) -> int:
    return prod(shape.dims) * dtypes.byte_width(shape.element_type)


def _all_gather(inst: Instruction, n: int, threshold: int) -> Windowing | None:
    dn = DotDims.of(inst)
    for k, operand in enumerate(inst.operands):
        if not is_inserted_reshard(operand):
            continue
        source = operand.operands[0]
        if not (_plain(source.sharding) and _plain(operand.sharding)) or \
                _bytes(source.shape) < threshold:
            continue
        rank = source.shape.rank
        have = Tiling(source.sharding, rank, n)
        need = Tiling(operand.sharding, rank, n)
        windowed = (dn.lhs_free + dn.lhs_contracting) if k == 0 else \
            (dn.rhs_free + dn.rhs_contracting)
        for f in windowed:
            if have.counts[f] > 1 and \
                    algebra.partially_replicate_on_dims(have.sharding, [f]) == need.sharding:
                inst.operands[k] = source
                return Windowing("ag", k, f)
    return None


def _reduce_scatter(inst: Instruction, users, n: int, threshold: int):
    """The RS windowing of `inst` and the reshard it replaces, or `(None, None)`."""
    sharding = inst.sharding
    if not sharding.has_unreduced or _bytes(inst.shape) < threshold or len(users[inst]) != 1:
        return None, None
    reshard = users[inst][0]
    if not is_inserted_reshard(reshard) or not _plain(reshard.sharding):
        return None, None
    dn = DotDims.of(inst)
    lhs = inst.operands[0]
    lt = Tiling(lhs.sharding, lhs.shape.rank, n) if _plain(lhs.sharding) else None
    if lt is None or sum(lt.counts[d] > 1 for d in dn.lhs_contracting) != 1:
        return None, None
    rank = inst.shape.rank
    partial = Tiling(sharding, rank, n)
    target = Tiling(reshard.sharding, rank, n)
    to_output = (dn.lhs_to_output(lhs.shape.rank), dn.rhs_to_output(inst.operands[1].shape.rank))
    for k, free in ((0, dn.lhs_free), (1, dn.rhs_free)):
        for e in free:
            g = to_output[k][e]
            if partial.counts[g] == 1 and algebra.reduce_scatter_partials(
                    partial.sharding, g, partial.partial_groups(), rank, n) == target.sharding:
                return Windowing("rs", k, e), reshard
    return None, None


# ---- lowering ---------------------------------------------------------------------------------

def lower_windowed(inst: Instruction, ctx: LowerContext, windowing: Windowing) -> Instruction:
    """The local loop computing `inst`'s shard (see the module docstring)."""
    dn = DotDims.of(inst)
    operands = inst.operands
    tilings = [Tiling(o.sharding, o.shape.rank, ctx.num_devices) for o in operands]
    local = ctx.operands(inst)
    out = inst.sharding.shard_shape(inst.shape)
    k = windowing.operand
    if windowing.kind == "ag":
        tiling, f = tilings[k], windowing.dim
        t = tiling.counts[f]
        shard = local[k].shape.dims[f]
        ordinal = tiling.coordinates()[:, f]
        ring = _ring(tiling.devices, f)
        if f in (dn.lhs_free if k == 0 else dn.rhs_free):
            g = (dn.lhs_to_output if k == 0 else dn.rhs_to_output)(operands[k].shape.rank)[f]
            step = _FreeStep(inst, k, g, shard)
            buffer = out.with_dims([t * shard if d == g else n for d, n in enumerate(out.dims)])
        else:
            c = (dn.lhs_to_rhs if k == 0 else dn.rhs_to_lhs)(operands[k].shape.rank)[f]
            fixed = local[1 - k]
            local[1 - k] = ctx.builder.pad_high(
                fixed, [t * shard if d == c else n for d, n in enumerate(fixed.shape.dims)])
            step = _ContractingStep(inst, k, c, shard, out)
            buffer = out
        result = _loop(ctx, inst, step, ordinal, t, ring, circulating=local[k],
                       fixed=local[1 - k], acc=_zeros(ctx.builder, buffer), peel="last")
        return ctx.builder.slice_to(result, out.dims)
    e = windowing.dim
    partial = dot_result(tilings[0], tilings[1], dn)
    t = partial.unreduced
    shard = cdiv(operands[k].shape.dims[e], t)
    fixed = local[k]
    local[k] = ctx.builder.pad_high(
        fixed, [t * shard if d == e else n for d, n in enumerate(fixed.shape.dims)])
    ordinal = partial.coordinates()[:, partial.rank]
    ring = _ring(partial.devices, partial.rank)
    step = _ContractingStep(inst, 1 - k, e, shard, out)
    return _loop(ctx, inst, step, ordinal, t, ring, circulating=None,
                 fixed=(local[1 - k], local[k]), acc=None, peel="first")


def _ring(devices: np.ndarray, axis: int) -> np.ndarray:
    """`[N, 2]` pairs: every device sends to the one before it on `axis` (cyclically)."""
    return np.stack([devices.ravel(), np.roll(devices, 1, axis=axis).ravel()], axis=1)


def _zeros(b: Builder, shape: ArrayShape) -> Instruction:
    return b.broadcast(b.zero(shape.element_type), shape.dims)


class _Step:
    """One step's local work: the dot of a block (`q`: its block index) into the accumulator."""

    def __init__(self, inst: Instruction, k: int, dim: int, shard: int):
        self.inst, self.k, self.dim, self.shard = inst, k, dim, shard

    def dot(self, b: Builder, lhs: Instruction, rhs: Instruction, shape: ArrayShape):
        attrs = {key: value for key, value in self.inst.attrs.items()
                 if key != "frontend_attributes"}
        return b.add("dot", shape, [lhs, rhs], attrs, name=f"{self.inst.name}.step")

    def offset(self, b: Builder, q: Instruction) -> Instruction:
        return b.binary("multiply", q, b.constant(self.shard, "s32"))

    def starts(self, b: Builder, q: Instruction, rank: int) -> list[Instruction]:
        zero = b.constant(0, "s32")
        return [self.offset(b, q) if d == self.dim else zero for d in range(rank)]


class _FreeStep(_Step):
    """AG over a free dim: the block's dot is written at its place in the result buffer."""

    def __call__(self, b, q, block, fixed, acc):
        lhs, rhs = (block, fixed) if self.k == 0 else (fixed, block)
        dims = list(acc.shape.dims)
        dims[self.dim] = self.shard
        piece = self.dot(b, lhs, rhs, acc.shape.with_dims(dims))
        return b.add("dynamic-update-slice", acc.shape.with_dims(acc.shape.dims),
                     [acc, piece, *self.starts(b, q, acc.shape.rank)])


class _ContractingStep(_Step):
    """AG over a contracting dim, or RS: the other operand (`fixed`) is sliced at block `q` on
    its dim `dim`; the dot is added to the accumulator (None: the dot is the first value)."""

    def __init__(self, inst, k, dim, shard, out: ArrayShape):
        super().__init__(inst, k, dim, shard)
        self.out = out

    def __call__(self, b, q, block, fixed, acc):
        sizes = list(fixed.shape.dims)
        sizes[self.dim] = self.shard
        piece = b.dynamic_slice(fixed, self.starts(b, q, fixed.shape.rank), sizes)
        lhs, rhs = (block, piece) if self.k == 0 else (piece, block)
        product = self.dot(b, lhs, rhs, self.out)
        return product if acc is None else b.binary("add", acc, product)


def _loop(ctx: LowerContext, inst: Instruction, step, ordinal: np.ndarray, t: int,
          ring: np.ndarray, circulating: Instruction, fixed, acc, peel: str) -> Instruction:
    """Emit the steps as a `while` loop. AG (`peel="last"`): `circulating` is the block, step
    `i` uses block `(o + i) mod t` then passes it on; the last step follows the loop. RS
    (`peel="first"`, `fixed` = (block operand, sliced operand), `circulating` = None): step 0
    precedes the loop and starts the accumulator, step `i` adds block `(o + i + 1) mod t` to
    the received one."""
    b = ctx.builder
    metadata = KeyValueList((("op_type", "windowed-einsum"), ("op_name", inst.name),
                             ("spmd_reason", f"dot as a {t}-step windowed einsum "
                                             f"({Windowing.of(inst).describe()})")))
    shift = 0 if peel == "last" else 1

    def block_index(builder, tables, i):
        o = tables.lookup(ordinal, "ring.ordinal")
        total = builder.binary("add", o, builder.constant(shift, "s32") if i is None else
                               builder.binary("add", i, builder.constant(shift, "s32")))
        return builder.binary("remainder", total, builder.constant(t, "s32"))

    with b.scope(metadata):
        if peel == "first":
            block, sliced = fixed
            acc = step(b, block_index(b, ctx.tables, None), block, sliced, circulating)
            state = [b.constant(1, "s32"), acc, block, sliced]
        else:
            state = [b.constant(0, "s32"), circulating, fixed, acc]
        if t > 1:
            shape = TupleShape(tuple(s.shape for s in state))
            body = _body(ctx, inst, shape, step, block_index, ring, peel, metadata)
            bound = t if peel == "first" else t - 1
            cond = _condition(ctx.module, inst, shape, bound)
            loop = b.add("while", shape, [b.add("tuple", shape, state)],
                         {"condition": ComputationRef(cond.name),
                          "body": ComputationRef(body.name)}, name=f"{inst.name}.windowed")
            state = [b.add("get-tuple-element", s, [loop], {"index": j})
                     for j, s in enumerate(shape.elements)]
        if peel == "first":
            return state[1]
        last = b.constant(t - 1, "s32")
        return step(b, block_index(b, ctx.tables, last), state[1], state[2], state[3])


def _body(ctx: LowerContext, inst: Instruction, shape: TupleShape, step, block_index,
          ring: np.ndarray, peel: str, metadata: KeyValueList) -> Computation:
    names = NameUniquer()
    b = Builder(names)
    tables = PartitionTables(b, ctx.num_devices)
    with b.scope(metadata):
        param = b.add("parameter", shape, name="state", parameter_number=0)
        i, first, second, third = [b.add("get-tuple-element", s, [param], {"index": j})
                                   for j, s in enumerate(shape.elements)]
        q = block_index(b, tables, i)
        if peel == "first":                             # (i, acc, block, sliced)
            received = b.collective_permute(first, ring, ctx.channels())
            new = [step(b, q, second, third, received), second, third]
        else:                                           # (i, block, fixed, acc)
            acc = step(b, q, first, second, third)
            new = [b.collective_permute(first, ring, ctx.channels()), second, acc]
        one = b.constant(1, "s32")
        root = b.add("tuple", shape, [b.binary("add", i, one), *new])
    return add_computation(ctx.module, f"{inst.name}.windowed_body", b.instructions, root)


def _condition(module: Module, inst: Instruction, shape: TupleShape, bound: int) -> Computation:
    b = Builder(NameUniquer())
    param = b.add("parameter", shape, name="state", parameter_number=0)
    i = b.add("get-tuple-element", shape.elements[0], [param], {"index": 0})
    root = b.compare(i, b.constant(bound, "s32"), "LT")
    return add_computation(module, f"{inst.name}.windowed_condition", b.instructions, root)


__all__ = ["WindowedEinsum", "Windowing", "lower_windowed"]
