"""Agreement figures over many cases, and divergence classes.

A divergence class names what differs, coarsely enough that one fix removes the whole class:
- ("sharding", opcode): an instruction of that opcode is sharded differently;
- ("deliberate", what): the shardings differ in a module that shows a known difference: one
  gspmdc makes on purpose (its other sharding differences, if any, are not classed) or a
  users-order tie, which explains all of them (`deliberate.py`);
- ("bytes", opcode): gspmdc sends more collective bytes than XLA, most of the excess in
  collectives made for instructions of that opcode (each partitioner records the instruction
  a collective serves in its metadata: gspmdc its name, XLA its op_name);
- ("values", who): the outputs of "gspmdc"'s or "XLA"'s partitioned program differ from the
  reference interpreter's, or its run failed, on the random inputs or with some branch of a
  conditional forced (`branches.py`);
- ("rejected", message) / ("crashed", message): gspmdc refused or failed on a module XLA
  partitions (the message with names and numbers blanked).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from gspmdc.ir.module import Module

from .differential import CaseResult


def _message_class(detail: str) -> str:
    text = re.sub(r"%?[A-Za-z_][\w.\-]*\.\d+", "<name>", detail)
    text = re.sub(r"\d+", "N", text)
    return text[:90]


def _origin_opcodes(before: Module) -> dict[str, str]:
    """What a collective's metadata op_name may say (an instruction's name, for gspmdc, or the
    op_name it carried, for XLA) -> the opcode of that instruction of `before`."""
    found = {}
    for _, inst in before.all_instructions():
        found[inst.name] = inst.opcode
        metadata = inst.attr("metadata")
        if metadata is not None and isinstance(metadata.get("op_name"), str):
            found.setdefault(metadata.get("op_name"), inst.opcode)
    return found


def _bytes_by_opcode(spmd: Module, origins: dict[str, str], n: int) -> Counter:
    from gspmdc.passes.spmd.traffic import collective_traffic
    by_name = {(c.name, i.name): i for c, i in spmd.all_instructions()}
    totals: Counter = Counter()
    for t in collective_traffic(spmd, n):
        metadata = by_name[(t.computation, t.name)].attr("metadata")
        op_name = metadata.get("op_name") if metadata is not None else None
        totals[origins.get(op_name, "?")] += t.total_sent_bytes or 0.0
    return totals


def divergence_classes(result: CaseResult) -> list[tuple[str, str]]:
    """The divergence classes `result` shows (see the module docstring), most specific first."""
    classes = []
    if result.status == "gspmdc-rejected":
        classes.append(("rejected", _message_class(result.detail)))
    elif result.status == "gspmdc-crashed":
        classes.append(("crashed", _message_class(result.detail)))
    if result.deliberate:
        classes += [("deliberate", reason) for reason in result.deliberate]
    else:
        for v in result.shardings:
            if v.compared and not v.agrees and ("sharding", v.opcode) not in classes:
                classes.append(("sharding", v.opcode))
    if result.bytes_compared and result.our_bytes > result.xla_bytes:
        from gspmdc import api
        origins = _origin_opcodes(api.parse(result.before, "<before>", verify=False))
        n = result.case.num_partitions
        excess = _bytes_by_opcode(api.parse(result.our_spmd, verify=False), origins, n)
        excess.subtract(_bytes_by_opcode(api.parse(result.xla_spmd, verify=False), origins, n))
        classes.append(("bytes", max(excess, key=excess.get) if excess else "?"))
    for who in ("gspmdc", "XLA"):
        if who in result.value_mismatch or any(who in b.mismatch for b in result.branches):
            classes.append(("values", who))
    return classes


def percent(part: int, whole: int, digits: int = 1) -> str:
    return f"{100.0 * part / whole:.{digits}f}%" if whole else "n/a"


@dataclass
class ValueChecks:
    """Counts of value checks of one kind (modules run on their random inputs, or forced
    branches): how many compared, how many agree with the reference interpreter for each
    partitioned program and for all three, and why the others were not run."""

    compared: int = 0
    agreeing: int = 0
    gspmdc_agreeing: int = 0
    xla_agreeing: int = 0
    skipped: Counter = field(default_factory=Counter)

    def add(self, values: str, mismatch) -> None:
        """Count one check: `values` is "compared" or "not run: <why>" (anything else, e.g.
        values not requested, is not counted); `mismatch` names who disagreed."""
        if values == "compared":
            self.compared += 1
            self.agreeing += not mismatch
            self.gspmdc_agreeing += "gspmdc" not in mismatch
            self.xla_agreeing += "XLA" not in mismatch
        elif values.startswith("not run: "):
            self.skipped[values[len("not run: "):].split(":")[0][:60]] += 1

    def agreement(self) -> str:
        return (f"gspmdc agrees with the reference on "
                f"{percent(self.gspmdc_agreeing, self.compared)}, XLA on "
                f"{percent(self.xla_agreeing, self.compared)}, all three on "
                f"{percent(self.agreeing, self.compared)}")

    def not_run(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.skipped.most_common()) or "none"


@dataclass
class Figures:
    """Counts over the cases of one option setting."""

    cases: int = 0
    status: Counter = field(default_factory=Counter)
    instructions: int = 0
    instructions_agreeing: int = 0
    instructions_absent: int = 0
    modules_compared: int = 0
    modules_agreeing: int = 0
    #: modules whose shardings differ where gspmdc differs from XLA on purpose or by a users-order
    #: tie (`deliberate.py`),
    #: and the instructions compared / agreeing in all the other modules
    modules_deliberate: int = 0
    instructions_elsewhere: int = 0
    instructions_agreeing_elsewhere: int = 0
    bytes_compared: int = 0
    bytes_equal: int = 0
    bytes_fewer: int = 0
    bytes_more: int = 0
    bytes_unknown: int = 0
    values: ValueChecks = field(default_factory=ValueChecks)
    #: forced branches (`branches.py`): modules with some, and the checks of their runs
    branch_modules: int = 0
    branches: ValueChecks = field(default_factory=ValueChecks)
    classes: Counter = field(default_factory=Counter)
    #: seconds spent per stage (`CaseResult.seconds`), summed over the cases
    seconds: Counter = field(default_factory=Counter)

    def add(self, r) -> None:
        """Count one case (a `summary.CaseSummary`)."""
        self.cases += 1
        self.status[r.status] += 1
        self.seconds.update(r.seconds)
        if r.status in ("xla-rejected", "xla-crashed", "skipped"):
            return
        self.instructions += r.instructions
        self.instructions_agreeing += r.agreeing
        self.instructions_absent += r.absent
        if r.propagated:
            self.modules_compared += 1
            self.modules_agreeing += r.shardings_agree
            if r.deliberate:
                self.modules_deliberate += 1
            else:
                self.instructions_elsewhere += r.instructions
                self.instructions_agreeing_elsewhere += r.agreeing
        if r.bytes_compared:
            self.bytes_compared += 1
            self.bytes_equal += r.our_bytes == r.xla_bytes
            self.bytes_fewer += r.our_bytes < r.xla_bytes
            self.bytes_more += r.our_bytes > r.xla_bytes
        elif r.spmd_made:
            self.bytes_unknown += 1
        self.values.add(r.values, r.value_mismatch)
        self.branch_modules += bool(r.branches)
        for _, values, mismatch in r.branches:
            self.branches.add(values, mismatch)
        for c in set(r.classes):
            self.classes[c] += 1

    @property
    def xla_partitioned(self) -> int:
        """Cases XLA partitioned."""
        return self.cases - self.status["xla-rejected"] - self.status["xla-crashed"] - \
            self.status["skipped"]

    @property
    def instruction_agreement(self) -> float:
        return self.instructions_agreeing / self.instructions if self.instructions else 1.0

    @property
    def module_agreement(self) -> float:
        return self.modules_agreeing / self.modules_compared if self.modules_compared else 1.0

    @property
    def instruction_agreement_elsewhere(self) -> float:
        """Per-instruction agreement over the modules without a deliberate difference."""
        return self.instructions_agreeing_elsewhere / self.instructions_elsewhere \
            if self.instructions_elsewhere else 1.0

    @property
    def module_agreement_elsewhere(self) -> float:
        """Modules agreeing fully among those without a deliberate difference."""
        whole = self.modules_compared - self.modules_deliberate
        return self.modules_agreeing / whole if whole else 1.0

    @property
    def gspmdc_value_agreement(self) -> float:
        """gspmdc's partitioned program agrees with the reference interpreter."""
        return self.values.gspmdc_agreeing / self.values.compared if self.values.compared \
            else 1.0

    def lines(self) -> list[str]:
        s = self.status
        return [
            f"cases: {self.cases} ({s['skipped']} with one partition skipped); XLA partitioned "
            f"{self.xla_partitioned} (rejected {s['xla-rejected']}, crashed "
            f"{s['xla-crashed']}); of those gspmdc "
            f"rejected {s['gspmdc-rejected']}, crashed {s['gspmdc-crashed']}",
            f"shardings: {percent(self.instructions_agreeing, self.instructions, 2)} of "
            f"{self.instructions} instructions agree; "
            f"{percent(self.modules_agreeing, self.modules_compared, 2)} of "
            f"{self.modules_compared} modules agree fully "
            f"({self.instructions_absent} instructions absent on one side, not compared)",
            f"shardings without the {self.modules_deliberate} modules that differ on purpose or by users order "
            f"(docs/propagation.md): "
            f"{percent(self.instructions_agreeing_elsewhere, self.instructions_elsewhere, 2)}"
            f" of {self.instructions_elsewhere} instructions agree; "
            f"{percent(self.modules_agreeing, self.modules_compared - self.modules_deliberate, 2)}"
            f" of {self.modules_compared - self.modules_deliberate} modules agree fully",
            f"bytes: {self.bytes_compared} modules compared: gspmdc <= XLA on "
            f"{self.bytes_equal + self.bytes_fewer} (equal {self.bytes_equal}, fewer "
            f"{self.bytes_fewer}), more on {self.bytes_more}; unknown trip count "
            f"{self.bytes_unknown}",
            f"values: {self.values.compared} modules run: {self.values.agreement()}",
            f"branches forced: {self.branches.compared} runs in {self.branch_modules} modules "
            f"with a conditional: {self.branches.agreement()}; not run: "
            f"{self.branches.not_run()}",
            f"values not run: {self.values.not_run()}",
            f"seconds per case ({self.cases - s['skipped']} cases): " + (", ".join(
                f"{stage} {seconds / max(1, self.cases - s['skipped']):.3f}"
                for stage, seconds in self.seconds.most_common()) or "none"),
        ]
