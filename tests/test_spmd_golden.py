"""Golden tests of the whole partitioner in the FileCheck manner: each `tests/data/spmd/*.hlo`
names the partition count (`// PARTITIONS: n`), optionally the dump to check (`// STAGE: <pass>`,
default: the final SPMD module), and `// CHECK...:` directives (`tests/filecheck.py`) matched
against the printed module. Every case is also run and compared with its unpartitioned program.
Golden tests of one pass at a time are `test_pass_golden.py`."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd

from filecheck import check, directives
from spmd_partition_helpers import check_equivalent

DATA = Path(__file__).parent / "data" / "spmd"
CASES = sorted(DATA.glob("*.hlo"))


def _setting(text: str, name: str) -> str | None:
    match = re.search(rf"^\s*// {name}: (.*)$", text, re.M)
    return None if match is None else match.group(1).strip()


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden(path, tmp_path):
    text = path.read_text()
    n, stage = int(_setting(text, "PARTITIONS")), _setting(text, "STAGE")
    spmd = compile_spmd(api.parse(text), n, dump_dir=tmp_path, verify_each=True)
    if stage is None:
        output = api.to_text(spmd)
    else:
        (dump,) = tmp_path.glob(f"*.{stage}.hlo")
        output = dump.read_text()
    check(output, directives(text))
    check_equivalent(text, n, rtol=1e-4)
