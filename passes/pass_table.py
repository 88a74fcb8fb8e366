"""The table of gspmdc's passes, and textual pipelines.

`PASSES` maps each pass name to its class; it is the one list of passes (adding a pass means
adding it here). A textual pipeline names passes separated by commas, each with optional
options in braces, as in MLIR and xDSL:

    propagate,insert-reshards,windowed-einsum{threshold=1048576},pad-uneven,halo-exchange,
    lower-spmd,cleanup

An option is `name=value` (several separated by commas or spaces): `true` / `false` for a flag,
an integer, a word, or a list of them in brackets, `[true,false]`, for a tuple-valued option.
`parse_pipeline(text)` gives the pass objects (PipelineError, exit 2, for an unknown pass or
option, or a malformed value); `format_pipeline(passes)` prints them back.
"""
from __future__ import annotations

import re
from dataclasses import Field, fields
from typing import Any

from gspmdc.passes.pass_manager import ModulePass, PipelineError
from gspmdc.passes.propagation import ShardingPropagation
from gspmdc.passes.shardy import ShardyPropagation, ShardyToGspmd
from gspmdc.passes.spmd.cleanup import Cleanup
from gspmdc.passes.spmd.halo_exchange import HaloExchange
from gspmdc.passes.spmd.inline_calls import InlineCalls
from gspmdc.passes.spmd.insert_reshards import InsertReshards
from gspmdc.passes.spmd.lower_spmd import LowerSpmd
from gspmdc.passes.spmd.pad_uneven import PadUneven
from gspmdc.passes.spmd.windowed_einsum import WindowedEinsum

#: every pass, by name, in the order of the partitioner's pipeline (one of the two propagations
#: runs; `shardy-to-gspmd` follows Shardy's, or comes first when a module in Shardy form
#: propagates the GSPMD way)
PASSES: dict[str, type[ModulePass]] = {cls.name: cls for cls in (
    InlineCalls, ShardingPropagation, ShardyPropagation, ShardyToGspmd, InsertReshards,
    WindowedEinsum, PadUneven, HaloExchange, LowerSpmd, Cleanup)}


_ITEM = re.compile(r"\s*([A-Za-z][\w-]*)\s*(\{[^{}]*\})?\s*(,|$)")
_OPTION = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*(\[[^\]]*\]|[^\s,\[\]]+)\s*(?:,|\s|$)")


def parse_pipeline(text: str) -> list[ModulePass]:
    """The passes a textual pipeline names (see the module docstring)."""
    passes, at = [], 0
    text = text.strip()
    if not text:
        raise PipelineError("the pipeline is empty; known passes: " + ", ".join(PASSES))
    while at < len(text):
        match = _ITEM.match(text, at)
        if match is None:
            raise PipelineError(f"pipeline {text!r}: cannot read a pass at column {at + 1} "
                                "(expected name or name{option=value,...})")
        name, options, _ = match.groups()
        passes.append(make_pass(name, _options(name, options[1:-1] if options else "")))
        at = match.end()
        if match.group(3) == "," and at >= len(text):
            raise PipelineError(f"pipeline {text!r} ends with a comma")
    return passes


def make_pass(name: str, options: dict[str, str]) -> ModulePass:
    """The pass `name` with its options given as text (PipelineError for unknown ones)."""
    cls = PASSES.get(name)
    if cls is None:
        raise PipelineError(f"unknown pass {name!r}; known passes: {', '.join(PASSES)}")
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, text in options.items():
        field = known.get(key)
        if field is None:
            listed = ", ".join(known) or "none"
            raise PipelineError(f"pass {name} has no option {key!r} (its options: {listed})")
        values[key] = _value(name, key, text, field)
    return cls(**values)


def format_pipeline(passes: list[ModulePass]) -> str:
    """The textual pipeline of `passes`, with the options that differ from their defaults."""
    items = []
    for pass_ in passes:
        changed = [f"{f.name}={format_option(getattr(pass_, f.name))}" for f in fields(pass_)
                   if getattr(pass_, f.name) != f.default]
        items.append(pass_.name + ("{" + ",".join(changed) + "}" if changed else ""))
    return ",".join(items)


def _options(name: str, text: str) -> dict[str, str]:
    options, at = {}, 0
    while at < len(text):
        if not text[at:].strip():
            break
        match = _OPTION.match(text, at)
        if match is None:
            raise PipelineError(f"pass {name}: cannot read options {text!r} at column "
                                f"{at + 1} (expected option=value)")
        key, value = match.group(1), match.group(2)
        if key in options:
            raise PipelineError(f"pass {name}: option {key!r} given twice")
        options[key] = value
        at = match.end()
    return options


def _value(name: str, key: str, text: str, field: Field) -> Any:
    """`text` as a value of the option's type (a bool, an int, a string, or a tuple of one of
    them, written `[a,b]` or as one value)."""
    annotation = str(field.type)
    kind = bool if "bool" in annotation else int if "int" in annotation else str
    if annotation.startswith("tuple"):
        words = text[1:-1].split(",") if text.startswith("[") else [text]
        return tuple(_scalar(name, key, w.strip(), kind) for w in words if w.strip())
    if text.startswith("["):
        raise PipelineError(f"pass {name}: option {key} takes one value, got {text!r}")
    return _scalar(name, key, text, kind)


def _scalar(name: str, key: str, text: str, kind: type) -> Any:
    if kind is bool:
        if text not in ("true", "false"):
            raise PipelineError(f"pass {name}: option {key} takes true or false, got {text!r}")
        return text == "true"
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise PipelineError(f"pass {name}: option {key} takes an integer, "
                                f"got {text!r}") from None
    return text


def format_option(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(format_option(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["PASSES", "parse_pipeline", "make_pass", "format_pipeline", "format_option"]
