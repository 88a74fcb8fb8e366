"""HLO text for tests: scalar reducer computations and the module builder.

    reducer("add")                        # add { a = f32[] ... ROOT r = f32[] add(a, b) }
    reducer("max_s32", "maximum", "s32")  # max_s32 { ... s32[] maximum(a, b) }
    hlo_module(body, reducer("add"))      # HloModule m, those computations, ENTRY e { body }
"""
from __future__ import annotations


def reducer(name: str, opcode: str | None = None, element_type: str = "f32") -> str:
    """The text of the scalar computation `name(a, b) = opcode(a, b)` on `element_type`
    (`opcode` defaults to `name`; `max` and `min` mean `maximum` and `minimum`)."""
    opcode = opcode or {"max": "maximum", "min": "minimum"}.get(name, name)
    t = element_type
    return (f"\n{name} {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
            f"  ROOT r = {t}[] {opcode}(a, b)\n}}\n")


def max_magnitude_reducer(name: str) -> str:
    """The text of the f32 computation `name(a, b) = maximum(abs(a), abs(b))`: associative and
    commutative, but no single elementwise op (evaluated vectorised, not as a numpy ufunc)."""
    return (f"\n{name} {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
            f"  x = f32[] abs(a)\n  y = f32[] abs(b)\n  ROOT r = f32[] maximum(x, y)\n}}\n")


def hlo_module(body: str, computations: str = "", header: str = "") -> str:
    """The text of a module `m` (with `header` attributes, e.g. ", num_partitions=4"): the
    `computations` (HLO text) and an entry computation `e` whose instructions are `body`."""
    return f"HloModule m{header}\n{computations}\nENTRY e {{\n{body}\n}}\n"


__all__ = ["reducer", "max_magnitude_reducer", "hlo_module"]
