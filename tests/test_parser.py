"""The HLO text parser: every syntax feature of docs/text-format.md, the typed attribute values, the
named-mesh extension, and every error kind with its exact file:line:col."""
import math
import re

import ml_dtypes
import numpy as np
import pytest

from gspmdc.errors import HloSyntaxError
from gspmdc.ir import parser as parser_module
from gspmdc.ir.grammar_callbacks import Records
from gspmdc.ir.attributes import (
    ComputationRef, ConvDimLabels, Ident, InstructionRef, KeyValueList, PadDim, RawAttr,
    ReplicaGroups, SliceDim, Window, WindowDim,
)
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sdy import Meshes
from gspmdc.ir.parser import STACK_FRAME_INDEX, parse_file, parse_module, parse_shape, parse_sharding
from gspmdc.ir.printer import print_module
from gspmdc.ir.sharding import HloSharding, ShardGroup
from gspmdc.ir.shapes import ArrayShape, TupleShape
from gspmdc.ir.tile_assignment import TileAssignment


ADD = "%add (a: f32[], b: f32[]) -> f32[] {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n" \
      "  ROOT s = f32[] add(a, b)\n}\n\n"


def entry(body: str, header: str = "HloModule m") -> str:
    """A module with the `add` reducer and an entry computation of the given instruction lines."""
    return f"{header}\n\n{ADD}ENTRY main {{\n{body}\n}}\n"


def inst(text: str, body: str = "", name: str = "x"):
    """The instruction `name` of a module whose entry has `body` lines then `text` as ROOT."""
    module = parse_module(entry(body + "\n  ROOT " + text if body else "  ROOT " + text))
    return module.entry.instruction(name)


def error(text: str) -> HloSyntaxError:
    with pytest.raises(HloSyntaxError) as info:
        parse_module(text, "t.hlo")
    return info.value


def f32(*dims, layout=None):
    return ArrayShape("f32", tuple(dims), layout)


# ---- module structure ---------------------------------------------------------------------------

def test_header_attributes_typed_and_verbatim():
    text = ("HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[8,16]{1,0})->f32[8,16]{1,0}}, "
            "num_partitions=8, replica_count=1, allow_spmd_sharding_propagation_to_parameters={true,false}, "
            "allow_spmd_sharding_propagation_to_output=true, "
            "input_output_alias={ {0}: (0, {}, may-alias) }, "
            "frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=2, \"y\"=4]>}}\n\n"
            "ENTRY main {\n  ROOT p = f32[8,16] parameter(0)\n}\n")
    m = parse_module(text)
    assert m.name == "jit_f"
    assert m.attrs == {
        "is_scheduled": True,
        "entry_computation_layout": RawAttr("{(f32[8,16]{1,0})->f32[8,16]{1,0}}"),
        "num_partitions": 8,
        "replica_count": 1,
        "allow_spmd_sharding_propagation_to_parameters": (True, False),
        "allow_spmd_sharding_propagation_to_output": True,
        "input_output_alias": RawAttr("{ {0}: (0, {}, may-alias) }"),
        "frontend_attributes": KeyValueList(
            (("xla.sdy.meshes", Meshes((("mesh", Mesh(["x", "y"], [2, 4])),))),), ", "),
    }
    assert list(m.attrs)[0] == "is_scheduled"       # input order kept
    assert m.num_partitions == 8


def test_no_header_names_module_after_entry_and_last_computation_is_entry():
    m = parse_module("neg {\n  p = f32[] parameter(0)\n  ROOT n = f32[] negate(p)\n}\n\n"
                     "main {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=neg\n}\n")
    assert m.name == "main" and m.entry_name == "main"
    assert m.entry.is_entry and not m.computations["neg"].is_entry
    assert list(m.computations) == ["neg", "main"]


def test_entry_keyword_chooses_entry_anywhere():
    m = parse_module("ENTRY first {\n  ROOT p = f32[] parameter(0)\n}\nsecond {\n  ROOT p = f32[] parameter(0)\n}\n")
    assert m.entry_name == "first"


def test_percent_optional_and_names_with_dots_and_dashes():
    m = parse_module("HloModule m\n\nENTRY %main.2 (p: f32[2]) -> f32[2] {\n"
                     "  %param.0-a = f32[2]{0} parameter(0)\n"
                     "  get-tuple-element.35 = f32[2] negate(%param.0-a)\n"
                     "  ROOT %reduce-window = f32[2] negate(get-tuple-element.35)\n}\n")
    comp = m.entry
    assert comp.name == "main.2"
    assert [i.name for i in comp.instructions] == ["param.0-a", "get-tuple-element.35", "reduce-window"]
    assert [o.name for o in comp.root.operands] == ["get-tuple-element.35"]


def test_root_defaults_to_last_instruction():
    m = parse_module(entry("  p = f32[] parameter(0)\n  n = f32[] negate(p)"))
    assert m.entry.root.name == "n"


def test_execution_thread_after_closing_brace():
    m = parse_module('HloModule m\n\nENTRY main {\n  ROOT p = f32[] parameter(0)\n}, execution_thread="thread_0" // c\n')
    assert m.entry.execution_thread == "thread_0"


def test_multi_line_instructions_and_comments_anywhere():
    m = parse_module("/* leading */ HloModule m // trailing\n\nENTRY main {\n"
                     "  p = f32[4,2] parameter(0),\n      sharding={devices=[2,1]0,1 /* inline */}\n"
                     "  q = f32[4,2] parameter(1)\n"
                     "  ROOT t = (f32[4,2], f32[4,2]) tuple(p, /*index=1*/q),\n"
                     "    sharding={{devices=[2,1]0,1},\n /*index=1*/ {replicated}} // done\n}\n")
    root = m.entry.root
    assert [o.name for o in root.operands] == ["p", "q"]
    assert root.sharding == HloSharding.tuple([HloSharding.tiled(TileAssignment.iota([2, 1])),
                                               HloSharding.replicate()])


def test_parameter_number_and_instruction_fields():
    x = inst("x = f32[8,16]{1,0} parameter(3), parameter_replication={true}")
    assert (x.opcode, x.parameter_number, x.shape) == ("parameter", 3, f32(8, 16, layout="1,0"))
    assert x.attrs == {"parameter_replication": (True,)}
    assert x.operands == [] and x.literal is None and x.sharding is None


def test_layouts_kept_verbatim():
    x = inst("x = f32[8,128]{1,0:T(8,128)(2,1)S(1)} parameter(0)")
    assert x.shape.layout == "1,0:T(8,128)(2,1)S(1)"


def test_tuple_shapes_and_token():
    x = inst("x = ((f32[2]{0}), pred[], (), token[]) parameter(0)")
    assert x.shape == TupleShape((TupleShape((f32(2, layout="0"),)), ArrayShape("pred", ()),
                                  TupleShape(()), ArrayShape("token", ())))


def test_operand_shape_prefix_checked_then_dropped():
    x = inst("x = f32[2] negate(f32[2]{0} p)", "  p = f32[2]{0} parameter(0)")
    assert [o.name for o in x.operands] == ["p"]


def test_omitted_shapes_are_inferred_callee_first_with_forward_reference():
    m = parse_module("HloModule m\n\nENTRY main {\n  p = f32[4,3] parameter(0)\n  z = f32[] constant(0)\n"
                     "  r = reduce(p, z), dimensions={1}, to_apply=max\n  ROOT c = call(r), to_apply=neg\n}\n\n"
                     "max {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT m = maximum(a, b)\n}\n\n"
                     "neg {\n  a = f32[4] parameter(0)\n  ROOT n = negate(a)\n}\n")
    assert m.computations["max"].root.shape == f32()
    assert m.entry.instruction("r").shape == f32(4)
    assert m.entry.root.shape == f32(4)
    assert m.entry_name == "main"


def test_stack_frame_index_kept_verbatim():
    tables = ('FileNames\n1 "x.py"\n\nFunctionNames\n1 "f"\n\nFileLocations\n'
              '1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}\n\n'
              'StackFrames\n1 {file_location_id=1 parent_frame_id=1}')
    m = parse_module(f"HloModule m, num_partitions=2\n\n{tables}\n\n\nENTRY main {{\n"
                     "  ROOT p = f32[] parameter(0), metadata={op_name=\"a\" stack_frame_id=1}\n}\n")
    assert m.attrs == {"num_partitions": 2, STACK_FRAME_INDEX: RawAttr(tables)}


# ---- attributes ---------------------------------------------------------------------------------

def test_plain_attribute_values_are_typed():
    x = inst('x = f32[2] custom-call(p), custom_call_target="foo", api_version=API_VERSION_TYPED_FFI, '
             'custom_call_has_side_effect=true, index=0, dimensions={1,0}, operand_precision={HIGH,highest}, '
             'parameter_replication={true,false}, source_target_pairs={{0,1},{1,0}}, dimensions_empty={}',
             "  p = f32[2] parameter(0)")
    assert x.attrs == {
        "custom_call_target": "foo", "api_version": Ident("API_VERSION_TYPED_FFI"),
        "custom_call_has_side_effect": True, "index": 0, "dimensions": (1, 0),
        "operand_precision": (Ident("HIGH"), Ident("highest")), "parameter_replication": (True, False),
        "source_target_pairs": ((0, 1), (1, 0)), "dimensions_empty": (),
    }
    assert type(x.attrs["api_version"]) is Ident and type(x.attrs["index"]) is int


def test_unknown_attribute_values_kept_verbatim():
    x = inst('x = f32[2] custom-call(p), custom_call_target="foo", '
             'output_to_operand_aliasing={{}: (0, {})}, epsilon=0.001, '
             'operand_layout_constraints={f32[2]{0}}, result_accuracy={tolerance={atol=0 rtol=0}}, '
             'schedule=SCHEDULE_LATEST, refs={%a, %b}', "  p = f32[2] parameter(0)")
    assert x.attrs["output_to_operand_aliasing"] == RawAttr("{{}: (0, {})}")
    assert x.attrs["epsilon"] == RawAttr("0.001")
    assert x.attrs["operand_layout_constraints"] == RawAttr("{f32[2]{0}}")
    assert x.attrs["result_accuracy"] == RawAttr("{tolerance={atol=0 rtol=0}}")
    assert x.attrs["schedule"] == Ident("SCHEDULE_LATEST")
    assert x.attrs["refs"] == RawAttr("{%a, %b}")


def test_backend_config_string_or_braces():
    x = inst('x = f32[2] copy(p), backend_config="unspecified_dims=[0]"', "  p = f32[2] parameter(0)")
    assert x.attrs["backend_config"] == "unspecified_dims=[0]"
    x = inst('x = f32[2] copy(p), backend_config={"flag":[],"kind":"A"}', "  p = f32[2] parameter(0)")
    assert x.attrs["backend_config"] == RawAttr('{"flag":[],"kind":"A"}')
    x = inst('x = f32[2] copy(p), backend_config={}', "  p = f32[2] parameter(0)")
    assert x.attrs["backend_config"] == RawAttr("{}")


def test_string_escapes():
    x = inst(r'x = f32[2] custom-call(), custom_call_target="a\"b\\c\nd\te\001"')
    assert x.attrs["custom_call_target"] == 'a"b\\c\nd\te\x01'


def test_window_all_fields_and_defaults():
    x = inst("x = f32[1,1] reduce-window(p, z), window={size=3x2 stride=2x1 pad=1_-1x0_2 "
             "lhs_dilate=1x3 rhs_dilate=2x1 rhs_reversal=0x1}, to_apply=add",
             "  p = f32[4,4] parameter(0)\n  z = f32[] constant(0)")
    assert x.attrs["window"] == Window((WindowDim(3, 2, 1, -1, 1, 2, False),
                                        WindowDim(2, 1, 0, 2, 3, 1, True)))
    y = inst("x = f32[2] reduce-window(p, z), window={size=5}, to_apply=add",
             "  p = f32[2] parameter(0)\n  z = f32[] constant(0)")
    assert y.attrs["window"] == Window((WindowDim(5),))


def test_convolution_attributes():
    x = inst("x = f32[1,2,2,1] convolution(a, b), window={size=3x3 pad=1_1x1_1}, "
             "dim_labels=b01f_01io->b01f, feature_group_count=1, operand_precision={default,default}",
             "  a = f32[1,2,2,1] parameter(0)\n  b = f32[3,3,1,1] parameter(1)")
    labels = x.attrs["dim_labels"]
    assert labels == ConvDimLabels("b01f", "01io", "b01f")
    assert (labels.lhs_batch, labels.lhs_feature, labels.rhs_spatial) == (0, 3, (0, 1))
    assert x.attrs["feature_group_count"] == 1


def test_slice_and_padding_forms():
    x = inst("x = f32[2,3] slice(p), slice={[0:4:2], [2:8]}", "  p = f32[4,8] parameter(0)")
    assert x.attrs["slice"] == (SliceDim(0, 4, 2), SliceDim(2, 8, 1))
    y = inst("x = f32[6,3] pad(p, z), padding=-1_2_1x0_-1", "  p = f32[3,4] parameter(0)\n  z = f32[] constant(0)")
    assert y.attrs["padding"] == (PadDim(-1, 2, 1), PadDim(0, -1, 0))


def test_gather_and_scatter_dimension_numbers():
    x = inst("x = f32[2,8] gather(p, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, "
             "index_vector_dim=1, slice_sizes={1,8}, indices_are_sorted=true, operand_batching_dims={}",
             "  p = f32[4,8] parameter(0)\n  i = s32[2,1] parameter(1)")
    assert x.attrs == {"offset_dims": (1,), "collapsed_slice_dims": (0,), "start_index_map": (0,),
                       "index_vector_dim": 1, "slice_sizes": (1, 8), "indices_are_sorted": True,
                       "operand_batching_dims": ()}


def test_computation_references():
    m = parse_module("t {\n  ROOT p = f32[] parameter(0)\n}\n\nENTRY main {\n"
                     "  c = pred[] parameter(0)\n  p = f32[] parameter(1)\n"
                     "  k = f32[] conditional(c, p, p), true_computation=t, false_computation=%t\n"
                     "  i = s32[] parameter(2)\n"
                     "  ROOT b = f32[] conditional(i, p, p), branch_computations={%t, t}\n}\n")
    comp = m.entry
    assert comp.instruction("k").attrs == {"true_computation": ComputationRef("t"),
                                           "false_computation": ComputationRef("t")}
    assert comp.root.attrs == {"branch_computations": (ComputationRef("t"), ComputationRef("t"))}
    assert comp.root.called_computation_names() == ["t", "t"]


def test_fusion_and_async_ops():
    m = parse_module("fused {\n  p = f32[2] parameter(0)\n  ROOT n = f32[2] negate(p)\n}\n\n"
                     "ENTRY main {\n  p = f32[2] parameter(0)\n"
                     "  f = f32[2] fusion(p), kind=kLoop, calls=%fused\n"
                     '  s = ((f32[2]), f32[2], u32[]) call-start(f), async_execution_thread="t", to_apply=fused\n'
                     "  ROOT d = f32[2] call-done(s)\n}\n")
    comp = m.entry
    assert comp.instruction("f").attrs == {"kind": Ident("kLoop"), "calls": ComputationRef("fused")}
    assert comp.instruction("s").attrs == {"async_execution_thread": "t", "to_apply": ComputationRef("fused")}


def test_metadata_frontend_attributes_and_control_predecessors():
    x = inst('x = f32[2] negate(p), control-predecessors={%p, q}, '
             'metadata={op_type="Add" op_name="jit(f)/add" source_file="x.py" source_line=12 preserve_layout=true}, '
             'frontend_attributes={_xla_compute_type="host", key="v"}',
             "  p = f32[2] parameter(0)\n  q = f32[2] parameter(1)")
    assert x.attrs["control-predecessors"] == (InstructionRef("p"), InstructionRef("q"))
    assert x.attrs["metadata"] == KeyValueList((("op_type", "Add"), ("op_name", "jit(f)/add"),
                                                ("source_file", "x.py"), ("source_line", 12),
                                                ("preserve_layout", True)), " ")
    assert x.attrs["frontend_attributes"] == KeyValueList((("_xla_compute_type", "host"), ("key", "v")), ", ")


def test_key_value_lists_with_nested_values_fall_back_to_structured_parse():
    x = inst('x = f32[2] negate(p), frontend_attributes={a={b="c"}, d="e"}, metadata={}',
             "  p = f32[2] parameter(0)")
    assert x.attrs["frontend_attributes"] == KeyValueList((("a", RawAttr('{b="c"}')), ("d", "e")), ", ")
    assert x.attrs["metadata"] == KeyValueList((), " ")


def test_sharding_is_not_an_attribute():
    x = inst("x = f32[2] parameter(0), sharding={replicated}, metadata={op_name=\"p\"}")
    assert x.sharding == HloSharding.replicate()
    assert list(x.attrs) == ["metadata"]


# ---- replica groups -----------------------------------------------------------------------------

@pytest.mark.parametrize("value, groups", [
    ("{}", ()),
    ("{{0,1},{3,2}}", ((0, 1), (3, 2))),
    ("{{0,2,4,6},{1,3,5,7}}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("[2,4]<=[4,2]T(1,0)", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    # XLA's mesh-axes form: devices arange(8).reshape(2,4).T as a [4,2] mesh, grouped along axis_0
    ("mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("mesh['axis_0'=8] {'axis_0'}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("mesh['a'=2,'b'=4] {'a'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("mesh['a'=2,'b'=4] {'b'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("mesh['a'=2,'b'=4] {'b', 'a'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
    ("mesh['a'=2,'b'=4], device_ids=(7,6,5,4,3,2,1,0) {'a'}", ((7, 3), (6, 2), (5, 1), (4, 0))),
    # sub-axis 'b':(2)2 of b=4: b = 2 (major) x 2 (the sub-axis)
    ("mesh['a'=2,'b'=4] {'b':(2)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("mesh['a'=2,'b'=4] {'b':(1)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
])
def test_replica_group_forms(value, groups):
    x = inst(f"x = f32[8] all-reduce(p), replica_groups={value}, to_apply=add", "  p = f32[8] parameter(0)")
    assert x.attrs["replica_groups"] == ReplicaGroups(groups)


def test_mesh_replica_groups_followed_by_other_attributes():
    x = inst("x = f32[12,5] all-gather(p), channel_id=2, "
             "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, "
             "dimensions={0}, use_global_device_ids=true", "  p = f32[3,5] parameter(0)")
    assert list(x.attrs) == ["channel_id", "replica_groups", "dimensions", "use_global_device_ids"]
    assert x.attrs["dimensions"] == (0,)


# ---- constants ----------------------------------------------------------------------------------

def literal(shape: str, text: str):
    return inst(f"x = {shape} constant({text})").literal


def test_scalar_constants_take_dtype_from_shape():
    v = literal("f32[]", "1").value
    assert v.dtype == np.float32 and v.shape == () and v == 1.0
    assert literal("s8[]", "-128").value == np.int8(-128)
    assert literal("u64[]", "18446744073709551615").value == np.uint64(2**64 - 1)
    assert literal("pred[]", "true").value.dtype == np.bool_
    assert literal("f64[]", "1.5e-3").value == 1.5e-3
    assert literal("bf16[]", "0.1").value.dtype == ml_dtypes.bfloat16


def test_array_constants_nest_per_dimension():
    v = literal("s32[2,3]", "{{1,2,3},\n    {4,5,6}}").value
    assert np.array_equal(v, np.array([[1, 2, 3], [4, 5, 6]], np.int32)) and v.dtype == np.int32
    assert literal("f32[0]", "{}").value.shape == (0,)
    assert literal("f32[2,0]", "{ {}, {} }").value.shape == (2, 0)
    assert np.array_equal(literal("pred[3]", "{true, false, true}").value, [True, False, True])


def test_special_float_values_keep_sign_and_payload():
    v = literal("f32[6]", "{inf, -inf, nan, -nan, nan(0x7ff), -0}").value
    bits = v.view(np.uint32)
    assert v[0] == np.inf and v[1] == -np.inf
    assert bits[2] == 0x7FC00000 and bits[3] == 0xFFC00000 and bits[4] == 0x7F8007FF
    assert bits[5] == 0x80000000
    h = literal("f16[]", "-nan(0x1)").value.view(np.uint16)
    assert h == 0xFC01


def test_complex_tuple_and_elided_constants():
    c = literal("c64[2]", "{(1, 2), (-3.5, inf)}").value
    assert c.dtype == np.complex64 and c[0] == 1 + 2j and c[1].real == -3.5 and math.isinf(c[1].imag)
    t = literal("(s32[], f32[2], (pred[]))", "(1, {2, 3}, (true))")
    a, b, (d,) = t.elements[0], t.elements[1], t.elements[2].elements
    assert a.value == 1 and np.array_equal(b.value, [2.0, 3.0]) and b.value.dtype == np.float32
    assert d.value == np.True_
    assert literal("f32[1000,1000]", "{...}").elided


def test_constant_with_comments_uses_structured_literal():
    v = literal("s32[2,2]", "{ /*i=0*/ {1, 2}, /*i=1*/ {3, 4} }").value
    assert np.array_equal(v, [[1, 2], [3, 4]])


# ---- shardings ----------------------------------------------------------------------------------

H = HloSharding


def iota(dims, reshape=None, perm=None, types=(), **kw):
    return H.tiled(TileAssignment.iota(dims, reshape, perm), types, **kw)


@pytest.mark.parametrize("text, expected", [
    ("{replicated}", H.replicate()),
    ("{manual}", H.manual()),
    ("{unknown}", H.unknown()),
    ("{unreduced}", H.unreduced()),
    ("{maximal device=3}", H.maximal(3)),
    ("{devices=[2,1]0,1}", iota([2, 1])),
    ("{devices=[2,2]3,1,2,0}", H.tiled(TileAssignment.explicit([2, 2], [3, 1, 2, 0]))),
    ("{devices=[2,2]<=[4]}", iota([2, 2])),
    ("{devices=[2,2]<=[2,2]T(1,0)}", H.tiled(TileAssignment.explicit([2, 2], [0, 2, 1, 3]))),
    ("{devices=[4,4,1]<=[4,2,2]T(1,0,2)}",
     H.tiled(TileAssignment.explicit([4, 4, 1], [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]))),
    ("{devices=[2,1,2]<=[4] last_tile_dim_replicate}", iota([2, 1, 2], types=("replicated",))),
    ("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}",
     H.tiled(TileAssignment.explicit([1, 2, 2], [0, 2, 1, 3]), ("replicated",))),
    ("{devices=[2,1,2]<=[4] last_tile_dims={manual}}", iota([2, 1, 2], types=("manual",))),
    ("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}", iota([2, 2, 2], types=("manual", "replicated"))),
    ("{devices=[4]<=[4] shard_as 0}", iota([4], shard_group=ShardGroup("as", 0))),
    ("{unknown shard_like 1}", H.unknown(shard_group=ShardGroup("like", 1))),
    ("{{devices=[2,1]0,1}, {maximal device=0}, {replicated}}",
     H.tuple([iota([2, 1]), H.maximal(0), H.replicate()])),
    ("{}", H.tuple([])),
])
def test_sharding_forms(text, expected):
    assert parse_sharding(text) == expected
    assert inst(f"x = f32[8] parameter(0), sharding={text}").sharding == expected


def test_sharding_metadata_single_and_list():
    one = parse_sharding('{devices=[2,1]0,1 metadata={op_name="a"}}')
    assert one.metadata == (KeyValueList((("op_name", "a"),), " "),)
    two = parse_sharding('{replicated metadata={{op_name="a"}, {op_type="b" op_name="c"}}}')
    assert two.metadata == (KeyValueList((("op_name", "a"),), " "),
                            KeyValueList((("op_type", "b"), ("op_name", "c")), " "))


def test_last_tile_dims_replicated_equals_last_tile_dim_replicate():
    assert parse_sharding("{devices=[2,2]<=[4] last_tile_dims={replicated}}") == \
        parse_sharding("{devices=[2,2]<=[4] last_tile_dim_replicate}")


def test_parse_shape():
    assert parse_shape("f32[8,16]{1,0}") == f32(8, 16, layout="1,0")
    assert parse_shape("(f32[2], s32[])") == TupleShape((f32(2), ArrayShape("s32", ())))


# ---- named-mesh extension -----------------------------------------------------------------------

def test_mesh_header_and_mesh_split_lowering():
    m = parse_module("HloModule m, mesh={x=2, y=4}, num_partitions=8\n\nENTRY main {\n"
                     "  p = f32[8,16] parameter(0), sharding={mesh_split=[x, _]}\n"
                     "  q = f32[8,16] parameter(1), sharding={mesh_split=[(y,x), _] metadata={op_name=\"q\"}}\n"
                     "  ROOT t = (f32[8,16], f32[8,16]) tuple(p, q), sharding={{mesh_split=[_, y]}, {replicated}}\n}\n")
    assert m.attrs["mesh"] == Mesh(("x", "y"), (2, 4))
    comp = m.entry
    # devices = arange(8).reshape(2,4): x splits dim 0, y (size 4) replicates
    assert comp.instruction("p").sharding == iota([2, 1, 4], types=("replicated",))
    # (y, x) major to minor: devices transposed to [y, x] and flattened
    assert comp.instruction("q").sharding == H.tiled(TileAssignment.explicit([8, 1], [0, 4, 1, 5, 2, 6, 3, 7]))
    assert comp.instruction("q").sharding.metadata == (KeyValueList((("op_name", "q"),), " "),)
    assert comp.root.sharding == H.tuple([H.tiled(TileAssignment.explicit([1, 4, 2], [0, 4, 1, 5, 2, 6, 3, 7]),
                                                  ("replicated",)), H.replicate()])


def test_mesh_with_explicit_device_order():
    m = parse_module("HloModule m, mesh={x=2, y=4, devices=[0,2,4,6,1,3,5,7]}\n\nENTRY main {\n"
                     "  ROOT p = f32[8,16] parameter(0), sharding={mesh_split=[x, y]}\n}\n")
    assert m.attrs["mesh"].device_ids == (0, 2, 4, 6, 1, 3, 5, 7)
    assert m.entry.root.sharding == H.tiled(TileAssignment.explicit([2, 4], [0, 2, 4, 6, 1, 3, 5, 7]))


# ---- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, line, column, message", [
    ("ENTRY e {\n  p = f32[2] parameter(0\n}\n", 3, 1, "expected ')', found '}'"),
    ("ENTRY e {\n  ROOT a = f32[8] \n}\n", 3, 1, "expected an opcode, found '}'"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0) $\n}\n", 2, 32, "expected ',', '}' or a name, found '$'"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), 3\n}\n", 2, 33, "expected an attribute (name=value), found '3'"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0)\n", 2, 31, "expected ',', 'ROOT', '}' or a name, found end of input"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0) /* never closed\n}\n", 2, 32, "unterminated /* comment"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), padding=1x1\n}\n", 2, 41,
     "expected ',', '}', a name or padding such as 0_0x1_1, found '1'"),
    ("", 1, 1, "expected 'ENTRY', 'HloModule', a name or a stack frame table, found end of input"),
])
def test_syntax_errors_are_located_and_readable(text, line, column, message):
    e = error(text)
    assert (e.line, e.column) == (line, column)
    assert e.bare_message.startswith(message)
    lark_names = {t.name for t in parser_module._lark().terminals}
    assert not set(re.findall(r"[A-Z_$][A-Z0-9_]+", re.sub(r"'[^']*'", "", e.bare_message))) & \
        (lark_names | {"$END"})


@pytest.mark.parametrize("text, line, column, message", [
    ("ENTRY e {\n  ROOT a = f32[2] negate(q)\n}\n", 2, 26, "operand 'q' is not defined in computation 'e'"),
    ("ENTRY e {\n  a = f32[2] negate(q)\n  ROOT q = f32[2] parameter(0)\n}\n", 2, 21,
     "operand 'q' is defined after its use"),
    ("ENTRY e {\n  a = f32[2] parameter(0)\n  a = f32[2] negate(a)\n}\n", 3, 3,
     "duplicate instruction name 'a' in computation 'e'"),
    ("c {\n  ROOT p = f32[] parameter(0)\n}\nc {\n  ROOT p = f32[] parameter(0)\n}\n", 4, 1,
     "duplicate computation name 'c'"),
    ("ENTRY e {\n  a = f32[2] parameter(0)\n  ROOT r = f32[] call(a), to_apply=nope\n}\n", 3, 36,
     "computation 'nope' is not defined"),
    ("ENTRY a {\n  ROOT p = f32[] parameter(0)\n}\nENTRY b {\n  ROOT p = f32[] parameter(0)\n}\n", 4, 1,
     "second ENTRY computation 'b' (the entry is 'a')"),
    ("ENTRY e {\n  ROOT a = f32[] parameter(0)\n  ROOT b = f32[] negate(a)\n}\n", 3, 3,
     "second ROOT in computation 'e' (the root is 'a')"),
    ("ENTRY e {\n  ROOT c = s32[2,2] constant({{1,2},{3}})\n}\n", 2, 30, "literal has 3 elements, shape s32[2,2] has 4"),
    ("ENTRY e {\n  ROOT c = s32[2,2] constant({1,2,3,4})\n}\n", 2, 30, "literal nesting does not match"),
    # a huge shape with a short literal is refused by its count, not by building its skeleton
    ("ENTRY e {\n  ROOT c = f16[4294967296] constant({0.5, 1.0})\n}\n", 2, 37,
     "literal has 2 elements, shape f16[4294967296] has 4294967296"),
    ("ENTRY e {\n  ROOT c = s8[2] constant({1, 200})\n}\n", 2, 27, "200 is out of range for s8"),
    ("ENTRY e {\n  ROOT c = (s32[], s32[]) constant((1))\n}\n", 2, 36, "expected a tuple literal of 2 elements"),
    ("ENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] negate(f32[3] a)\n}\n", 3, 33,
     "operand 'a' has shape f32[2], not f32[3]"),
    ("ENTRY e {\n  ROOT a = f32[8,<=8] parameter(0)\n}\n", 2, 18, "dynamic dimension '<=8' is not supported"),
    ("ENTRY e {\n  ROOT a = f32[?] parameter(0)\n}\n", 2, 16, "dynamic dimension '?' is not supported"),
    ("ENTRY e {\n  ROOT a = f8e4m3fn[8] parameter(0)\n}\n", 2, 12, "element type f8e4m3fn is not supported"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), sharding={devices=[3]0,1}\n}\n", 2, 43,
     "invalid sharding: tile assignment dims [3] need 3 devices"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), sharding={replicated device=1}\n}\n", 2, 42,
     "'device=' belongs to a maximal sharding"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), sharding={mesh_split=[x]}\n}\n", 2, 42,
     "mesh_split= needs a mesh={...} header attribute"),
    ("HloModule m, mesh={x=2}\nENTRY e {\n  ROOT a = f32[8] parameter(0), sharding={mesh_split=[z]}\n}\n", 3, 42,
     "unknown mesh axes ['z']"),
    ("HloModule m, mesh={x=2}, num_partitions=4\nENTRY e {\n  ROOT a = f32[8] parameter(0)\n}\n", 1, 14,
     "the mesh has 2 devices but num_partitions=4"),
    ("HloModule m, num_partitions=two\nENTRY e {\n  ROOT a = f32[8] parameter(0)\n}\n", 1, 29,
     "num_partitions must be a positive integer"),
    ("ENTRY e {\n  a = f32[8] parameter(0)\n  b = f32[9] parameter(1)\n  ROOT c = add(a, b)\n}\n", 4, 12,
     "cannot infer the shape of 'c'"),
    ("ENTRY e (p: f32[8]) -> f32[9] {\n  ROOT a = f32[8] parameter(0)\n}\n", 1, 9,
     "computation 'e' returns f32[8], its signature says f32[9]"),
    ("c {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=c\n}\n", 3, 36,
     "computation 'c' calls itself"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), control-predecessors={%z}\n}\n", 2, 33,
     "control predecessor 'z' is not defined"),
    ("ENTRY e {\n  p = f32[8] parameter(0)\n  ROOT c = f32[8] reduce-window(p, p), window={size=3 stride=1x1}\n}\n",
     3, 55, "window field stride= has 2 dimensions, size= has 1"),
    ("ENTRY e {\n  ROOT a = f32[8] parameter(0), index=1, index=2\n}\n", 2, 48, "attribute 'index' given twice"),
    ("ENTRY e {\n  a = f32[8] parameter(0)\n  ROOT c = f32[8] all-reduce(a), replica_groups=[2,3]<=[4]\n}\n",
     3, 34, "invalid replica groups"),
])
def test_semantic_errors_are_located(text, line, column, message):
    e = error(text)
    assert (e.filename, e.line, e.column) == ("t.hlo", line, column)
    assert e.bare_message.startswith(message), e.bare_message


def test_error_text_shows_file_line_column_source_and_caret():
    e = error("ENTRY e {\n  ROOT a = f32[2] negate(q)\n}\n")
    assert str(e) == ("t.hlo:2:26: operand 'q' is not defined in computation 'e'\n"
                      "  ROOT a = f32[2] negate(q)\n"
                      "                         ^")


def test_parse_sharding_rejects_mesh_split_and_bad_text():
    with pytest.raises(HloSyntaxError, match="mesh_split= needs a module"):
        parse_sharding("{mesh_split=[x]}")
    with pytest.raises(HloSyntaxError, match="<sharding>:1:13: expected end of input"):
        parse_sharding("{replicated}}")


def test_parse_file_names_the_file(tmp_path):
    path = tmp_path / "bad.hlo"
    path.write_text("ENTRY e {\n  ROOT a = f32[2] negate(q)\n}\n")
    with pytest.raises(HloSyntaxError, match=r"bad\.hlo:2:26: "):
        parse_file(path)
    path.write_text(entry("  ROOT p = f32[] parameter(0)"))
    assert parse_file(path).name == "m"


def test_every_grammar_rule_has_a_callback():
    lark = parser_module._lark()
    records = Records
    for rule in lark.rules:
        name = rule.alias or rule.origin.name
        if name.startswith("_") or (rule.options.expand1 and len(rule.expansion) == 1):
            continue
        assert hasattr(records, name), name


def test_any_unknown_attribute_value_parses_verbatim():
    x = inst("x = f32[2] custom-call(p), a=x:y, b=-inf, c=1.5e3x, d=<q>, e=[1,{2}](3), f=p/q, g=#t<[\"s\"]>",
             "  p = f32[2] parameter(0)")
    assert x.attrs == {"a": RawAttr("x:y"), "b": RawAttr("-inf"), "c": RawAttr("1.5e3x"), "d": RawAttr("<q>"),
                       "e": RawAttr("[1,{2}](3)"), "f": RawAttr("p/q"), "g": RawAttr('#t<["s"]>')}


@pytest.mark.parametrize("attribute", [
    'domain={kind="sharding", entry={devices=[2,2]<=[4] last_tile_dim_replicate}, '
    'exit={replicated}}',
    "foo={x=[2] abc}",
    "foo={[1,2] replicated, (3) maximal}",
    "foo={d=[2]1,0 ROOT ENTRY FileNames 7}",
])
def test_a_word_after_a_nested_group_in_an_attribute_value(attribute):
    # found by fuzzing: right after a nested group the lexer took a word for an instruction
    # name, so XLA's own domain attribute (`entry={devices=[2,2]<=[4] last_tile_dim_replicate}`)
    # failed to parse, as did an integer there (`devices=[2,2]1,0,3,2`)
    text = f"""HloModule m
ENTRY e {{
  p = f32[4] parameter(0)
  ROOT d = f32[4] domain(p), {attribute}
}}"""
    module = parse_module(text)
    assert print_module(module).count(attribute) == 1
    assert parse_module(print_module(module)).difference(module) is None
