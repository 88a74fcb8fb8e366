"""Per-instruction agreement of gspmdc's Shardy propagation with XLA's (test-only).

XLA's answer is its module before and after its Shardy pass (`shardy_oracle.py`). gspmdc
propagates XLA's *before* module (so both start from the same graph: XLA inlines calls and
simplifies a little first) and every instruction of the entry and its control-flow callees that
XLA named (`metadata={op_name=...}`, the original instruction's name) is compared with XLA's
instruction of the same name and opcode (a sharding constraint is a `copy` in XLA's module),
copies of one instruction (constant splitting) pair in any order. Tuple-shaped instructions and get-tuple-elements are left
out (XLA may reorder loop-carried tuples); a missing sharding counts as replicated. Where XLA's
export already inserted one of Shardy's explicit reshards after an instruction (a partitioning
decision: gspmdc's partitioner makes its own there), the sharding propagation gave it is the
reshard's.

    python tests/shardy_differential.py FILE.hlo ... [-n 8]   # runs the oracle, prints disagreements
    python tests/shardy_differential.py --random 200 [--seed 0]   # random modules (shardy_random)
    python tests/shardy_differential.py --fuzz 200 [--seed 0]     # tests/fuzz's, in Shardy form
"""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gspmdc import api
from gspmdc.ir.sharding import HloSharding
from gspmdc.passes.shardy import propagate_shardy
from gspmdc.passes.spmd.call_graph import partitioned_computations
from gspmdc.passes.pass_manager import PassContext
from gspmdc.passes.spmd.inline_calls import InlineCalls


@dataclass
class Agreement:
    compared: int = 0
    agreed: int = 0
    differences: list[str] = field(default_factory=list)

    def add(self, other: "Agreement") -> None:
        self.compared += other.compared
        self.agreed += other.agreed
        self.differences += other.differences

    @property
    def ratio(self) -> float:
        return self.agreed / self.compared if self.compared else 1.0


def _op_name(inst) -> str | None:
    metadata = inst.attrs.get("metadata")
    return metadata.get("op_name") if metadata is not None else None


def _leaves(inst) -> tuple:
    if inst.sharding is None:
        return tuple(HloSharding.replicate() for _ in inst.shape.leaves())
    return tuple(inst.sharding.elements) if inst.sharding.is_tuple else (inst.sharding,)


#: the ops Shardy's export reshards the result of (its explicit reshards, minimal version)
_RESHARDED_OPS = frozenset({"concatenate", "dot"})


def _named(module, constraint_opcode: str):
    """Named instructions by (op_name, opcode), each with its propagated sharding: an
    instruction XLA's export resharded (a `copy` of it with its op_name follows: Shardy's
    explicit reshards, a partitioning step) counts with the copy's sharding."""
    out = defaultdict(list)
    for comp in partitioned_computations(module):
        users = defaultdict(list)
        for inst in comp.instructions:
            for operand in inst.operands:
                users[id(operand)].append(inst)
        resharded = {id(i.operands[0]): i for i in comp.instructions
                     if i.opcode == "copy" and _op_name(i) is not None and
                     i.operands[0].opcode in _RESHARDED_OPS and
                     _op_name(i) == _op_name(i.operands[0]) and users[id(i.operands[0])] == [i]}
        for inst in comp.instructions:
            name = _op_name(inst)
            if name is None or inst.shape.is_tuple or inst.opcode == "get-tuple-element" or \
                    any(r is inst for r in resharded.values()):
                continue
            opcode = constraint_opcode if inst.attrs.get("custom_call_target") == "Sharding" \
                else inst.opcode
            out[(name, opcode)].append(resharded.get(id(inst), inst))
    return out


def agreement(before_text: str, after_text: str, label: str = "") -> Agreement:
    """Propagate XLA's `before` module with gspmdc and compare with XLA's `after` module."""
    ours = api.parse(before_text, f"{label} (XLA before Shardy)")
    InlineCalls().apply(PassContext(), ours)
    propagate_shardy(ours)
    theirs = api.parse(after_text, f"{label} (XLA after Shardy)", verify=False)
    mine = _named(ours, "copy")
    result = Agreement()
    for key, insts in _named(theirs, "custom-call").items():
        ours_left = [_leaves(i) for i in mine.get(key, [])]
        paired = min(len(insts), len(ours_left))
        unmatched = []
        for theirs_inst in insts[:paired]:      # copies of one instruction pair in any order
            leaves = _leaves(theirs_inst)
            if leaves in ours_left:
                ours_left.remove(leaves)
                result.agreed += 1
            else:
                unmatched.append(leaves)
            result.compared += 1
        for theirs_leaves, our_leaves in zip(unmatched, ours_left):
            result.differences.append(
                f"{label}: {key[0]} ({key[1]}): gspmdc {[str(s) for s in our_leaves]}"
                f" XLA {[str(s) for s in theirs_leaves]}")
    return result


def _option(argv: list[str], flag: str, default: int) -> tuple[int, list[str]]:
    if flag not in argv:
        return default, argv
    k = argv.index(flag)
    return int(argv[k + 1]), argv[:k] + argv[k + 2:]


def random_agreement(count: int, seed: int = 0, n: int = 8) -> tuple[Agreement, list[str]]:
    """Agreement over `count` random modules (`shardy_random`), and the modules XLA rejected."""
    from shardy_oracle import run_in_subprocess
    from shardy_random import random_module
    texts = [random_module(seed + k) for k in range(count)]
    total, rejected = Agreement(), []
    for k, (text, answer) in enumerate(zip(texts, run_in_subprocess(texts, n))):
        if "error" in answer:
            rejected.append(f"seed {seed + k}: {answer['error'][:200]}")
            continue
        total.add(agreement(answer["before"], answer["after"], f"seed {seed + k}"))
    return total, rejected


def _answers(texts: list[str], n: int, chunk: int = 20) -> list[dict]:
    """The oracle's answers, `chunk` modules per process; a chunk whose process XLA killed (a
    check failure) is rerun one module at a time, the killer answering {'error': ...}."""
    from shardy_oracle import run_in_subprocess
    answers = []
    for start in range(0, len(texts), chunk):
        part = texts[start:start + chunk]
        try:
            answers += run_in_subprocess(part, n)
        except RuntimeError:
            for text in part:
                try:
                    answers += run_in_subprocess([text], n)
                except RuntimeError as e:
                    answers.append({"error": f"XLA crashed: {str(e)[-300:]}"})
    return answers


def fuzz_agreement(count: int, seed: int = 0) -> tuple[Agreement, list[str], int]:
    """Agreement over the first `count` cases of `tests/fuzz` from `seed` that have a Shardy form
    (`shardy_fuzz`), the cases XLA rejected, and the number of cases without a Shardy form."""
    from fuzz import case
    from shardy_fuzz import shardy_text
    by_n: dict[int, list[tuple[int, str]]] = defaultdict(list)
    skipped = 0
    for k in range(count):
        c = case(seed + k)
        text = shardy_text(c)
        if text is None:
            skipped += 1
        else:
            by_n[c.num_partitions].append((seed + k, text))
    total, rejected = Agreement(), []
    for n, items in sorted(by_n.items()):
        for (s, text), answer in zip(items, _answers([t for _, t in items], n)):
            if "error" in answer:
                rejected.append(f"fuzz case {s}: {answer['error'][:200]}")
                continue
            total.add(agreement(answer["before"], answer["after"], f"fuzz case {s}"))
    return total, rejected, skipped


def main(argv: list[str]) -> int:
    from shardy_oracle import run_in_subprocess
    n, argv = _option(argv, "-n", 8)
    count, argv = _option(argv, "--random", 0)
    seed, argv = _option(argv, "--seed", 0)
    fuzz_count, argv = _option(argv, "--fuzz", 0)
    if fuzz_count:
        total, rejected, skipped = fuzz_agreement(fuzz_count, seed)
        for line in total.differences + [f"XLA rejected {r}" for r in rejected]:
            print(line)
        print(f"total {total.agreed}/{total.compared} ({100 * total.ratio:.2f}%), "
              f"{len(rejected)} cases rejected by XLA, {skipped} without a Shardy form")
        return 0
    if count:
        total, rejected = random_agreement(count, seed, n)
        for line in total.differences + [f"XLA rejected {r}" for r in rejected]:
            print(line)
        print(f"total {total.agreed}/{total.compared} ({100 * total.ratio:.2f}%), "
              f"{len(rejected)} of {count} modules rejected by XLA")
        return 0
    total = Agreement()
    for path, answer in zip(argv, run_in_subprocess([Path(p).read_text() for p in argv], n)):
        if "error" in answer:
            print(f"{path}: XLA failed: {answer['error'][:300]}")
            continue
        result = agreement(answer["before"], answer["after"], path)
        print(f"{path}: {result.agreed}/{result.compared}")
        for line in result.differences:
            print("  " + line)
        total.add(result)
    print(f"total {total.agreed}/{total.compared} ({100 * total.ratio:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main(sys.argv[1:]))
