"""`gspmdc cost --calibrate`: measure this machine as `gspmdc run` sees it, and fit a machine
model (`passes/analysis/machine.Machine`) that `gspmdc cost --machine FILE` uses.

- Links: a partitioned program (`calibration_program`) runs on N MPI ranks through `gspmdc run
  --profile-json`; a loop of `REPEATS` iterations sends, for each message size from 8 bytes to
  4 MiB, one collective-permute around the ring of ranks and one all-reduce over all of them.
  The profile gives each collective's time per execution (the slowest rank's). The latency α and
  bandwidth β are the least-squares fit of `t = α + b/β` to the permutes (relative errors
  weighted alike); the all-reduces, predicted by the machine model from that fit, show how well
  the model describes this MPI (the report lists both).
- Operations: numpy's float32 matrix product (what the runtime's dot kernel runs), best of a few
  runs; memory bandwidth: numpy copying a 64 MiB array (bytes read plus written per second).
- Memory capacity: the machine's physical memory shared by the N ranks.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gspmdc.errors import GspmdcError, RuntimeFailure
from gspmdc.ir.cost import all_reduce, collective_permute, collective_seconds
from gspmdc.passes.analysis.machine import Machine
from gspmdc.units import format_bytes, format_seconds

#: message sizes in bytes (float32 elements x 4)
SIZES = tuple(8 * 4 ** k for k in range(11))
REPEATS = 20


def calibration_program(n: int) -> str:
    """A partitioned module for `n` partitions: a while loop of `REPEATS` iterations whose body
    permutes (p -> p+1 mod n) and all-reduces one float32 array of each size in `SIZES`."""
    pairs = ",".join(f"{{{p},{(p + 1) % n}}}" for p in range(n))
    shapes = [f"f32[{size // 4}]" for size in SIZES]
    state = "(s32[], " + ", ".join(shapes) + ")"
    body = [f"  p = {state} parameter(0)",
            "  i = s32[] get-tuple-element(p), index=0",
            "  one = s32[] constant(1)",
            "  next = s32[] add(i, one)"]
    results = []
    for k, (size, shape) in enumerate(zip(SIZES, shapes)):
        body += [f"  x{k} = {shape} get-tuple-element(p), index={k + 1}",
                 f"  permute_{size}B = {shape} collective-permute(x{k}), channel_id={2 * k + 1}, "
                 f"source_target_pairs={{{pairs}}}",
                 f"  allreduce_{size}B = {shape} all-reduce(permute_{size}B), "
                 f"channel_id={2 * k + 2}, replica_groups=[1,{n}]<=[{n}], "
                 "use_global_device_ids=true, to_apply=add"]
        results.append(f"allreduce_{size}B")
    body.append(f"  ROOT r = {state} tuple(next, {', '.join(results)})")
    entry = [f"  x{k} = {shape} parameter({k}), sharding={{replicated}}"
             for k, shape in enumerate(shapes)]
    entry += ["  zero = s32[] constant(0)",
              f"  init = {state} tuple(zero, {', '.join(f'x{k}' for k in range(len(SIZES)))})",
              f"  loop = {state} while(init), condition=cond, body=body",
              f"  ROOT last = {shapes[-1]} get-tuple-element(loop), index={len(SIZES)}, "
              "sharding={replicated}"]
    return "\n".join([
        f'HloModule calibration, num_partitions={n}, '
        'frontend_attributes={gspmdc.stage="partitioned"}', "",
        "add {", "  a = f32[] parameter(0)", "  b = f32[] parameter(1)",
        "  ROOT s = f32[] add(a, b)", "}", "",
        "cond {", f"  p = {state} parameter(0)", "  i = s32[] get-tuple-element(p), index=0",
        f"  limit = s32[] constant({REPEATS})",
        "  ROOT lt = pred[] compare(i, limit), direction=LT", "}", "",
        "body {", *body, "}", "", "ENTRY main {", *entry, "}", ""])


def measure_collectives(n: int, mpiexec: str | None) -> dict[str, float]:
    """Seconds per execution of each collective of `calibration_program(n)` run on `n` MPI
    ranks (the slowest rank's)."""
    with tempfile.TemporaryDirectory(prefix="gspmdc-calibrate-") as directory:
        program = Path(directory) / "calibration.hlo"
        figures = Path(directory) / "figures.json"
        program.write_text(calibration_program(n))
        command = [sys.executable, "-m", "gspmdc", "run", str(program), "-n", str(n), "-q",
                   "--profile-json", str(figures)]
        if mpiexec is not None:
            command += ["--mpiexec", mpiexec]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeFailure(f"the calibration run failed (exit {done.returncode}): "
                                 f"{done.stderr.strip()}")
        data = json.loads(figures.read_text())
    return {c["name"]: c["seconds"] / c["calls"] for c in data["collectives"]}


def fit_latency_bandwidth(sizes, seconds) -> tuple[float, float]:
    """`(α, β)` minimising the relative error of `t = α + b/β` over the measurements."""
    b = np.asarray(sizes, np.float64)
    t = np.asarray(seconds, np.float64)
    design = np.stack([np.ones_like(b), b], axis=1) / t[:, None]
    (alpha, inverse_beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if inverse_beta <= 0:
        raise GspmdcError("the calibration measured no growth of time with message size; "
                          "cannot fit a bandwidth")
    return max(float(alpha), 0.0), float(1.0 / inverse_beta)


def measure_operation_rate() -> float:
    """float32 operations per second of numpy's matrix product (best of 3)."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * 1024 ** 3 / best


def measure_memory_bandwidth() -> float:
    """Bytes read plus written per second by numpy copying 64 MiB (best of 3)."""
    source = np.ones(16 << 20, np.float32)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best


def calibrate(n: int, mpiexec: str | None = None) -> tuple[Machine, str]:
    """The measured machine model for `n` ranks and a report of the measurements."""
    per_call = measure_collectives(n, mpiexec)
    permutes = [per_call[f"permute_{size}B"] for size in SIZES]
    alpha, beta = fit_latency_bandwidth(SIZES, permutes)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n
    machine = Machine(
        "calibrated", f"this machine ({os.uname().nodename}), {n} MPI ranks, measured "
        f"{time.strftime('%Y-%m-%d')} by gspmdc cost --calibrate",
        measure_operation_rate(), measure_memory_bandwidth(), memory, beta, alpha)
    lines = [f"fit over {n} ranks: latency {format_seconds(alpha)}, bandwidth "
             f"{beta / 1e9:.2f} GB/s; operations {machine.flops_per_second / 1e9:.1f} GFLOP/s, "
             f"memory {machine.memory_bandwidth / 1e9:.1f} GB/s",
             f"{'bytes':>10}  {'permute':>10}  {'model':>10}  {'all-reduce':>10}  {'model':>10}"]
    ring = [(p, (p + 1) % n) for p in range(n)]
    for size, permute in zip(SIZES, permutes):
        reduce = per_call[f"allreduce_{size}B"]
        model_permute = collective_seconds(collective_permute(ring, size, n), alpha, beta)[0]
        model_reduce = collective_seconds(all_reduce([list(range(n))], size // 4, 4, n), alpha,
                                          beta)[0]
        lines.append(f"{format_bytes(size):>10}  {format_seconds(permute):>10}  "
                     f"{format_seconds(model_permute):>10}  {format_seconds(reduce):>10}  "
                     f"{format_seconds(model_reduce):>10}")
    return machine, "\n".join(lines)


__all__ = ["calibrate", "calibration_program", "fit_latency_bandwidth", "SIZES"]
