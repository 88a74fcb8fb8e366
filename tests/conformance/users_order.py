"""Proving a *users-order tie* (docs/propagation.md, "Against XLA itself"): a value whose users
want shardings with as many tiles, neither a sub-tiling of the other, takes the first user's; both
compilers take the first user, but XLA's first is its in-memory order of the users, which its
rewrites before propagation reorder and which the printed module does not show, while gspmdc's is
the order of the text.

A divergent case is one only when that is shown, not guessed: gspmdc propagates the module again
with the users of one value in another order, everything else as in its own run (the same
pipeline up to `propagate`, the same options), and gives XLA's answer on every instruction both
sides have. The values reordered are those whose sharding differs in gspmdc's own run (repeated
here, in the text's order: where a tie went the other way, the value took another user's
sharding), one at a time, in every order of up to `MAX_USERS` users, `MAX_ORDERS` orders at most.
"""
from __future__ import annotations

from itertools import permutations
from typing import TYPE_CHECKING

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.pipeline import partitioner_pipeline
from gspmdc.passes.propagation.driver import Driver, PropagationOptions

from .correspondence import compare_shardings

if TYPE_CHECKING:
    from .differential import Case

#: values with more users than this are not reordered (their orders grow factorially)
MAX_USERS = 4
#: orders tried per case at most (a large module differing in many values stays unproven)
MAX_ORDERS = 120


def users_order_tie(before_text: str, case: "Case", xla_propagated: Module) -> bool:
    """Whether gspmdc, given `before_text` (the module XLA's propagation started from) with the
    users of one of its values in an order other than the text's, propagates it under `case`'s
    options to XLA's shardings (`xla_propagated`) on every instruction both sides have (and in
    the text's order does not)."""
    before = api.parse(before_text, case.name)

    def differing(order_of: tuple[str, str] | None, order: tuple[int, ...] = ()) -> set | None:
        propagated = _propagate_reordered(before_text, case, order_of, order)
        if propagated is None:
            return None
        return {(v.computation, v.name) for v in compare_shardings(before, propagated,
                                                                    xla_propagated)
                if v.compared and not v.agrees}

    ours = differing(None)
    if not ours:
        return False
    prepared = _prepared(before_text, case)[0]
    users = {(comp.name, inst.name): len(of) for comp in prepared.computations.values()
             for inst, of in comp.users().items()}
    candidates = [(value, order) for value in sorted(ours)
                  if 2 <= users.get(value, 0) <= MAX_USERS
                  for order in permutations(range(users[value]))
                  if order != tuple(range(users[value]))]
    return any(differing(value, order) == set() for value, order in candidates[:MAX_ORDERS])


def _prepared(text: str, case: "Case") -> tuple[Module, PropagationOptions]:
    """`text` after the passes of gspmdc's pipeline that run before `propagate`, and the options
    of its `propagate` pass under `case`'s settings."""
    passes = partitioner_pipeline()
    index = [p.name for p in passes].index("propagate")
    propagate = passes[index]
    options = PropagationOptions(
        is_spmd=propagate.is_spmd, propagate_to_output=(case.propagate_to_output,),
        propagate_to_parameters=(case.propagate_to_parameters,),
        cse_prevention_only=propagate.cse_prevention_only,
        execution_threads=propagate.execution_threads, record_origins=False)
    return (run_pipeline(PassContext(case.num_partitions), api.parse(text, case.name),
                         passes[:index]), options)


def _propagate_reordered(text: str, case: "Case", order_of: tuple[str, str] | None,
                         order: tuple[int, ...]) -> Module | None:
    """The module propagated by gspmdc (as `differential._gspmdc_compile` does, without origins)
    with the users of the value `order_of` (computation, name; None: none) taken in `order`
    (indices into the text order); None when gspmdc refuses it."""
    module, options = _prepared(text, case)
    driver = Driver(module, options)
    if order_of is not None:
        comp_name, name = order_of
        value = next(i for i in module.computations[comp_name].instructions if i.name == name)
        users = driver.graph.users[value]
        driver.graph.users[value] = [users[k] for k in order]
    try:
        driver.run()
    except GspmdcError:
        return None
    return api.parse(api.to_text(module), "<gspmdc propagated, users reordered>", verify=False)
