"""The program generator: a random valid module (≤ ~25 instructions, dims ≤ 16) with shardings
on some instructions, as one `Case`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from . import (ops_annotation, ops_contraction, ops_control, ops_data, ops_elementwise,
               ops_indexing, ops_random, ops_reduce)
from .program import Comp, ModuleBuilder, TooLarge
from .shardings import sharding as random_sharding
from .source import Source
from .values import Tup, Value
from . import choices

Generator = Callable[[Comp], "Value | None"]

#: (generator, weight) of every op family
TABLE: list[tuple[Generator, float]] = [
    *ops_elementwise.GENERATORS,
    *ops_data.GENERATORS,
    *ops_contraction.GENERATORS,
    *ops_reduce.GENERATORS,
    *ops_indexing.GENERATORS,
    *ops_random.GENERATORS,
    *ops_control.GENERATORS,
    *ops_annotation.GENERATORS,
]


@dataclass(frozen=True)
class Case:
    """One generated program (see the package docstring)."""

    text: str
    num_partitions: int
    propagate_to_output: bool
    propagate_to_parameters: bool
    reference_text: str | None = None
    seed: int | None = None

    @property
    def reference(self) -> str:
        """The program `run --check` compares against: `reference_text` or `text` itself."""
        return self.text if self.reference_text is None else self.reference_text

    @property
    def operations(self) -> frozenset[str]:
        """The operations `text` uses: opcodes, and `custom-call:<target>` for custom-calls."""
        from .coverage import operations_in
        return operations_in(self.text)


def grow(c: Comp, steps: int, table: Sequence[tuple[Generator, float]] = TABLE) -> None:
    """Run up to `steps` random generators on `c` while the module has budget."""
    for _ in range(steps):
        if c.mb.budget <= 1:
            return
        generate_one = c.src.weighted(list(table))
        try:
            generate_one(c)
        except TooLarge:
            pass


def outputs(c: Comp) -> list[Value]:
    """The values the entry returns: the newest value and up to three more nobody uses (so
    most of what the program computes is compared)."""
    candidates = [v for v in reversed(c.pool + c.tuples) if not v.manual]
    unused = [v for v in candidates if v.name not in c.used]
    first = unused[0] if unused else candidates[0]
    rest = [v for v in unused if v is not first]
    return [first] + rest[:c.src.integer(0, 3)]


def generate(src: Source, *, max_instructions: int = 25, seed: int | None = None) -> Case:
    n = src.weighted([(2, 4), (4, 4), (1, 1), (3, 1), (8, 2), (6, 1)])
    mb = ModuleBuilder(src, n, max_instructions)
    entry = Comp(mb, "main", "entry")
    for _ in range(src.integer(1, 3)):
        kind = src.weighted([("float", 6), ("int", 2), ("pred", 1)])
        entry.param(choices.new_shape(src, kind))
    grow(entry, max_instructions)
    to_output = src.boolean(0.3)
    to_parameters = src.boolean(0.3)
    results = outputs(entry)
    root = results[0] if len(results) == 1 else \
        entry.emit("tuple", Tup(tuple(r.shape for r in results)), "tuple", results,
                   sharding=None, parts=results)
    annotate = src.boolean(0.2 if to_output else 0.4)
    entry.finish(root, random_sharding(src, root.shape, n) if annotate else None)
    text = mb.text()
    reference = mb.text(reference=True)
    return Case(text, n, to_output, to_parameters, None if reference == text else reference, seed)
