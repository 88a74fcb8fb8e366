"""Score the SPMD partitioner on XLA's partitioner tests (`conformance/xla-partitioner.json`).

Every case is partitioned as XLA's test helper does (no sharding propagation: unsharded
instructions are replicated; `num_devices` partitions), run on the local backend with the
inputs split by the parameter shardings (uneven padding filled with NaN / integer maxima, so a
program that reads padding shows), assembled by the root sharding, and compared with the
unpartitioned program on the reference interpreter (`gspmdc run --check`'s tolerance). Each case
lands in one bucket:

- equivalent: the partitioned program reproduces the reference;
- mismatch: it runs and gives different numbers;
- cleanly rejected: partitioning or running stops with a gspmdc error (unsupported feature,
  invalid input; XLA's cases that expect an error count here);
- crashed: any other exception (a bug);
- skipped: the reference cannot run (I/O ops) or the case is too large for a local run.

Equivalent cases where some op had no partitioning rule of its own (it ran replicated, the
default action) are counted separately.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gspmdc.conformance import (
    IO_OPCODES, Tally, _one_line, _report, largest_value_bytes, multiply_adds, time_limit,
)
from gspmdc.errors import GspmdcError

CASE_TIMEOUT_SECONDS = 120
MAX_VALUE_BYTES = 1 << 26
MAX_MULTIPLY_ADDS = 2e9


class _Mismatch(Exception):
    pass


def run_case(hlo: str, num_devices: int, name: str = "<case>") -> tuple[list[str], bool]:
    """Partition `hlo` on `num_devices` partitions, run it locally on random inputs and compare
    with the reference. Returns the mismatch descriptions (empty when equivalent) and whether
    some op ran replicated for lack of a rule. Raises GspmdcError when partitioning or running
    stops cleanly."""
    from gspmdc import api
    from gspmdc.passes.spmd import compile_spmd
    from gspmdc.runtime import io
    from gspmdc.runtime.backends.local import run_local
    from gspmdc.runtime.compare import check_tolerance, compare_output_arrays, reduction_length
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
    comparisons = compare_output_arrays(got, want, check_tolerance(reduction_length(reference)))
    default = any("no partitioning rule" in str(inst.attr("metadata"))
                  for _, inst in spmd.all_instructions())
    return [c.line() for c in comparisons if not c.ok], default


def score(shared_dir: Path, verbose: bool = False) -> int:
    """Score every case; print the buckets; exit code 1 when a case mismatches or crashes."""
    from gspmdc import api
    path = Path(shared_dir) / "conformance" / "xla-partitioner.json"
    cases = json.loads(path.read_text())["cases"]
    equivalent = Tally("equivalent")
    default = Tally("  of which use the default action", counts_only=True)
    mismatch = Tally("mismatch", counts_only=True)
    rejected = Tally("cleanly rejected", counts_only=True)
    crashed = Tally("crashed", counts_only=True)
    skipped = Tally("skipped", counts_only=True)
    for case in cases:
        name = f"{case['name']}:{case['line']}"
        n = case["num_devices"]
        if IO_OPCODES & set(case.get("opcodes", ())):
            skipped.record(name, "I/O ops: the reference cannot run")
            continue
        try:
            module = api.parse(case["hlo"], name)
        except GspmdcError as e:
            rejected.record(name, _one_line(e))
            continue
        largest, work = largest_value_bytes(module), multiply_adds(module)
        if largest > MAX_VALUE_BYTES or work > MAX_MULTIPLY_ADDS:
            skipped.record(name, f"too large for a local run ({largest / 2**20:.0f} MiB value, "
                                 f"{work:.2g} multiply-adds)")
            continue
        try:
            with time_limit(CASE_TIMEOUT_SECONDS):
                problems, used_default = run_case(case["hlo"], n, name)
            if problems:
                mismatch.record(name, "; ".join(problems))
            else:
                equivalent.record(name, None)
                if used_default:
                    default.record(name, None)
        except GspmdcError as e:
            rejected.record(name, ("(expected) " if case.get("expects_error") else "") +
                            _one_line(e))
        except Exception as e:  # noqa: BLE001 - a crash is a finding to report
            crashed.record(name, _one_line(e))
    _report("xla-partitioner.json (partition + run --check on the local backend):",
            [equivalent, default, mismatch, rejected, crashed, skipped], verbose)
    return 1 if mismatch.attempted or crashed.attempted else 0


__all__ = ["score", "run_case"]
