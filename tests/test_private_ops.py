"""gspmdc's private ops and attributes (`ir/private_ops.py`): the definitions the partitioner
writes and the runtime reads, checked by hand, and the partitioner no longer reaching into the
runtime for them."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gspmdc.errors import UnsupportedError, VerificationError
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.module import Instruction
from gspmdc.ir.private_ops import (
    GLOBAL_DIMS, HALO, frontend_attribute, global_dims_attribute, global_dims_of,
    rng_state_delta, set_frontend_attribute,
)
from gspmdc.ir.shapes import ArrayShape

REPO = Path(__file__).resolve().parents[1]


def instruction(**attrs) -> Instruction:
    return Instruction("x", "custom-call", ArrayShape("f32", (2,)), [], attrs)


def test_setting_a_frontend_attribute_replaces_it_last_and_removing_the_last_drops_the_list():
    inst = instruction(frontend_attributes=KeyValueList((("a", "1"), (HALO, "old"), ("b", "2")),
                                                        ", "))
    set_frontend_attribute(inst, HALO, "new")
    assert inst.attrs["frontend_attributes"].items == (("a", "1"), ("b", "2"), (HALO, "new"))
    assert frontend_attribute(inst, HALO) == "new"
    single = instruction()
    set_frontend_attribute(single, HALO, "plan")
    set_frontend_attribute(single, HALO, None)
    assert "frontend_attributes" not in single.attrs and frontend_attribute(single, HALO) is None


def test_global_dims_round_trip_and_a_missing_attribute_is_named():
    inst = instruction(custom_call_target="gspmdc.RngShard",
                       frontend_attributes=global_dims_attribute((5, 7)))
    assert inst.attrs["frontend_attributes"].items == ((GLOBAL_DIMS, "5,7"),)
    assert global_dims_of(inst) == (5, 7)
    assert global_dims_of(instruction(frontend_attributes=global_dims_attribute(()))) == ()
    with pytest.raises(VerificationError, match="global_dims"):
        global_dims_of(instruction(custom_call_target="gspmdc.RngShard"))


@pytest.mark.parametrize("distribution, element_type, count, blocks", [
    ("rng_uniform", "f32", 10, 3),      # ten 32-bit values, four to a Philox block
    ("rng_uniform", "u8", 4, 1),        # narrow values still take one 32-bit word each
    ("rng_uniform", "s64", 3, 2),       # 64-bit values take two words
    ("rng_normal", "f32", 5, 2),        # Box-Muller pairs: six 32-bit values
    ("rng_normal", "f64", 1, 1),        # two 64-bit values: four words
])
def test_rng_state_delta_counts_philox_blocks(distribution, element_type, count, blocks):
    assert rng_state_delta(distribution, element_type, count) == blocks


def test_rng_state_delta_refuses_types_without_random_bits():
    with pytest.raises(UnsupportedError, match="c64"):
        rng_state_delta("rng_uniform", "c64", 4)


def test_the_passes_import_nothing_from_the_runtime():
    offenders = []
    for path in sorted((REPO / "passes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names
                          if n.startswith("gspmdc.runtime")]
    assert offenders == []
