"""Reshard nodes in the global IR: `custom-call(x), custom_call_target="Sharding"`.

XLA's sharding annotation means "this value, laid out as the custom-call's sharding" and evaluates
as the identity, so the partitioner uses it for every resharding it decides on: the module stays
an ordinary HLO module with global shapes that prints, re-parses and runs. The metadata of a node
the partitioner inserts records why it exists:

| key           | value                                                          |
|---------------|----------------------------------------------------------------|
| `op_type`     | `"reshard"`                                                    |
| `op_name`     | the instruction whose partitioned form needs the layout        |
| `spmd_value`  | the value being resharded                                      |
| `spmd_role`   | `operand i`, `result`, or `annotation` (a user's constraint)  |
| `spmd_from`   | the value's sharding                                           |
| `spmd_to`     | the sharding needed                                            |
| `spmd_reason` | the strategy that asked for it                                 |

Lowering adds `spmd_step` to each instruction a reshard becomes.
"""
from __future__ import annotations

from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.custom_call_targets import SHARDING, target_of
from gspmdc.ir.module import Instruction
from gspmdc.ir.sharding import HloSharding

RESHARD_OP_TYPE = "reshard"


def is_reshard(inst: Instruction) -> bool:
    """A `Sharding` custom-call: a reshard node (inserted or written by the user)."""
    return target_of(inst) == SHARDING


def is_inserted_reshard(inst: Instruction) -> bool:
    """A reshard node the partitioner inserted (its metadata says so)."""
    if inst.opcode != "custom-call":         # asked of every operand while planning
        return False
    metadata = inst.attr("metadata")
    return is_reshard(inst) and metadata is not None and \
        metadata.get("op_type") == RESHARD_OP_TYPE


def reshard_metadata(value: Instruction, source: HloSharding, target: HloSharding,
                     user: Instruction, role: str, reason: str) -> KeyValueList:
    return KeyValueList((
        ("op_type", RESHARD_OP_TYPE), ("op_name", user.name), ("spmd_value", value.name),
        ("spmd_role", role), ("spmd_from", source.to_text(False)),
        ("spmd_to", target.to_text(False)), ("spmd_reason", reason)))


__all__ = ["RESHARD_OP_TYPE", "is_reshard", "is_inserted_reshard",
           "reshard_metadata"]
