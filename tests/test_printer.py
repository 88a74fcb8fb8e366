"""The HLO printer: canonical XLA style (golden text), attribute order, value spellings, exact float
round trips per element type, replica groups in iota form, and print -> parse identity."""
import re

import ml_dtypes
import numpy as np
import pytest

from gspmdc.ir.attributes import (
    ComputationRef, ConvDimLabels, Ident, InstructionRef, KeyValueList, Literal, PadDim, RawAttr,
    ReplicaGroups, SliceDim, Window, WindowDim,
)
from gspmdc.ir.literal_text import LiteralTextError, format_array, parse_array
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.parser import parse_module
from gspmdc.ir.printer import format_attribute, print_instruction, print_module, print_shape
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.ir.tile_assignment import TileAssignment


def f32(*dims, layout=None):
    return ArrayShape("f32", tuple(dims), layout)


def roundtrip(text: str) -> str:
    module = parse_module(text)
    printed = print_module(module)
    again = parse_module(printed)
    assert module.difference(again) is None
    assert print_module(again) == printed
    return printed


SOURCE = """HloModule m, entry_computation_layout={(f32[4,2]{1,0})->f32[4]{0}}, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = add(a, b)
}

ENTRY main {
  p = f32[4,2]{1,0} parameter(0), sharding={devices=[2,1]0,1}, metadata={op_name="x"}
  z = f32[] constant(0)
  r = f32[4]{0} reduce(p, z), dimensions={1}, to_apply=add, metadata={op_name="sum"}
  ROOT o = f32[4]{0} all-reduce(r), replica_groups={{0,1}}, channel_id=1, to_apply=add
}
"""

GOLDEN = """HloModule m, entry_computation_layout={(f32[4,2]{1,0})->f32[4]{0}}, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[4,2]) -> f32[4] {
  %p = f32[4,2]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}, metadata={op_name="x"}
  %z = f32[] constant(0)
  %r = f32[4]{0} reduce(%p, %z), dimensions={1}, to_apply=%add, metadata={op_name="sum"}
  ROOT %o = f32[4]{0} all-reduce(%r), replica_groups=[1,2]<=[2], channel_id=1, to_apply=%add
}
"""


def test_canonical_module_text():
    assert roundtrip(SOURCE) == GOLDEN


def test_attribute_order_sharding_then_trailing_then_raw():
    text = ("ENTRY main {\n  p = f32[2] parameter(0)\n"
            "  ROOT c = f32[2] custom-call(p), backend_config=\"cfg\", metadata={op_name=\"m\"}, "
            "weird={1:2}, control-predecessors={p}, frontend_attributes={k=\"v\"}, "
            "custom_call_target=\"foo\", sharding={replicated}, api_version=API_VERSION_ORIGINAL\n}\n")
    line = roundtrip(text).splitlines()[4]
    assert line == ('  ROOT %c = f32[2] custom-call(%p), custom_call_target="foo", '
                    'api_version=API_VERSION_ORIGINAL, sharding={replicated}, frontend_attributes={k="v"}, '
                    'control-predecessors={%p}, metadata={op_name="m"}, backend_config="cfg", weird={1:2}')


@pytest.mark.parametrize("name, value, text", [
    ("index", 3, "3"),
    ("is_stable", True, "true"),
    ("direction", Ident("GT"), "GT"),
    ("custom_call_target", 'a"b\\c\nd\x01', '"a\\"b\\\\c\\nd\\001"'),
    ("dimensions", (1, 0), "{1,0}"),
    ("dimensions", (), "{}"),
    ("operand_precision", (Ident("HIGH"), Ident("DEFAULT")), "{HIGH,DEFAULT}"),
    ("parameter_replication", (True, False), "{true,false}"),
    ("to_apply", ComputationRef("sum.1"), "%sum.1"),
    ("branch_computations", (ComputationRef("a"), ComputationRef("b")), "{%a, %b}"),
    ("control-predecessors", (InstructionRef("x"),), "{%x}"),
    ("source_target_pairs", ((0, 1), (1, 0)), "{{0,1},{1,0}}"),
    ("slice", (SliceDim(0, 4, 2), SliceDim(2, 8)), "{[0:4:2], [2:8]}"),
    ("padding", (PadDim(-1, 2), PadDim(0, 0)), "-1_2x0_0"),
    ("padding", (PadDim(0, 1, 1), PadDim(2, 0)), "0_1_1x2_0_0"),
    ("dim_labels", ConvDimLabels("b01f", "01io", "b01f"), "b01f_01io->b01f"),
    ("window", Window((WindowDim(3), WindowDim(3))), "{size=3x3}"),
    ("window", Window((WindowDim(3, 2, 1, 0, 1, 2, False), WindowDim(1, 1, 0, -1, 3, 1, True))),
     "{size=3x1 stride=2x1 pad=1_0x0_-1 lhs_dilate=1x3 rhs_dilate=2x1 rhs_reversal=0x1}"),
    ("window", Window(()), "{}"),
    ("replica_groups", ReplicaGroups(()), "{}"),
    ("replica_groups", ReplicaGroups(((0, 2, 4, 6), (1, 3, 5, 7))), "[2,4]<=[4,2]T(1,0)"),
    ("replica_groups", ReplicaGroups(((0, 1, 2, 3), (4, 5, 6, 7))), "[2,4]<=[8]"),
    ("replica_groups", ReplicaGroups(((0, 3), (1, 2))), "{{0,3},{1,2}}"),
    ("replica_groups", ReplicaGroups(((0,), (1, 2))), "{{0},{1,2}}"),
    ("metadata", KeyValueList((("op_name", "a b"), ("source_line", 3)), " "), '{op_name="a b" source_line=3}'),
    ("frontend_attributes", KeyValueList((("a", "1"), ("b", "2")), ", "), '{a="1", b="2"}'),
    ("backend_config", RawAttr('{"x":1}'), '{"x":1}'),
])
def test_attribute_value_text(name, value, text):
    assert format_attribute(name, value) == text


def test_unprintable_value_is_a_type_error():
    with pytest.raises(TypeError, match="no text form"):
        format_attribute("x", 1.5)


def test_print_instruction_and_shape_of_a_module_built_in_code():
    p = Instruction("p", "parameter", f32(4, 2, layout="1,0"), parameter_number=0,
                    sharding=HloSharding.tiled(TileAssignment.iota([2, 1])))
    c = Instruction("c", "constant", ArrayShape("s32", (2,)), literal=Literal(np.array([1, -2], np.int32)))
    t = Instruction("t", "tuple", TupleShape((f32(4, 2), ArrayShape("s32", (2,)))), [p, c])
    assert print_instruction(p) == "%p = f32[4,2]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}"
    assert print_instruction(c) == "%c = s32[2] constant({1, -2})"
    assert print_instruction(t) == "%t = (f32[4,2], s32[2]) tuple(%p, %c)"
    assert print_shape(TupleShape((ArrayShape("token", ()), TupleShape(())))) == "(token[], ())"
    module = Module("built", [Computation("main", [p, c, t], t, is_entry=True)], "main", {"num_partitions": 2})
    assert parse_module(print_module(module)).difference(module) is None


def test_literals_of_every_kind_round_trip():
    text = ("ENTRY main {\n"
            "  a = pred[2,2] constant({{true, false}, {false, true}})\n"
            "  b = s8[3] constant({-128, 0, 127})\n"
            "  c = u64[] constant(18446744073709551615)\n"
            "  d = c64[2] constant({(1, -2.5), (nan, inf)})\n"
            "  e = (s32[], (f32[2], bf16[])) constant((1, ({0.1, -0}, 0.1)))\n"
            "  f = f32[1000] constant({...})\n"
            "  g = f32[0,3] constant({})\n"
            "  ROOT h = f32[3] constant({1, 1e+30, -1e-45})\n}\n")
    printed = roundtrip(text)
    assert "constant({{true, false}, {false, true}})" in printed
    assert "constant((1, ({0.1, -0}, 0.1)))" in printed
    assert "constant({(1, -2.5), (nan, inf)})" in printed
    assert "f32[1000] constant({...})" in printed
    assert "ROOT %h = f32[3] constant({1, 1e+30, -1e-45})" in printed


def test_one_bare_token_for_an_array_is_its_first_element_and_zeros_elsewhere():
    # XLA's parser reads `f32[2,3] constant(7)` as 7 at index 0 and zeros, not a broadcast (its
    # partitioned output of such a module holds the constant `{{7, 0, 0}, {0, 0, 0}}`)
    expected = {"f32[2,3]": np.array([[7, 0, 0], [0, 0, 0]], np.float32),
                "pred[2]": np.array([True, False]), "s32[3]": np.array([-5, 0, 0], np.int32),
                "f16[1,1]": np.array([[-np.inf]], np.float16)}
    for (shape, value), token in zip(expected.items(), ["7", "true", "-5", "-inf"]):
        element_type, dims = shape.split("[")
        dims = tuple(int(d) for d in dims.rstrip("]").split(","))
        parsed = parse_array(token, element_type, dims)
        assert parsed.dtype == value.dtype and np.array_equal(parsed, value)
    printed = roundtrip("ENTRY main {\n  ROOT c = s32[2,2] constant(3)\n}\n")
    assert "constant({{3, 0}, {0, 0}})" in printed


@pytest.mark.parametrize("token, element_type, dims, message", [
    ("1", "f32", (0, 3), "literal has 1 element, shape f32[0,3] has none"),
    ("1.5", "s32", (2,), "expected an integer, found '1.5'"),
    ("300", "s8", (2,), "300 is out of range for s8"),
])
def test_one_bare_token_for_an_array_is_checked_as_its_element(token, element_type, dims, message):
    with pytest.raises(LiteralTextError, match=re.escape(message)):
        parse_array(token, element_type, dims)


BITS = {"bf16": np.uint16, "f16": np.uint16, "f32": np.uint32, "f64": np.uint64}
DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32, "f64": np.float64}


@pytest.mark.parametrize("element_type", ["bf16", "f16", "f32", "f64"])
def test_floats_round_trip_bit_exactly(element_type):
    rng = np.random.default_rng(7)
    uint = BITS[element_type]
    bits = rng.integers(0, np.iinfo(uint).max, size=20000, dtype=uint, endpoint=True)
    values = bits.view(DTYPES[element_type])         # every pattern: subnormals, inf, NaN payloads
    text = format_array(values, element_type)
    back = parse_array(text, element_type, values.shape)
    assert np.array_equal(back.view(uint), bits)


def test_bf16_and_f16_use_their_own_shortest_digits():
    assert format_array(np.array([0.1, 1.0, 3.140625], ml_dtypes.bfloat16), "bf16") == "{0.1, 1, 3.14}"
    assert format_array(np.array([0.1, 65504], np.float16), "f16") == "{0.1, 6.55e+04}"
    assert format_array(np.array([0.1, 16777216], np.float32), "f32") == "{0.1, 1.6777216e+07}"


def test_nan_sign_and_payload_text():
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC00123], np.uint32)
    assert format_array(bits.view(np.float32), "f32") == "{nan, -nan, nan(0x1), -nan(0x400123)}"


def test_header_mesh_stack_frames_and_execution_thread_round_trip():
    text = ('HloModule m, mesh={x=2, y=2, devices=[0,2,1,3]}, num_partitions=4\n\n'
            'FileNames\n1 "a.py"\n\nStackFrames\n1 {file_location_id=1 parent_frame_id=1}\n\n'
            'ENTRY main {\n  ROOT p = f32[4,4] parameter(0), sharding={mesh_split=[x, y]}, '
            'metadata={op_name="p" stack_frame_id=1}\n}, execution_thread="main"\n')
    printed = roundtrip(text)
    assert printed.startswith('HloModule m, mesh={x=2, y=2, devices=[0,2,1,3]}, num_partitions=4\n\n'
                              'FileNames\n1 "a.py"\n\nStackFrames\n1 {file_location_id=1 parent_frame_id=1}\n\n'
                              'ENTRY %main')
    assert "sharding={devices=[2,2]<=[2,2]T(1,0)}" in printed
    assert printed.endswith('}, execution_thread="main"\n')


def test_omitted_shapes_are_printed_once_inferred():
    printed = roundtrip("ENTRY main {\n  p = f32[3] parameter(0)\n  ROOT n = negate(p)\n}\n")
    assert "ROOT %n = f32[3] negate(%p)" in printed


def test_verbatim_attributes_survive():
    text = ("HloModule m, input_output_alias={ {0}: (0, {}, may-alias) }\n\nENTRY main {\n"
            "  p = f32[2] parameter(0)\n  ROOT c = f32[2] custom-call(p), custom_call_target=\"x\", "
            "output_to_operand_aliasing={{}: (0, {})}, epsilon=1e-05, operand_layout_constraints={f32[2]{0}}\n}\n")
    printed = roundtrip(text)
    assert "input_output_alias={ {0}: (0, {}, may-alias) }" in printed
    assert "output_to_operand_aliasing={{}: (0, {})}, epsilon=1e-05, operand_layout_constraints={f32[2]{0}}" in printed


def test_original_value_attributes_in_every_form_xlas_parser_reads_survive():
    # `origin=`: a tuple tree of `{"instruction" {shape index}}` leaves, an empty leaf, or
    # `[synthetic_call]` (XLA's grammar for an instruction's original value)
    forms = ['{{"p.1"}}', '{{"p.1" {}}}', '{({"t.1" {0}}, {"t.1" {1}})}', '{[synthetic_call]}',
             '{{}}']
    body = "".join(f"  a{k} = f32[2] negate(p), origin={form}\n" for k, form in enumerate(forms))
    printed = roundtrip(f"ENTRY main {{\n  p = f32[2] parameter(0)\n{body}"
                        "  ROOT r = f32[2] copy(p)\n}\n")
    for form in forms:
        assert f"origin={form}" in printed
