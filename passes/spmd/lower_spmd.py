"""The lower-spmd pass: rewrite the global program (after insert-reshards and pad-uneven) into
the per-partition program.

Every instruction of the entry computation and of its control-flow callees (`call_graph.py`) is
lowered by its op rule (`op_rules.py`) onto the
local values of its operands; its result has the shard shape of its sharding (`cdiv` on tiled
dims, so uneven dims are padded to the ceiling shard size). Reshard nodes become the collectives
and local slices of their plans (`reshard.py`; a value uniform along some dims, `uniform_dims.py`,
through its first element along them, `reshard_uniform.py`), per-partition values come from
constant tables indexed by `partition-id` (`partition_ids.py`), and instructions keep their
names and shardings
(for reading the program; collectives carry none). Collectives use explicit replica groups of
partition ids with `use_global_device_ids=true` (printed in iota form where it applies). Once
every computation is lowered, the reshards are re-routed where another of their plans lowers
the program's bytes (`reshard_routes.py`).

The module header gets `num_partitions=N`, `entry_computation_layout` (when present) with the
local shapes, and `spmd_global_signature={(global parameter shapes)->global result shape}`: with
the shardings the entry parameters and root keep, what a runtime needs to scatter inputs and
assemble outputs. Other called computations (reducers, comparators) run unchanged on every
partition; their shardings are dropped. An elementwise fusion calls a local copy of its fused
computation (`op_rules_fusion.py`); a fused computation no fusion calls any more is removed.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.errors import InternalError
from gspmdc.ir.attributes import RawAttr
from gspmdc.ir.module import Computation, Module
from gspmdc.ir.shapes import compatible
from gspmdc.ir.stage import GLOBAL_SIGNATURE_KEY, Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .builder import Builder, NameUniquer
from .call_graph import partitioned_computations
from .op_rules import LowerContext
from .partition_ids import PartitionTables
from .partition_rules import rule_for
from .reshard_routes import balance
from .uniform_dims import UniformDims


@dataclass(frozen=True)
class LowerSpmd(ModulePass):
    """Emit the per-partition program: local shapes, partition-id tables, collectives."""

    name = "lower-spmd"
    accepts = frozenset({Stage.HALO_PLANNED})
    produces = Stage.PARTITIONED

    def apply(self, ctx: PassContext, module: Module) -> Module:
        signature = global_signature(module)
        partitioned = partitioned_computations(module)
        fused = {inst.attrs["calls"].name for comp in module.computations.values()
                 for inst in comp.instructions if inst.opcode == "fusion"}
        lowered = [(comp, _lower(module, comp, ctx)) for comp in partitioned]
        if fused:
            _drop_uncalled(module, fused)
        balance(module, lowered, ctx.num_partitions)
        for other in module.computations.values():
            if all(other is not comp for comp in partitioned):
                for inst in other.instructions:
                    inst.sharding = None
        module.attrs["num_partitions"] = ctx.num_partitions
        if "entry_computation_layout" in module.attrs:
            module.attrs["entry_computation_layout"] = RawAttr(_layout_text(module))
        module.attrs[GLOBAL_SIGNATURE_KEY] = RawAttr(signature)
        return module


def _lower(module: Module, comp: Computation, pass_ctx: PassContext) -> LowerContext:
    """Replace `comp`'s instructions by their local forms (own partition tables); the context
    they were lowered in."""
    b = Builder(NameUniquer(i.name for i in comp.instructions))
    ctx = LowerContext(b, PartitionTables(b, pass_ctx.num_partitions), module,
                       pass_ctx.channel_ids, local={}, uniform=UniformDims())
    for inst in comp.instructions:
        local = rule_for(inst, module.computations).lower(inst, ctx)
        expected = inst.sharding.shard_shape(inst.shape)
        # most rules give the shard shape itself (one object per sharding and shape)
        if local.shape is not expected and not compatible(local.shape, expected):
            raise InternalError(f"lowering {inst.name} ({inst.opcode}) gave {local.shape}, "
                                f"expected the shard shape {expected}")
        ctx.local[inst] = local
    comp.instructions = b.instructions
    root_sharding = comp.root.sharding
    comp.root = ctx.local[comp.root]
    comp.root.sharding = root_sharding
    return ctx


def _drop_uncalled(module: Module, names: set[str]) -> None:
    """Remove the computations of `names` no instruction calls any more (fused computations
    whose fusions now call local copies, `op_rules_fusion.py`)."""
    called = {name for _, inst in module.all_instructions()
              for name in inst.called_computation_names()}
    module.computations = {name: comp for name, comp in module.computations.items()
                           if name in called or name not in names}


def global_signature(module: Module) -> str:
    """`{(p0, p1, ...)->root}`: the entry's global parameter and result shapes (no layouts)."""
    entry = module.entry
    params = ", ".join(str(p.shape.without_layout()) for p in entry.parameters)
    return "{(" + params + ")->" + str(entry.root.shape.without_layout()) + "}"


def _layout_text(module: Module) -> str:
    entry = module.entry
    params = ", ".join(str(p.shape) for p in entry.parameters)
    return "{(" + params + ")->" + str(entry.root.shape) + "}"


__all__ = ["LowerSpmd", "global_signature"]
