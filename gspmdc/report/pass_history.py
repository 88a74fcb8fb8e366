"""The partitioner's passes as the report shows them: the module after each pass, what the pass
changed (a line diff of the printed modules and the instructions it added and removed, by
opcode), and its wall time."""
from __future__ import annotations

import difflib
import time
from collections import Counter
from dataclasses import dataclass

from gspmdc.ir.module import Module
from gspmdc.ir.printer import print_module
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.pipeline import default_propagation, partitioner_pipeline

#: diff context lines
CONTEXT = 2


@dataclass(frozen=True)
class PassStep:
    """One pass: its name, seconds, the module text after it, the diff against the text before
    (unified diff lines), and the opcodes it added and removed (counts)."""

    name: str
    seconds: float
    text: str
    diff: tuple[str, ...]
    added: dict[str, int]
    removed: dict[str, int]
    instructions: int


def partition_with_history(module: Module, n: int, windowed_einsum_threshold: int | None
                           ) -> tuple[Module, str, list[PassStep], float]:
    """Partition `module` (a global program; changed in place) for `n` partitions with the
    passes of `gspmdc compile` (Shardy's propagation for a module in Shardy form), keeping the
    module after each pass. Returns the partitioned module, the input text, the steps and the
    total compile seconds."""
    from gspmdc.ir.stage import module_stage
    before = print_module(module)
    before_ops = _opcodes(module)
    steps: list[PassStep] = []
    state = {"text": before, "ops": before_ops}

    def after(index, pass_, result, seconds):
        text = print_module(result)
        ops = _opcodes(result)
        diff = tuple(difflib.unified_diff(state["text"].splitlines(), text.splitlines(),
                                          lineterm="", n=CONTEXT))[2:]
        added = {k: v for k, v in (ops - state["ops"]).items()}
        removed = {k: v for k, v in (state["ops"] - ops).items()}
        steps.append(PassStep(pass_.name, seconds, text, diff, added, removed,
                              sum(ops.values())))
        state["text"], state["ops"] = text, ops

    form = default_propagation(module)          # as compile: Shardy's for a Shardy-form module
    pipeline = partitioner_pipeline(windowed_einsum_threshold=windowed_einsum_threshold,
                                    start=module_stage(module), propagation=form,
                                    shardy_form=form == "shardy")
    start = time.perf_counter()
    result = run_pipeline(PassContext(n), module, pipeline, after)
    return result, before, steps, time.perf_counter() - start


def _opcodes(module: Module) -> Counter:
    return Counter(inst.opcode for _, inst in module.all_instructions())


__all__ = ["PassStep", "partition_with_history"]
