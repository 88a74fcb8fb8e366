"""Passes, the context they share, and the pipeline that runs them.

A pass is a frozen dataclass whose fields are its options. It has a `name` (its name in textual
pipelines, `passes/pass_table.py`), the stages of module it accepts (`accepts`), the stage it
leaves the module at (`produces`, None: unchanged; see `gspmdc.ir.stage`), and
`apply(ctx, module) -> module`, which rewrites the module (in place or by returning a new one).
Everything a pass needs besides its options and the module comes from the `PassContext`: the
number of partitions, the verification option, the channel-id allocator and the provenance sink.

`run_pipeline(ctx, module, passes, callback)` runs passes in order: before each it checks the
module's stage (PipelineError, exit 2, naming what the pass needs and what the module is) and
its declared `num_partitions`; after each it records the new stage, verifies the module when
`ctx.verify_each`, and calls `callback(index, pass, module, seconds)` (the hook for
`--dump-dir` and `--time-passes`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar

from gspmdc.errors import GspmdcError
from gspmdc.ir.gc_pause import paused_collection
from gspmdc.ir.module import Module
from gspmdc.ir.stage import Stage, module_stage, set_stage
from gspmdc.ir.verifier import verify_module


class PipelineError(GspmdcError):
    """A pipeline that cannot run on this module (a pass's stage precondition fails, or the
    module was made for another number of partitions)."""


class ChannelIds:
    """Channel ids for the collectives passes emit: each call hands out a new one, above every id
    already used in the modules it was shown (`account_for`). A pipeline shows it each module
    object it meets once: passes take their new ids from here and copy the others, so a module
    a pass rewrote in place holds no id it was not shown."""

    def __init__(self):
        self.next = 1

    def account_for(self, module: Module) -> None:
        """Never hand out an id `module` already uses."""
        used = [i.attrs.get("channel_id", 0) for _, i in module.all_instructions()]
        self.next = max([self.next] + [c + 1 for c in used if isinstance(c, int)])

    def __call__(self) -> int:
        value = self.next
        self.next += 1
        return value


@dataclass
class PassContext:
    """What the passes of one pipeline run share.

    `num_partitions`: the partition count the module is partitioned for. `verify_each`: run the
    verifier after every pass (tests turn it on). `channel_ids`: the allocator of the
    collectives' channel ids. `provenance`: what passes record about where their decisions came
    from, by pass name (`propagate` puts its sharding origins there, which `explain` reads)."""

    num_partitions: int = 1
    verify_each: bool = False
    channel_ids: ChannelIds = field(default_factory=ChannelIds)
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if type(self.num_partitions) is not int or self.num_partitions < 1:
            raise GspmdcError(f"the number of partitions must be a positive integer, got "
                              f"{self.num_partitions!r}")


@dataclass(frozen=True)
class ModulePass:
    """Base class of every pass. Subclasses set `name`, `accepts`, `produces` and implement
    `apply`."""

    name: ClassVar[str] = ""
    #: the stages of module this pass can take
    accepts: ClassVar[frozenset[Stage]] = frozenset(Stage)
    #: the stage this pass leaves the module at (None: the stage it had)
    produces: ClassVar[Stage | None] = None

    def apply(self, ctx: PassContext, module: Module) -> Module:
        raise NotImplementedError(f"pass {type(self).__name__} does not implement apply()")

    def options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


PipelineCallback = Callable[[int, ModulePass, Module, float], None]


def run_pipeline(ctx: PassContext, module: Module, passes: list[ModulePass],
                 callback: PipelineCallback | None = None) -> Module:
    """Run `passes` in order on `module` (see the module docstring); the resulting module. The
    cyclic garbage collector is paused meanwhile (`gc_pause`)."""
    with paused_collection():
        return _run(ctx, module, passes, callback)


def _run(ctx: PassContext, module: Module, passes: list[ModulePass],
         callback: PipelineCallback | None) -> Module:
    accounted = None
    for index, pass_ in enumerate(passes):
        check_can_run(pass_, module, ctx)
        if module is not accounted:
            ctx.channel_ids.account_for(module)
            accounted = module
        start = time.perf_counter()
        module = pass_.apply(ctx, module)
        seconds = time.perf_counter() - start
        if pass_.produces is not None:
            set_stage(module, pass_.produces)
        if ctx.verify_each:
            verify_module(module)
        if callback is not None:
            callback(index, pass_, module, seconds)
    return module


def check_can_run(pass_: ModulePass, module: Module, ctx: PassContext) -> None:
    """PipelineError unless `pass_` accepts `module`'s stage and `module` was made for
    `ctx.num_partitions` partitions (or declares none, or 1)."""
    stage = module_stage(module)
    if stage not in pass_.accepts:
        needs = " or ".join(s.description if s is Stage.GLOBAL else f"a module {s.description}"
                            for s in Stage if s in pass_.accepts)
        raise PipelineError(f"{pass_.name} needs {needs}; this module is at stage "
                            f"{stage.value} ({stage.description})")
    declared = module.num_partitions
    if declared not in (None, 1, ctx.num_partitions):
        raise PipelineError(f"module {module.name} declares num_partitions={declared}, but the "
                            f"pipeline runs for {ctx.num_partitions} partitions")


__all__ = ["ModulePass", "PassContext", "ChannelIds", "PipelineError", "PipelineCallback",
           "run_pipeline", "check_can_run"]
