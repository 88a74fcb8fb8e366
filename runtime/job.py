"""A `gspmdc run` job: a partitioned program to execute, and the parts every backend shares.

The driver (`gspmdc/prepare.py`) compiles a program into a `Job`: the SPMD program and the
reference program for `--check` as IR (no text), the global signature of the SPMD program's entry
(global shapes and shardings of its parameters and result), the partition count and the options;
it also checks before any partition starts what the runtime can tell (`check_executable`: every
opcode has a kernel; `check_input_file`: the input file has the entry's arrays). A `Job` pickles
into a compact plan of its programs (several times faster to load than their text is to parse):
MPI ranks receive it that way and never import the parser or the passes. Backends then execute
the job: `execute_local` here (threads), `rank.execute_on_mpi` (one MPI rank per partition).
Both get their inputs from `input_sources` and end with `finish` (profile table, the times of
`--repeat`, `--check` against the reference, atomic output file, printed outputs).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from gspmdc.errors import EXIT_MISMATCH, EXIT_OK, GspmdcError, UnsupportedError
from gspmdc.ir import dtypes
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import TupleShape

from . import io
from .options import RunOptions
from .sharded_io import SpmdSignature, unflatten_value

if TYPE_CHECKING:       # annotations only: a rank that does not profile never imports profiling
    from .profile import RankProfile


@dataclass(frozen=True)
class Job:
    """A prepared run: the SPMD program, the global program it was partitioned from (None when
    the input was already partitioned: random inputs are drawn for it, and `--check` evaluates
    it on one device), the global signature of the SPMD program's entry, the partition count and
    the options. `reference_spmd` (with its signature): for a global program with manual regions
    under `--check`, the SPMD program `--check` runs instead, on `num_partitions` local threads
    from the same global inputs. Picklable: what the launcher sends to every MPI rank."""

    spmd: Module
    reference: Module | None
    signature: SpmdSignature
    num_partitions: int
    options: RunOptions
    #: wall-clock time (`time.time()`) the run started, for --profile's start-up figure
    started_at: float | None = None
    reference_spmd: Module | None = None
    reference_spmd_signature: SpmdSignature | None = None


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
    from .npz_members import member_header, member_names
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
        reference = job.reference or _parameters_only(signature)
        return io.random_inputs(reference, job.options.seed)
    from .npz_members import member_array
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
    from .allocation import keep_freed_memory
    from .backends.local import run_local_timed
    from .blas import blas_kernels
    from .cores import chosen_blas_threads
    from .profile import ProfileRecorder
    from .sharded_io import assemble_outputs, split_inputs
    keep_freed_memory()
    module, signature = job.spmd, job.signature
    inputs = input_sources(job, signature)
    per_partition = split_inputs(signature, inputs, padding=job.options.padding)
    n = job.num_partitions
    recorders = [ProfileRecorder(p, n, job.started_at, module) for p in range(n)] \
        if job.options.profiling else None
    threads = chosen_blas_threads(n)
    results, run_times = run_local_timed(module, per_partition, n, repeat=job.options.repeat,
                                         recorders=recorders, timeout=job.options.timeout,
                                         started_at=job.started_at,
                                         rounding=job.options.rounding, blas_threads=threads)
    profiles = [r.profile() for r in recorders] if recorders is not None else None
    kernels = blas_kernels()
    return finish(job, module, assemble_outputs(signature, results), inputs, profiles,
                  run_times=run_times, blas=None if kernels is None else (kernels, threads))


def finish(job: Job, module: Module, outputs: Any, inputs: Sequence[np.ndarray],
           profiles: Sequence[RankProfile] | None,
           write_outputs: Callable[[dict[str, np.ndarray]], None] | None = None,
           run_times: Sequence[float] = (), blas: tuple[str, int] | None = None) -> int:
    """After the run: print the profile (`--profile`) and write its figures (`--profile-json`),
    print the times of the repeated runs (`--repeat`) with the BLAS they ran (`blas`: the
    kernels of an OpenBLAS and its threads per partition), check against the reference, write and
    print the outputs (`write_outputs(arrays)` when given, else `io.write_npz_atomic` to
    `--outputs`). Returns EXIT_MISMATCH when the check fails, else EXIT_OK."""
    from .compare import check_tolerance, compare_output_arrays
    options = job.options
    named = io.output_arrays(module, outputs)
    if profiles is not None:
        from .profile import format_profiles, measured_figures
        if options.profile:
            print(format_profiles(profiles))
        if options.profile_json is not None:
            _write_json(options.profile_json, measured_figures(module, profiles).to_json())
    if run_times:
        from .profile import format_run_times
        print(format_run_times(run_times, blas))
    if options.outputs is not None:
        if write_outputs is not None:
            write_outputs(named)
        else:
            io.write_npz_atomic(options.outputs, named)
    if not options.quiet:
        for name, value in named.items():
            print(f"{name}: {io.describe_value(value)}")
    if not options.check:
        return EXIT_OK
    reference = job.reference
    want = io.output_arrays(reference, _reference_outputs(job, reference, inputs))
    results = compare_output_arrays(named, want, check_tolerance(reference))
    for result in results:
        print(f"check {result.line()}")
    bad = [r.name for r in results if not r.ok]
    if bad:
        print(f"gspmdc: error: the partitioned program's {', '.join(bad)} differ from the "
              "unpartitioned reference", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _write_json(path: str, data: dict) -> None:
    import json
    from gspmdc.atomic import atomic_output
    with atomic_output(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def _reference_outputs(job: Job, reference: Module, inputs: Sequence[Any]) -> Any:
    """The reference's global result on `inputs`: the global program evaluated on one device,
    or the reference SPMD program run on `job.num_partitions` local threads."""
    from .interpreter import evaluate
    values = [_in_memory(a) for a in inputs]
    spmd = job.reference_spmd
    if spmd is None:
        return evaluate(reference, values, rounding=job.options.rounding)
    from .backends.local import run_local
    from .sharded_io import assemble_outputs, split_inputs
    signature = job.reference_spmd_signature
    results = run_local(spmd, split_inputs(signature, values), job.num_partitions,
                        timeout=job.options.timeout, started_at=job.started_at,
                        rounding=job.options.rounding)
    return assemble_outputs(signature, results)


def _in_memory(value: Any) -> Any:
    """Arrays (memory maps included) as plain ndarrays, through tuples."""
    if isinstance(value, tuple):
        return tuple(_in_memory(v) for v in value)
    return np.asarray(value)
