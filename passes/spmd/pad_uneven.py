"""The pad-uneven pass: make the padding of uneven shards harmless
(docs/design/partitioning.md#uneven-shards).

A dim of size S cut into t tiles has shards of `cdiv(S, t)` elements (lower-spmd gives every
partition that shard shape); the last tiles carry padding with unspecified values. Padding is
harmless for ops that map elements one to one, and for every reshard (data movement keeps padding
in padding). It is harmful where a padding element flows into a real one:

- `reduce` over a tiled uneven dim: the input is masked with the reduce's init value;
- `dot` (and `ragged-dot`) contracting over a tiled uneven dim: *both* operands are masked
  with 0 (a masked lhs alone would still give `0 * NaN`), except an operand whose padding is
  zeros already (`zero_padded`: a replicated value resharded into tiles, e.g. a weight that
  arrives whole), which a mask would copy for nothing.

The mask is written in the global IR as ops that are the identity on the global program:

    index = s32[...] iota(), iota_dimension=d          (the operand's sharding)
    valid = compare(index, broadcast(S_d)), direction=LT
    x'    = select(valid [and valid' ...], x, broadcast(fill))

so the module still evaluates to the same result; lower-spmd lowers the iota to
`local iota + this partition's offset` (a partition-id table lookup), which turns `valid` into
the per-partition valid-extent mask. Instructions are checked after insert-reshards, when their
operands carry their final shardings.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.ir.attributes import Ident, KeyValueList
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .builder import Builder, NameUniquer
from .call_graph import partitioned_computations
from .reshard_nodes import is_reshard


@dataclass(frozen=True)
class PadUneven(ModulePass):
    """Mask padding before reductions and contractions over uneven tiled dims."""

    name = "pad-uneven"
    accepts = frozenset({Stage.RESHARDED})
    produces = Stage.PADDED

    def apply(self, ctx: PassContext, module: Module) -> Module:
        for comp in partitioned_computations(module):
            _mask_computation(comp)
        return module


def _mask_computation(comp: Computation) -> None:
    """Mask the padding read by `comp`'s reductions and contractions. The instruction list is
    rebuilt from the first instruction that needs a mask on (most computations need none and
    are left as they are)."""
    instructions = comp.instructions
    b: Builder | None = None
    for position, inst in enumerate(instructions):
        if inst.opcode == "reduce":
            count = len(inst.operands) // 2
            dims = inst.attr("dimensions")
            for i in range(count):
                x = inst.operands[i]
                uneven = uneven_dims(x, dims)
                if uneven:
                    b = _builder(instructions, position) if b is None else b
                    inst.operands[i] = mask_padding(b, x, uneven, inst.operands[count + i],
                                                    inst, "the reduce's init value")
        elif inst.opcode in ("dot", "ragged-dot"):
            lhs, rhs = inst.operands[:2]
            lc = inst.attr("lhs_contracting_dims", ())
            rc = inst.attr("rhs_contracting_dims", ())
            lu, ru = uneven_dims(lhs, lc), uneven_dims(rhs, rc)
            if lu or ru:
                b = _builder(instructions, position) if b is None else b
                for operand, x, dims in ((0, lhs, lu), (1, rhs, ru)):
                    if not zero_padded(x):
                        inst.operands[operand] = mask_padding(
                            b, x, dims, _zero(b, x.shape.element_type), inst, "zero")
        if b is not None:
            b.append(inst)
    if b is not None:
        comp.instructions = b.instructions


def _builder(instructions: list[Instruction], position: int) -> Builder:
    """A builder over the instructions before `position`, every name of the computation
    taken."""
    return Builder(NameUniquer(i.name for i in instructions), instructions[:position])


def uneven_dims(x: Instruction, dims) -> list[int]:
    """The dims among `dims` that `x`'s sharding tiles without dividing them evenly."""
    sharding = x.sharding
    if sharding is None or not sharding.is_tiled:
        return []
    counts = sharding.tile_counts
    return [d for d in sorted(dims) if counts[d] > 1 and x.shape.dims[d] % counts[d]]


def zero_padded(x: Instruction) -> bool:
    """Whether the padding of `x`'s shards is known to be zeros: `x` is (a copy of) a reshard of
    a replicated value into tiles none of which lies wholly past the end of its dim. lower-spmd
    makes such a reshard by padding the whole value with zeros and slicing every partition's
    window out of it (`reshard._slice`); a tile wholly in the padding would instead be given a
    clamped window of real data."""
    sharding = x.sharding
    while x.opcode == "copy" and x.operands[0].sharding == sharding:
        x = x.operands[0]
    if not is_reshard(x) or sharding is None or not sharding.is_tiled or \
            any(t != "replicated" for t in sharding.subgroup_types):
        return False
    source = x.operands[0].sharding
    return source is not None and source.is_replicated and all(
        -(-n // t) * (t - 1) < n for n, t in zip(x.shape.dims, sharding.tile_counts))


def _zero(b: Builder, element_type: str) -> Instruction:
    zero = b.zero(element_type)
    zero.sharding = HloSharding.replicate()
    return zero


def mask_padding(b: Builder, x: Instruction, dims: list[int], fill: Instruction,
                 user: Instruction, fill_name: str) -> Instruction:
    """`x` with the padding of `dims` (under `x`'s sharding) replaced by the scalar `fill`."""
    if not dims:
        return x
    sharding = x.sharding
    shape = x.shape
    metadata = KeyValueList((
        ("op_type", "pad-mask"), ("op_name", user.name), ("spmd_value", x.name),
        ("spmd_reason", f"mask padding of uneven dims {list(dims)} with {fill_name} before "
                        f"{user.opcode}")))
    index_shape = ArrayShape("s32", shape.dims)
    pred_shape = ArrayShape("pred", shape.dims)
    with b.scope(metadata):
        valid = None
        for d in dims:
            index = b.add("iota", index_shape, attrs={"iota_dimension": d},
                          name=f"{x.name}.index", sharding=sharding)
            size = b.constant(shape.dims[d], "s32", name=f"{x.name}.size")
            size.sharding = HloSharding.replicate()
            limit = b.add("broadcast", index_shape, [size], {"dimensions": ()},
                          name=f"{x.name}.limit", sharding=sharding)
            inside = b.add("compare", pred_shape, [index, limit], {"direction": Ident("LT")},
                           name=f"{x.name}.valid", sharding=sharding)
            valid = inside if valid is None else \
                b.add("and", pred_shape, [valid, inside], name=f"{x.name}.valid",
                      sharding=sharding)
        filler = b.add("broadcast", shape.with_dims(shape.dims), [fill], {"dimensions": ()},
                       name=f"{x.name}.fill", sharding=sharding)
        return b.add("select", shape.with_dims(shape.dims), [valid, x, filler],
                     name=f"{x.name}.masked", sharding=sharding)


__all__ = ["PadUneven", "uneven_dims", "mask_padding", "zero_padded"]
