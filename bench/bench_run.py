"""Run-side benchmark: every figure of `gspmdc run` as a ratio against its anchor, in one run.

1. The bundled example, `gspmdc run gspmdc/examples/mlp.hlo -n 8 --check`, on MPI against the same
   command on the local backend (whole command, wall time).
2. Start-up: seconds from the start of `gspmdc run` to the first instruction (`--profile`'s
   start-up line, slowest rank) of a trivial program at N = 2 and 8, against bare `mpiexec -n N`
   starting Python ranks that import numpy and mpi4py (the raw mpi4py floor).
3. Per execution, the JAX programs of ../shared/jax-programs at N = 2 and 8 (`jax_programs.py`):
   `gspmdc run --repeat` on MPI and on the local backend (threads: the interpreter and kernels
   without the processes' synchronisation) against XLA through JAX on N host devices, same
   program text, same inputs; geometric mean and worst ratio per N and backend.
4. Kernels at real sizes, one device: convolution-heavy programs (a ResNet basic block, a
   MobileNet depthwise-separable block, a strided stem) and matmul-heavy ones (a 4-layer MLP,
   batched attention products), `gspmdc run -n 1 --backend local --repeat` against XLA through
   JAX on one device, same HLO text, same (seeded) inputs, 20 executions per measurement in five
   rounds. Each side uses the threads it uses by default (XLA's pool has a thread per core;
   gspmdc's BLAS threads follow the load when `gspmdc run` starts, one on a busy machine, and
   under `chrt` the waiting work counts as busy): the section prints the BLAS threads the gspmdc
   runs used (`run --repeat` names them). Where this environment sets `OPENBLAS_CORETYPE` or
   `OPENBLAS_L2_SIZE` (some machines do, for older OpenBLAS builds; they can force older kernels
   than the CPU has: Haswell's AVX2 kernels take twice the time of the AVX-512 ones XLA uses on a
   CPU that has them), the figures are those of `gspmdc run` with both unset for that command
   alone (OpenBLAS picks the kernels for the CPU; XLA's side is the same), then again with this
   environment's, labelled. Each figure names the kernels numpy's OpenBLAS runs in that
   environment, as a child with exactly that environment reports them
   (`runtime/blas.py`'s `blas_kernels`).

Every ratio is the median over rounds of the sides run back to back, rotating which goes first
(drift and load hit every side alike); times are medians. The load average is printed with each
section: on a shared machine compare ratios of one run, not absolute times. XLA figures are
skipped, with a note, when jax/jaxlib are not installed (the `[xla]` extra), the JAX programs when
../shared is absent.

    python bench/run.py run         (or `make bench`, which runs every benchmark)
"""
from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax_programs  # noqa: E402

PYTHON = sys.executable
MPIEXEC = str(Path(PYTHON).with_name("mpiexec"))
GSPMDC = str(Path(PYTHON).with_name("gspmdc"))
EXAMPLE = Path(__file__).resolve().parents[1] / "gspmdc" / "examples" / "mlp.hlo"

#: rounds of alternating runs per figure, executions per `--repeat` measurement
ROUNDS = 3
EXECUTIONS = 20
_STARTUP = re.compile(r"^start-up: ([0-9.]+) s", re.M)


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _blas(env: dict[str, str] | None) -> str:
    """The kernels numpy's BLAS runs in a child with the environment `env` (None: this
    process's), the one `gspmdc run` gets: what the child's OpenBLAS reports, not what the
    variables ask for."""
    probe = ("import numpy\n"
             "from gspmdc.runtime.blas import blas_kernels\n"
             "print(blas_kernels())\n")
    proc = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=env, check=True)
    kernels = proc.stdout.strip()
    return "numpy's BLAS is not an OpenBLAS" if kernels == "None" else \
        f"numpy's OpenBLAS runs its {kernels} kernels"


def _rotating(*sides, rounds: int = ROUNDS) -> tuple[list[float], list[float]]:
    """(the median time of each side, per side but the last the median over the rounds of its
    time / the last side's (the anchor)): each round runs every side once, starting from a
    different side each round (drift and load hit every side alike)."""
    times: list[list[float]] = [[] for _ in sides]
    for r in range(rounds):
        for k in range(len(sides)):
            i = (r + k) % len(sides)
            times[i].append(sides[i]())
    ratios = [statistics.median(x / y for x, y in zip(t, times[-1])) for t in times[:-1]]
    return [statistics.median(t) for t in times], ratios


def _wall(command: list[str], cwd: str | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {proc.stderr.strip()[-2000:]}")
    return time.perf_counter() - start


# -------------------------------------------------------------------------- 1. the example

def example_mpi_vs_local() -> tuple[float, float, float]:
    command = [GSPMDC, "run", str(EXAMPLE), "-n", "8", "--check", "-q"]
    with tempfile.TemporaryDirectory() as cwd:
        (mpi, local), (ratio,) = _rotating(lambda: _wall(command, cwd),
                                           lambda: _wall(command + ["--backend", "local"], cwd))
        return mpi, local, ratio


# ------------------------------------------------------------------------------- 2. start-up

TRIVIAL = """HloModule trivial, num_partitions={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[4] parameter(0), sharding={{replicated}}
  ROOT r = f32[4] all-reduce(x), channel_id=1, replica_groups={{}}, use_global_device_ids=true, to_apply=add, sharding={{replicated}}
}}
"""


def startup(n: int) -> tuple[float, float, float]:
    """(seconds to the first instruction, seconds of bare mpiexec + numpy + mpi4py, ratio)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trivial.hlo"
        path.write_text(TRIVIAL.format(n=n))

        def ours() -> float:
            proc = subprocess.run([GSPMDC, "run", str(path), "-n", str(n), "-q", "--profile"],
                                  capture_output=True, text=True, timeout=300, cwd=tmp)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr)
            return float(_STARTUP.search(proc.stdout).group(1))
        bare = [MPIEXEC, "-n", str(n), PYTHON, "-c", "import numpy; from mpi4py import MPI"]
        (seconds, floor), (ratio,) = _rotating(ours, lambda: _wall(bare, tmp))
        return seconds, floor, ratio


# ------------------------------------------------------------------------ 3. JAX programs

def jax_program_ratios(n: int, folders: list[Path]) -> list[tuple[str, list[float], list[float]]]:
    """[(program, seconds per execution [MPI, local backend, XLA], ratios to XLA [MPI, local])]
    on n devices."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in folders:
            path = Path(tmp) / f"{folder.name}.hlo"
            path.write_text(jax_programs.program_text(folder, n))
            inputs = folder / "inputs.npz"
            rows.append((folder.name, *_rotating(
                lambda: jax_programs.gspmdc_seconds_per_execution(path, n, inputs, EXECUTIONS),
                lambda: jax_programs.gspmdc_seconds_per_execution(path, n, inputs, EXECUTIONS,
                                                                  "local"),
                lambda: jax_programs.jax_seconds_per_execution(path, n, inputs, EXECUTIONS))))
    return rows


# ------------------------------------------------------------------------------- 4. kernels

KERNEL_PROGRAMS = {
    "resnet block (conv)": """HloModule resnet_block

relu {
  x = f32[8,56,56,64] parameter(0)
  zero = f32[] constant(0)
  zeros = f32[8,56,56,64] broadcast(zero), dimensions={}
  ROOT r = f32[8,56,56,64] maximum(x, zeros)
}

ENTRY main {
  x = f32[8,56,56,64] parameter(0)
  k1 = f32[3,3,64,64] parameter(1)
  k2 = f32[3,3,64,64] parameter(2)
  c1 = f32[8,56,56,64] convolution(x, k1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  r1 = f32[8,56,56,64] call(c1), to_apply=relu
  c2 = f32[8,56,56,64] convolution(r1, k2), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  s = f32[8,56,56,64] add(c2, x)
  ROOT r2 = f32[8,56,56,64] call(s), to_apply=relu
}
""",
    "depthwise-separable (conv)": """HloModule separable

ENTRY main {
  x = f32[8,56,56,128] parameter(0)
  dw = f32[3,3,1,128] parameter(1)
  pw = f32[1,1,128,128] parameter(2)
  d = f32[8,56,56,128] convolution(x, dw), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=128
  ROOT p = f32[8,56,56,128] convolution(d, pw), window={size=1x1}, dim_labels=b01f_01io->b01f
}
""",
    "strided stem (conv)": """HloModule stem

ENTRY main {
  x = f32[4,224,224,3] parameter(0)
  k = f32[7,7,3,64] parameter(1)
  ROOT c = f32[4,112,112,64] convolution(x, k), window={size=7x7 stride=2x2 pad=3_3x3_3}, dim_labels=b01f_01io->b01f
}
""",
    "4-layer MLP (matmul)": """HloModule mlp

ENTRY main {
  x = f32[512,1024] parameter(0)
  w1 = f32[1024,2048] parameter(1)
  w2 = f32[2048,1024] parameter(2)
  w3 = f32[1024,2048] parameter(3)
  w4 = f32[2048,1024] parameter(4)
  h1 = f32[512,2048] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  a1 = f32[512,2048] tanh(h1)
  h2 = f32[512,1024] dot(a1, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  a2 = f32[512,1024] tanh(h2)
  h3 = f32[512,2048] dot(a2, w3), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  a3 = f32[512,2048] tanh(h3)
  ROOT h4 = f32[512,1024] dot(a3, w4), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
""",
    "attention products (matmul)": """HloModule attention

ENTRY main {
  q = f32[8,16,512,64] parameter(0)
  k = f32[8,16,512,64] parameter(1)
  v = f32[8,16,512,64] parameter(2)
  s = f32[8,16,512,512] dot(q, k), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
  ROOT o = f32[8,16,512,64] dot(s, v), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
}
""",
}


#: executions per measurement and rounds of the kernel figures (with five executions in three
#: rounds the MLP's ratio read 0.94, 1.04 and 1.08 in three quiet runs of sessions 13 and 14)
KERNEL_EXECUTIONS = 20
KERNEL_ROUNDS = 5


def kernel_ratios(env: dict[str, str] | None = None
                  ) -> tuple[list[tuple[str, list[float], list[float]]], set[str]]:
    """([(program, seconds per execution [gspmdc, XLA], [ratio])] on one device, for each of
    `KERNEL_PROGRAMS`; the BLAS the gspmdc runs used, as they name it: its kernels and threads,
    which the thread policy sets from the load when each run starts); `gspmdc run` gets the
    environment `env` (None: this process's)."""
    rows, used = [], set()

    def ours(path: Path) -> float:
        seconds, blas = jax_programs.gspmdc_execution(path, 1, None, KERNEL_EXECUTIONS, "local",
                                                      env)
        used.add(blas or "numpy's BLAS, not an OpenBLAS")
        return seconds
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in KERNEL_PROGRAMS.items():
            path = Path(tmp) / "program.hlo"
            path.write_text(text)
            rows.append((name, *_rotating(
                lambda: ours(path),
                lambda: jax_programs.jax_seconds_per_execution(path, 1, None, KERNEL_EXECUTIONS),
                rounds=KERNEL_ROUNDS)))
    return rows, used


#: the variables some machines set for older OpenBLAS builds, which pick the kernels OpenBLAS
#: runs and its cache blocking instead of the CPU it finds
OPENBLAS_KERNEL_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def kernel_environments() -> list[tuple[str, dict[str, str] | None]]:
    """The environments the kernel figures run `gspmdc run` in, labelled: with the
    `OPENBLAS_KERNEL_VARIABLES` this process's environment sets unset together (the kernels
    OpenBLAS picks for the CPU), then this environment as it is; only the latter where it sets
    neither."""
    forced = {name: os.environ[name] for name in OPENBLAS_KERNEL_VARIABLES if name in os.environ}
    if not forced:
        return [("this environment", None)]
    settings = " ".join(f"{name}={value}" for name, value in forced.items())
    unset = {k: v for k, v in os.environ.items() if k not in OPENBLAS_KERNEL_VARIABLES}
    return [(f"{' and '.join(forced)} unset for gspmdc run (this environment sets {settings})",
             unset),
            (f"as this environment sets them ({settings}), forced kernels", None)]


# ------------------------------------------------------------------------------------ report

def _table(rows, sides: list[str]) -> None:
    """One line per program: each side's time, then each side's ratio to the last (the
    anchor)."""
    ratios = [f"{side}/{sides[-1]}" for side in sides[:-1]]
    print("   " + f"{'program':<28}" + "".join(f"{side:>11}" for side in sides)
          + "".join(f"{r:>11}" for r in ratios))
    for name, times, to_anchor in rows:
        print("   " + f"{name:<28}" + "".join(f"{1e3 * t:>9.2f}ms" for t in times)
              + "".join(f"{r:>11.2f}" for r in to_anchor))


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def run() -> None:
    print(f"1. gspmdc run mlp.hlo -n 8 --check, MPI vs local backend ({_load()}):")
    mpi, local, ratio = example_mpi_vs_local()
    print(f"   MPI {mpi:.2f} s, local {local:.2f} s: ratio {ratio:.2f} (target <= 1.6)")
    print(f"\n2. start-up to the first instruction vs bare mpiexec + numpy + mpi4py ({_load()}):")
    for n, target in ((2, 1.0), (8, 1.5)):
        ours, bare, ratio = startup(n)
        print(f"   N={n}: {ours:.2f} s (target <= {target} s), bare {bare:.2f} s: ratio "
              f"{ratio:.2f}")
    xla = jax_programs.jax_available()
    folders = jax_programs.programs()
    print(f"\n3. per execution, JAX programs, gspmdc on MPI and on the local backend vs XLA "
          f"({_load()}):")
    if not xla:
        print("   skipped: jax/jaxlib are not installed (pip install 'gspmdc[xla]')")
    elif not folders:
        print("   skipped: ../shared/jax-programs is absent")
    else:
        for n in (2, 8):
            rows = jax_program_ratios(n, folders)
            print(f"   N={n}:")
            _table(rows, ["MPI", "local", "XLA"])
            for k, side in enumerate(("MPI", "local")):
                ratios = [r[k] for *_, r in rows]
                print(f"   N={n}, {side}: geometric mean {_geomean(ratios):.2f}, worst "
                      f"{max(ratios):.2f}" + (" (targets: <= 3, none above 6)" if n == 2 else ""))
    print("\n4. kernels at real sizes, one device, gspmdc vs XLA:")
    if not xla:
        print("   skipped: jax/jaxlib are not installed (pip install 'gspmdc[xla]')")
        return
    for label, env in kernel_environments():
        print(f"   {label}; {_blas(env)} ({_load()}):")
        rows, used = kernel_ratios(env=env)
        _table(rows, ["gspmdc", "XLA"])
        print(f"   gspmdc ran {' / '.join(sorted(used))}; XLA's pool runs a thread on each of "
              f"the {len(os.sched_getaffinity(0))} cores it may run on")
        conv = [r for name, _, (r,) in rows if "(conv)" in name]
        matmul = [r for name, _, (r,) in rows if "(matmul)" in name]
        print(f"   convolution-heavy: worst {max(conv):.2f} (target <= 1.5); matmul-heavy: worst "
              f"{max(matmul):.2f} (target <= 1.0)")


if __name__ == "__main__":
    run()
