"""`make bench`: run every benchmark module `bench/bench_*.py` (each defines `run()`, which prints
its own tables) in name order, or only those named on the command line (`python bench/run.py
foundation propagation`)."""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    modules = sorted(HERE.glob("bench_*.py"))
    if argv:
        modules = [m for m in modules if m.stem.removeprefix("bench_") in argv]
    for path in modules:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        # registered before it runs: a dataclass reads its own module while being defined
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        print(f"== {path.stem.removeprefix('bench_')} ==")
        start = time.perf_counter()
        module.run()
        print(f"({time.perf_counter() - start:.1f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
