"""The halo-exchange pass: record on every windowed op the halo exchange lower-spmd will emit.

After insert-reshards the operands of `reduce-window`, `pad`, `slice`, `concatenate`,
`reverse` and `select-and-scatter` carry the shardings their rules chose
(`op_rules_window.py`); where one of them keeps a windowed dim tiled, each partition needs its
neighbours' elements. Other rules with halos (e.g.
convolution) take part by offering `halo_plans(inst, num_partitions)` (per operand, dim →
`HaloPlan`). This pass writes the plan as

    frontend_attributes={halo="operand 0 dim 1: left=1,right=1,from_left=1,from_right=1,mask,
                                  shards=4,input=3,output=3,window=5,valid=10,offsets=0"}

per operand and dim: `left`/`right` are the elements before/after its own shard each partition's
window covers (one number when all shards agree, else a per-shard `[..]` table indexed by the
shard's position), `from_left`/`from_right` the elements received from the partitions on each
side (one `collective-permute` per shard-sized hop), `dilate=b` a local base dilation first, and
`mask` that positions outside the data are replaced by the op's pad/init value; then the rest
of the plan (`HaloPlan.to_text`): `shards`, the local base elements of a shard (`input`), the
outputs of a shard (`output`), the window input each shard computes on (`window`), the real
base positions (`valid`), where each shard's window starts in the concatenation of received
and own elements (`offsets`), the padding of that concatenation (`pad=low_high`, when
any) and, when some shard receives fewer hops than its neighbours offer, per shard the farthest
hop it receives (`reach_left`, `reach_right`) and the near hops it skips (`skip_left`,
`skip_right`). A cumulative reduce-window records `prefix scan over n shards ...` instead
(`prefix_scan.py`). The program is otherwise unchanged (it still evaluates to the same result).
lower-spmd reads the plans back (`halo.recorded_plans`) and emits exactly them, without
computing them again.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.ir.frontend_attributes import HALO, set_frontend_attribute
from gspmdc.ir.module import Module
from gspmdc.ir.ops import PARTITION_RULES
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .call_graph import partitioned_computations
from .halo import describe_plans
from .op_rules_window import WindowRule


@dataclass(frozen=True)
class HaloExchange(ModulePass):
    """Record on windowed ops the halo exchange of each partition (`halo=`).

    Annotates the windowed ops of the partitioned computations (the entry, loop bodies,
    branches) with their halo plans (see the module docstring)."""

    name = "halo-exchange"
    accepts = frozenset({Stage.PADDED})
    produces = Stage.HALO_PLANNED

    def apply(self, ctx: PassContext, module: Module) -> Module:
        # the rules with halos, by opcode, looked up once (most instructions have none)
        rules = {opcode: rule for opcode, rule in PARTITION_RULES.rules.items()
                 if isinstance(rule, WindowRule) or hasattr(rule, "halo_plans")}
        for comp in partitioned_computations(module):
            for inst in comp.instructions:
                rule = rules.get(inst.opcode)
                if rule is None:
                    continue
                if isinstance(rule, WindowRule):
                    text = rule.halo_description(inst, ctx.num_partitions, module.computations)
                else:
                    text = describe_plans(rule.halo_plans(inst, ctx.num_partitions))
                set_frontend_attribute(inst, HALO, text or None)
        return module


__all__ = ["HaloExchange"]
