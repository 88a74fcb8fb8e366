"""Runtime benchmark: what running an SPMD program on N partitions costs besides the kernels.

1. Interpreter overhead per rank on a matmul-heavy program (a 4-layer Megatron MLP partitioned by
   gspmdc): `(wall - kernels - collectives) / wall` from `--profile`'s bookkeeping, on the local
   backend (threads) and on MPI ranks.
2. Collective efficiency: the MPI backend's all-reduce (f32 sum) and all-gather, finished at
   once, against the same nonblocking MPI call made with raw mpi4py on the backend's
   communicator, from the same operand, into one preallocated buffer, completed by the backend's
   own `Waiter`, at 1 MiB and 64 MiB (all-reduce: operand size;
   all-gather: result size). A sample is the time per call of a batch of calls between
   barriers (2 MiB of calls per batch; the slowest rank's time), so that the barrier's and the
   clock's noise is spread over several calls; in each round the two sides run back to back,
   each going first in every other round, after one warm-up round (21 rounds at 64 MiB, 210 at
   1 MiB). Efficiency = the median over the rounds of raw time / backend time: the paired ratio
   cancels the machine's drift between rounds; the times shown are medians.
   N=4 on a 2-core machine is also run with blocking waits. (Start-up and the other run-side
   figures are in `bench_run.py`.)

    python bench/bench_runtime.py            (or `make bench`, which calls run())
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PYTHON = sys.executable
MPIEXEC = str(Path(PYTHON).with_name("mpiexec"))
GSPMDC = str(Path(PYTHON).with_name("gspmdc"))

B, D, F, LAYERS = 512, 1024, 2048, 4


def mlp_module(n: int) -> str:
    """A LAYERS-deep MLP, batch replicated, weights Megatron-sharded over all n partitions."""
    col = f"{{devices=[1,{n}]<=[{n}]}}"
    row = f"{{devices=[{n},1]<=[{n}]}}"
    lines = [f"  x0 = f32[{B},{D}] parameter(0), sharding={{replicated}}"]
    p = 1
    for i in range(LAYERS):
        lines += [
            f"  w1.{i} = f32[{D},{F}] parameter({p}), sharding={col}",
            f"  w2.{i} = f32[{F},{D}] parameter({p + 1}), sharding={row}",
            f"  h.{i} = f32[{B},{F}] dot(x{i}, w1.{i}), lhs_contracting_dims={{1}}, "
            "rhs_contracting_dims={0}",
            f"  a.{i} = f32[{B},{F}] tanh(h.{i})",
            f"  x{i + 1} = f32[{B},{D}] dot(a.{i}, w2.{i}), lhs_contracting_dims={{1}}, "
            "rhs_contracting_dims={0}" + (", sharding={replicated}" if i == LAYERS - 1 else ""),
        ]
        p += 2
    lines[-1] = "  ROOT " + lines[-1].strip()
    return f"HloModule mlp, num_partitions={n}\n\nENTRY main {{\n" + "\n".join(lines) + "\n}\n"


def interpreter_overhead(n: int) -> list[tuple[str, float, float, float, float]]:
    """(backend, wall, kernels, collectives, overhead share) averaged over ranks."""
    from gspmdc import api
    from gspmdc.passes.pipeline import compile_spmd
    from gspmdc.runtime import io
    from gspmdc.runtime.backends.local import run_local
    from gspmdc.runtime.profile import ProfileRecorder
    from gspmdc.runtime.sharded_io import split_inputs, spmd_signature
    text = mlp_module(n)
    module = api.parse(text)
    inputs = io.random_inputs(module, 0)
    spmd = compile_spmd(api.parse(text), n)
    per_partition = split_inputs(spmd_signature(spmd, n), inputs)
    run_local(spmd, per_partition, n)                      # warm up
    recorders = [ProfileRecorder(p, n) for p in range(n)]
    run_local(spmd, per_partition, n, recorders=recorders)
    rows = [_average("local", [r.profile() for r in recorders])]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp.hlo"
        path.write_text(text)
        out = subprocess.run([GSPMDC, "run", str(path), "-n", str(n), "--profile", "-q"],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
    rows.append(_average("mpi", _parse_profile(out.stdout)))
    return rows


def _average(backend, profiles):
    wall = statistics.mean(p.wall for p in profiles)
    kernels = statistics.mean(p.kernel_seconds for p in profiles)
    collectives = statistics.mean(p.collective_seconds for p in profiles)
    overhead = statistics.mean(p.interpretation_seconds / p.wall for p in profiles)
    return backend, wall, kernels, collectives, overhead


def _parse_profile(text: str):
    """RankProfile-like rows from the table `--profile` prints."""
    from gspmdc.runtime.profile import RankProfile
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[0].isdigit() and fields[5].endswith("%"):
            rows.append(RankProfile(int(fields[0]), wall=float(fields[1]),
                                    kernel_seconds=float(fields[2]),
                                    collective_seconds=float(fields[3])))
    return rows


# ---------------------------------------------------------------- collectives (under mpiexec)

COLLECTIVES = """HloModule c, num_partitions={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[{count}] parameter(0)
  y = f32[{part}] parameter(1)
  ar = f32[{count}] all-reduce(x), channel_id=1, replica_groups={{}}, use_global_device_ids=true, to_apply=add
  ag = f32[{count}] all-gather(y), channel_id=2, replica_groups={{}}, use_global_device_ids=true, dimensions={{0}}
  ROOT t = (f32[{count}], f32[{count}]) tuple(ar, ag)
}}
"""


def collectives_worker(sizes: list[int], rounds: int, wait: str) -> None:
    """Run by every rank: time backend vs raw mpi4py; rank 0 prints one JSON line of
    (size, collective, backend seconds per call, raw seconds per call, efficiency): the times
    are medians over the rounds, the efficiency is the median of the rounds' raw / backend."""
    from mpi4py import MPI
    from gspmdc.ir.parser import parse_module
    from gspmdc.runtime.backends.mpi import MpiBackend
    from gspmdc.runtime.collectives import Reduction
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    results = []
    for size in sizes:
        count = size // 4
        module = parse_module(COLLECTIVES.format(n=n, count=count, part=count // n))
        backend = MpiBackend(module, comm, wait=wait)
        ar = module.entry.instruction("ar")
        ag = module.entry.instruction("ag")
        x = np.ones(count, np.float32)
        y = np.ones(count // n, np.float32)
        out = np.empty(count, np.float32)
        add = Reduction(np.add, np.add)

        def raw(instruction, name):
            """The nonblocking MPI call the backend makes, on its communicator, completed the
            way the backend waits."""
            start = getattr(backend.group_communicator(instruction), name)
            return lambda *args: backend.waiter.wait([start(*args)])
        raw_allreduce, raw_allgather = raw(ar, "Iallreduce"), raw(ag, "Iallgather")
        pairs = {   # (backend, raw) of each collective, same operands, finished at once
            "all-reduce": (lambda: backend.all_reduce(ar, [x], add).result(),
                           lambda: raw_allreduce(x, out, MPI.SUM)),
            "all-gather": (lambda: backend.all_gather(ag, [y], 0).result(),
                           lambda: raw_allgather(y, out)),
        }
        calls = max(1, (2 << 20) // size)      # per batch: 2 MiB of calls

        def batch(fn) -> float:
            """Seconds per call of a batch of `calls` calls between barriers, slowest rank."""
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)
        samples = {(op, side): [] for op in pairs for side in ("backend", "raw")}
        many = rounds if size > (8 << 20) else 10 * rounds     # small batches are quick
        for r in range(many + 1):              # round 0 warms up (first touch of the buffers)
            for op, (ours, theirs) in pairs.items():
                # interleaved, alternating which side goes first, so drift hits both alike
                order = ((ours, "backend"), (theirs, "raw"))
                for fn, side in order if r % 2 else order[::-1]:
                    t = batch(fn)
                    if r:
                        samples[op, side].append(t)
        for op in pairs:
            ours, theirs = samples[op, "backend"], samples[op, "raw"]
            results.append((size, op, statistics.median(ours), statistics.median(theirs),
                            statistics.median(t / o for t, o in zip(theirs, ours))))
        backend.close()
    if comm.Get_rank() == 0:
        print(json.dumps(results))


def collective_efficiency(n: int, sizes=(1 << 20, 64 << 20), rounds: int = 21,
                          wait: str = "auto"):
    """[(size, collective, backend seconds per call, raw seconds per call, efficiency)] on n
    ranks (`collectives_worker`; `rounds` at sizes above 8 MiB, ten times as many below)."""
    out = subprocess.run([MPIEXEC, "-n", str(n), PYTHON, __file__, "--collectives-worker",
                          ",".join(map(str, sizes)), str(rounds), wait],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> None:
    print(f"interpreter overhead, {LAYERS}-layer MLP (batch {B}, {D}x{F} weights, Megatron):")
    print(f"{'N':>3} {'backend':<8} {'wall(s)':>8} {'kernels(s)':>10} {'collect.(s)':>11} "
          f"{'overhead':>8}")
    for n in (2, 4):
        for backend, wall, kernels, collectives, overhead in interpreter_overhead(n):
            print(f"{n:>3} {backend:<8} {wall:>8.3f} {kernels:>10.3f} {collectives:>11.3f} "
                  f"{100 * overhead:>7.2f}%")
    print()
    print("collective efficiency (raw mpi4py time / MPI backend time, median of interleaved "
          "rounds):")
    print(f"{'N':>3} {'waiting':<9} {'size':>7} {'collective':<11} {'backend(ms)':>11} "
          f"{'raw(ms)':>8} {'efficiency':>10}")
    for n, wait in ((2, "auto"), (4, "auto"), (4, "blocking")):
        for size, op, ours, raw, efficiency in collective_efficiency(n, wait=wait):
            print(f"{n:>3} {wait:<9} {size >> 20:>4} MiB {op:<11} {1e3 * ours:>11.2f} "
                  f"{1e3 * raw:>8.2f} {efficiency:>10.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--collectives-worker":
        collectives_worker([int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]),
                           sys.argv[4])
    else:
        run()
