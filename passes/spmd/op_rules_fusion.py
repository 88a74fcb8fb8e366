"""Partitioning of `fusion` (docs/design/partitioning.md#per-op-rules).

An elementwise fusion (`ir/elementwise.py`: its fused root depends only on parameters,
constants, elementwise ops and no-ops) is partitioned as one elementwise op: the operands its
computation reads arrive in the result's sharding and the fused computation runs on the local
shards. Candidates, as for an elementwise op: the annotated result sharding and each read
operand's own sharding; the cheapest wins. An operand the computation never reads keeps its
sharding (nothing moves). The local fusion calls a local copy of the fused computation:

- parameters take the local operands' shapes; instructions the root does not depend on and
  no-ops are left out;
- every other instruction has the fusion's dims, and gets the shard's dims (padding stays
  padding, as for elementwise ops);
- a constant whose elements are all equal is built shard-shaped; another array constant
  becomes a new trailing operand of the fusion, the caller's copy of the constant sliced to
  this partition's shard (locally, nothing is sent).

XLA's partitioner clones the fusion on local shapes but keeps the global fused computation (its
verifier then refuses the module); gspmdc partitions it as described.

Other fusions, and elementwise ones holding an `rng` (whose draws would depend on the
partitioning), use the default action: the fused computation runs whole on replicated operands.
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir.attributes import ComputationRef, Literal
from gspmdc.ir.elementwise import is_elementwise_fusion, live_fused_instructions, skip_no_ops
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.ops import PARTITION_RULES, RNG_STATE
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape

from .builder import NameUniquer
from .op_rules import DEFAULT_RULE, OpPlan, PartitionRule, clone, without_partials
from .op_rules_data import is_splat
from .reshard import emit_reshard
from .reshard_plan import plan_reshard


@PARTITION_RULES.register("fusion", instance=True)
class FusionRule(PartitionRule):
    def plan(self, inst, ctx):
        if not runs_on_shards(inst, ctx.computations):
            return DEFAULT_RULE.plan(inst, ctx)
        read = _read_operands(inst, ctx.computations)
        candidates = [without_partials(inst.sharding)]
        for k in read:
            sharding = inst.operands[k].sharding
            if sharding not in candidates and sharding == without_partials(sharding):
                candidates.append(sharding)
        plans = [OpPlan(tuple(c if k in read else o.sharding
                              for k, o in enumerate(inst.operands)),
                        c, "an elementwise fusion runs on its operands' shards")
                 for c in candidates]
        return ctx.choose(inst, plans)

    def lower(self, inst, ctx):
        if not runs_on_shards(inst, ctx.module.computations):
            return DEFAULT_RULE.lower(inst, ctx)
        fused = ctx.module.computations[inst.attr("calls").name]
        operands = ctx.operands(inst)
        name = _fresh_name(ctx.module, fused.name)
        local_fused, hoisted = _local_computation(fused, name, [o.shape for o in operands],
                                                  inst.sharding)
        _add_before_entry(ctx.module, local_fused)
        operands += [_constant_shard(constant, inst.sharding, ctx) for constant in hoisted]
        local = clone(inst, ctx, operands)
        local.attrs["calls"] = ComputationRef(name)
        return local


def runs_on_shards(inst: Instruction, computations: dict[str, Computation]) -> bool:
    """Whether the fusion `inst` is partitioned as an elementwise op (module docstring)."""
    if not isinstance(inst.shape, ArrayShape) or inst.sharding is None or \
            inst.sharding.has_manual_leaf or not is_elementwise_fusion(inst, computations):
        return False
    fused = computations[inst.attr("calls").name]
    return not any(i.opcode == "rng" or i.opcode in RNG_STATE
                   for i in live_fused_instructions(fused))


def _read_operands(inst: Instruction, computations: dict[str, Computation]) -> set[int]:
    """The operand numbers whose fused parameters the fused root depends on."""
    fused = computations[inst.attr("calls").name]
    return {i.parameter_number for i in live_fused_instructions(fused)
            if i.opcode == "parameter"}


def _local_computation(fused: Computation, name: str, operand_shapes: list,
                       sharding: HloSharding) -> tuple[Computation, list[Instruction]]:
    """The fused computation on shards (module docstring) under `name`, and the array
    constants it takes as trailing parameters, in parameter order."""
    local: dict[Instruction, Instruction] = {}
    instructions: list[Instruction] = []
    hoisted: list[Instruction] = []
    for param in fused.parameters:
        local[param] = Instruction(param.name, "parameter", operand_shapes[param.parameter_number],
                                   parameter_number=param.parameter_number)
        instructions.append(local[param])
    names = NameUniquer(i.name for i in fused.instructions)
    for inst in live_fused_instructions(fused):
        if inst.opcode == "parameter":
            continue
        shape = sharding.shard_shape(inst.shape)
        if inst.opcode == "constant" and inst.shape.rank > 0 and not is_splat(inst):
            new = Instruction(names(f"{inst.name}.shard"), "parameter", shape,
                              parameter_number=len(operand_shapes) + len(hoisted))
            hoisted.append(inst)
        elif inst.opcode == "constant":
            value = inst.literal.value.reshape(-1)[:1].reshape(())
            new = Instruction(inst.name, "constant", shape, (), dict(inst.attrs),
                              literal=Literal(np.full(shape.dims, value, dtype=value.dtype)))
        else:
            new = Instruction(inst.name, inst.opcode, shape,
                              [local[skip_no_ops(op)] for op in inst.operands], dict(inst.attrs))
        local[inst] = new
        instructions.append(new)
    return Computation(name, instructions, local[skip_no_ops(fused.root)]), hoisted


def _constant_shard(constant: Instruction, sharding: HloSharding, ctx) -> Instruction:
    """`constant` in the caller, sliced to this partition's shard of `sharding`."""
    b = ctx.builder
    whole = b.add("constant", constant.shape, name=constant.name, literal=constant.literal,
                  sharding=HloSharding.replicate())
    plan = plan_reshard(constant.shape, HloSharding.replicate(), sharding, ctx.num_devices)
    return emit_reshard(ctx, whole, constant.shape, plan)


def _fresh_name(module: Module, base: str) -> str:
    name, k = f"{base}.shard", 0
    while name in module.computations:
        k += 1
        name = f"{base}.shard.{k}"
    return name


def _add_before_entry(module: Module, comp: Computation) -> None:
    computations = list(module.computations.values())
    entry_at = [c.name for c in computations].index(module.entry_name)
    computations.insert(entry_at, comp)
    module.computations = {c.name: c for c in computations}


__all__ = ["FusionRule", "runs_on_shards"]
