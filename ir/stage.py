"""A module's stage: how far through gspmdc's partitioning pipeline it is.

The stage is recorded in the module header as a frontend attribute, which XLA's own parser
accepts and keeps:

    HloModule m, frontend_attributes={gspmdc.stage="resharded"}

Each pass of the pipeline writes the stage it leaves the module at, and refuses a module at a
stage it cannot take (`passes/pass_manager.py`). The stages, in pipeline order:

| stage         | the module is                                                          |
|---------------|------------------------------------------------------------------------|
| `global`      | a global program with sharding annotations (manual regions allowed)    |
| `propagated`  | a global program whose shardings propagation completed                  |
| `resharded`   | a global program with every reshard explicit (after insert-reshards)   |
| `padded`      | ... with the padding of uneven shards masked (after pad-uneven)        |
| `halo-planned`| ... with the halo exchange of every windowed op recorded (halo-exchange) |
| `partitioned` | one SPMD program per partition (after lower-spmd): local shapes       |

Every stage but `partitioned` is a global program: it runs on global inputs and evaluates to
the result of the original program.

A module without the attribute (written by hand, by JAX, by XLA) gets its stage from one rule
(`inferred_stage`): it is `partitioned` when it is evidently an SPMD program — it has a
`partition-id`, a collective across partitions (a `channel_id`: an all-reduce without one
combines replicas) or gspmdc's `spmd_global_signature` header — and nothing in it belongs to a
global program:
no manual sharding and no manual-region boundary (`SPMDFullToShardShape` /
`SPMDShardToFullShape`, or Shardy's `xla.sdy.GlobalToLocalShape` / `xla.sdy.LocalToGlobalShape`,
which XLA's partitioner removes). Otherwise it is `global`. So a JAX
`shard_map` program, whose collectives sit inside manual regions, is a global program, and
XLA's partitioned output (`xla_spmd.hlo`) is a partitioned one.
"""
from __future__ import annotations

import enum

from gspmdc.errors import GspmdcError

from .attributes import KeyValueList
from .custom_call_targets import MANUAL_BOUNDARIES, target_of
from .module import Instruction, Module
from .ops import SPMD_ONLY

#: the key of the stage in the module's header `frontend_attributes`
STAGE_KEY = "gspmdc.stage"

#: the header attribute of a partitioned module giving its entry's global shapes,
#: `{(global parameter shapes)->global result shape}` (written by lower-spmd, read by `run`)
GLOBAL_SIGNATURE_KEY = "spmd_global_signature"


class Stage(enum.Enum):
    """The stages of a module, in pipeline order (see the module docstring)."""

    GLOBAL = "global"
    PROPAGATED = "propagated"
    RESHARDED = "resharded"
    PADDED = "padded"
    HALO_PLANNED = "halo-planned"
    PARTITIONED = "partitioned"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    @property
    def is_global(self) -> bool:
        """Whether a module at this stage is a global program (runs on global inputs)."""
        return self is not Stage.PARTITIONED


_DESCRIPTIONS = {
    Stage.GLOBAL: "a global program",
    Stage.PROPAGATED: "after propagate",
    Stage.RESHARDED: "after insert-reshards",
    Stage.PADDED: "after pad-uneven",
    Stage.HALO_PLANNED: "after halo-exchange",
    Stage.PARTITIONED: "after lower-spmd: one program per partition",
}


def module_stage(module: Module) -> Stage:
    """The module's recorded stage, else the one `inferred_stage` gives. GspmdcError for a
    recorded stage gspmdc does not know."""
    recorded = recorded_stage(module)
    return recorded if recorded is not None else inferred_stage(module)


def recorded_stage(module: Module) -> Stage | None:
    """The stage in the header's frontend attributes, or None."""
    attrs = module.attrs.get("frontend_attributes")
    text = attrs.get(STAGE_KEY) if isinstance(attrs, KeyValueList) else None
    if text is None:
        return None
    try:
        return Stage(text)
    except ValueError:
        known = ", ".join(s.value for s in Stage)
        raise GspmdcError(f"module {module.name}: unknown {STAGE_KEY}={text!r} "
                          f"(known stages: {known})") from None


def set_stage(module: Module, stage: Stage) -> None:
    """Record `stage` in the header (other frontend attributes are kept, in order)."""
    attrs = module.attrs.get("frontend_attributes")
    items = tuple(kv for kv in (attrs.items if isinstance(attrs, KeyValueList) else ())
                  if kv[0] != STAGE_KEY)
    module.attrs["frontend_attributes"] = KeyValueList(items + ((STAGE_KEY, stage.value),), ", ")


def claim_global(module: Module, path: str) -> None:
    """Record that `module` is a global program (`--global`): one that records no stage is then
    partitioned from the start whatever it holds, as XLA's partitioner takes every module (a
    collective outside manual regions then runs on its operand's replicated copy). GspmdcError
    when the module records a partitioned stage."""
    recorded = recorded_stage(module)
    if recorded is None:
        set_stage(module, Stage.GLOBAL)
    elif not recorded.is_global:
        raise GspmdcError(f"{path} records stage {recorded.value}, which is not --global")


def inferred_stage(module: Module) -> Stage:
    """The stage of a module without a recorded one (see the module docstring)."""
    partition_ops = GLOBAL_SIGNATURE_KEY in module.attrs
    # asked before each pass of a pipeline until one records a stage: no generator, no call
    # per instruction; what XLA's partitioner removes (a manual sharding or a manual-region
    # boundary) makes it a global program
    for comp in module.computations.values():
        for inst in comp.instructions:
            if target_of(inst) in MANUAL_BOUNDARIES or \
                    (inst.sharding is not None and inst.sharding.has_manual_leaf):
                return Stage.GLOBAL
            if inst.opcode in SPMD_ONLY and not _cross_replica(inst):
                partition_ops = True
    return Stage.PARTITIONED if partition_ops else Stage.GLOBAL


def _cross_replica(inst: Instruction) -> bool:
    """An all-reduce without `channel_id`: it combines replicas, not partitions."""
    return inst.opcode == "all-reduce" and inst.attr("channel_id") is None


__all__ = ["Stage", "STAGE_KEY", "GLOBAL_SIGNATURE_KEY", "module_stage", "recorded_stage",
           "set_stage", "claim_global", "inferred_stage"]
