"""Passes, their registry and the pipeline that runs them.

A pass is a frozen dataclass whose fields are its options, registered by name with
`@register_pass`; `apply(module) -> module` rewrites the module (in place or by returning a new one)
and returns the result. `run_pipeline(module, passes, callback=...)` runs passes in order and calls
`callback(index, pass_, module, seconds)` after each one: the hook for `--dump-dir` (write
`NNN.<pass>.hlo`) and `--time-passes`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Callable, ClassVar

from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module

PASS_REGISTRY: dict[str, type["ModulePass"]] = {}


@dataclass(frozen=True)
class ModulePass:
    """Base class of every pass. Subclasses set `name` and implement `apply`."""

    name: ClassVar[str] = ""

    def apply(self, module: Module) -> Module:
        raise NotImplementedError(f"pass {type(self).__name__} does not implement apply()")

    def options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def register_pass(cls: type[ModulePass]) -> type[ModulePass]:
    """Class decorator: make the pass available by its `name`."""
    if not cls.name:
        raise ValueError(f"pass class {cls.__name__} has no name")
    if cls.name in PASS_REGISTRY:
        raise ValueError(f"two passes named {cls.name!r}")
    PASS_REGISTRY[cls.name] = cls
    return cls


def get_pass(name: str, **options) -> ModulePass:
    """Instantiate a registered pass by name."""
    try:
        cls = PASS_REGISTRY[name]
    except KeyError:
        raise GspmdcError(f"unknown pass {name!r}; known passes: {', '.join(sorted(PASS_REGISTRY))}") \
            from None
    return cls(**options)


PipelineCallback = Callable[[int, ModulePass, Module, float], None]


def run_pipeline(module: Module, passes: list[ModulePass],
                 callback: PipelineCallback | None = None) -> Module:
    """Run `passes` in order; after pass i, call `callback(i, pass, module, seconds)`."""
    for index, pass_ in enumerate(passes):
        start = time.perf_counter()
        module = pass_.apply(module)
        if callback is not None:
            callback(index, pass_, module, time.perf_counter() - start)
    return module
