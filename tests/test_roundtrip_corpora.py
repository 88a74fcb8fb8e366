"""Every module of the team's corpora (both XLA conformance JSON files and every .hlo of the JAX
programs) parses, and printing it gives text that re-parses to an identical module and prints the
same again. Skips when ../shared is absent."""
import json
from pathlib import Path

import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.ir.printer import print_module

SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPORA = ("xla-propagation.json", "xla-partitioner.json")


def _modules():
    if not SHARED.is_dir():
        return []
    found = []
    for corpus in CORPORA:
        path = SHARED / "conformance" / corpus
        if path.is_file():
            for case in json.loads(path.read_text())["cases"]:
                found.append(pytest.param(case["hlo"], id=f"{corpus}:{case['name']}:{case['line']}"))
    for path in sorted((SHARED / "jax-programs").glob("*/*.hlo")):
        found.append(pytest.param(path.read_text(), id=f"{path.parent.name}/{path.name}"))
    return found


MODULES = _modules()


@pytest.mark.skipif(not MODULES, reason="../shared corpora not present")
@pytest.mark.parametrize("text", MODULES)
def test_corpus_module_round_trips(text):
    module = parse_module(text)
    printed = print_module(module)
    again = parse_module(printed, "<printed>")
    assert module.difference(again) is None
    assert print_module(again) == printed
