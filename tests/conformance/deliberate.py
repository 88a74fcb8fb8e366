"""The differences from XLA's propagation that gspmdc makes on purpose (docs/propagation.md,
"Against XLA itself"), recognised in XLA's propagated module, so that the agreement figures can
be read with and without the modules that show one.

- sort: where XLA keeps an operand's tiles on the sort dimension (its partitioner moves them
  around the sort with an all-to-all pair), gspmdc moves them to another dimension during
  propagation, and the sort's neighbours follow.
"""
from __future__ import annotations

from gspmdc.ir.module import Module

SORT_ALONG_SORT_DIM = "a sort XLA tiles along its sort dimension"


def deliberate_differences(xla_propagated: Module) -> list[str]:
    """The deliberate differences (their descriptions, above) that XLA's propagated module gives
    occasion to: here, a sort one of whose results XLA tiles along the sort dimension (XLA may
    give a variadic sort's results different shardings, e.g. one taken back from a user tiled
    along the sort dimension and the others replicated; gspmdc's sort moves those tiles too)."""
    found = []
    for _, inst in xla_propagated.all_instructions():
        if inst.opcode != "sort" or inst.sharding is None:
            continue
        dim = inst.attrs["dimensions"][0]
        if any(leaf.is_tiled and leaf.tile_counts[dim] > 1
               for leaf in inst.sharding.leaf_shardings(inst.shape)):
            found.append(SORT_ALONG_SORT_DIM)
            break
    return found
