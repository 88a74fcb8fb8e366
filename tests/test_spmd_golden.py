"""Golden tests of the partitioner in the FileCheck manner: each `tests/data/spmd/*.hlo` names the
partition count (`// PARTITIONS: n`), optionally the dump to check (`// STAGE: <pass>`, default:
the final SPMD module), and `// CHECK:` / `// CHECK-NEXT:` / `// CHECK-NOT:` lines matched
against the printed module: literal text, `{{regex}}` for a regular expression. Every case is also
run and compared with its unpartitioned program."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd

from spmd_partition_helpers import check_equivalent

DATA = Path(__file__).parent / "data" / "spmd"
CASES = sorted(DATA.glob("*.hlo"))


def _directives(text: str) -> tuple[int, str | None, list[tuple[str, str]]]:
    partitions, stage, checks = None, None, []
    for line in text.splitlines():
        m = re.match(r"\s*// (PARTITIONS|STAGE|CHECK|CHECK-NEXT|CHECK-NOT): (.*)$", line)
        if not m:
            continue
        kind, value = m.groups()
        if kind == "PARTITIONS":
            partitions = int(value)
        elif kind == "STAGE":
            stage = value.strip()
        else:
            checks.append((kind, value.strip()))
    assert partitions is not None, "missing // PARTITIONS: n"
    return partitions, stage, checks


def _pattern(check: str) -> re.Pattern:
    """Literal text with `{{regex}}` holes."""
    parts = re.split(r"\{\{(.*?)\}\}", check)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else p for i, p in enumerate(parts)))


def file_check(output: str, checks: list[tuple[str, str]]) -> None:
    lines = output.splitlines()
    at = 0                      # next line to search from
    forbidden: list[tuple[str, re.Pattern]] = []
    for kind, check in checks:
        pattern = _pattern(check)
        if kind == "CHECK-NOT":
            forbidden.append((check, pattern))
            continue
        if kind == "CHECK-NEXT":
            found = at if at < len(lines) and pattern.search(lines[at]) else None
            assert found is not None, f"CHECK-NEXT: {check}\nnext line: " \
                                      f"{lines[at] if at < len(lines) else '<end>'}"
        else:
            found = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
            assert found is not None, f"CHECK: {check}\nnot found after line {at}"
        for text, bad in forbidden:
            hit = next((lines[i] for i in range(at, found) if bad.search(lines[i])), None)
            assert hit is None, f"CHECK-NOT: {text}\nfound: {hit}"
        forbidden = []
        at = found + 1
    for text, bad in forbidden:
        hit = next((lines[i] for i in range(at, len(lines)) if bad.search(lines[i])), None)
        assert hit is None, f"CHECK-NOT: {text}\nfound: {hit}"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden(path, tmp_path):
    text = path.read_text()
    n, stage, checks = _directives(text)
    spmd = compile_spmd(api.parse(text), n, dump_dir=tmp_path)
    if stage is None:
        output = api.to_text(spmd)
    else:
        (dump,) = tmp_path.glob(f"*.{stage}.hlo")
        output = dump.read_text()
    file_check(output, checks)
    check_equivalent(text, n, rtol=1e-4)


def test_file_check_itself():
    output = "a = 1\nb = 2\nc = all-reduce\nd = 4"
    file_check(output, [("CHECK", "a = {{[0-9]}}"), ("CHECK-NEXT", "b = 2")])
    with pytest.raises(AssertionError, match="CHECK-NOT"):
        file_check(output, [("CHECK", "a"), ("CHECK-NOT", "all-reduce"), ("CHECK", "d = 4")])
    with pytest.raises(AssertionError, match="CHECK-NEXT"):
        file_check(output, [("CHECK", "a"), ("CHECK-NEXT", "c")])
