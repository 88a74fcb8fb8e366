"""Agreement figures over many cases, and divergence classes.

A divergence class names what differs, coarsely enough that one fix removes the whole class:
- ("sharding", opcode): an instruction of that opcode is sharded differently;
- ("deliberate", what): the shardings differ in a module that shows a known difference: one
  gspmdc makes on purpose (its other sharding differences, if any, are not classed) or a
  users-order tie, which explains all of them (`deliberate.py`);
- ("bytes", opcode): gspmdc sends more collective bytes than XLA by the project's measure (the
  busiest device's bytes, then the mean on a tie: `bytes_verdict`), most of the excess (on the
  busiest device) in collectives made for instructions of that opcode (each partitioner
  records the instruction a collective serves in its metadata: gspmdc its name, XLA its
  op_name); not where XLA's values are wrong (`differential.xla_values_wrong`);
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

import numpy as np

from gspmdc.ir.module import Module

from .differential import CaseResult, ProgramBytes

#: the two measures a case's bytes are judged by: the project's ("busiest": the busiest
#: device's bytes, then the mean on a tie) and XLA's reports' ("mean" per device alone)
MEASURES = ("busiest", "mean")


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


def _bytes_by_opcode(spmd: Module, origins: dict[str, str], n: int) -> dict[str, ProgramBytes]:
    """The program's bytes (`ProgramBytes`, exact per device) of the collectives made for each
    opcode of `origins`."""
    from gspmdc.passes.spmd.traffic import collective_traffic
    by_name = {(c.name, i.name): i for c, i in spmd.all_instructions()}
    sent: dict[str, np.ndarray] = {}
    for t in collective_traffic(spmd, n):
        metadata = by_name[(t.computation, t.name)].attr("metadata")
        op_name = metadata.get("op_name") if metadata is not None else None
        opcode = origins.get(op_name, "?")
        sent[opcode] = sent.get(opcode, 0) + t.traffic.sent * (t.executions or 0)
    return {opcode: ProgramBytes(int(v.max()), float(v.sum()) / n) for opcode, v in sent.items()}


def bytes_verdict(r, measure: str = "busiest") -> str | None:
    """How case `r` (a `CaseResult` or `summary.CaseSummary`) compares with XLA in collective
    bytes by `measure` (`MEASURES`): "fewer", "equal" or "more"; "xla-values-wrong" when XLA's
    partitioned program computes wrong values (`differential.xla_values_wrong`: its bytes bound
    nothing, the case is kept out of the verdict); "unrecorded" for the busiest device in a
    record written before it was kept; None when the bytes were not compared (no partitioned
    program on some side, or a loop without a static trip count)."""
    if not r.bytes_compared:
        return None
    if r.xla_values_wrong:
        return "xla-values-wrong"
    if measure == "mean":
        ours, theirs = r.our_bytes, r.xla_bytes
    elif r.our_busiest is None or r.xla_busiest is None:
        return "unrecorded"
    else:
        ours = ProgramBytes(r.our_busiest, r.our_bytes)
        theirs = ProgramBytes(r.xla_busiest, r.xla_bytes)
    return "more" if ours > theirs else "fewer" if ours < theirs else "equal"


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
    if bytes_verdict(result) == "more":
        from gspmdc import api
        origins = _origin_opcodes(api.parse(result.before, "<before>", verify=False))
        n = result.case.num_partitions
        ours = _bytes_by_opcode(api.parse(result.our_spmd, verify=False), origins, n)
        theirs = _bytes_by_opcode(api.parse(result.xla_spmd, verify=False), origins, n)
        none = ProgramBytes(0, 0.0)
        excess = {opcode: (ours.get(opcode, none).busiest - theirs.get(opcode, none).busiest,
                           ours.get(opcode, none).mean - theirs.get(opcode, none).mean)
                  for opcode in ours.keys() | theirs.keys()}
        classes.append(("bytes", max(sorted(excess), key=excess.get) if excess else "?"))
    for who in ("gspmdc", "XLA"):
        if who in result.value_mismatch or any(who in b.mismatch for b in result.branches):
            classes.append(("values", who))
    return classes


def run_order(name: str) -> tuple:
    """A case's place in run order by its name (the generator seed, then off before on),
    whatever order shards finished the cases in."""
    module, _, setting = name.partition(" ")
    digits = module.rsplit("/", 1)[-1]
    return (int(digits) if digits.isdigit() else 0, module, setting)


def _names(names: list[str]) -> str:
    """` (a, b, ...)`: case names in run order, each as "<module> <setting>" (the module's
    last path component: `fuzz/11100000266 [on]` is `11100000266 on`)."""
    if not names:
        return ""
    shown = [f"{n.partition(' ')[0].rsplit('/', 1)[-1]} {n.partition(' ')[2].strip('[]')}"
             for n in sorted(names, key=run_order)]
    return " (" + ", ".join(shown) + ")"


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
    #: bytes by the project's measure (`bytes_verdict`), over the modules compared with XLA's
    #: values not wrong, and the module-settings above XLA
    bytes_compared: int = 0
    bytes_equal: int = 0
    bytes_fewer: int = 0
    bytes_more: int = 0
    #: the same by the mean alone
    mean: Counter = field(default_factory=Counter)
    #: module-settings above XLA by each measure, and kept out of the verdict because XLA's
    #: values are wrong; records without the busiest device's bytes
    above: dict = field(default_factory=lambda: {m: [] for m in MEASURES})
    xla_values_wrong: list = field(default_factory=list)
    bytes_unrecorded: int = 0
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
        verdict, by_mean = bytes_verdict(r), bytes_verdict(r, "mean")
        if verdict in ("equal", "fewer", "more"):
            self.bytes_compared += 1
            self.bytes_equal += verdict == "equal"
            self.bytes_fewer += verdict == "fewer"
            self.bytes_more += verdict == "more"
        self.bytes_unrecorded += verdict == "unrecorded"
        if by_mean in ("equal", "fewer", "more"):
            self.mean[by_mean] += 1
        for measure, v in zip(MEASURES, (verdict, by_mean)):
            if v == "more":
                self.above[measure].append(r.name)
        if verdict == "xla-values-wrong":
            self.xla_values_wrong.append(r.name)
        if verdict is None and r.spmd_made:
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
            f"bytes (the busiest device's, then the mean on a tie): {self.bytes_compared} "
            f"modules compared: gspmdc <= XLA on {self.bytes_equal + self.bytes_fewer} (equal "
            f"{self.bytes_equal}, fewer {self.bytes_fewer}), more on {self.bytes_more}"
            f"{_names(self.above['busiest'])}; unknown trip count {self.bytes_unknown}"
            + (f"; busiest device not recorded {self.bytes_unrecorded}"
               if self.bytes_unrecorded else ""),
            f"bytes (the mean per device alone): {sum(self.mean.values())} modules compared: "
            f"gspmdc <= XLA on {self.mean['equal'] + self.mean['fewer']} (equal "
            f"{self.mean['equal']}, fewer {self.mean['fewer']}), more on {self.mean['more']}"
            f"{_names(self.above['mean'])}",
            f"bytes not judged, XLA's values wrong (its outputs differ from the reference "
            f"interpreter's where gspmdc's agree): {len(self.xla_values_wrong)}"
            f"{_names(self.xla_values_wrong)}",
            f"values: {self.values.compared} modules run: {self.values.agreement()}",
            f"branches forced: {self.branches.compared} runs in {self.branch_modules} modules "
            f"with a conditional: {self.branches.agreement()}; not run: "
            f"{self.branches.not_run()}",
            f"values not run: {self.values.not_run()}",
            f"seconds per case ({self.cases - s['skipped']} cases): " + (", ".join(
                f"{stage} {seconds / max(1, self.cases - s['skipped']):.3f}"
                for stage, seconds in self.seconds.most_common()) or "none"),
        ]
