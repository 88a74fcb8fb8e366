"""What one case showed, as the figures and the report need it: a `CaseSummary` is made from a
`CaseResult` (`summarize`) and written to / read from a line of JSON, so that a run split into
shards (separate processes or sessions, `xla.py --shard i/k --results FILE`) gives per-case
records whose union is reported exactly as the unsplit run (`xla.py merge FILE...`).

A divergent case keeps the texts its shrinking starts from (`text`, `before`,
`reference_text`); a case without divergences keeps none of them, so a record stays small.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .differential import Case, CaseResult, xla_values_wrong
from .report import divergence_classes


@dataclass
class CaseSummary:
    """One case (a module under one option setting). `instructions` / `agreeing` / `absent`:
    instructions of XLA's `before` compared, agreeing, absent on one side; `differing`: the
    compared instructions that disagree as (opcode, description); `classes`: its divergence
    classes (`report.divergence_classes`), most specific first; `spmd_made`: gspmdc partitioned
    it; `seed`: the run seed its inputs were drawn from; `branches`: each forced branch's value
    check as [label, values, mismatch] (`differential.BranchValues`). The other fields are
    `CaseResult`'s (`our_busiest` / `xla_busiest` are None in records written before they
    were kept: such a record's bytes are judged by the mean alone)."""

    name: str
    num_partitions: int
    propagate_to_output: bool
    propagate_to_parameters: bool
    seed: int
    status: str
    detail: str = ""
    instructions: int = 0
    agreeing: int = 0
    absent: int = 0
    propagated: bool = False
    differing: list = field(default_factory=list)
    deliberate: list = field(default_factory=list)
    our_bytes: float | None = None
    xla_bytes: float | None = None
    spmd_made: bool = False
    values: str = "not run"
    value_mismatch: dict = field(default_factory=dict)
    classes: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)
    branches: list = field(default_factory=list)
    our_busiest: int | None = None
    xla_busiest: int | None = None
    text: str | None = None
    before: str | None = None
    reference_text: str | None = None

    @property
    def setting(self) -> str:
        """"on" or "off": the two option settings every module runs under."""
        return "on" if self.propagate_to_output else "off"

    @property
    def shardings_agree(self) -> bool:
        return not self.differing

    @property
    def bytes_compared(self) -> bool:
        return self.our_bytes is not None and self.xla_bytes is not None

    @property
    def xla_values_wrong(self) -> bool:
        return xla_values_wrong(self.value_mismatch, [m for _, _, m in self.branches])

    def case(self, text: str | None = None) -> Case:
        """The case again (with `text` in place of its module, e.g. a smaller one)."""
        return Case(self.name, text if text is not None else self.text, self.num_partitions,
                    self.propagate_to_output, self.propagate_to_parameters, self.reference_text)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "CaseSummary":
        record = json.loads(line)
        record["classes"] = [tuple(c) for c in record["classes"]]
        record["differing"] = [tuple(d) for d in record["differing"]]
        return cls(**record)


def summarize(result: CaseResult, seed: int) -> CaseSummary:
    """The summary of `result` (a case run from run seed `seed`)."""
    case = result.case
    compared = result.compared_shardings
    classes = [tuple(c) for c in divergence_classes(result)]
    summary = CaseSummary(
        case.name, case.num_partitions, case.propagate_to_output, case.propagate_to_parameters,
        seed, result.status, result.detail, len(compared), sum(v.agrees for v in compared),
        len(result.shardings) - len(compared), bool(result.shardings),
        [(v.opcode, v.describe()) for v in compared if not v.agrees], list(result.deliberate),
        result.our_bytes, result.xla_bytes, result.our_spmd is not None, result.values,
        dict(result.value_mismatch), classes, dict(result.seconds),
        [[b.label, b.values, dict(b.mismatch)] for b in result.branches],
        our_busiest=result.our_busiest, xla_busiest=result.xla_busiest)
    if classes:
        summary.text, summary.before = case.text, result.before
        summary.reference_text = case.reference_text
    return summary


def read_summaries(paths) -> list[CaseSummary]:
    """The summaries recorded in the files `paths` (one JSON line each); a case recorded twice
    (a shard resumed after being cut off mid-write) counts once, a torn last line not at all."""
    found: dict[str, CaseSummary] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    summary = CaseSummary.from_json(line)
                except (ValueError, TypeError, KeyError):
                    continue
                found.setdefault(summary.name, summary)
    return list(found.values())
