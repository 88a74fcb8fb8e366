"""Sharding-propagation benchmark: a transformer-like module of about 10,000 instructions (layer
norm, attention with reshapes/transposes/batched dots and a softmax, an MLP, residual adds),
annotated Megatron-style on a (data, model) mesh with iota shardings on the inputs and weights
only. Reports the time per 1,000 instructions at several device counts and the ratio of the time
at 4096 devices to the time at 8 (propagation should not depend on the device count: target
<= 1.1).

    python bench/bench_propagation.py [--instructions N] [--repeat R]
"""
from __future__ import annotations

import argparse
import statistics
import gc
import time

from gspmdc.ir.parser import parse_module
from gspmdc.passes.propagation import propagate
from gspmdc.ir.sharding_algebra import clear_caches

#: (data, model) meshes; the first and last give the reported ratio
MESHES = ((2, 4), (8, 16), (64, 64))
B, S, D, H, DH, F = 256, 128, 1024, 64, 16, 4096
HD = H * DH

_HEADER = """HloModule transformer, num_partitions={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

max {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}}
"""

_LAYER = """  wq.{i} = f32[{D},{HD}] parameter({p0}), sharding={col}
  wk.{i} = f32[{D},{HD}] parameter({p1}), sharding={col}
  wv.{i} = f32[{D},{HD}] parameter({p2}), sharding={col}
  wo.{i} = f32[{HD},{D}] parameter({p3}), sharding={row}
  w1.{i} = f32[{D},{F}] parameter({p4}), sharding={col}
  b1.{i} = f32[{F}] parameter({p5}), sharding={vec}
  w2.{i} = f32[{F},{D}] parameter({p6}), sharding={row}
  sq.{i} = f32[{B},{S},{D}] multiply(x.{i}, x.{i})
  ss.{i} = f32[{B},{S}] reduce(sq.{i}, zero), dimensions={{2}}, to_apply=add
  scale.{i} = f32[{B},{S}] broadcast(inv), dimensions={{}}
  mean.{i} = f32[{B},{S}] multiply(ss.{i}, scale.{i})
  rs.{i} = f32[{B},{S}] rsqrt(mean.{i})
  rsb.{i} = f32[{B},{S},{D}] broadcast(rs.{i}), dimensions={{0,1}}
  h.{i} = f32[{B},{S},{D}] multiply(x.{i}, rsb.{i})
  q.{i} = f32[{B},{S},{HD}] dot(h.{i}, wq.{i}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  k.{i} = f32[{B},{S},{HD}] dot(h.{i}, wk.{i}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  v.{i} = f32[{B},{S},{HD}] dot(h.{i}, wv.{i}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  q4.{i} = f32[{B},{S},{H},{DH}] reshape(q.{i})
  k4.{i} = f32[{B},{S},{H},{DH}] reshape(k.{i})
  v4.{i} = f32[{B},{S},{H},{DH}] reshape(v.{i})
  qt.{i} = f32[{B},{H},{S},{DH}] transpose(q4.{i}), dimensions={{0,2,1,3}}
  kt.{i} = f32[{B},{H},{S},{DH}] transpose(k4.{i}), dimensions={{0,2,1,3}}
  vt.{i} = f32[{B},{H},{S},{DH}] transpose(v4.{i}), dimensions={{0,2,1,3}}
  s.{i} = f32[{B},{H},{S},{S}] dot(qt.{i}, kt.{i}), lhs_batch_dims={{0,1}}, rhs_batch_dims={{0,1}}, lhs_contracting_dims={{3}}, rhs_contracting_dims={{3}}
  smax.{i} = f32[{B},{H},{S}] reduce(s.{i}, ninf), dimensions={{3}}, to_apply=max
  smaxb.{i} = f32[{B},{H},{S},{S}] broadcast(smax.{i}), dimensions={{0,1,2}}
  sd.{i} = f32[{B},{H},{S},{S}] subtract(s.{i}, smaxb.{i})
  se.{i} = f32[{B},{H},{S},{S}] exponential(sd.{i})
  ssum.{i} = f32[{B},{H},{S}] reduce(se.{i}, zero), dimensions={{3}}, to_apply=add
  ssumb.{i} = f32[{B},{H},{S},{S}] broadcast(ssum.{i}), dimensions={{0,1,2}}
  pr.{i} = f32[{B},{H},{S},{S}] divide(se.{i}, ssumb.{i})
  c.{i} = f32[{B},{H},{S},{DH}] dot(pr.{i}, vt.{i}), lhs_batch_dims={{0,1}}, rhs_batch_dims={{0,1}}, lhs_contracting_dims={{3}}, rhs_contracting_dims={{2}}
  ct.{i} = f32[{B},{S},{H},{DH}] transpose(c.{i}), dimensions={{0,2,1,3}}
  c3.{i} = f32[{B},{S},{HD}] reshape(ct.{i})
  o.{i} = f32[{B},{S},{D}] dot(c3.{i}, wo.{i}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  r.{i} = f32[{B},{S},{D}] add(x.{i}, o.{i})
  f1.{i} = f32[{B},{S},{F}] dot(r.{i}, w1.{i}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  b1b.{i} = f32[{B},{S},{F}] broadcast(b1.{i}), dimensions={{2}}
  f2.{i} = f32[{B},{S},{F}] add(f1.{i}, b1b.{i})
  g1.{i} = f32[{B},{S},{F}] multiply(f2.{i}, f2.{i})
  g2.{i} = f32[{B},{S},{F}] tanh(g1.{i})
  g3.{i} = f32[{B},{S},{F}] multiply(f2.{i}, g2.{i})
  f3.{i} = f32[{B},{S},{D}] dot(g3.{i}, w2.{i}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  x.{j} = f32[{B},{S},{D}] add(r.{i}, f3.{i})
"""
_LAYER_SIZE = _LAYER.count("\n")
_FIXED = 5   # x.0, zero, ninf, inv, root


def transformer(layers: int, data: int, model: int) -> str:
    """HLO text of `layers` transformer blocks on a data x model mesh (iota shardings)."""
    n = data * model
    mesh = f"<=[{data},{model}]T(1,0)"
    shardings = {
        "col": f"{{devices=[1,{model},{data}]{mesh} last_tile_dim_replicate}}",
        "row": f"{{devices=[{model},1,{data}]{mesh} last_tile_dim_replicate}}",
        "vec": f"{{devices=[{model},{data}]{mesh} last_tile_dim_replicate}}",
    }
    lines = [_HEADER.format(n=n), "ENTRY main {",
             f"  x.0 = f32[{B},{S},{D}] parameter(0), "
             f"sharding={{devices=[{data},1,1,{model}]<=[{n}] last_tile_dim_replicate}}",
             "  zero = f32[] constant(0)", "  ninf = f32[] constant(-inf)",
             "  inv = f32[] constant(0.001)"]
    for i in range(layers):
        params = {f"p{k}": 1 + 7 * i + k for k in range(7)}
        lines.append(_LAYER.format(i=i, j=i + 1, B=B, S=S, D=D, H=H, DH=DH, HD=HD, F=F,
                                   **params, **shardings).rstrip("\n"))
    lines += [f"  ROOT out = f32[{B},{S},{D}] copy(x.{layers})", "}"]
    return "\n".join(lines) + "\n"


def layers_for(instructions: int) -> int:
    return max(1, round((instructions - _FIXED) / _LAYER_SIZE))


def measure(text: str) -> tuple[int, float]:
    """(instruction count, seconds) of one propagation of a fresh parse of `text`, with cold
    memo tables and the garbage collector paused while timing (as timeit does)."""
    module = parse_module(text, "transformer")
    count = sum(len(c.instructions) for c in module.computations.values())
    clear_caches()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        propagate(module, record_origins=False)
        return count, time.perf_counter() - start
    finally:
        gc.enable()


def run(instructions: int = 10_000, repeat: int = 3) -> list[dict]:
    """Benchmark rows (one per mesh, then the ratio), printed as a table. Repeats are interleaved
    across meshes and the median time of each is kept, so drift affects every mesh alike."""
    layers = layers_for(instructions)
    texts = [transformer(layers, data, model) for data, model in MESHES]
    measure(transformer(2, *MESHES[0]))          # warm-up: imports, caches
    times: list[list[float]] = [[] for _ in MESHES]
    counts = [0] * len(MESHES)
    for _ in range(repeat):
        for k, text in enumerate(texts):
            counts[k], seconds = measure(text)
            times[k].append(seconds)
    medians = [statistics.median(t) for t in times]
    rows = []
    print(f"sharding propagation, transformer-like module ({layers} layers), median of {repeat}")
    print(f"  {'devices':>8} {'mesh':>8} {'instructions':>13} {'seconds':>9} {'ms/1000 instr':>14}")
    for (data, model), count, seconds in zip(MESHES, counts, medians):
        row = {"benchmark": "propagation", "devices": data * model, "mesh": f"{data}x{model}",
               "instructions": count, "seconds": seconds,
               "ms_per_1000_instructions": 1e6 * seconds / count}
        rows.append(row)
        print(f"  {row['devices']:>8} {row['mesh']:>8} {count:>13} {seconds:>9.3f} "
              f"{row['ms_per_1000_instructions']:>14.1f}")
    ratio = rows[-1]["seconds"] / rows[0]["seconds"]
    rows.append({"benchmark": "propagation", "ratio_max_to_min_devices": ratio,
                 "target": 1.1, "met": ratio <= 1.1})
    print(f"  time at {rows[-2]['devices']} devices / time at {rows[0]['devices']} devices: "
          f"{ratio:.3f} (target <= 1.1)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instructions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    run(args.instructions, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
