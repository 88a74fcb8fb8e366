"""Compiling a program into a `gspmdc run` job: read it, decide its stage, partition it when it
is a global program, and check everything that can be checked before any partition starts.

`prepare_job(path, options, started_at, compile_options)` returns the runtime's picklable `Job`
(`gspmdc.runtime.job`): the SPMD program and the reference program for `--check` as IR (the
launcher pickles them for the ranks, which never parse), the partition count and the options. The stage of the input (`gspmdc.ir.stage`) decides:

- a global program (any stage but `partitioned`) is partitioned with the rest of the
  partitioner's pipeline (a dump at stage `resharded` runs from `pad-uneven` on); `--check`
  compares with the program itself run on one device or, when it has manual regions
  (`shard_map`: per-device code, whose collectives need every device), with the program
  partitioned at its manual-region boundaries only (every other value replicated) and run on
  N local threads;
- a partitioned program runs as it is; it has no reference, so `--check` is refused.

`--global` / `--partitioned` (`CompileOptions.stage`) state the stage of a module that records
none, where the rule of `ir/stage.py` would guess wrong.
"""
from __future__ import annotations

import pickle
import time
from dataclasses import dataclass

from gspmdc import api
from gspmdc.errors import GspmdcError, UnsupportedError
from gspmdc.ir.custom_call_targets import MANUAL_BOUNDARIES
from gspmdc.ir.module import Module
from gspmdc.ir.ops import HOST_IO
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.stage import Stage, claim_global, module_stage, recorded_stage
from gspmdc.runtime.job import Job, check_executable, check_input_file
from gspmdc.runtime.options import RunOptions
from gspmdc.runtime.sharded_io import PADDINGS, spmd_signature


@dataclass(frozen=True)
class CompileOptions:
    """How `run` compiles a global program: `windowed_einsum_threshold`, `propagation` and
    `shardy_strategy` as for `compile`; `stage`: "global" or "partitioned" from `--global` /
    `--partitioned`, None: the module's recorded or inferred stage."""

    windowed_einsum_threshold: int | None = None
    stage: str | None = None
    propagation: str | None = None
    shardy_strategy: str = "aggressive"


def prepare_job(path: str, options: RunOptions, started_at: float | None = None,
                compile_options: CompileOptions = CompileOptions()) -> Job:
    """Read, partition (when needed) and check a program for `gspmdc run` (see the module
    docstring); `started_at` is when the run started (default: now). Raises GspmdcError (exit 2)
    for anything that would make the run fail early."""
    started_at = time.time() if started_at is None else started_at
    if options.padding not in PADDINGS:
        raise GspmdcError(f"padding must be one of {PADDINGS}, got {options.padding!r}")
    text = _read_text(path)
    module = api.parse(text, path)
    n = options.num_partitions or module.num_partitions or devices_named_by_shardings(module)
    if n < 1:
        raise GspmdcError(f"the number of partitions must be positive, got {n}")
    reference, reference_spmd, reference_spmd_signature = None, None, None
    if stage_of(module, compile_options.stage, path) is Stage.PARTITIONED:
        if options.check:
            raise GspmdcError(f"{path} is already partitioned (stage partitioned), so there is "
                              "no unpartitioned reference to --check against; run --check on the "
                              "global program instead")
        if module.num_partitions not in (None, n):
            raise GspmdcError(f"{path} was partitioned for {module.num_partitions} partitions, "
                              f"cannot run it on {n}")
        if options.output_sharding is not None:
            module.entry.root.sharding = _output_sharding(options.output_sharding, module, path)
        spmd = module
    else:
        if options.output_sharding is not None:
            raise GspmdcError(f"{path} is not partitioned: --output-sharding only describes the "
                              "result of an already-partitioned program (annotate the root of "
                              "an unpartitioned one)")
        if options.check:
            _check_reference(module, path)
            if has_manual_regions(module):
                reference_spmd = _partition(manual_boundaries_only(_in_gspmd_form(_copy(module))),
                                            n, CompileOptions(propagation="gspmd"))
                reference_spmd_signature = spmd_signature(reference_spmd, n)
        spmd = _partition(_copy(module), n, compile_options)
        reference = module
    check_executable(spmd)
    signature = spmd_signature(spmd, n)
    signature.check_global_io()
    if options.inputs is not None:
        check_input_file(options.inputs, signature)
    return Job(spmd, reference, signature, n, options, started_at, reference_spmd,
               reference_spmd_signature)


def _copy(module: Module) -> Module:
    """A deep copy of `module` (the partitioner rewrites the module it is given; the original is
    the reference): a pickle round trip, several times faster than parsing the text again."""
    return pickle.loads(pickle.dumps(module, pickle.HIGHEST_PROTOCOL))


def stage_of(module: Module, claimed: str | None, path: str) -> Stage:
    """The module's stage: the recorded one, else `claimed` (`--global` / `--partitioned`),
    else the inferred one. GspmdcError when `claimed` contradicts the recorded stage."""
    recorded = recorded_stage(module)
    if claimed is None:
        return module_stage(module)
    if recorded is not None and recorded.is_global != (claimed == "global"):
        raise GspmdcError(f"{path} records stage {recorded.value}, which is not --{claimed}")
    if claimed == "global":
        claim_global(module, path)
    return recorded or Stage(claimed)


def devices_named_by_shardings(module: Module) -> int:
    """The number of devices the module's shardings name (1 + the largest device id; 1 when no
    instruction has a sharding): the partition count when neither `-n` nor the module's
    `num_partitions` gives one."""
    largest = 0
    for _, inst in module.all_instructions():
        for leaf in inst.sharding.leaves() if inst.sharding is not None else ():
            if leaf.kind == "maximal":
                largest = max(largest, leaf.device)
            elif leaf.kind == "tiled":
                largest = max(largest, leaf.tile_assignment.max_device)
    return largest + 1


def has_manual_regions(module: Module) -> bool:
    """Whether some value of `module` is per-device data (a manual sharding, or a manual-region
    boundary, GSPMD's or Shardy's)."""
    return any((inst.sharding is not None and inst.sharding.has_manual_leaf) or
               (inst.opcode == "custom-call" and
                inst.attr("custom_call_target") in MANUAL_BOUNDARIES)
               for _, inst in module.all_instructions())


def manual_boundaries_only(module: Module) -> Module:
    """`module` (changed in place) with every sharding dropped except those that give it its
    meaning: manual shardings, the sharding a value has where it enters a manual region (the
    operand of `SPMDFullToShardShape`: how the global value is cut into per-device pieces) and
    the sharding of `SPMDShardToFullShape` (how the pieces make the global value). Partitioned
    without propagation, everything else is replicated: the reference of `--check` for a
    program with manual regions."""
    keep = set()
    for _, inst in module.all_instructions():
        if inst.opcode == "custom-call" and \
                inst.attr("custom_call_target") in MANUAL_BOUNDARIES:
            keep.add(inst)
            keep.update(inst.operands)
    for _, inst in module.all_instructions():
        if inst not in keep and not (inst.sharding is not None and inst.sharding.has_manual_leaf):
            inst.sharding = None
    return module


def _output_sharding(text: str, module: Module, path: str):
    """The `--output-sharding` of an SPMD program whose root has none."""
    if module.entry.root.sharding is not None:
        raise GspmdcError(f"{path}: the root {module.entry.root.name} has a sharding already; "
                          "--output-sharding is for programs whose root has none")
    try:
        return parse_sharding(text)
    except GspmdcError as e:
        raise GspmdcError(f"--output-sharding {text}: {e}") from None


def _read_text(path: str) -> str:
    from gspmdc.ir.parser import read_source
    return read_source(path)


def _in_gspmd_form(module: Module) -> Module:
    """A module in Shardy form in GSPMD form, with the shardings as written (every value of a
    shard_map body manual over its manual axes): what `manual_boundaries_only` reads. Other
    modules are returned unchanged."""
    from gspmdc.ir.sdy import module_meshes
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.shardy import ShardyPropagation, ShardyToGspmd
    from gspmdc.passes.spmd import InlineCalls
    if module_meshes(module) is None:
        return module
    return run_pipeline(PassContext(), module, [
        InlineCalls(), ShardyPropagation(propagate=False), ShardyToGspmd(after_propagation=True)])


def _partition(module: Module, n: int, options: CompileOptions) -> Module:
    """The SPMD program of the global `module` for `n` partitions, compiled as `options` say
    (`stage` aside, which `prepare_job` has read). The partitioner is imported here: an
    already-partitioned program starts its ranks without it."""
    from gspmdc.passes.pipeline import compile_spmd
    return compile_spmd(module, n, windowed_einsum_threshold=options.windowed_einsum_threshold,
                        propagation=options.propagation, shardy_strategy=options.shardy_strategy)


def _check_reference(module: Module, path: str) -> None:
    """`--check` needs a reference that runs from global inputs."""
    reason = why_no_reference(module)
    if reason is not None:
        raise UnsupportedError(f"{path}: run --check cannot compare {reason}")


def why_no_reference(module: Module) -> str | None:
    """Why sharded == unsharded is undefined for `module` (so `run --check` refuses it), or
    None: I/O instructions (their data does not come from the input file), and entry
    parameters or a result with manual shardings (per-device data, which one global array
    cannot describe)."""
    io_ops = sorted({inst.opcode for _, inst in module.all_instructions()
                     if inst.opcode in HOST_IO})
    if io_ops:
        return (f"a program with I/O instructions ({', '.join(io_ops)}): their data does not "
                "come from the input file")
    for p in module.entry.parameters:
        if p.sharding is not None and p.sharding.has_manual_leaf:
            return (f"entry parameter {p.parameter_number} ({p.name}), which has a manual "
                    "sharding: its value is per-device data, which one global input cannot "
                    "describe")
    root = module.entry.root
    if root.sharding is not None and root.sharding.has_manual_leaf:
        return (f"a result ({root.name}) with a manual sharding: its value is per-device data, "
                "which one global output cannot describe")
    return None


__all__ = ["CompileOptions", "prepare_job", "stage_of", "devices_named_by_shardings",
           "has_manual_regions", "manual_boundaries_only", "why_no_reference"]
