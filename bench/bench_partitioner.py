"""Partitioner benchmark: compile the transformer-like module of bench_propagation (about 10,000
instructions, Megatron-style shardings on a (data, model) mesh) into its SPMD program, at 8 and
at 4096 devices, and at half and full size. Reports each pass's median wall time, the total per
1,000 instructions, the ratio of the total at 4096 devices to 8 (GSPMD's property: compile
time does not grow with the device count; target <= 1.1) and of full size to half size
(linear in program size: target about 2).

    python bench/run.py partitioner
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_propagation import layers_for, transformer  # noqa: E402

from gspmdc.ir.parser import parse_module  # noqa: E402
from gspmdc.ir.sharding_algebra import clear_caches  # noqa: E402
from gspmdc.passes.pass_manager import PassContext, run_pipeline  # noqa: E402
from gspmdc.passes.pipeline import partitioner_pipeline  # noqa: E402

REPEAT = 3
MESHES = ((2, 4), (64, 64))


def compile_times(text: str, devices: int) -> tuple[int, dict[str, float]]:
    """Instruction count and the median seconds of each pass over REPEAT compilations."""
    samples: dict[str, list[float]] = {}
    count = 0
    for _ in range(REPEAT):
        clear_caches()
        module = parse_module(text)
        count = sum(len(c.instructions) for c in module.computations.values())

        def after(index, pass_, result, seconds):
            samples.setdefault(pass_.name, []).append(seconds)
        run_pipeline(PassContext(devices), module, partitioner_pipeline(), after)
    return count, {name: statistics.median(times) for name, times in samples.items()}


def run(instructions: int = 10_000) -> None:
    rows = []
    for size in (instructions // 2, instructions):
        for data, model in MESHES:
            count, passes = compile_times(transformer(layers_for(size), data, model),
                                          data * model)
            rows.append((count, data * model, passes))
    names = list(rows[0][2])
    print(f"{'instrs':>7} {'devices':>7} " + " ".join(f"{n:>15}" for n in names) +
          f" {'total(s)':>9} {'s/1k instrs':>11}")
    for count, devices, passes in rows:
        total = sum(passes.values())
        print(f"{count:>7} {devices:>7} " + " ".join(f"{passes[n]:>15.3f}" for n in names) +
              f" {total:>9.2f} {1000 * total / count:>11.3f}")
    totals = [sum(p.values()) for _, _, p in rows]
    print(f"ratio 4096 / 8 devices (full size): {totals[3] / totals[2]:.2f} (target <= 1.1)")
    print(f"ratio full / half size (8 devices): {totals[2] / totals[0]:.2f} "
          f"(instructions {rows[2][0] / rows[0][0]:.2f}x)")


if __name__ == "__main__":
    run()
