"""A `gspmdc run` job: what to run, prepared once, and the parts every backend shares.

`prepare_job(path, options)` reads the module and, unless it is already an SPMD program, partitions
it with `passes.spmd.compile_spmd`; it checks everything that can be checked before any partition
starts (the program is executable, inputs and outputs can be split/assembled, the input file has
the right arrays, `--check` has a reference) and returns a picklable `Job` holding the SPMD
program's text, the reference program's text and the options. Backends then execute the job:
`execute_local` here (threads), `rank.execute_on_mpi` (one MPI rank per partition). Both get
their inputs from `input_sources` and end with `finish` (profile table, `--check` against the
reference, atomic output file, printed outputs).

A module counts as SPMD (already partitioned) when it has `partition-id` or collective
instructions (other than a cross-replica all-reduce, which has no `channel_id` and combines
replicas, not partitions), or the `spmd_global_signature` header attribute gspmdc's partitioner
writes.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from gspmdc.errors import EXIT_MISMATCH, EXIT_OK, GspmdcError, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.attributes import RawAttr
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import TupleShape

from . import io
from .npz_members import member_array, member_header, member_names
from .profile import RankProfile, format_profiles
from .sharded_io import (
    GLOBAL_SIGNATURE_ATTR, PADDINGS, SpmdSignature, spmd_signature, unflatten_value,
)

IO_OPCODES = frozenset({"infeed", "outfeed", "send", "send-done", "recv", "recv-done"})
SPMD_OPCODES = frozenset({
    "partition-id", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
    "collective-permute", "all-reduce-start", "all-reduce-done", "all-gather-start",
    "all-gather-done", "collective-permute-start", "collective-permute-done",
    "collective-broadcast", "ragged-all-to-all",
})


@dataclass(frozen=True)
class RunOptions:
    """The options of `gspmdc run` that travel with the job."""

    num_partitions: int | None = None
    inputs: str | None = None
    seed: int = 0
    outputs: str | None = None
    check: bool = False
    profile: bool = False
    timeout: float | None = None
    padding: str = "zeros"
    deterministic: bool = False
    mpi_wait: str = "auto"
    output_sharding: str | None = None
    quiet: bool = False
    #: partitioning: dots at least this big (bytes) run as windowed einsums (None: never)
    windowed_einsum_threshold: int | None = None


@dataclass(frozen=True)
class Job:
    """A prepared run: the SPMD program, the unpartitioned reference (None when the input file was
    already partitioned), the partition count and the options."""

    spmd_text: str
    reference_text: str | None
    num_partitions: int
    options: RunOptions
    #: wall-clock time (`time.time()`) the run started, for --profile's start-up figure
    started_at: float | None = None

    def spmd_module(self) -> Module:
        from gspmdc.ir.parser import parse_module
        return parse_module(self.spmd_text, "<spmd program>")

    def reference_module(self) -> Module | None:
        from gspmdc.ir.parser import parse_module
        return None if self.reference_text is None else \
            parse_module(self.reference_text, "<reference program>")


def is_spmd(module: Module) -> bool:
    """The module is already an SPMD program (see the module docstring)."""
    return GLOBAL_SIGNATURE_ATTR in module.attrs or any(
        inst.opcode in SPMD_OPCODES and not _cross_replica_all_reduce(inst)
        for _, inst in module.all_instructions())


def _cross_replica_all_reduce(inst: Instruction) -> bool:
    """An all-reduce without `channel_id`: it combines replicas, not partitions."""
    return inst.opcode == "all-reduce" and inst.attr("channel_id") is None


def devices_named_by_shardings(module) -> int:
    """The number of devices the module's shardings name (1 + the largest device id; 1 when no
    instruction has a sharding): `run`'s partition count when neither `-n` nor the module's
    `num_partitions` gives one."""
    largest = 0
    for _, inst in module.all_instructions():
        for leaf in inst.sharding.leaves() if inst.sharding is not None else ():
            if leaf.kind == "maximal":
                largest = max(largest, leaf.device)
            elif leaf.kind == "tiled":
                largest = max(largest, leaf.tile_assignment.max_device)
    return largest + 1


def prepare_job(path: str, options: RunOptions, started_at: float | None = None) -> Job:
    """Read, partition (when needed) and check a program for `gspmdc run` (see the module
    docstring); `started_at` is when the run started (default: now). Raises GspmdcError (exit 2)
    for anything that would make the run fail early."""
    import time
    started_at = time.time() if started_at is None else started_at
    from gspmdc import api
    if options.padding not in PADDINGS:
        raise GspmdcError(f"padding must be one of {PADDINGS}, got {options.padding!r}")
    text = _read_text(path)
    module = api.parse(text, path)
    n = options.num_partitions or module.num_partitions or devices_named_by_shardings(module)
    if n < 1:
        raise GspmdcError(f"the number of partitions must be positive, got {n}")
    if is_spmd(module):
        if options.check:
            raise GspmdcError(f"{path} is already partitioned (it has collectives, partition-id "
                              f"or {GLOBAL_SIGNATURE_ATTR}), so there is no unpartitioned "
                              "reference to --check against; run --check on the unpartitioned "
                              "program instead")
        if module.num_partitions not in (None, n):
            raise GspmdcError(f"{path} was partitioned for {module.num_partitions} partitions, "
                              f"cannot run it on {n}")
        if options.output_sharding is not None:
            module.entry.root.sharding = _output_sharding(options.output_sharding, module, path)
        spmd, reference_text = module, None
    else:
        if options.output_sharding is not None:
            raise GspmdcError(f"{path} is not partitioned: --output-sharding only describes the "
                              "result of an already-partitioned program (annotate the root of "
                              "an unpartitioned one)")
        if options.check:
            _check_reference(module, path)
        spmd = _partition(api.parse(text, path), module, n, path,
                          options.windowed_einsum_threshold)
        reference_text = api.to_text(module)
    spmd_text = api.to_text(spmd)
    spmd = api.parse(spmd_text, f"{path} (partitioned)", verify=False)
    check_executable(spmd)
    signature = spmd_signature(spmd, n)
    signature.check_global_io()
    if options.inputs is not None:
        check_input_file(options.inputs, signature)
    return Job(spmd_text, reference_text, n, options, started_at)


def _output_sharding(text: str, module: Module, path: str):
    """The `--output-sharding` of an SPMD program whose root has none."""
    from gspmdc.ir.parser import parse_sharding
    if module.entry.root.sharding is not None:
        raise GspmdcError(f"{path}: the root {module.entry.root.name} has a sharding already; "
                          "--output-sharding is for programs whose root has none")
    try:
        return parse_sharding(text)
    except GspmdcError as e:
        raise GspmdcError(f"--output-sharding {text}: {e}") from None


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise GspmdcError(f"{path}: cannot read: {e}") from None


def _partition(module: Module, original: Module, n: int, path: str,
               windowed_einsum_threshold: int | None = None) -> Module:
    try:
        from gspmdc.passes.pipeline import compile_spmd
    except ImportError:
        raise GspmdcError(f"{path} is not partitioned (no partition-id or collectives) and "
                          "partitioning is not available in this installation "
                          "(gspmdc.passes.spmd.compile_spmd)") from None
    spmd = compile_spmd(module, n, windowed_einsum_threshold=windowed_einsum_threshold)
    if GLOBAL_SIGNATURE_ATTR not in spmd.attrs:
        params = ", ".join(str(p.shape.without_layout()) for p in original.entry.parameters)
        spmd.attrs[GLOBAL_SIGNATURE_ATTR] = RawAttr(
            f"{{({params})->{original.entry.root.shape.without_layout()}}}")
    return spmd


def _check_reference(module: Module, path: str) -> None:
    """`--check` needs a reference that runs on one device from global inputs."""
    reason = why_no_reference(module)
    if reason is not None:
        raise UnsupportedError(f"{path}: run --check cannot compare {reason}")


def why_no_reference(module: Module) -> str | None:
    """Why sharded == unsharded is undefined for `module` (so `run --check` refuses it), or
    None: I/O instructions (their data does not come from the input file), and entry
    parameters or a result with manual shardings (per-device data, which one global array
    cannot describe)."""
    io_ops = sorted({inst.opcode for _, inst in module.all_instructions()
                     if inst.opcode in IO_OPCODES})
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



def check_executable(module: Module) -> None:
    """Every opcode has a kernel and every custom-call target a handler (UnsupportedError)."""
    from .kernels import KERNELS
    from .kernels.custom_call import CUSTOM_CALL_TARGETS
    missing = sorted({inst.opcode for _, inst in module.all_instructions()
                      if inst.opcode not in KERNELS and inst.opcode != "parameter"})
    targets = sorted({str(inst.attr("custom_call_target")) for _, inst in module.all_instructions()
                      if inst.opcode == "custom-call"
                      and inst.attr("custom_call_target") not in CUSTOM_CALL_TARGETS})
    if missing or targets:
        what = ([f"opcodes {', '.join(missing)}"] if missing else []) + \
            ([f"custom-call targets {', '.join(targets)}"] if targets else [])
        raise UnsupportedError(f"the program uses {' and '.join(what)}, which the runtime "
                               "cannot execute")


def check_input_file(path: str, signature: SpmdSignature) -> None:
    """The npz file has exactly the entry arguments (`arg0`, ...; tuple parameters as `arg0.0`,
    ... as in `runtime/io.py`) with the global shapes and types; reads headers only."""
    names = set(member_names(path))
    expected = {key for i, value in enumerate(signature.parameters)
                for key, _ in io.leaf_keys(f"arg{i}", value.global_shape)}
    if names - expected:
        raise GspmdcError(f"{path}: unexpected inputs {sorted(names - expected)}; the entry "
                          f"computation has {len(signature.parameters)} parameters")
    for i, value in enumerate(signature.parameters):
        for key, shape in io.leaf_keys(f"arg{i}", value.global_shape):
            if shape.is_token:
                raise UnsupportedError(f"entry parameter {i} has shape {value.global_shape}; "
                                       "only arrays and tuples of arrays come from an npz file")
            header = member_header(path, key)
            want = dtypes.numpy_dtype(shape.element_type)
            same_type = header.dtype == want or \
                (header.dtype.kind == "V" and header.dtype.itemsize == want.itemsize)
            if header.shape != shape.dims or not same_type:
                raise GspmdcError(f"{path}:{key}: {header.dtype}{list(header.shape)} does not "
                                  f"match entry parameter {i}: {shape}")


def input_sources(job: Job, signature: SpmdSignature) -> list[Any]:
    """The global inputs: memory maps of the input file's arrays (slicing one reads only the
    slice), or the seeded random inputs (`runtime/io.random_inputs` on the reference program, so
    index inputs stay in range; on an already-partitioned program integers are drawn in [0, 8))."""
    if job.options.inputs is None:
        reference = job.reference_module() or _parameters_only(signature)
        return io.random_inputs(reference, job.options.seed)
    values = []
    for i, value in enumerate(signature.parameters):
        leaves = []
        for key, shape in io.leaf_keys(f"arg{i}", value.global_shape):
            array = member_array(job.options.inputs, key)
            want = dtypes.numpy_dtype(shape.element_type)
            leaves.append(array if array.dtype == want else array.view(want))
        values.append(unflatten_value(leaves, value.global_shape))
    return values


def _parameters_only(signature: SpmdSignature) -> Module:
    params = [Instruction(f"arg{i}", "parameter", v.global_shape, parameter_number=i)
              for i, v in enumerate(signature.parameters)]
    root = Instruction("inputs", "tuple", TupleShape(tuple(p.shape for p in params)), params)
    return Module("inputs", [Computation("main", params + [root], root, is_entry=True)], "main")


def execute_local(job: Job) -> int:
    """Run the job on the local backend (one thread per partition); the exit code."""
    from .backends.local import run_local
    from .profile import ProfileRecorder
    from .sharded_io import assemble_outputs, split_inputs
    module = job.spmd_module()
    signature = spmd_signature(module, job.num_partitions)
    inputs = input_sources(job, signature)
    per_partition = split_inputs(signature, inputs, padding=job.options.padding)
    n = job.num_partitions
    recorders = [ProfileRecorder(p, n, job.started_at) for p in range(n)] \
        if job.options.profile else None
    results = run_local(module, per_partition, n, recorders=recorders,
                        timeout=job.options.timeout)
    profiles = [r.profile() for r in recorders] if recorders is not None else None
    return finish(job, module, assemble_outputs(signature, results), inputs, profiles)


def finish(job: Job, module: Module, outputs: Any, inputs: Sequence[np.ndarray],
           profiles: Sequence[RankProfile] | None,
           write_outputs: Callable[[dict[str, np.ndarray]], None] | None = None) -> int:
    """After the run: print the profile, check against the reference, write and print the
    outputs (`write_outputs(arrays)` when given, else `io.write_npz_atomic` to `--outputs`).
    Returns EXIT_MISMATCH when the check fails, else EXIT_OK."""
    from gspmdc.commands.basic import describe
    from .compare import check_tolerance, compare_output_arrays, reduction_length
    from .interpreter import evaluate
    options = job.options
    named = io.output_arrays(module, outputs)
    if profiles is not None:
        print(format_profiles(profiles))
    if options.outputs is not None:
        if write_outputs is not None:
            write_outputs(named)
        else:
            io.write_npz_atomic(options.outputs, named)
    if not options.quiet:
        for name, value in named.items():
            print(f"{name}: {describe(value)}")
    if not options.check:
        return EXIT_OK
    reference = job.reference_module()
    want = io.output_arrays(reference, evaluate(reference, [_in_memory(a) for a in inputs]))
    results = compare_output_arrays(named, want, check_tolerance(reduction_length(reference)))
    for result in results:
        print(f"check {result.line()}")
    bad = [r.name for r in results if not r.ok]
    if bad:
        print(f"gspmdc: error: the partitioned program's {', '.join(bad)} differ from the "
              "unpartitioned reference", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _in_memory(value: Any) -> Any:
    """Arrays (memory maps included) as plain ndarrays, through tuples."""
    if isinstance(value, tuple):
        return tuple(_in_memory(v) for v in value)
    return np.asarray(value)
