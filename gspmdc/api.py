"""The Python API: load, print and evaluate modules (what the CLI calls, usable from scripts).

    from gspmdc import api
    module = api.load("model.hlo")            # parse + verify; GspmdcError on bad input
    print(api.to_text(module))                # canonical HLO text
    outputs = api.evaluate(module, [x, w])    # single-device reference run
"""
from __future__ import annotations

import os
import sys

from gspmdc.atomic import atomic_output
from gspmdc.ir.module import Module


def parse(text: str, filename: str = "<string>", *, verify: bool = True) -> Module:
    """Parse HLO text into a Module; verify shapes and shardings unless `verify` is False
    (an error about an instruction then gives its file:line:col)."""
    from gspmdc.ir.parser import parse_module
    return parse_module(text, filename, verify=verify)


def load(path: str | os.PathLike, *, verify: bool = True) -> Module:
    """Parse (and verify) an HLO text file; `-` reads standard input."""
    from gspmdc.ir.parser import read_source
    return parse(read_source(path), "<stdin>" if str(path) == "-" else str(path), verify=verify)


def to_text(module: Module) -> str:
    """Canonical HLO text; re-parses to an identical module."""
    from gspmdc.ir.printer import print_module
    return print_module(module)


def write_text(text: str, path: str | os.PathLike | None) -> None:
    """Write `text` to `path` atomically (temp file + rename), or to stdout when `path` is None."""
    if path is None:
        sys.stdout.write(text)
        return
    with atomic_output(path, "w") as f:
        f.write(text)


def evaluate(module: Module, args: list, **kwargs):
    """Run the entry computation with the reference interpreter (see runtime/interpreter.py)."""
    from gspmdc.runtime.interpreter import evaluate as run
    return run(module, args, **kwargs)
