"""`gspmdc bisect`: the first value of a partitioned program that differs from the unpartitioned
program's.

The reference is the global program after `inline-calls` (the partitioner's first pass, which
names the values the partitioned program keeps), evaluated on one device; the partitioned program
runs on N local threads from the same global inputs. Both runs record the values they need, each
time an instruction runs (loop bodies once per iteration). Then, in the reference's execution
order (program order, through loops, calls and branches), every instruction X that the
partitioned program kept is checked at its k-th execution against the reference's k-th:

1. the reshards of its operands: the partitioner's reshard of operand i (the instructions whose
   metadata say `op_name=X spmd_role="operand i"`) ends in the value X reads, which must be the
   reference's value `spmd_value` laid out as `spmd_to`;
2. X itself, laid out as its sharding in the partitioned program (a partial result, with an
   `unreduced` subgroup, combined by the reduction its result reshard applies);
3. the reshard of its result (`spmd_role="result"`), which must be X laid out as `spmd_to`.

A value is checked piece by piece: every partition's piece against its part of the reference
value (a tile of a tiled value, the whole of a replicated one, padding ignored), so a partition
holding wrong numbers is named even when the others are right; a partial result as the combined
whole. Floats must agree within `run --check`'s bound for the program's least precise output
(`runtime.compare.program_tolerance`), anything else exactly. The first
value that differs is reported with both values, the partitions whose pieces differ, the
shardings, and the partitioner's instructions for X with their reasons.

Values the partitioned program does not keep (cleanup removes dead and duplicate instructions),
or whose per-partition shape is not a shard of the global one, are not checked; the report counts
them. Both runs' values stay in memory: bisect a small reproduction, not a full-size model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.sharding import HloSharding
from gspmdc.runtime.compare import compare_output_arrays, program_tolerance
from gspmdc.runtime.sharded_io import ShardedLeaf, assemble_leaf, flatten_value

#: reducers of the collectives that resolve partial results, by their root opcode
_COMBINERS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
              "minimum": np.minimum, "and": np.logical_and, "or": np.logical_or}


@dataclass(frozen=True)
class Check:
    """A value of the partitioned program that must equal a reference value: instruction
    `spmd` of computation `computation` holds reference value `value` laid out as `sharding`
    (`role`: "value", "operand i reshard" or "result reshard"); partial values are combined
    with `combine`."""

    computation: str
    spmd: Instruction
    value: str
    sharding: HloSharding
    role: str
    combine: Any = np.add


@dataclass(frozen=True)
class PieceDifference:
    """One partition's piece of a value against its part of the reference."""

    partition: int
    max_abs_error: float
    problem: str


@dataclass(frozen=True)
class Difference:
    """The first differing value: the check that failed, at which execution, both values, the
    partitions whose pieces differ, and the instruction X it belongs to with the partitioner's
    instructions for it."""

    check: Check
    instruction: Instruction
    spmd_instruction: Instruction
    execution: int
    executions: int
    leaf: int | None
    reference: np.ndarray
    partitioned: np.ndarray
    pieces: tuple[PieceDifference, ...]
    partitioner_instructions: tuple[Instruction, ...]
    loop: str | None


@dataclass
class BisectResult:
    """How many values bisect checked, what it could not check and why, and the first
    difference (None when every checked value matches) or a divergence of the runs."""

    checked: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    difference: Difference | None = None
    divergence: str | None = None


class _Recorder:
    """An `on_value` hook keeping every value of the wanted (computation, instruction)s."""

    def __init__(self, module: Module, wanted: set):
        self.where = {id(inst): comp.name for comp in module.computations.values()
                      for inst in comp.instructions}
        self.wanted = wanted
        self.values: dict[tuple[str, str], list[Any]] = {}
        self.order: list[tuple[str, str, int]] = []

    def __call__(self, inst: Instruction, value: Any) -> None:
        key = (self.where[id(inst)], inst.name)
        if key in self.wanted:
            seen = self.values.setdefault(key, [])
            self.order.append((key[0], key[1], len(seen)))
            seen.append(value)


def bisect(reference: Module, spmd: Module, num_partitions: int,
           inputs: Sequence[Any]) -> BisectResult:
    """Check `spmd` (the partitioned program, for `num_partitions`) against `reference` (the
    global program after inline-calls) on the global `inputs` (see the module docstring)."""
    from gspmdc.runtime.backends.local import run_local
    from gspmdc.runtime.interpreter import evaluate
    from gspmdc.runtime.sharded_io import spmd_signature, split_inputs
    n = num_partitions
    result = BisectResult()
    ref_by_key = {(comp.name, inst.name): inst for comp in reference.computations.values()
                  for inst in comp.instructions}
    checks = _checks(reference, spmd, ref_by_key, n, result.skipped)
    wanted_ref = {(c.computation, c.value) for cs in checks.values() for c in cs}
    wanted_spmd = {(c.computation, c.spmd.name) for cs in checks.values() for c in cs}
    ref_recorder = _Recorder(reference, wanted_ref | set(checks))
    evaluate(reference, list(inputs), on_value=ref_recorder)
    recorders = [_Recorder(spmd, wanted_spmd) for _ in range(n)]
    run_local(spmd, split_inputs(spmd_signature(spmd, n), inputs), n, on_value=recorders)
    tolerance = program_tolerance(reference)
    for computation, name, k in ref_recorder.order:
        key = (computation, name)
        for check in checks.get(key, ()):
            executions = len(ref_recorder.values[(computation, check.value)])
            runs = [r.values.get((computation, check.spmd.name), []) for r in recorders]
            if any(len(run) != len(ref_recorder.values[key]) for run in runs):
                result.divergence = (
                    f"{computation}/{check.spmd.name} ran {min(len(r) for r in runs)} to "
                    f"{max(len(r) for r in runs)} times in the partitioned program, "
                    f"{computation}/{name} {len(ref_recorder.values[key])} times in the "
                    "reference")
                return result
            want = ref_recorder.values[(computation, check.value)]
            # an operand reshard reads the value as of this execution of its user
            want_k = want[min(k, len(want) - 1)]
            difference = _compare(check, want_k, [run[k] for run in runs],
                                  reference.computation(computation).instruction(check.value), n,
                                  tolerance)
            if difference is not None:
                spmd_inst = spmd.computation(computation).instruction(name)
                result.difference = Difference(
                    check, ref_by_key[key], spmd_inst, k, executions, difference[0],
                    difference[1], difference[2], difference[3],
                    _partitioner_instructions(spmd.computation(computation), spmd_inst),
                    _loop_of(reference, computation))
                return result
            result.checked += 1
    return result


def _checks(reference: Module, spmd: Module, ref_by_key: dict, n: int,
            skipped: dict[str, int]) -> dict[tuple[str, str], list[Check]]:
    """The checks of each reference instruction the partitioned program kept, in order."""
    checks: dict[tuple[str, str], list[Check]] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for comp in spmd.computations.values():
        groups = _reshard_groups(comp)
        for inst in comp.instructions:
            key = (comp.name, inst.name)
            ref = ref_by_key.get(key)
            if ref is None or _made_by_partitioner(inst):
                continue
            if ref.opcode != inst.opcode:
                skip("replaced by the partitioner")
                continue
            found = []
            for i, operand in enumerate(inst.operands):
                group = groups.get((inst.name, f"operand {i}"))
                if group is not None and operand in group[1]:
                    found.append(_reshard_check(comp.name, operand, group[0], f"operand {i}"))
            found.append(Check(comp.name, inst, inst.name,
                               inst.sharding or HloSharding.replicate(), "value",
                               _combiner(ref, reference)))
            group = groups.get((inst.name, "result"))
            if group is not None:
                last = _last(group[1])
                found.append(_reshard_check(comp.name, last, group[0], "result"))
            kept = []
            for check in found:
                reason = _why_not_checkable(check, ref_by_key.get((comp.name, check.value)), n)
                if reason is None:
                    kept.append(check)
                else:
                    skip(reason)
            if kept:
                checks[key] = kept
    kept = {(comp.name, inst.name) for comp in spmd.computations.values()
            for inst in comp.instructions}
    for key in ref_by_key:
        if key not in kept:
            skip("not in the partitioned program (removed or renamed)")
    return checks


def _made_by_partitioner(inst: Instruction) -> bool:
    metadata = inst.attr("metadata")
    return metadata is not None and metadata.get("spmd_reason") is not None


def _reshard_groups(comp: Computation) -> dict[tuple[str, str], tuple[dict, list[Instruction]]]:
    """The reshards of `comp` by (user, role): their metadata and instructions."""
    groups: dict[tuple[str, str], tuple[dict, list[Instruction]]] = {}
    for inst in comp.instructions:
        metadata = inst.attr("metadata")
        if metadata is None or metadata.get("op_type") != "reshard":
            continue
        key = (metadata.get("op_name"), metadata.get("spmd_role"))
        groups.setdefault(key, ({k: metadata.get(k) for k in ("spmd_value", "spmd_to")}, []))
        groups[key][1].append(inst)
    return groups


def _reshard_check(computation: str, final: Instruction, metadata: dict, role: str) -> Check:
    return Check(computation, final, metadata["spmd_value"], parse_sharding(metadata["spmd_to"]),
                 f"{role} reshard")


def _last(group: list[Instruction]) -> Instruction:
    """The instruction of a reshard that no other instruction of it reads (its output)."""
    read = {id(o) for inst in group for o in inst.operands}
    return [inst for inst in group if id(inst) not in read][-1]


def _combiner(ref: Instruction, module: Module):
    """How partial values of `ref` combine: by its reducer for a reduce (whose partial results
    over a tiled reduced dimension await the rest of the reduction), else by addition (partial
    sums of dots and convolutions)."""
    if ref.opcode in ("reduce", "reduce-window") and ref.attr("to_apply") is not None:
        return _COMBINERS.get(module.computation(ref.attr("to_apply").name).root.opcode, np.add)
    return np.add


def _why_not_checkable(check: Check, ref: Instruction | None, n: int) -> str | None:
    """Why `check` cannot be made, or None."""
    if ref is None:
        return "its value is not in the reference"
    global_leaves = list(ref.shape.leaves())
    local_leaves = list(check.spmd.shape.leaves())
    if len(global_leaves) != len(local_leaves):
        return "shape changed by the partitioner"
    for g, local, s in zip(global_leaves, local_leaves,
                           check.sharding.leaf_shardings(check.spmd.shape)):
        if g.is_token:
            continue
        if s.kind in ("manual", "unknown") or \
                (s.kind == "tiled" and "manual" in s.subgroup_types):
            return "per-device (manual) value"
        try:
            if s.shard_shape(g).dims != local.dims:
                return "per-partition shape is not a shard of the global shape"
        except GspmdcError:
            return "sharding does not fit the global shape"
    return None


def _compare(check: Check, want: Any, got: Sequence[Any], ref: Instruction, n: int, tolerance):
    """`(leaf, reference, assembled, piece differences)` of the first leaf of `check` that
    differs, or None."""
    wants = flatten_value(want, ref.shape)
    pieces_by_partition = [flatten_value(v, check.spmd.shape) for v in got]
    local_leaves = list(check.spmd.shape.leaves())
    global_leaves = list(ref.shape.leaves())
    shardings = check.sharding.leaf_shardings(check.spmd.shape)
    for index, (global_shape, local_shape, sharding) in enumerate(
            zip(global_leaves, local_leaves, shardings)):
        if global_shape.is_token:
            continue
        leaf = ShardedLeaf(global_shape, local_shape, sharding)
        reference = np.asarray(wants[index])
        pieces = [np.asarray(p[index]) for p in pieces_by_partition]
        bad = _piece_differences(reference, pieces, leaf, n, tolerance)
        whole = assemble_leaf(pieces, leaf, check.combine)
        if bad or not compare_output_arrays({"v": whole}, {"v": reference}, tolerance)[0].ok:
            return (None if len(global_leaves) == 1 else index), reference, whole, tuple(bad)
    return None


def _piece_differences(want: np.ndarray, pieces: list[np.ndarray], leaf: ShardedLeaf, n: int,
                       tolerance) -> list[PieceDifference]:
    """The partitions whose piece differs from its part of `want` (padding ignored); none for
    partial values, whose pieces are operands of a reduction."""
    s = leaf.sharding
    if s.has_unreduced:
        return []
    if s.kind == "maximal":
        parts = {s.device: tuple(slice(0, d) for d in want.shape)}
    elif s.kind == "tiled":
        start, limit = s.valid_range_table(leaf.global_shape, n)
        parts = {p: tuple(slice(a, b) for a, b in zip(start[p], limit[p])) for p in range(n)}
    else:
        parts = {p: tuple(slice(0, d) for d in want.shape) for p in range(n)}
    found = []
    for p, region in parts.items():
        expected = want[region]
        piece = pieces[p][tuple(slice(0, e) for e in expected.shape)]
        comparison = compare_output_arrays({"v": piece}, {"v": expected}, tolerance)[0]
        if not comparison.ok:
            found.append(PieceDifference(p, comparison.max_abs_error, comparison.problem or ""))
    return found


def _partitioner_instructions(comp: Computation, inst: Instruction) -> tuple[Instruction, ...]:
    """The instructions the partitioner made for `inst`, in program order: those whose metadata
    name it as their user or value (reshards of its operands and result, masks), and those its
    operands are made of back to the program's own values (halo exchanges, reshards of values
    the partitioner replaced)."""
    found = set()
    pending = list(inst.operands)
    while pending:
        operand = pending.pop()
        if operand not in found and _made_by_partitioner(operand):
            found.add(operand)
            pending.extend(operand.operands)
    for other in comp.instructions:
        metadata = other.attr("metadata")
        if _made_by_partitioner(other) and \
                inst.name in (metadata.get("op_name"), metadata.get("spmd_value")):
            found.add(other)
    return tuple(i for i in comp.instructions if i in found)


def _loop_of(module: Module, computation: str) -> str | None:
    """The while instruction whose body or condition `computation` is, if any."""
    for comp, inst in module.all_instructions():
        if inst.opcode == "while" and computation in (inst.attr("body").name,
                                                      inst.attr("condition").name):
            return f"{comp.name}/{inst.name}"
    return None


def format_result(result: BisectResult, num_partitions: int) -> list[str]:
    """The report `gspmdc bisect` prints."""
    skipped = ", ".join(f"{count} {reason}" for reason, count in sorted(result.skipped.items()))
    tail = f" (not checked: {skipped})" if skipped else ""
    if result.divergence is not None:
        return [f"the runs diverge: {result.divergence}",
                f"{result.checked} values checked before that matched{tail}"]
    d = result.difference
    if d is None:
        return [f"no difference: all {result.checked} values checked match the unpartitioned "
                f"program{tail}"]
    inst, check = d.instruction, d.check
    where = f"{check.computation}/{inst.name}"
    if d.executions > 1:
        where += f", execution {d.execution + 1} of {d.executions}"
        if d.loop is not None:
            where += f" (iteration {d.execution + 1} of loop {d.loop})"
    what = {"value": "its value", "result reshard": "the reshard of its result"}.get(
        check.role, f"the reshard of its {check.role.removesuffix(' reshard')} ({check.value})")
    leaf = "" if d.leaf is None else f", tuple element {d.leaf}"
    lines = [f"first difference: {what}{leaf}, at {where}",
             f"  {inst.name} = {inst.shape.without_layout()} {inst.opcode}("
             f"{', '.join(o.name for o in inst.operands)})"]
    if check.role != "value":
        lines.append(f"  {check.spmd.name} = {check.spmd.shape.without_layout()} "
                     f"{check.spmd.opcode} should hold {check.value} as "
                     f"{check.sharding.to_text(include_metadata=False)}")
    else:
        lines.append(f"  sharding in the partitioned program: {_text(d.spmd_instruction.sharding)};"
                     f" per-partition shape {d.spmd_instruction.shape.without_layout()}")
    lines += ["  " + line for line in _value_difference(d.reference, d.partitioned)]
    if d.pieces:
        from gspmdc.sharding_picture import device_list
        partitions = device_list([p.partition for p in d.pieces])
        lines.append(f"  partitions whose piece differs: {partitions} (of {num_partitions}); "
                     f"worst |difference| {max(p.max_abs_error for p in d.pieces):.6g}")
    lines.append("  operands in the partitioned program:")
    for operand in d.spmd_instruction.operands:
        lines.append(f"    {operand.name} = {operand.shape.without_layout()} {operand.opcode}, "
                     f"sharding {_text(operand.sharding)}")
    if d.partitioner_instructions:
        lines.append(f"  the partitioner's instructions for {inst.name}:")
        for made in d.partitioner_instructions:
            metadata = made.attr("metadata")
            lines.append(f"    {made.name} = {made.shape.without_layout()} {made.opcode}"
                         f" ({metadata.get('spmd_role') or metadata.get('op_type')}): "
                         f"{metadata.get('spmd_reason')}")
            step = metadata.get("spmd_step")
            if step:
                lines.append(f"      step {step}")
    lines.append(f"  {result.checked} values checked before it matched{tail}")
    return lines


def _text(sharding: HloSharding | None) -> str:
    return "none (replicated)" if sharding is None else sharding.to_text(include_metadata=False)


def _value_difference(want: np.ndarray, got: np.ndarray) -> list[str]:
    """How many elements differ, and both values where they differ most."""
    if want.dtype.kind in "fc":
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        a, b = want.astype(wide), got.astype(wide)
        error = np.abs(a - b)
        error = np.where(np.isnan(a) & np.isnan(b), 0.0,
                         np.where(np.isnan(error), np.inf, error))
    else:
        error = (want != got).astype(np.float64)
    differing = int(np.count_nonzero(error))
    if differing == 0:
        return ["the assembled value matches; some partitions' pieces differ"]
    at = np.unravel_index(int(np.argmax(error)), error.shape) if error.ndim else ()
    size = f" {float(error[at]):.6g}" if want.dtype.kind in "fc" else ""
    return [f"{differing} of {want.size} elements differ; the largest difference{size} at "
            f"{list(map(int, at))}: reference {want[at].item()!r}, partitioned "
            f"{got[at].item()!r}"]


__all__ = ["bisect", "format_result", "BisectResult", "Difference", "PieceDifference", "Check"]
