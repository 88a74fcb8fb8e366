"""Helpers for the sharding-propagation tests: run the pass on HLO text, read shardings back."""
from gspmdc.ir.parser import parse_module, parse_sharding
from gspmdc.passes.propagation import propagate
from gspmdc.ir.sharding_algebra import for_shape


def run(text: str, **options):
    """Parse `text` (an HLO module) and propagate with `options`; returns the module."""
    module = parse_module(text, "<test>")
    options.setdefault("record_origins", False)
    return propagate(module, **options)


def find(module, name: str):
    """The instruction called `name`, preferring the entry computation."""
    for inst in module.entry.instructions:
        if inst.name == name:
            return inst
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.name == name:
                return inst
    raise KeyError(name)


def sharding_of(module, name: str):
    return find(module, name).sharding


def expect(module, **expected) -> None:
    """`expect(m, add="{devices=[2,1]<=[2]}", root=None)`: compare parsed shardings (an instruction
    name with `.` or `-` is written with `__` / `_` replaced back by the caller)."""
    for name, text in expected.items():
        inst = find(module, name)
        want = None if text is None else for_shape(parse_sharding(text), inst.shape)
        got = inst.sharding
        assert got == want, f"{name}: got {got}, expected {want}"
