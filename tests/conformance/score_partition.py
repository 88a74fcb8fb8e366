"""Score the SPMD partitioner on XLA's partitioner tests (`conformance/xla-partitioner.json`).

Every case is run exactly as a user would check it,

    gspmdc run CASE.hlo -n NUM_DEVICES --backend local --check --seed 0 --garbage-padding

(sharding propagation, partitioning, the local backend on random inputs split by the parameter
shardings, the outputs assembled by the root sharding and compared with the unpartitioned
program on the reference interpreter); `--garbage-padding` fills uneven padding with NaN /
integer maxima so that a program reading padding shows. Each case runs in a child process under
this machine's limits (`MachineLimits`) and lands in one bucket:

- equivalent: `run --check` passes (exit 0);
- mismatch: it runs and gives different numbers (exit 1);
- cleanly rejected: `run` stops with a clear error (exit 2: unsupported feature, invalid input;
  XLA's cases that expect an error count here);
- crashed: anything else (a bug);
- excluded: sharded == unsharded is undefined for the case (I/O ops, or entry parameters with
  manual shardings, i.e. per-device data: `run --check` refuses them with exit 2, see
  `prepare.why_no_reference`), or it is too large for this machine (`MachineLimits.too_large`:
  a value beyond half of memory plus free temporary disk, or too many multiply-adds; or it runs
  out of memory or time).

The figure is equivalent cases over all cases less those without a reference. Equivalent cases where some
op had no partitioning rule of its own (it ran replicated, the default action) are counted
separately. `run_case` is the in-process variant tests use: no propagation (as XLA's test
helper partitions), same comparison.
"""
from __future__ import annotations

import contextlib
import io as text_io
import json
import tempfile
from pathlib import Path

import numpy as np

from .score import (
    CaseOutOfMemory, CaseTimeout, ChildDied, ChildFailed, MachineLimits, Tally,
    _one_line, _report, run_isolated,
)
from gspmdc.errors import GspmdcError
from gspmdc.prepare import why_no_reference

CASE_TIMEOUT_SECONDS = 120


def run_case(hlo: str, num_devices: int, name: str = "<case>") -> tuple[list[str], bool]:
    """Partition `hlo` on `num_devices` partitions, run it locally on random inputs and compare
    with the reference. Returns the mismatch descriptions (empty when equivalent) and whether
    some op ran replicated for lack of a rule. Raises GspmdcError when partitioning or running
    stops cleanly."""
    from gspmdc import api
    from gspmdc.passes.pipeline import compile_spmd
    from gspmdc.runtime import io
    from gspmdc.runtime.backends.local import run_local
    from gspmdc.runtime.compare import check_tolerance, compare_output_arrays
    from gspmdc.runtime.sharded_io import assemble_outputs, spmd_signature, split_inputs

    reference = api.parse(hlo, name)
    inputs = io.random_inputs(reference, seed=0)
    want = io.output_arrays(reference, api.evaluate(reference, inputs))
    spmd = compile_spmd(api.parse(hlo, name), num_devices, propagate=False)
    spmd = api.parse(api.to_text(spmd), name)            # the text must re-parse and verify
    signature = spmd_signature(spmd, num_devices)
    per_partition = split_inputs(signature, inputs, padding="garbage")
    results = run_local(spmd, per_partition, num_devices, timeout=CASE_TIMEOUT_SECONDS)
    got = io.output_arrays(spmd, assemble_outputs(signature, results))
    # compared as at least 1-d arrays (the comparison indexes element arrays)
    got = {k: np.atleast_1d(v) for k, v in got.items()}
    want = {k: np.atleast_1d(v) for k, v in want.items()}
    comparisons = compare_output_arrays(got, want, check_tolerance(reference))
    return [c.line() for c in comparisons if not c.ok], ran_replicated(spmd)


def ran_replicated(spmd) -> bool:
    """Some op of the SPMD program ran replicated for lack of a partitioning rule (the
    partitioner says so in its metadata)."""
    return any("no partitioning rule" in str(inst.attr("metadata"))
               for _, inst in spmd.all_instructions())


def run_command(hlo: str, num_devices: int, timeout: float) -> tuple[int, str, bool]:
    """`gspmdc run` on `hlo` (see the module docstring): the exit code, the first mismatch
    line (exit 1) and whether some op ran replicated for lack of a rule. GspmdcError
    propagates (a clean rejection)."""
    from gspmdc.prepare import prepare_job
    from gspmdc.runtime.job import execute_local
    from gspmdc.runtime.options import RunOptions
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "case.hlo"
        path.write_text(hlo)
        options = RunOptions(num_partitions=num_devices, seed=0, check=True, timeout=timeout,
                             padding="garbage", quiet=True)
        job = prepare_job(str(path), options)
        printed = text_io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = execute_local(job)
    mismatch = next((line for line in printed.getvalue().splitlines()
                     if line.startswith("check") and "MISMATCH" in line), "")
    return code, mismatch, ran_replicated(job.spmd)


BUCKETS = ("equivalent", "mismatch", "cleanly rejected", "crashed", "excluded: no reference",
           "excluded: too large here")


def classify(case: dict, limits: MachineLimits) -> tuple[str, str | None, bool]:
    """(bucket, reason, used the default action) of one case (see the module docstring)."""
    from gspmdc import api
    name = f"{case['name']}:{case['line']}"
    try:
        module = api.parse(case["hlo"], name)
    except GspmdcError as e:
        return "cleanly rejected", _one_line(e), False
    reason = why_no_reference(module)
    if reason is not None:
        return "excluded: no reference", reason, False
    reason = limits.too_large(module)
    if reason is not None:
        return "excluded: too large here", reason, False
    try:
        code, problem, used_default = run_isolated(limits, run_command, case["hlo"],
                                                   case["num_devices"], limits.timeout_seconds)
    except ChildFailed as e:
        return (("cleanly rejected" if e.clean else "crashed"),
                ("(expected) " if case.get("expects_error") else "") + _one_line(e), False)
    except (CaseTimeout, CaseOutOfMemory) as e:
        return "excluded: too large here", str(e), False
    except ChildDied as e:
        return "crashed", str(e), False
    if code == 0:
        return "equivalent", None, used_default
    return "mismatch", problem or f"exit code {code}", False


def score(shared_dir: Path, limits: MachineLimits, verbose: bool = False,
          names: list[str] | None = None) -> int:
    """Score every case (or those named in `names`); print the buckets and the figure (with
    `verbose`, every case as it finishes and every reason); exit code 1 when a case mismatches
    or crashes."""
    import sys
    import time
    path = Path(shared_dir) / "conformance" / "xla-partitioner.json"
    cases = json.loads(path.read_text())["cases"]
    if names is not None:
        cases = [c for c in cases if c["name"] in names]
    tallies = {bucket: Tally(bucket, counts_only=True) for bucket in BUCKETS}
    default = Tally("  of which use the default action", counts_only=True)
    for index, case in enumerate(cases, 1):
        name = f"{case['name']}:{case['line']}"
        start = time.perf_counter()
        bucket, reason, used_default = classify(case, limits)
        tallies[bucket].record(name, reason)
        if bucket == "equivalent" and used_default:
            default.record(name, None)
        if verbose:
            print(f"[{index}/{len(cases)}] {name}: {bucket} "
                  f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    ordered = [tallies["equivalent"], default] + [tallies[b] for b in BUCKETS[1:]]
    _report("xla-partitioner.json (gspmdc run --backend local --check --seed 0 "
            "--garbage-padding):", ordered, verbose)
    equivalent = tallies["equivalent"].attempted
    counted = len(cases) - tallies["excluded: no reference"].attempted
    runnable = counted - tallies["excluded: too large here"].attempted
    print(f"  figure: {equivalent} / {counted} cases with a reference equivalent "
          f"({100.0 * equivalent / max(counted, 1):.1f}%); "
          f"{equivalent} / {runnable} of those this machine can run "
          f"({100.0 * equivalent / max(runnable, 1):.1f}%)")
    return 1 if tallies["mismatch"].attempted or tallies["crashed"].attempted else 0


__all__ = ["score", "classify", "run_case", "run_command"]
