"""Write what the compiler prints for a fixed corpus, one file per case, so that two versions of
the compiler can be compared byte for byte (`diff -r BEFORE AFTER`): a performance change must
leave every output identical.

    python bench/compile_outputs.py OUT_DIR [--sample K]

The corpus: the transformer-like bench modules (100, 1,000 and 10,000 instructions at 8 and 64
devices, 100 and 1,000 at 4,096), the JAX programs of ../shared/jax-programs (GSPMD and Shardy
forms), and every K-th case (default 3) of the partitioner and propagation conformance corpora of
../shared/conformance (skipped where ../shared is absent). For each case the file holds the
module after propagation and the partitioned module, or the error a case raises (its type and
message), which must not change either.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
sys.path.insert(0, str(HERE))

from bench_propagation import layers_for, transformer  # noqa: E402


def _cases(sample: int):
    """(name, text, devices) of the corpus."""
    for size, meshes in ((100, ((2, 4), (8, 8), (64, 64))), (1_000, ((2, 4), (8, 8), (64, 64))),
                         (10_000, ((2, 4), (8, 8)))):
        for d, m in meshes:
            yield f"bench-{size}-{d}x{m}", transformer(layers_for(size), d, m), d * m
    programs = SHARED / "jax-programs"
    if programs.is_dir():
        for folder in sorted(p for p in programs.iterdir() if p.is_dir()):
            devices = json.loads((folder / "reference.json").read_text()).get("num_partitions", 8) \
                if (folder / "reference.json").exists() else 8
            for form in ("program.hlo", "program_shardy.hlo"):
                if (folder / form).exists():
                    yield f"jax-{folder.name}-{form}", (folder / form).read_text(), int(devices)
    for corpus in ("xla-partitioner", "xla-propagation"):
        path = SHARED / "conformance" / f"{corpus}.json"
        if not path.exists():
            continue
        for i, case in enumerate(json.loads(path.read_text())["cases"]):
            if i % sample == 0:
                devices = int(case.get("num_devices") or _devices_named(case["hlo"]))
                yield f"{corpus}-{i:03d}-{case['name']}", case["hlo"], devices


def _devices_named(text: str) -> int:
    """The largest device count a `devices=[...]` tile shape of the text covers (8 if none)."""
    counts = [math.prod(int(x) for x in dims.split(","))
              for dims in re.findall(r"devices=\[([\d,]+)\]", text)]
    return max(counts, default=8)


def _compile(text: str, devices: int) -> str:
    """The propagated and the partitioned module as text, or the error raised."""
    from gspmdc.ir.parser import parse_module
    from gspmdc.ir.printer import print_module
    from gspmdc.ir.sharding_algebra import clear_caches
    from gspmdc.passes.pipeline import compile_spmd
    clear_caches()
    out = []
    try:
        module = parse_module(text)
        out.append(print_module(module))
        out.append(print_module(compile_spmd(module, devices)))
    except Exception as error:  # noqa: BLE001 -- the error is part of the output compared
        out.append(f"ERROR {type(error).__name__}: {error}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sample", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    count = 0
    for name, text, devices in _cases(args.sample):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        (args.out / f"{safe}.txt").write_text(_compile(text, devices))
        count += 1
    print(f"{count} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
