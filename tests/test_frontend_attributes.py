"""gspmdc's own frontend attributes (`ir/frontend_attributes.py`): reading and setting one keeps
the others, in order, and removing the last one drops the list."""
from __future__ import annotations

from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.frontend_attributes import HALO, frontend_attribute, set_frontend_attribute
from gspmdc.ir.module import Instruction
from gspmdc.ir.parser import parse_module
from gspmdc.ir.printer import print_module
from gspmdc.ir.shapes import ArrayShape
from hlo_text import hlo_module


def instruction(**attrs) -> Instruction:
    return Instruction("x", "custom-call", ArrayShape("f32", (2,)), [], attrs)


def test_setting_a_frontend_attribute_replaces_it_last_and_keeps_the_others():
    inst = instruction(frontend_attributes=KeyValueList((("a", "1"), (HALO, "old"), ("b", "2")),
                                                        ", "))
    set_frontend_attribute(inst, HALO, "new")
    assert inst.attrs["frontend_attributes"].items == (("a", "1"), ("b", "2"), (HALO, "new"))
    assert frontend_attribute(inst, HALO) == "new" and frontend_attribute(inst, "c") is None


def test_removing_the_last_frontend_attribute_drops_the_list():
    inst = instruction()
    set_frontend_attribute(inst, HALO, "plan")
    set_frontend_attribute(inst, HALO, None)
    assert "frontend_attributes" not in inst.attrs and frontend_attribute(inst, HALO) is None


def test_a_set_attribute_prints_and_parses_back():
    module = parse_module(hlo_module("  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)"))
    set_frontend_attribute(module.entry.root, HALO, "operand 0 dim 0: left=1")
    again = parse_module(print_module(module))
    assert frontend_attribute(again.entry.root, HALO) == "operand 0 dim 0: left=1"
