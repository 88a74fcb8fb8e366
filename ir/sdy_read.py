"""Reading the Shardy form while parsing HLO text: the parser hands every `xla.sdy.*` value to a
`SdyReader`, which types it (`sdy_text.py`), remembers where it was written, and once the module is
built checks it against the module: meshes declared, axes of the mesh, one sharding per array leaf
with the value's rank, known `xla.sdy.*` custom-calls. Every problem is a `SdyPositionError` at the
offending character; the parser turns it into `file:line:col: message`.
"""
from __future__ import annotations

from gspmdc.errors import ShardingError

from .mesh import Mesh
from . import custom_call_targets as targets
from .sdy import (
    IN_SHARDINGS, MANUAL_AXES, OUT_SHARDINGS, PREFIX, SHARDING, SHARDING_RULE,
    OpShardingRule, frontend, module_meshes, resolve_mesh, validate,
)
from .sdy_text import SdyTextError, read_frontend_value, read_header_value

__all__ = ["SdyReader", "SdyPositionError", "KNOWN_TARGETS"]

#: the `xla.sdy.*` custom-call targets gspmdc knows (`custom_call_targets.py`)
KNOWN_TARGETS = frozenset(t for t in targets.KNOWN if t.startswith(PREFIX))


class SdyPositionError(Exception):
    """A problem with a Shardy attribute at `offset` characters into the module text."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.message, self.offset = message, offset


class SdyReader:
    """Types `xla.sdy.*` values as the parser meets them, then checks them against the module."""

    def __init__(self, text: str):
        self.text = text
        self.where: dict[int, int] = {}      # id(typed value) -> offset of its text
        self.values: list = []               # keeps the values alive, so ids stay unique

    def value(self, key: str, start: int, end: int):
        """The typed value of instruction attribute `key`, written at text[start:end]."""
        try:
            typed = read_frontend_value(key, self.text[start:end])
        except SdyTextError as e:
            raise SdyPositionError(e.message, start + e.offset) from None
        self.where[id(typed)] = start
        self.values.append(typed)
        return typed

    def header_value(self, key: str, start: int, end: int):
        """The typed value of the module header's frontend attribute `key` (only
        `xla.sdy.meshes` is known there), written at text[start:end]."""
        try:
            return read_header_value(key, self.text[start:end])
        except SdyTextError as e:
            raise SdyPositionError(e.message, start + e.offset) from None

    def check(self, module) -> None:
        """Check every Shardy value of `module` against its meshes and shapes."""
        meshes = module_meshes(module)
        for comp, inst in module.all_instructions():
            if inst.opcode == "custom-call":
                target = inst.attrs.get("custom_call_target")
                if isinstance(target, str) and target.startswith(PREFIX) and \
                        target not in KNOWN_TARGETS:
                    raise SdyPositionError(
                        f"{inst.name}: unknown Shardy custom-call '{target}' (known: "
                        f"{', '.join(sorted(KNOWN_TARGETS))})", self._inst_offset(inst))
            for key, value in frontend(inst).items():
                try:
                    self._check_value(key, value, inst, meshes)
                except ShardingError as e:
                    raise SdyPositionError(f"{inst.name}: {key}: {e}",
                                           self.where.get(id(value), 0)) from None

    def _inst_offset(self, inst) -> int:
        kv = inst.attrs.get("frontend_attributes")
        values = [v for _, v in kv.items] if kv is not None else []
        return min((self.where[id(v)] for v in values if id(v) in self.where), default=0)

    def _check_value(self, key, value, inst, meshes) -> None:
        if key == SHARDING:
            ranks = [leaf.rank for leaf in inst.shape.leaves()]
            self._check_shardings(value.shardings, ranks, meshes)
        elif key == IN_SHARDINGS:
            ranks = [leaf.rank for o in inst.operands for leaf in o.shape.leaves()]
            self._check_shardings(value.shardings, ranks, meshes)
        elif key == OUT_SHARDINGS:
            ranks = [leaf.rank for leaf in inst.shape.leaves()]
            self._check_shardings(value.shardings, ranks, meshes)
        elif key == MANUAL_AXES:
            names = {a for _, m in (meshes.meshes if meshes else ()) if isinstance(m, Mesh)
                     for a in m.axis_names}
            unknown = [a for a in value.axes if a not in names]
            if unknown:
                raise ShardingError(f"manual axes {unknown} are not axes of the module's meshes")
        elif key == SHARDING_RULE:
            _check_rule(value, inst)

    @staticmethod
    def _check_shardings(shardings, ranks, meshes) -> None:
        if len(shardings) != len(ranks):
            raise ShardingError(f"{len(shardings)} shardings for {len(ranks)} array values")
        for sharding, rank in zip(shardings, ranks):
            validate(sharding, resolve_mesh(sharding, meshes), rank)


def _check_rule(rule: OpShardingRule, inst) -> None:
    operands = [o.shape.rank for o in inst.operands]
    results = [leaf.rank for leaf in inst.shape.leaves()]
    if [len(m) for m in rule.operands] != operands or [len(m) for m in rule.results] != results:
        raise ShardingError(f"the rule maps tensors of ranks {[len(m) for m in rule.operands]} -> "
                            f"{[len(m) for m in rule.results]}, the instruction has {operands} -> "
                            f"{results}")
