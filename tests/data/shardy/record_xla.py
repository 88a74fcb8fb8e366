"""Record XLA's Shardy answer for the modules of this folder (needs jax==0.10.2; not run by the
tests, which read the recordings).

    .venv/bin/python tests/data/shardy/record_xla.py

For each `<name>.hlo`, `xla/<name>.before.hlo` is XLA's module just before its Shardy pass and
`xla/<name>.after.hlo` just after it (`tests/shardy_oracle.py`). Modules XLA cannot compile are
listed and skipped.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from shardy_oracle import run_in_subprocess  # noqa: E402


def main() -> None:
    paths = sorted(HERE.glob("*.hlo"))
    out = HERE / "xla"
    out.mkdir(exist_ok=True)
    for path, answer in zip(paths, run_in_subprocess([p.read_text() for p in paths], 8)):
        if "error" in answer:
            print(f"{path.name}: XLA cannot compile it: {answer['error'][:200]}")
            continue
        (out / f"{path.stem}.before.hlo").write_text(answer["before"])
        (out / f"{path.stem}.after.hlo").write_text(answer["after"])
        print("recorded", path.stem)


if __name__ == "__main__":
    main()
