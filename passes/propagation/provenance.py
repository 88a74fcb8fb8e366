"""Where each sharding came from (in the spirit of Shardy's sharding origins).

Every instruction whose sharding propagation set or changed keeps a *history*: one `OriginStep`
per change, oldest first, each naming how it happened (`forward`, `backward`, `shard group`,
`control flow`, `constraint`, `refined`, `finalize`), the rule, and the source instructions *with
the version of their history they had then*. Following the first source of each step back in time
gives the chain of instructions and rules the sharding travelled through, down to a user
annotation (version 0 of an instruction that was sharded in the input).

In text, the history rides on the instruction as the frontend attribute `sharding_origin`:
steps separated by `;`, each `how|rule|sources|level|sharding`, sources `name@version` (or
`computation:name@version` across computations) joined by `,`, the sharding omitted on the last
step (it is the instruction's). Instructions without the attribute that carry a sharding are
user annotations. `explain` reads either the in-memory history or these attributes.

The partitioner may compute an instruction in another sharding than propagation gave it (its
plan for the op computes it so: partial sums, or a layout its users read for fewer bytes);
`record_partitioner_sharding` then adds a last step,
`partitioner`, whose source is the instruction's own propagated version, so the chain of a
partitioned module starts with the sharding the instruction really has.
"""
from __future__ import annotations

from typing import NamedTuple

from gspmdc.errors import GspmdcError
from gspmdc.ir.frontend_attributes import (
    SHARDING_ORIGIN, frontend_attribute, set_frontend_attribute,
)
from gspmdc.ir.module import Instruction, Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.sharding_algebra import cached

ANNOTATION = "annotation"
PARTITIONER = "partitioner"

Key = tuple[str, str]  # (computation name, instruction name)


class OriginStep(NamedTuple):
    """One change of an instruction's sharding (an immutable named tuple: propagation records
    one per change)."""

    sharding: HloSharding | None
    how: str
    rule: str = ""
    sources: tuple[tuple[Key, int], ...] = ()
    level: int | None = None


class Provenance:
    """Histories keyed by (computation, instruction) name."""

    def __init__(self):
        self.history: dict[Key, list[OriginStep]] = {}
        #: sharding barriers propagation removed: key -> (custom-call target, operand key)
        self.removed_barriers: dict[Key, tuple[str, Key]] = {}

    # ---- recording -----------------------------------------------------------------------

    def version(self, key: Key) -> int:
        """Current version of `key`'s sharding (0 for an annotation never changed)."""
        return max(len(self.history.get(key, ())) - 1, 0)

    def record(self, key: Key, sharding: HloSharding | None, how: str, rule: str = "",
               sources: tuple[Key, ...] = (), level: int | None = None) -> None:
        history = self.history
        refs = tuple([(s, max(len(history.get(s, ())) - 1, 0)) for s in sources if s != key])
        history.setdefault(key, []).append(OriginStep(sharding, how, rule, refs, level))

    def forget(self, key: Key) -> None:
        self.history.pop(key, None)

    # ---- text form ------------------------------------------------------------------------

    def write_attributes(self, module: Module) -> None:
        """Store every history that is more than a plain annotation as `sharding_origin`."""
        history = self.history
        for comp in module.computations.values():
            name = comp.name
            for inst in comp.instructions:
                steps = history.get((name, inst.name))
                if inst.sharding is None or not steps or \
                        (len(steps) == 1 and steps[0].how == ANNOTATION):
                    if "frontend_attributes" in inst.attrs:
                        set_frontend_attribute(inst, SHARDING_ORIGIN, None)
                else:
                    set_frontend_attribute(inst, SHARDING_ORIGIN, _encode(steps, name))

    @classmethod
    def from_module(cls, module: Module) -> "Provenance":
        """Histories read back from `sharding_origin` attributes."""
        prov = cls()
        for comp in module.computations.values():
            for inst in comp.instructions:
                text = frontend_attribute(inst, SHARDING_ORIGIN)
                if text is not None:
                    prov.history[(comp.name, inst.name)] = _decode(text, comp.name, inst)
        return prov

    # ---- explaining -----------------------------------------------------------------------

    def chain(self, module: Module, key: Key, max_steps: int | None = None) -> list[str]:
        """The origin chain of `key`'s current sharding, one step a line; shardings are written
        with the module's mesh axes when it has a mesh and they are over it. The chain stops at a
        user annotation, at a source that is no longer in the module (the partitioner removes
        instructions after propagation: the line says so), and where a hand-edited
        `sharding_origin` would lead back to a step already shown."""
        lines: list[str] = []

        def _text(s: HloSharding | None, inst: Instruction) -> str:
            return _sharding_text(s, inst, module)

        version: int | None = None
        seen: set[tuple[Key, int]] = set()
        while max_steps is None or len(lines) < max_steps:
            comp, name = key
            inst = _instruction(module, comp, name)
            if inst is None:
                lines.append(f"{name}  ← {_removed(module, comp)}")
                break
            steps = self.history.get(key)
            if not steps:
                if inst.sharding is None:
                    lines.append(f"{name}  (no sharding)")
                else:
                    lines.append(f"{name}  {_text(inst.sharding, inst)}  ← user annotation")
                break
            index = len(steps) - 1 if version is None else min(version, len(steps) - 1)
            if (key, index) in seen:
                lines.append(f"{name}  ← (the recorded origins lead back here: a cycle)")
                break
            seen.add((key, index))
            step = steps[index]
            sharding = step.sharding if index < len(steps) - 1 or step.sharding is not None \
                else inst.sharding
            lines.append(f"{name}  {_text(sharding, inst)}  ← {_describe(step, comp)}")
            if not step.sources:
                break
            key, version = step.sources[0]
        return lines


def _instruction(module: Module, comp: str, name: str) -> Instruction | None:
    computation = module.computations.get(comp)
    if computation is None:
        return None
    return next((inst for inst in computation.instructions if inst.name == name), None)


def _removed(module: Module, comp: str) -> str:
    """What the chain says of a source that is gone."""
    where = "it" if comp in module.computations else f"its computation {comp}"
    return (f"no longer in the module: {where} was removed after propagation (the partitioner "
            "folds instructions into equal or simpler ones and drops unused ones), so its own "
            "origin is not recorded here")


def _text(s: HloSharding | None) -> str:
    return "{}" if s is None else _plain_text(s)


@cached
def _plain_text(s: HloSharding) -> str:
    """A sharding's text without metadata (made once per distinct sharding: a model's layers
    repeat a few)."""
    return s.to_text(include_metadata=False)


def _sharding_text(s: HloSharding | None, inst: Instruction, module: Module) -> str:
    """A sharding with mesh axes names where the module has a mesh, else as in the text."""
    from gspmdc.ir.sdy_hlo import named_text
    if s is not None and not inst.shape.is_tuple:
        named = named_text(s, inst.shape.rank, module)
        if named is not None:
            return named
    return _text(s)


def record_partitioner_sharding(inst: Instruction, comp: str, propagated: HloSharding) -> None:
    """Record on `inst` (of computation `comp`) that the partitioner computes it in its present
    sharding rather than `propagated`, the one propagation gave it: its `sharding_origin` gains a
    `partitioner` step whose source is its own previous version (a user annotation becomes
    version 0)."""
    text = frontend_attribute(inst, SHARDING_ORIGIN) or \
        _step_head(OriginStep(None, ANNOTATION), comp)
    propagated_version = text.count(";")         # the last step's index
    partitioner = _step_head(
        OriginStep(None, PARTITIONER, "", (((comp, inst.name), propagated_version),)), comp)
    set_frontend_attribute(inst, SHARDING_ORIGIN, f"{text}{_text(propagated)};{partitioner}")


def _describe(step: OriginStep, comp: str) -> str:
    if step.how == ANNOTATION:
        return "user annotation"
    if step.how == PARTITIONER:
        return ("computed so by the partitioner's plan for this op; propagation's sharding is on "
                "the next line")
    names = ", ".join(n if c == comp else f"{c}:{n}" for (c, n), _ in step.sources)
    text = step.how + (f" from {names}" if names else "")
    if step.rule:
        text += f" via {step.rule}"
    if step.level is not None:
        text += f" (level {step.level})"
    return text


def _encode(steps: list[OriginStep], comp: str) -> str:
    """The attribute's text: the last step without its sharding (the instruction's); most
    histories are that one step."""
    last = _step_head(steps[-1], comp)
    if len(steps) == 1:
        return last
    return ";".join([_step_head(step, comp) + _text(step.sharding) for step in steps[:-1]]
                    + [last])


def _step_head(step: OriginStep, comp: str) -> str:
    """A step's text up to its sharding: `how|rule|sources|level|`."""
    refs = ",".join([f"{n}@{v}" if c == comp else f"{c}:{n}@{v}" for (c, n), v in step.sources])
    return f"{step.how}|{step.rule}|{refs}|{'' if step.level is None else step.level}|"


def _decode(text: str, comp: str, inst: Instruction) -> list[OriginStep]:
    from gspmdc.ir.parser import parse_sharding
    steps = []
    try:
        for part in text.split(";"):
            how, rule, sources, level, sharding = part.split("|")
            refs = []
            for ref in filter(None, sources.split(",")):
                where, version = ref.rsplit("@", 1)
                c, n = where.split(":", 1) if ":" in where else (comp, where)
                refs.append(((c, n), int(version)))
            steps.append(OriginStep(parse_sharding(sharding) if sharding else None, how, rule,
                              tuple(refs), int(level) if level else None))
    except (ValueError, GspmdcError) as e:
        raise GspmdcError(f"instruction {inst.name}: malformed {SHARDING_ORIGIN} attribute "
                          f"{text!r}: {e}") from None
    return steps
