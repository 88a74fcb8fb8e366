"""A `slice` of a `pad` (through single-use copies) on a tiled dim becomes one `pad` before
partitioning, as XLA's partitioner preprocesses such chains: the pad alone would exchange halos
to make room for its padding and the slice exchange them again to shift its window, where the
merged pad (its edge padding less the slice's cut, negative where it crops) exchanges them
once.

`merge_pad_slices(comp)` rewrites every such slice of `comp` in place (it keeps its name,
shape, sharding and metadata) and drops the copies and the pad it read. A chain merges when
the pad and every copy between have that one user, the pad has the slice's sharding (tiled,
not manual), no dim is padded inside or sliced with a stride, and some tiled dim is both padded
and cut by the slice (elsewhere one halo exchange at most happens anyway)."""
from __future__ import annotations

from gspmdc.ir.attributes import PadDim
from gspmdc.ir.module import Computation, Instruction


def merge_pad_slices(comp: Computation) -> None:
    users = None
    dropped: set[Instruction] = set()
    for inst in comp.instructions:
        if inst.opcode != "slice" or inst.sharding is None or not inst.sharding.is_tiled or \
                inst.sharding.has_manual_leaf:
            continue
        if users is None:
            users = comp.users()        # at the first tiled slice (most computations have none)
        chain, pad = [], inst.operands[0]
        while pad.opcode == "copy" and len(users[pad]) == 1:
            chain.append(pad)
            pad = pad.operands[0]
        if pad.opcode != "pad" or len(users[pad]) != 1 or pad.sharding != inst.sharding:
            continue
        merged = _merged_padding(pad, inst)
        if merged is None:
            continue
        attrs = {key: value for key, value in inst.attrs.items() if key != "slice"}
        inst.opcode, inst.operands = "pad", list(pad.operands)
        inst.attrs = {"padding": merged, **attrs}
        dropped.update(chain + [pad])
    if dropped:
        comp.instructions = [i for i in comp.instructions if i not in dropped]


def _merged_padding(pad: Instruction, sliced: Instruction) -> tuple[PadDim, ...] | None:
    """The one padding doing `pad` then `sliced`'s slice, or None where they do not merge (a dim
    padded inside or sliced with a stride) or need not (no tiled dim both padded and cut)."""
    counts = sliced.sharding.tile_counts
    merged, needed = [], False
    for d, (p, s) in enumerate(zip(pad.attr("padding"), sliced.attr("slice"))):
        if p.interior != 0 or s.stride != 1:
            return None
        size = pad.shape.dims[d]
        needed |= counts[d] > 1 and (p.low, p.high) != (0, 0) and \
            sliced.shape.dims[d] != size
        merged.append(PadDim(p.low - s.start, s.limit - (size - p.high)))
    return tuple(merged) if needed else None


__all__ = ["merge_pad_slices"]
