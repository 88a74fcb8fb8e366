"""Where cases come from, each module under both option settings (`SETTINGS`):
- "fuzz": the random module x sharding generator of `tests/fuzz` (`fuzz.case(seed)`);
- "corpus": the team's corpora beside the repository (`../shared`): XLA's propagation and
  partitioner test modules and the JAX-exported programs."""
from __future__ import annotations

import json
import random
from pathlib import Path

from .differential import Case

SHARED = Path(__file__).resolve().parents[3] / "shared"
#: the two propagation option settings every module is tried under: (to_output, to_parameters)
SETTINGS = ((False, False), (True, True))


def _devices_named(text: str) -> int:
    from gspmdc import api
    from gspmdc.errors import GspmdcError
    from gspmdc.prepare import devices_named_by_shardings
    try:
        return devices_named_by_shardings(api.parse(text, verify=False))
    except GspmdcError:
        return 1


def corpus_modules(shared: Path = SHARED) -> list[tuple[str, str, int]]:
    """(name, text, partitions) of every corpus module with at least two partitions."""
    found = []
    conformance = shared / "conformance"
    if (conformance / "xla-partitioner.json").exists():
        for c in json.loads((conformance / "xla-partitioner.json").read_text())["cases"]:
            if c.get("num_devices", 1) > 1 and not c.get("expects_error"):
                found.append((f"partitioner/{c['name']}", c["hlo"], c["num_devices"]))
    if (conformance / "xla-propagation.json").exists():
        for c in json.loads((conformance / "xla-propagation.json").read_text())["cases"]:
            n = _devices_named(c["hlo"])
            if n > 1:
                found.append((f"propagation/{c['name']}", c["hlo"], n))
    programs = shared / "jax-programs"
    if (programs / "index.json").exists():
        for p in json.loads((programs / "index.json").read_text())["programs"]:
            found.append((f"jax/{p['name']}", (programs / p["dir"] / "program.hlo").read_text(),
                          p["num_partitions"]))
    return found


#: run `seed` draws generator seeds seed * SEED_STRIDE + i, so that runs with different seeds
#: do not share modules
SEED_STRIDE = 1_000_000


def in_shard(index: int, shard: tuple[int, int]) -> bool:
    """Whether module `index` of a run belongs to shard `shard` = (i, k): every k-th module from
    the i-th, so that k shards of a run hold each of its modules exactly once."""
    i, k = shard
    return index % k == i


def fuzz_cases(count: int, seed: int, shard: tuple[int, int] = (0, 1)) -> list[Case]:
    """`count` generated modules from run seed `seed` (those of `shard`, see `in_shard`), each
    under both option settings (the generator's own choice of options is replaced by the two
    settings)."""
    from fuzz import case
    found = []
    for i in range(shard[0], count, shard[1]):
        generated = case(seed * SEED_STRIDE + i)
        found += [Case(f"fuzz/{generated.seed} [{'on' if out else 'off'}]", generated.text,
                       generated.num_partitions, out, params, generated.reference_text)
                  for out, params in SETTINGS]
    return found


def corpus_cases(count: int, seed: int, shard: tuple[int, int] = (0, 1),
                 shared: Path = SHARED) -> list[Case]:
    """`count` corpus modules drawn by `seed` (all of them when `count` is larger; those of
    `shard`, see `in_shard`), each under both option settings."""
    modules = corpus_modules(shared)
    random.Random(seed).shuffle(modules)
    return [Case(f"{name} [{'on' if out else 'off'}]", text, n, out, params)
            for index, (name, text, n) in enumerate(modules[:count]) if in_shard(index, shard)
            for out, params in SETTINGS]
