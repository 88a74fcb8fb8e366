"""The fast reader (`ir/fast_reader.py`) against lark's reading of the grammar: on every HLO file of
the repository and the team's corpora, on their printed forms and on single-character mutations of
them, the fast reader either declines (None) or returns exactly lark's records, every token's type,
text, line, column and offsets included; and it does read the forms it exists for."""
import dataclasses
import json
import random
import sys
from pathlib import Path

import pytest
from lark import Token
from lark.exceptions import UnexpectedInput

from gspmdc.ir import parser
from gspmdc.ir.fast_reader import read_records
from gspmdc.ir.parse_errors import ParseProblem
from gspmdc.ir.printer import print_module

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT / "bench"))

from bench_propagation import transformer  # noqa: E402


def _texts() -> list:
    files = sorted(ROOT.glob("gspmdc/examples/*.hlo")) + sorted(ROOT.glob("tests/**/*.hlo"))
    found = [pytest.param(p.read_text(), id=str(p.relative_to(ROOT))) for p in files]
    for corpus in ("xla-propagation.json", "xla-partitioner.json"):
        path = SHARED / "conformance" / corpus
        if path.is_file():
            found += [pytest.param(case["hlo"], id=f"{corpus}:{case['line']}")
                      for case in json.loads(path.read_text())["cases"]]
    found += [pytest.param(p.read_text(), id=f"{p.parent.name}/{p.name}")
              for p in sorted((SHARED / "jax-programs").glob("*/*.hlo"))]
    return found


TEXTS = _texts()


def _canonical(value):
    """`value` as nested tuples in which a token is its type, text, line, column and offsets."""
    if isinstance(value, Token):
        return ("token", value.type, str(value), value.line, value.column, value.start_pos,
                value.end_pos)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(_canonical(getattr(value, f.name))
                                               for f in dataclasses.fields(value) if f.compare)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_canonical(v) for v in value)
    return (type(value).__name__, value)


def _lark_records(text: str):
    try:
        return parser._lark().parse(text, start="start")
    except (UnexpectedInput, ParseProblem):
        return None


def _agree(text: str) -> bool:
    """Whether the fast reader read `text` (asserting it agrees with lark when it did)."""
    fast = read_records(text)
    if fast is None:
        return False
    lark = _lark_records(text)
    assert lark is not None, "the fast reader accepted text the grammar refuses"
    assert _canonical(fast) == _canonical(lark)
    return True


@pytest.mark.parametrize("text", TEXTS)
def test_the_fast_reader_agrees_with_lark(text):
    _agree(text)
    printed = print_module(parser.parse_module(text))
    _agree(printed)


def test_the_fast_reader_reads_the_forms_it_is_for():
    assert _agree(transformer(3, 2, 4))
    examples = [p.read_text() for p in sorted(ROOT.glob("gspmdc/examples/*.hlo"))]
    assert examples and all(_agree(print_module(parser.parse_module(t))) for t in examples)


def test_mutated_text_is_read_as_lark_reads_it_or_left_to_lark():
    rng = random.Random(0)
    sources = [transformer(1, 2, 4)] + [p.read_text() for p in
                                        sorted(ROOT.glob("gspmdc/examples/*.hlo"))]
    pieces = list("{}[](),=%:-\" \n0x_") + ["ROOT ", "ENTRY ", "<=", "/*", "f32[2]", "sharding="]
    read = 0
    for _ in range(400):
        text = rng.choice(sources)
        at = rng.randrange(len(text))
        edit = rng.randrange(3)
        if edit == 0:
            text = text[:at] + text[at + 1:]
        elif edit == 1:
            text = text[:at] + rng.choice(pieces) + text[at:]
        else:
            text = text[:at] + rng.choice(pieces) + text[at + 1:]
        read += _agree(text)
    assert read >= 30   # enough edits keep the text in the fast reader's subset


@pytest.mark.parametrize("text", [
    "ENTRY e {\n  ROOT p = f32[2] parameter(0) /* a comment */\n}\n",
    "ENTRY e {\n  ROOT p = f32[2] parameter(0), a=x [1]\n}\n",
    "HloModule m, mesh={x=2}\nENTRY e {\n"
    "  ROOT p = f32[2] parameter(0), sharding={mesh_split=[x]}\n}\n",
    "ENTRY e {\n  ROOT c = (f32[2], s32[]) constant((1, 2))\n}\n",
    "ENTRY e {\n  ROOT p = f32[2] parameter(0), sharding={devices=[3]0,1}\n}\n",
    "ENTRY e {\n  ROOT a = f32[2] negate(q)\n",
])
def test_what_the_fast_reader_leaves_to_lark(text):
    assert read_records(text) is None


def test_a_module_written_over_several_lines_per_instruction_is_read_fast():
    text = ("HloModule m, num_partitions=2\n\nENTRY e\n  (p: f32[2])\n  -> f32[2] {\n"
            "  p = f32[2]\n    parameter(0),\n    sharding={devices=[2]0,1\n"
            "      metadata={op_name=\"a\"}}\n"
            "  ROOT n = f32[2] negate(\n    f32[2] p),\n"
            "  metadata={op_name=\"b\" source_line=3}\n}\n")
    assert _agree(text)
