"""Random cases of the sharding algebra and XLA's answers to them, asked of XLA's own sharding
propagation (through jax, test-only: see ../shared/xla-oracle).

Each case is one small program around one instruction, and XLA's answer is the sharding its
propagation gives that instruction:

* `reshape`: `reshape(p)` with `p` sharded, forward: `propagate_through_reshape`;
* `reshape_backward`: `reshape(copy(p))` with the reshape sharded: the copy gets
  `propagate_through_reshape` from target dims to source dims;
* `transpose`: `transpose(p)` with `p` sharded: `transpose` (XLA removes identity transposes
  and rewrites those that move only size-1 dims as reshapes before propagating: not drawn);
* `merge`: `add(p0, p1)` with two partially replicated operands over one mesh: the add gets the
  operands' shardings merged (`merge_if_compatible` through propagation's improve decision).

`tests/data/algebra/xla_cases.json` holds a recorded table (test_sharding_algebra_xla.py checks
the algebra against it without jax). Regenerate it, with jax 0.10.2 installed, by

    .venv/bin/python tests/xla_algebra_cases.py [--count 1200] [--seed 0] [--out FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import sys
from collections import defaultdict
from math import prod
from pathlib import Path

import numpy as np
from fuzz.shardings import prime_factors

from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment

HERE = Path(__file__).resolve().parent
TABLE = HERE / "data" / "algebra" / "xla_cases.json"
ORACLE = HERE.parents[1] / "shared" / "xla-oracle"
KINDS = ("reshape", "reshape_backward", "transpose", "merge")
#: device counts of the random cases (jax is started with the largest)
DEVICE_COUNTS = (2, 4, 6, 8, 8, 12, 16)
#: cases per module sent to XLA
BATCH = 100


# ---- random cases ------------------------------------------------------------------------------

def _split(n: int, parts: int, rng: random.Random) -> list[int]:
    """`n` as a product of `parts` factors, each prime factor placed at random."""
    dims = [1] * parts
    for f in prime_factors(n):
        dims[rng.randrange(parts)] *= f
    return dims


def _devices(dims: list[int], n: int, rng: random.Random) -> TileAssignment:
    """An iota, a transposed mesh (what named meshes give) or a random device order."""
    mode = rng.random()
    if mode < 0.5:
        return TileAssignment.iota(dims)
    if mode < 0.8:
        mesh = _split(n, rng.randint(2, 3), rng)
        perm = list(range(len(mesh)))
        rng.shuffle(perm)
        return TileAssignment.from_array(np.arange(n).reshape(mesh).transpose(perm).reshape(dims))
    ids = list(range(n))
    rng.shuffle(ids)
    return TileAssignment.from_array(np.array(ids).reshape(dims))


def random_sharding(rank: int, n: int, rng: random.Random) -> HloSharding:
    replicated = rng.random() < 0.3
    dims = _split(n, rank + replicated, rng)
    return HloSharding.tiled(_devices(dims, n, rng), ("replicated",) if replicated else ())


def _sized_dims(counts, rng: random.Random) -> list[int]:
    """Dim sizes for tile counts: mostly multiples, sometimes any size (uneven, size 1)."""
    dims = []
    for t in counts:
        r = rng.random()
        if r < 0.6:
            dims.append(t * rng.choice([1, 1, 2, 3, 4, 6]))
        elif r < 0.8:
            dims.append(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]))
        else:
            dims.append(rng.choice([2, 3, 4, 6, 8]))
    return dims


def random_case(kind: str, rng: random.Random) -> dict | None:
    n = rng.choice(DEVICE_COUNTS)
    if kind == "merge":
        return _merge_case(n, rng)
    rank = rng.randint(1, 4)
    s = random_sharding(rank, n, rng)
    source = _sized_dims(s.tile_counts_for_rank(rank), rng)
    if kind == "transpose":
        perm = list(range(rank))
        rng.shuffle(perm)
        moved = [p for p in perm if source[p] > 1]
        if moved == sorted(moved):
            return None         # XLA rewrites a transpose of only size-1 dims as a reshape
        return {"kind": kind, "n": n, "source": source, "perm": perm, "sharding": s.to_text()}
    other = _split(prod(source), rng.randint(1, 4), rng)
    if rng.random() < 0.2:
        other.insert(rng.randrange(len(other) + 1), 1)
    if other == source:
        return None
    if kind == "reshape_backward":
        # the sharding sits on the reshape's result: `source` are its dims, the operand's `other`
        return {"kind": kind, "n": n, "source": other, "target": source,
                "sharding": s.to_text()}
    return {"kind": kind, "n": n, "source": source, "target": other, "sharding": s.to_text()}


def _merge_case(n: int, rng: random.Random) -> dict:
    """Two partially replicated shardings cut from one mesh (each mesh axis cuts a dim of the
    first, of the second, of both or of neither), or sometimes two unrelated ones."""
    rank = rng.randint(1, 3)
    mesh = _devices(_split(n, rng.randint(2, 3), rng).copy(), n, rng).array
    pair = []
    roles = [(rng.choice(["a", "b", "both", "none"]), rng.randrange(rank)) for _ in mesh.shape]
    for side in ("a", "b"):
        axes = [[a for a, (role, dim) in enumerate(roles) if dim == d and role in (side, "both")]
                for d in range(rank)]
        used = [a for dim_axes in axes for a in dim_axes]
        unused = [a for a in range(mesh.ndim) if a not in used]
        tiles = [prod(mesh.shape[a] for a in dim_axes) for dim_axes in axes]
        t = mesh.transpose(used + unused).reshape(tiles + [prod(mesh.shape[a] for a in unused)])
        pair.append(HloSharding.tiled(TileAssignment.from_array(t), ["replicated"]))
    if rng.random() < 0.2:
        pair[1] = random_sharding(rank, n, rng)
    counts = [max(a, b) for a, b in zip(pair[0].tile_counts_for_rank(rank),
                                        pair[1].tile_counts_for_rank(rank))]
    dims = [c * rng.choice([1, 2, 3]) for c in counts]
    return {"kind": "merge", "n": n, "source": dims, "shardings": [p.to_text() for p in pair]}


# ---- modules -----------------------------------------------------------------------------------

def _shape(dims) -> str:
    return "f32[" + ",".join(map(str, dims)) + "]"


def _lines(case: dict, i: int, first: int) -> tuple[list[str], str, str]:
    """(instruction lines, root value, its shape) of case `i`, whose parameters are numbered from
    `first`; the instruction XLA's answer is read from is named `q{i}`."""
    kind, src = case["kind"], _shape(case["source"])
    if kind == "reshape":
        tgt = _shape(case["target"])
        return [f"p{i} = {src} parameter({first}), sharding={case['sharding']}",
                f"q{i} = {tgt} reshape(p{i})"], f"q{i}", tgt
    if kind == "reshape_backward":
        tgt = _shape(case["target"])
        return [f"p{i} = {src} parameter({first})",
                f"q{i} = {src} copy(p{i})",
                f"r{i} = {tgt} reshape(q{i}), sharding={case['sharding']}"], f"r{i}", tgt
    if kind == "transpose":
        dims = [case["source"][p] for p in case["perm"]]
        perm = ",".join(map(str, case["perm"]))
        return [f"p{i} = {src} parameter({first}), sharding={case['sharding']}",
                f"q{i} = {_shape(dims)} transpose(p{i}), dimensions={{{perm}}}"], f"q{i}", \
            _shape(dims)
    a, b = case["shardings"]
    return [f"a{i} = {src} parameter({first}), sharding={a}",
            f"b{i} = {src} parameter({first + 1}), sharding={b}",
            f"q{i} = {src} add(a{i}, b{i})"], f"q{i}", src


def module_text(cases: list[dict], n: int) -> str:
    body, roots, shapes = [], [], []
    first = 0
    for i, case in enumerate(cases):
        lines, root, shape = _lines(case, i, first)
        first += 2 if case["kind"] == "merge" else 1
        body += lines
        roots.append(root)
        shapes.append(shape)
    body.append(f"ROOT t = ({', '.join(shapes)}) tuple({', '.join(roots)})")
    return f"HloModule cases, num_partitions={n}\n\nENTRY main {{\n  " + "\n  ".join(body) + "\n}\n"


_QUERY = re.compile(r"^\s*(?:ROOT\s+)?%?q(\d+)(?:\.\d+)?\s*=.*?(?:, sharding=(\{.*\}))?\s*$")


def answers(module: str, count: int) -> list[str | None]:
    """The sharding of each `q{i}` in a printed module (None: no sharding)."""
    found: dict[int, str | None] = {}
    for line in module.splitlines():
        m = _QUERY.match(line)
        if m:
            text = m.group(2)
            found[int(m.group(1))] = None if text is None else \
                parse_sharding(text).to_text(include_metadata=False)
    return [found.get(i) for i in range(count)]


# ---- asking XLA ---------------------------------------------------------------------------------

def oracle_available() -> bool:
    """Whether jax and ../shared/xla-oracle are there (without importing jax)."""
    return importlib.util.find_spec("jax") is not None and (ORACLE / "xla_oracle.py").is_file()


def load_oracle():
    """`xla_oracle` started on the largest device count; None without jax or the oracle."""
    if not oracle_available():
        return None
    sys.path.insert(0, str(ORACLE))
    import xla_oracle
    xla_oracle.init_jax(max(DEVICE_COUNTS))
    return xla_oracle


def ask_xla(oracle, cases: list[dict]) -> list[dict]:
    """`cases` with XLA's answer added as `xla` (batched by device count)."""
    by_n: dict[int, list[dict]] = defaultdict(list)
    for case in cases:
        by_n[case["n"]].append(case)
    out = []
    for n, group in sorted(by_n.items()):
        for k in range(0, len(group), BATCH):
            batch = group[k:k + BATCH]
            propagated = oracle.xla_partition_hlo_text(module_text(batch, n), n)["propagated"]
            for case, answer in zip(batch, answers(propagated, len(batch))):
                out.append(dict(case, xla=answer))
    return out


def random_cases(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        case = random_case(KINDS[len(cases) % len(KINDS)], rng)
        if case is not None:
            cases.append(case)
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TABLE, help="where to write the table")
    args = parser.parse_args(argv)
    oracle = load_oracle()
    if oracle is None:
        print("needs jax 0.10.2 and ../shared/xla-oracle", file=sys.stderr)
        return 2
    table = ask_xla(oracle, random_cases(args.count, args.seed))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"xla": "jax 0.10.2 (XLA GSPMD propagation, CPU)",
                                    "seed": args.seed, "cases": table}, indent=0) + "\n")
    print(f"{len(table)} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
