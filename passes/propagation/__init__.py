"""Sharding propagation ("sharding completion", docs/design/propagation.md): give every instruction
that can be
partitioned a sharding, following XLA's ShardingPropagation pass, and record where each one came
from.

    from gspmdc.passes.propagation import propagate, explain
    propagate(module, propagate_to_output=True)        # in place; returns the module
    for line in explain(module, "dot.3"):               # the origin chain of dot.3's sharding
        print(line)

Module layout: `driver` (levels, worklist fixpoint, entry policy), `inference` (checks common to
every opcode), `forward_rules` / `backward_rules` (per-opcode tables), `contraction` (dot and
convolution), `indexing` (gather and scatter), `control_flow`, `constraints` (unspecified dims),
`preprocess`, `provenance`, `improve` (whether a candidate sharding replaces the current one),
`opclass`, `graph`, `while_devices`. The shardings themselves are derived with
`gspmdc.ir.sharding_algebra`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

from .driver import PropagationError, PropagationOptions, propagate_module
from .provenance import Provenance

__all__ = ["propagate", "explain", "parse_flags", "ShardingPropagation", "PropagationError",
           "PropagationOptions"]


def _flags(value: bool | Sequence[bool]) -> tuple[bool, ...]:
    if isinstance(value, bool):
        return (value,)
    flags = tuple(bool(v) for v in value)
    if not flags:
        raise GspmdcError("a propagation flag list needs at least one value")
    return flags


def parse_flags(text: str) -> tuple[bool, ...]:
    """`true`, `false`, or a comma-separated list of them (one per output / parameter)."""
    words = [w.strip().lower() for w in text.split(",")]
    if not words or any(w not in ("true", "false") for w in words):
        raise GspmdcError(f"expected true/false or a comma-separated list of them, got {text!r}")
    return tuple(w == "true" for w in words)


def propagate(module: Module, *, propagate_to_output: bool | Sequence[bool] = False,
              propagate_to_parameters: bool | Sequence[bool] = False, is_spmd: bool = True,
              cse_prevention_only: bool = False,
              execution_threads: Sequence[str] | None = None,
              record_origins: bool = True) -> Module:
    """Propagate shardings through `module` in place and return it (the `propagate` pass run
    alone, without a pipeline: no stage check, no stage recorded).

    `propagate_to_output` / `propagate_to_parameters`: whether propagation may set the entry
    root's sharding (one flag, or one per output tuple element) and the entry parameters'
    shardings (one flag, or one per parameter); where it may not, the input's sharding is kept.
    `record_origins`: store each inferred sharding's origin chain in the text as the frontend
    attribute `sharding_origin` (the `ShardingPropagation` pass also leaves it in its context's
    provenance)."""
    propagate_module(module, _options(propagate_to_output, propagate_to_parameters, is_spmd,
                                      cse_prevention_only, execution_threads, record_origins))
    return module


def _options(propagate_to_output, propagate_to_parameters, is_spmd, cse_prevention_only,
             execution_threads, record_origins) -> PropagationOptions:
    return PropagationOptions(
        is_spmd=is_spmd, propagate_to_output=_flags(propagate_to_output),
        propagate_to_parameters=_flags(propagate_to_parameters),
        cse_prevention_only=cse_prevention_only,
        execution_threads=None if execution_threads is None else tuple(execution_threads),
        record_origins=record_origins)


def explain(module: Module, instruction_name: str, max_steps: int | None = None,
            provenance: Provenance | None = None) -> list[str]:
    """The origin chain of an instruction's sharding, one step a line, newest first:
    `name  sharding  ← how from source via rule (level k)`, ending at a user annotation.

    `instruction_name` is a name, or `computation:name` when names repeat across computations
    (an entry-computation instruction is preferred otherwise). The origins come from
    `provenance` (what the `propagate` pass left in its context's `provenance["propagate"]`) or,
    without it, from the module's `sharding_origin` attributes (a module propagated with
    `record_origins`, or parsed from text written after propagation). A sharding barrier
    (`ShardBarrierFrom`/`ShardBarrierTo`, which propagation removes) is said to be one, followed
    by the chain of its operand (known from `provenance` only: a propagated file has no trace of
    its barriers)."""
    if max_steps is not None and max_steps < 1:
        raise GspmdcError(f"explain: the number of steps must be positive, got {max_steps}")
    if provenance is None:
        provenance = Provenance.from_module(module)
    try:
        key = _find(module, instruction_name)
    except GspmdcError:
        barrier = _removed_barrier(provenance, instruction_name)
        if barrier is None:
            raise
        (_, name), (kind, operand) = barrier
        head = (f"{name}  ← a sharding barrier (custom-call \"{kind}\"): propagation stops "
                f"shardings from crossing it, then removes it, so it has no sharding of its own; "
                f"its operand {operand[1]}:")
        if max_steps == 1:
            return [head]
        return [head] + provenance.chain(module, operand,
                                         None if max_steps is None else max_steps - 1)
    return provenance.chain(module, key, max_steps)


def _removed_barrier(provenance: Provenance, name: str):
    """`(key, (target, operand key))` of the barrier named `name` (or `computation:name`) that
    propagation removed, if any."""
    for key, removed in provenance.removed_barriers.items():
        if name in (key[1], f"{key[0]}:{key[1]}"):
            return key, removed
    return None


def _find(module: Module, name: str) -> tuple[str, str]:
    if ":" in name:
        comp, inst = name.split(":", 1)
        if comp in module.computations and \
                any(i.name == inst for i in module.computations[comp].instructions):
            return comp, inst
    matches = [(c.name, i.name) for c in module.computations.values() for i in c.instructions
               if i.name == name]
    if not matches:
        raise GspmdcError(f"explain: no instruction named {name!r} in module {module.name!r}")
    entry = [m for m in matches if m[0] == module.entry_name]
    return (entry or matches)[0]


@dataclass(frozen=True)
class ShardingPropagation(ModulePass):
    """Complete the shardings (XLA's sharding propagation).

    Options as in `propagate`; leaves the origins of the shardings in
    `ctx.provenance["propagate"]`."""

    name = "propagate"
    accepts = frozenset({Stage.GLOBAL, Stage.PROPAGATED})
    produces = Stage.PROPAGATED
    propagate_to_output: tuple[bool, ...] = (False,)
    propagate_to_parameters: tuple[bool, ...] = (False,)
    is_spmd: bool = True
    cse_prevention_only: bool = False
    execution_threads: tuple[str, ...] | None = None
    record_origins: bool = True

    def apply(self, ctx: PassContext, module: Module) -> Module:
        ctx.provenance[self.name] = propagate_module(module, _options(
            self.propagate_to_output, self.propagate_to_parameters, self.is_spmd,
            self.cse_prevention_only, self.execution_threads, self.record_origins))
        return module
