"""gspmdc's own frontend attributes: the keys one part of gspmdc writes on an instruction
(`frontend_attributes={key="value", ...}`) and another reads, and the helpers to read and set one.

| key               | written by        | read by                    | value                         |
|-------------------|-------------------|----------------------------|-------------------------------|
| `sharding_origin` | propagation       | `explain`                  | the origin chain of a sharding |
| `halo`            | halo-exchange     | lower-spmd                 | the halo plan of a windowed op |
| `windowed_einsum` | windowed-einsum   | lower-spmd                 | how a dot runs as a loop       |
| `global_dims`     | lower-spmd        | the runtime                | the global dims of a random shard (`random_shards.py`) |

gspmdc's other private definitions live beside this module: the module's stage and the
`spmd_global_signature` header (`stage.py`), the random shard ops (`random_shards.py`), and every
custom-call target (`custom_call_targets.py`).
"""
from __future__ import annotations

from .attributes import KeyValueList
from .module import Instruction

SHARDING_ORIGIN = "sharding_origin"
HALO = "halo"
WINDOWED_EINSUM = "windowed_einsum"


def frontend_attribute(inst: Instruction, key: str) -> str | None:
    """The value of frontend attribute `key`, or None."""
    attrs = inst.attrs.get("frontend_attributes")
    return None if attrs is None else attrs.get(key)


def set_frontend_attribute(inst: Instruction, key: str, value: object | None) -> None:
    """Set frontend attribute `key` (last), or remove it (`value=None`; an empty list goes). The
    value is a string or a typed value that prints as one (`ir/sdy.py`'s); the list keeps its
    separator."""
    attrs = inst.attrs.get("frontend_attributes")
    if attrs is None:
        if value is not None:
            inst.attrs["frontend_attributes"] = KeyValueList(((key, value),), ", ")
        return
    items = tuple(kv for kv in attrs.items if kv[0] != key)
    if value is not None:
        items += ((key, value),)
    if items:
        inst.attrs["frontend_attributes"] = KeyValueList(items, attrs.separator)
    else:
        del inst.attrs["frontend_attributes"]
