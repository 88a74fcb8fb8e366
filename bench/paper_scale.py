"""`make paper-scale`: the GSPMD paper's scaling claims for a dense Transformer with 2-D sharding,
checked on 128 ... 2048 devices without running anything.

For each mesh, the model of `gspmdc transformer` (same model everywhere) is partitioned
(`compile_spmd`; the best of `ROUNDS` timings, the meshes taking turns in each round, in a
rotating order, so that a change of the machine's load touches them alike) and analysed
(`gspmdc cost`'s model on the TPU v3 preset, the paper's machine). The table gives, per device
count:

- compile time (CPU seconds), and the partitioned program's instruction count and text size
  (the program does not grow with the devices);
- peak memory per device from the liveness analysis and peak x N, against 128 devices (the claim:
  memory per device falls linearly, so peak x N stays constant);
- bytes each device sends per step, from the analysis and from the closed form of the 2-D
  sharding (`gspmdc.transformer.sharding_bytes_per_device`);
- the modelled step time and utilization (operations of the dots over step time x peak rate),
  beside the paper's measured 50-62%.

`python bench/paper_scale.py --write docs/paper-scale.md` replaces the table between the
`<!-- paper-scale table -->` markers of that file; without it the table is printed.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

from gspmdc import api
from gspmdc.passes.analysis.cost import program_cost
from gspmdc.passes.analysis.machine import PRESETS
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.transformer import TransformerConfig, sharding_bytes_per_device, transformer_hlo
from gspmdc.units import format_bytes, format_seconds

MESHES = ((8, 16), (16, 16), (16, 32), (32, 32), (32, 64))
MARKER = "<!-- paper-scale table -->"
ROUNDS = 5
PAPER_UTILIZATION = "50–62%"


def compile_seconds(configs: list[TransformerConfig]) -> list[float]:
    """The best partitioning time of each config over `ROUNDS` rounds, in CPU seconds of this
    process (on a shared machine, wall time also counts the waits for a core; partitioning is
    single-threaded). Each round compiles every config once, in turn, starting one config further
    on than the round before; the garbage of the previous compile is collected before each
    timing."""
    texts = [transformer_hlo(c) for c in configs]
    best = [float("inf")] * len(configs)
    for round_number in range(ROUNDS):
        for step in range(len(configs)):
            k = (round_number + step) % len(configs)
            module = api.parse(texts[k])
            gc.collect()
            start = time.process_time()
            compile_spmd(module, configs[k].devices)
            best[k] = min(best[k], time.process_time() - start)
    return best


def measure(config: TransformerConfig, seconds: float) -> dict:
    n = config.devices
    spmd = compile_spmd(api.parse(transformer_hlo(config)), n)
    printed = api.to_text(spmd)
    cost = program_cost(spmd, n, PRESETS["tpu-v3"])
    figures = cost.figures
    return {"devices": n, "mesh": f"{config.mesh_x}×{config.mesh_y}", "compile": seconds,
            "instructions": sum(1 for _ in spmd.all_instructions()), "text": len(printed),
            "peak": cost.memory.peak_bytes, "peak_at": cost.memory.peak_at,
            "sent": figures.total_bytes_sent_per_device[0],
            "predicted": sum(sharding_bytes_per_device(config).values()),
            "step": figures.modelled_step_seconds,
            "utilization": figures.extra["modelled_utilization"],
            "collective_share": sum(v for k, v in figures.seconds_by_kind.items()
                                    if k not in ("compute", "memory"))
            / figures.modelled_step_seconds}


def table(config: TransformerConfig, rows: list[dict]) -> str:
    base = rows[0]
    lines = [
        f"Model: {config.layers} layers, width {config.width}, {config.heads} heads, hidden "
        f"{config.hidden}, batch {config.batch} × sequence {config.sequence}, "
        f"{config.element_type} ({config.parameters / 1e9:.0f}B parameters); machine tpu-v3 "
        "(one TPU v3 core). Measured by `make paper-scale`.",
        "",
        "| devices | mesh | compile | instructions | program text | peak memory / device | "
        "peak × N vs 128 | sent / device / step | predicted by the sharding | "
        "modelled step | in collectives | modelled utilization | paper |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = r["peak"] * r["devices"] / (base["peak"] * base["devices"])
        compile_ratio = r["compile"] / base["compile"]
        lines.append(
            f"| {r['devices']} | {r['mesh']} | {r['compile']:.2f} s ({compile_ratio:.2f}×) | "
            f"{r['instructions']} | {format_bytes(r['text'])} | {format_bytes(r['peak'])} | "
            f"{ratio:.3f} | {format_bytes(r['sent'])} | "
            f"{format_bytes(r['predicted'])}{' ✓' if r['sent'] == r['predicted'] else ' ✗'} | "
            f"{format_seconds(r['step'])} | {100 * r['collective_share']:.0f}% | "
            f"{100 * r['utilization']:.0f}% | {PAPER_UTILIZATION} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sequence", type=int, default=1024)
    parser.add_argument("--write", metavar="FILE",
                        help=f"replace the table between the {MARKER} markers of FILE")
    args = parser.parse_args(argv)
    configs = [TransformerConfig(args.layers, args.width, args.heads, args.hidden, args.batch,
                                 args.sequence, x, y) for x, y in MESHES]
    rows = [measure(config, seconds)
            for config, seconds in zip(configs, compile_seconds(configs))]
    text = table(configs[-1], rows)
    if args.write is None:
        print(text)
        return 0
    path = Path(args.write)
    document = path.read_text()
    before, _, rest = document.partition(MARKER)
    _, _, after = rest.partition(MARKER)
    path.write_text(f"{before}{MARKER}\n{text}\n{MARKER}{after}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
