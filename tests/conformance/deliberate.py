"""The known differences from XLA's propagation (docs/propagation.md, "Against XLA itself"): the
one gspmdc makes on purpose, recognised in XLA's propagated module, and the users-order ties,
proven by propagating again; so that the agreement figures can be read with and without the
modules that show one.

- sort: where XLA keeps an operand's tiles on the sort dimension (its partitioner moves them
  around the sort with an all-to-all pair), gspmdc moves them to another dimension during
  propagation, and the sort's neighbours follow.
- users-order tie: a tie between users goes to the first user, and XLA's first is in an order
  its printed module does not show; counted only where gspmdc, given another order of one
  value's users, gives XLA's answer (`users_order.py`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gspmdc.ir.module import Module

from .users_order import users_order_tie

if TYPE_CHECKING:
    from .differential import Case

SORT_ALONG_SORT_DIM = "a sort XLA tiles along its sort dimension"
USERS_ORDER_TIE = ("a users-order tie (gspmdc gives XLA's answer with another order of one "
                   "value's users)")


def deliberate_differences(before_text: str, case: "Case", xla_propagated: Module) -> list[str]:
    """The deliberate differences (their descriptions, above) that a case whose shardings differ
    shows, given the module XLA's propagation started from (`before_text`) and XLA's propagated
    module: a sort one of whose results or operands XLA tiles along the sort dimension
    (`_sort_along_sort_dim`) or, failing that, a proven users-order tie."""
    if _sort_along_sort_dim(xla_propagated):
        return [SORT_ALONG_SORT_DIM]
    if users_order_tie(before_text, case, xla_propagated):
        return [USERS_ORDER_TIE]
    return []


def _sort_along_sort_dim(xla_propagated: Module) -> bool:
    """Whether XLA tiles some sort's result or operand along its sort dimension (XLA may give a
    variadic sort's results different shardings, e.g. one taken back from a user tiled along the
    sort dimension and the others replicated, or, its operand tiled so, results from their users
    that are not; gspmdc's sort moves those tiles)."""
    for _, inst in xla_propagated.all_instructions():
        if inst.opcode != "sort":
            continue
        dim = inst.attrs["dimensions"][0]
        shardings = [(inst.sharding, inst.shape)] + [(o.sharding, o.shape) for o in inst.operands]
        if any(leaf.is_tiled and leaf.tile_counts[dim] > 1
               for sharding, shape in shardings if sharding is not None
               for leaf in sharding.leaf_shardings(shape)):
            return True
    return False
