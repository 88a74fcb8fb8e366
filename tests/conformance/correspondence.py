"""Which instruction of XLA's propagated module is which of gspmdc's, and whether their
shardings agree.

Both compilers propagate from the same module: the one XLA's sharding-propagation pass starts
from (`before`, see `differential.py`). XLA renames instructions on its way in (HLO text ->
StableHLO -> HLO), but not during propagation, so the correspondence is by name: instruction I of
computation C of `before` is, on each side, the instruction named I in C after propagation.
Either compiler may add instructions while propagating (copies that keep a root or a constraint
apart); those are not in `before` and are not compared. An instruction of `before` that one side
no longer has (dead code removed) is counted as absent there, not compared.

The canonical form of a sharding on a shape is the tuple of its array leaves' shardings without
metadata or shard groups, as gspmdc's `HloSharding` builds them from XLA's text (iota and
explicit device lists, and `last_tile_dim_replicate` over all devices and `{replicated}`,
compare equal); an instruction without a sharding has the canonical form None, which differs
from `{replicated}`. An outfeed's sharding is read on the shape it describes (its data, maybe
followed by the token: `annotation_shape.annotated_shape`).
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.ir.module import Module
from gspmdc.ir.shapes import Shape, TupleShape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.annotation_shape import annotated_shape

Canonical = tuple | None
ABSENT = "absent"


def canonical(sharding: HloSharding | None, shape: Shape) -> Canonical:
    """The canonical form of `sharding` on `shape` (see the module docstring)."""
    if sharding is None:
        return None
    if sharding.is_tuple and not isinstance(shape, TupleShape) and len(sharding.elements) == 1:
        sharding = sharding.elements[0]
    return tuple(leaf.with_metadata(()).with_shard_group(None)
                 for leaf in sharding.leaf_shardings(shape))


def canonical_text(form: Canonical | str) -> str:
    if form is None:
        return "(none)"
    if form == ABSENT:
        return "(absent)"
    texts = [leaf.to_text(include_metadata=False) for leaf in form]
    return texts[0] if len(texts) == 1 else "{" + ", ".join(texts) + "}"


@dataclass(frozen=True)
class ShardingVerdict:
    """One instruction of `before`: its canonical sharding on each side (`ABSENT` when that side
    no longer has it) and whether they agree."""

    computation: str
    name: str
    opcode: str
    ours: Canonical | str
    xla: Canonical | str

    @property
    def compared(self) -> bool:
        return self.ours != ABSENT and self.xla != ABSENT

    @property
    def agrees(self) -> bool:
        return self.compared and self.ours == self.xla

    def describe(self) -> str:
        return (f"{self.computation}/{self.name} ({self.opcode}): gspmdc "
                f"{canonical_text(self.ours)}  XLA {canonical_text(self.xla)}")


def _forms(module: Module) -> dict[tuple[str, str], Canonical]:
    return {(comp.name, inst.name): canonical(inst.sharding, annotated_shape(inst))
            for comp in module.computations.values() for inst in comp.instructions}


def compare_shardings(before: Module, ours: Module, xla: Module) -> list[ShardingVerdict]:
    """One verdict per instruction of `before`, given gspmdc's and XLA's modules after
    propagation (see the module docstring)."""
    our_forms, xla_forms = _forms(ours), _forms(xla)
    return [ShardingVerdict(comp.name, inst.name, inst.opcode,
                            our_forms.get((comp.name, inst.name), ABSENT),
                            xla_forms.get((comp.name, inst.name), ABSENT))
            for comp in before.computations.values() for inst in comp.instructions]
