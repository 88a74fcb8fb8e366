"""gspmdc's private random-number ops, as both the partitioner and the runtime read them.

The partitioner computes a shard of a random result alone (`passes/spmd/op_rules_random.py`);
the runtime executes those local forms (`runtime/kernels/random.py`). What the two sides must
agree on lives here:

- the operands of the shard custom-calls (their targets, `gspmdc.RngBitGeneratorShard`: state,
  then s32 offsets per dim; `gspmdc.RngShard`: a, b, the global state value, then s32 offsets per
  dim, are in `custom_call_targets.py`) and the frontend attribute naming their global dims
  (`frontend_attributes={global_dims="d0,d1"}`);
- how far an `rng` advances the global rng state: the Philox blocks its whole result draws
  (`rng_state_delta`), which the partitioner writes as the `delta` of the
  `rng-get-and-update-state` that every partition runs.
"""
from __future__ import annotations

from gspmdc.errors import UnsupportedError, VerificationError

from . import dtypes
from .module import Instruction

#: the frontend attribute of a shard custom-call giving the global dims
GLOBAL_DIMS_KEY = "global_dims"


def random_bit_width(element_type: str) -> int:
    """The width of the random bits of `element_type` (UnsupportedError for types without)."""
    width = dtypes.bit_width(element_type)
    if element_type == "pred" or dtypes.is_complex(element_type) or width not in (8, 16, 32, 64):
        raise UnsupportedError(f"random bits of type {element_type} are not supported")
    return width


def draw_plan(distribution: str, element_type: str, count: int) -> tuple[int, int]:
    """(Philox values drawn, their width) for an `rng` of `count` elements."""
    if distribution == "rng_normal" and dtypes.is_float(element_type):
        return 2 * -(-count // 2), 64 if element_type == "f64" else 32
    return count, random_bit_width(element_type)


def rng_state_delta(distribution: str, element_type: str, count: int) -> int:
    """The Philox blocks an `rng` of `count` elements draws: how far it advances the global
    state."""
    values, width = draw_plan(distribution, element_type, count)
    return -(-values * (2 if width == 64 else 1) // 4)


def global_dims_of(inst: Instruction) -> tuple[int, ...]:
    """The global dims a shard custom-call names in `frontend_attributes={global_dims="a,b"}`."""
    attrs = inst.attr("frontend_attributes")
    text = attrs.get(GLOBAL_DIMS_KEY) if attrs is not None else None
    if text is None:
        raise VerificationError(f"{inst.name}: {inst.attr('custom_call_target')} needs "
                                f'frontend_attributes={{{GLOBAL_DIMS_KEY}="..."}}')
    return tuple(int(d) for d in text.split(",") if d.strip())


__all__ = ["GLOBAL_DIMS_KEY", "random_bit_width",
           "draw_plan", "rng_state_delta", "global_dims_of"]
