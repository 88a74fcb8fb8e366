"""Golden tests: modules under tests/data/propagation/*.hlo propagated with default options
must give exactly the shardings listed in the matching `.shardings` file (every instruction of
the module listed; `none` for no sharding)."""
from pathlib import Path

import pytest

from gspmdc.ir.parser import parse_file, parse_sharding
from gspmdc.passes.propagation import propagate
from gspmdc.ir.sharding_algebra import for_shape

DATA = Path(__file__).resolve().parent / "data" / "propagation"
CASES = sorted(DATA.glob("*.hlo"))


def read_expected(path: Path) -> dict[tuple[str | None, str], str]:
    expected = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        where, text = line.split(maxsplit=1)
        comp, name = where.split(":") if ":" in where else (None, where)
        expected[(comp, name)] = text.strip()
    return expected


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path):
    module = propagate(parse_file(path), record_origins=False)
    expected = read_expected(path.with_suffix(".shardings"))
    seen = set()
    for comp in module.computations.values():
        for inst in comp.instructions:
            key = (None if comp.is_entry else comp.name, inst.name)
            assert key in expected, f"{key} missing from the golden file"
            seen.add(key)
            text = expected[key]
            want = None if text == "none" else for_shape(parse_sharding(text), inst.shape)
            assert inst.sharding == want, f"{key}: got {inst.sharding}, expected {want}"
    assert seen == set(expected)
