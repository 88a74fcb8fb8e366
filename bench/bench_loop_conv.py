"""Loop-of-convolutions benchmark: the local backend run from a Python process that had numpy
loaded already (the API's and the conformance scorers' way) against `gspmdc run --backend local`
(a process that sets the BLAS threads before numpy loads), per execution, same program.

The program is XLA's propagation test `WhileConv` (a while loop whose body convolves a
`bf16[B,512,C]` input, sharded `[8,1,2]`, with a `bf16[C,768]` kernel, `0bf_io0->0bf`, and
reduce-scatters the partial sums) on 16 partitions, at its size (`B = 128`, `C = 2048`: 1.0e11
multiply-adds per iteration), with its counter incremented (the test's own loop never
terminates) for one iteration. In-process, each of the 16 partition threads drives the
OpenBLAS numpy loaded; when that library runs its default thread pool (one per core), the
spinning pools make the run several times slower than the command (the scorer's WhileConv runs
took 3.5 times the CPU), which is why `run_local` sets the library's count for the run
(`runtime/blas.py`). Target: in-process / command <= 1.2. Measured at loads of 16-19: 0.97
(30.5 s and 31.5 s per execution); with the library left at its two threads, 2.01 (57.8 s and
25.9 s).

Each side's time is the median of `EXECUTIONS` executions after a first one; the ratio is the
median over `ROUNDS` rounds of the two sides run back to back, taking turns going first.

    python bench/run.py loop_conv         (or `make bench`, which runs every benchmark)
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax_programs  # noqa: E402

N = 16
ROUNDS = 3
EXECUTIONS = 1
B, C = 128, 2048

PROGRAM = f"""HloModule while_conv

cond {{
  s = (u32[], bf16[2,{C},768], bf16[{B},512,{C}], bf16[{B},512,768], s32[]) parameter(0)
  count = u32[] get-tuple-element(s), index=0
  limit = u32[] constant(1)
  ROOT lt = pred[] compare(count, limit), direction=LT
}}

body {{
  s = (u32[], bf16[2,{C},768], bf16[{B},512,{C}], bf16[{B},512,768], s32[]) parameter(0)
  i0 = s32[] constant(0)
  count = u32[] get-tuple-element(s), index=0
  one = u32[] constant(1)
  next = u32[] add(count, one)
  kernels = bf16[2,{C},768] get-tuple-element(s), index=1
  index = s32[] get-tuple-element(s), index=4
  dys = bf16[1,{C},768] dynamic-slice(kernels, index, i0, i0), dynamic_slice_sizes={{1,{C},768}}
  kernel = bf16[{C},768,1] reshape(dys)
  lhs = bf16[{B},512,{C}] get-tuple-element(s), index=2, sharding={{devices=[8,1,2]<=[16]}}
  conv = bf16[{B},512,768] convolution(lhs, kernel), window={{size=1}}, dim_labels=0bf_io0->0bf, sharding={{devices=[8,1,2]<=[16]}}
  ROOT t = (u32[], bf16[2,{C},768], bf16[{B},512,{C}], bf16[{B},512,768], s32[]) tuple(next, kernels, lhs, conv, index)
}}

ENTRY main {{
  p0 = bf16[{C},768] parameter(0), sharding={{devices=[2,1,8]<=[8,2]T(1,0) last_tile_dim_replicate}}
  p1 = bf16[{B},512,{C}] parameter(1), sharding={{devices=[8,1,2]<=[16]}}
  p2 = bf16[{B},512,768] parameter(2)
  r0 = bf16[1,{C},768] reshape(p0)
  kernels = bf16[2,{C},768] concatenate(r0, r0), dimensions={{0}}
  zero = u32[] constant(0)
  p3 = s32[] parameter(3)
  init = (u32[], bf16[2,{C},768], bf16[{B},512,{C}], bf16[{B},512,768], s32[]) tuple(zero, kernels, p1, p2, p3)
  w = (u32[], bf16[2,{C},768], bf16[{B},512,{C}], bf16[{B},512,768], s32[]) while(init), condition=cond, body=body
  ROOT r = bf16[{B},512,768] get-tuple-element(w), index=3, sharding={{replicated}}
}}
"""


def _in_process(path: Path) -> float:
    """The median seconds per execution of `run_local` on `path`'s partitioned program, called
    from this process (numpy loaded)."""
    from gspmdc.ir import dtypes
    from gspmdc.partitioned import load_partitioned
    from gspmdc.runtime.backends.local import run_local_timed
    from gspmdc.runtime.sharded_io import spmd_signature, split_inputs
    spmd, n = load_partitioned(str(path), N)
    signature = spmd_signature(spmd, n)
    rng = np.random.default_rng(0)
    values = []
    for parameter in signature.parameters:
        shape = parameter.global_shape
        dtype = dtypes.numpy_dtype(shape.element_type)
        values.append(np.zeros(shape.dims, dtype) if dtype.kind == "i" else
                      rng.standard_normal(shape.dims, np.float32).astype(dtype))
    _, times = run_local_timed(spmd, split_inputs(signature, values), n, repeat=EXECUTIONS)
    return statistics.median(times)


def _command(path: Path) -> float:
    return jax_programs.gspmdc_seconds_per_execution(path, N, None, EXECUTIONS, "local")


def run() -> None:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"WhileConv, one iteration, {N} partitions, local backend, per execution "
          f"(load average {load}):")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "while_conv.hlo"
        path.write_text(PROGRAM)
        times: dict[str, list[float]] = {"in-process": [], "command": []}
        sides = {"in-process": _in_process, "command": _command}
        for r in range(ROUNDS):
            for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                times[name].append(sides[name](path))
    ratio = statistics.median(a / b for a, b in zip(times["in-process"], times["command"]))
    print(f"   in-process {statistics.median(times['in-process']):.2f} s, command "
          f"{statistics.median(times['command']):.2f} s: ratio {ratio:.2f} (target <= 1.2)")


if __name__ == "__main__":
    run()
