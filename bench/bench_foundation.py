"""Foundation benchmark: parsing, printing and verifying a transformer-like module of about 10,000
instructions, and the cost of sharding arithmetic at 8 vs 4096 devices (iota shardings must not get
slower with the device count). Medians of several runs, measured in one process.

    python bench/run.py foundation
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_propagation import layers_for, transformer  # noqa: E402

from gspmdc.ir import sharding_algebra  # noqa: E402
from gspmdc.ir.parser import parse_module, parse_sharding  # noqa: E402
from gspmdc.ir.printer import print_module  # noqa: E402
from gspmdc.ir.shapes import ArrayShape  # noqa: E402
from gspmdc.ir.verifier import verify_module  # noqa: E402

REPEAT = 5


def _median_seconds(fn, repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def text_pipeline(instructions: int = 10_000) -> None:
    text = transformer(layers_for(instructions), 2, 4)
    module = parse_module(text)
    count = sum(len(c.instructions) for c in module.computations.values())
    rows = [("parse", _median_seconds(lambda: parse_module(text))),
            ("print", _median_seconds(lambda: print_module(module))),
            ("verify", _median_seconds(lambda: verify_module(module)))]
    print(f"HLO text, transformer-like module: {count} instructions, {len(text) / 1e6:.2f} MB, "
          f"median of {REPEAT}")
    print(f"  {'stage':<8} {'seconds':>9} {'ms/1000 instr':>14}")
    for stage, seconds in rows:
        print(f"  {stage:<8} {seconds:>9.3f} {1e6 * seconds / count:>14.1f}")


def _sharding_bundle(data: int, model: int) -> None:
    n = data * model
    shape = ArrayShape("f32", (4096, 8192))
    tiled = parse_sharding(f"{{devices=[{data},{model}]<=[{n}]}}")
    partial = parse_sharding(f"{{devices=[{data},1,{model}]<=[{model},{data}]T(1,0) "
                             "last_tile_dim_replicate}")
    for _ in range(20):
        assert tiled == parse_sharding(tiled.to_text())
        hash(partial)
        tiled.shard_shape(shape)
        sharding_algebra.transpose(tiled, (1, 0)).to_text()
        sharding_algebra.partially_replicate_on_dims(tiled, [0]).to_text()
        sharding_algebra.reshape_sharding(tiled, (4096, 8192), (4096, 64, 128))
        sharding_algebra.is_more_specific(tiled, partial)


def sharding_scaling() -> None:
    meshes = [(2, 4), (8, 16), (64, 64)]
    seconds = {m: _median_seconds(lambda m=m: _sharding_bundle(*m), repeat=9) for m in meshes}
    print("sharding arithmetic (parse, text, hash, shard shape, transpose, partial replication, "
          "reshape, specificity) x 20, median of 9")
    print(f"  {'devices':>8} {'mesh':>8} {'ms':>9}")
    for (d, m), s in seconds.items():
        print(f"  {d * m:>8} {f'{d}x{m}':>8} {1e3 * s:>9.2f}")
    ratio = seconds[meshes[-1]] / seconds[meshes[0]]
    print(f"  time at 4096 devices / time at 8 devices: {ratio:.2f} (target <= 1.1)")


def run() -> None:
    text_pipeline()
    sharding_scaling()


if __name__ == "__main__":
    run()
