"""Shardy's sharding propagation, the second propagation mode (`--propagation shardy`).

    from gspmdc.passes.shardy import propagate_shardy
    propagate_shardy(module)        # in place: a module in Shardy form (xla.sdy.meshes)

Modules: `axes` (mesh axis algebra), `factor_rules` (the op sharding rules, as data per opcode),
`options` (`ShardyOptions`), `projection` (dimension <-> factor shardings), `factor_propagation`
(the basic and aggressive strategies), `graph` (values and ops of a module), `prepare` (constant splitting, sharding
constraints), `driver` (user priorities, op priorities, the worklist), `export` (writing the
shardings back), `lower` (shard_maps and Shardy-only constructs in the partitioner's form),
`import_gspmd` (a module in GSPMD form given a one-axis mesh, so that it propagates the Shardy
way too). The algorithm is described in
docs/design/shardy.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.ir.module import Module
from gspmdc.ir.sdy import module_meshes
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .lower import ShardyToGspmd
from .options import STRATEGIES, ShardyOptions

__all__ = ["propagate_shardy", "ShardyPropagation", "ShardyToGspmd", "ShardyOptions",
           "STRATEGIES"]


def propagate_shardy(module: Module, options: ShardyOptions | None = ShardyOptions()):
    """Propagate the Shardy shardings of `module` (in place) and write them back as Shardy and
    HloShardings, the module staying in Shardy form; calls must be inlined already (shard_map
    bodies excepted). With `options` None nothing propagates: the shardings as written are
    completed (HloShardings everywhere, manual inside shard_maps). Returns the shardings'
    `Provenance` (also written as `sharding_origin` attributes). The propagation's modules are
    imported here, not with the package: naming the pass (the pass table) must not load them."""
    from gspmdc.passes.spmd.call_graph import partitioned_computations, unshare_callees

    from .driver import propagate
    from .export import export
    from .graph import Graph
    from .import_gspmd import to_shardy_form
    from .prepare import (
        apply_constraints, open_conflicting_groups, reapply, shorten_constraint_chains,
        split_constants,
    )
    meshes = module_meshes(module)
    if meshes is None:          # GSPMD form: one mesh axis over the devices (import_gspmd)
        meshes = to_shardy_form(module)
    unshare_callees(module)
    computations = partitioned_computations(module)
    split_constants(module, computations)
    shorten_constraint_chains(module, computations)
    graph = Graph(module)
    if options is not None:
        applied = apply_constraints(graph)
        if open_conflicting_groups(graph):
            graph = Graph(module)
            reapply(graph, applied)
        propagate(graph, meshes, options)
    return export(graph, meshes)


@dataclass(frozen=True)
class ShardyPropagation(ModulePass):
    """The `shardy-propagate` pass (options as in `ShardyOptions`; `propagate` false: only
    complete the shardings as written). The origins of the shardings go to
    `ctx.provenance["shardy-propagate"]` (and `sharding_origin` attributes), for `explain`."""

    name = "shardy-propagate"
    accepts = frozenset({Stage.GLOBAL, Stage.PROPAGATED})
    produces = Stage.PROPAGATED
    strategy: str = "aggressive"
    op_priorities: bool = True
    conservative: bool = False
    propagate: bool = True

    def apply(self, ctx: PassContext, module: Module) -> Module:
        options = ShardyOptions(self.strategy, self.op_priorities, self.conservative) \
            if self.propagate else None
        ctx.provenance[self.name] = propagate_shardy(module, options)
        return module
