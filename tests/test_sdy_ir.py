"""The Shardy form in the IR: `xla.sdy.*` attributes parse to typed values, print back to the same
text, convert to the HloShardings JAX printed beside them, and bad ones are reported at their
position."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.errors import HloSyntaxError
from gspmdc.ir import sdy
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sdy_hlo import from_hlo, to_hlo
from gspmdc.ir.sdy_text import read_frontend_value
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.tile_assignment import TileAssignment

from spmd_helpers import SHARED

DATA = Path(__file__).parent / "data" / "shardy"
DUMPS = sorted(DATA.glob("*.hlo")) + sorted((SHARED / "jax-programs").glob("*/program_shardy.hlo"))


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_dump_round_trips_exactly(path):
    text = path.read_text()
    module = api.parse(text, str(path))
    printed = api.to_text(module)
    assert api.parse(printed).difference(module) is None
    # every xla.sdy attribute is printed back character for character
    import re
    attrs = re.compile(r'xla\.sdy\.\w+=(?:"(?:[^"\\]|\\.)*"|\{[^\n]*?\}\})')
    assert sorted(attrs.findall(printed)) == sorted(attrs.findall(text))


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_dump_survives_a_pickle_round_trip(path):
    """`run` copies the module and sends the job to MPI ranks by pickling: meshes included."""
    import pickle
    module = api.parse(path.read_text(), str(path))
    assert pickle.loads(pickle.dumps(module)).difference(module) is None


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shardy_shardings_convert_to_jaxs_hlo_shardings(path):
    """JAX prints each Shardy sharding next to its HloSharding: the conversion must agree, and
    converting back gives the sharding with its dimensions closed."""
    module = api.load(path)
    meshes = sdy.module_meshes(module)
    checked = 0
    for _, inst in module.all_instructions():
        shardings = sdy.instruction_shardings(inst)
        if shardings is None or inst.sharding is None or len(shardings) != 1:
            continue
        (sharding,), (leaf,) = shardings, list(inst.shape.leaves())
        mesh = sdy.resolve_mesh(sharding, meshes)
        assert to_hlo(sharding, mesh) == inst.sharding, inst.name
        closed = sharding.with_dims(sdy.DimSharding(d.axes) for d in sharding.dims)
        assert from_hlo(inst.sharding, mesh, leaf.rank, sharding.mesh) == closed, inst.name
        checked += 1
    assert checked or "shard_map" in path.name or "handwritten" in path.name


def _ts(*dims, replicated=(), unreduced=()):
    def axes(names):
        return tuple(sdy.AxisRef(*n) if isinstance(n, tuple) else sdy.AxisRef(n) for n in names)
    return sdy.TensorSharding("mesh", tuple(sdy.DimSharding(axes(d)) for d in dims),
                              axes(replicated), axes(unreduced))


def test_sub_axes_tile_the_devices_as_a_reshaped_mesh():
    mesh = Mesh(["x", "y"], [2, 4])
    # y split into y:(1)2 (major) and y:(2)2 (minor); dim 0 takes y:(2)2 then x; y:(1)2 replicates
    hlo = to_hlo(_ts([("y", 2, 2), "x"], []), mesh)
    devices = np.arange(8).reshape(2, 2, 2)           # [x, y_major, y_minor]
    expected = devices.transpose(2, 0, 1).reshape(4, 1, 2)
    assert hlo == HloSharding.tiled(TileAssignment.from_array(expected), ("replicated",))
    assert from_hlo(hlo, mesh, 2, "mesh") == _ts([("y", 2, 2), "x"], [])


def test_unreduced_and_manual_axes_become_subgroups():
    mesh = Mesh(["x", "y", "z"], [2, 2, 2])
    hlo = to_hlo(_ts(["x"], unreduced=["z"]), mesh, manual_axes=("y",))
    devices = np.arange(8).reshape(2, 2, 2)
    expected = devices.transpose(0, 1, 2).reshape(2, 2, 2)   # dim x, manual y, unreduced z
    assert hlo == HloSharding.tiled(TileAssignment.from_array(expected), ("manual", "unreduced"))


def test_device_order_of_the_mesh_is_kept():
    mesh = Mesh(["a"], [4], [3, 2, 1, 0])
    assert to_hlo(_ts(["a"]), mesh) == HloSharding.tiled(TileAssignment.from_array([3, 2, 1, 0]))
    assert from_hlo(to_hlo(_ts(["a"]), mesh), mesh, 1, "m") == \
        sdy.TensorSharding("m", (sdy.DimSharding((sdy.AxisRef("a"),)),))


def test_hlo_sharding_not_over_the_mesh_has_no_named_form():
    mesh = Mesh(["x", "y"], [2, 4])
    odd = HloSharding.tiled(TileAssignment.from_array([0, 3, 1, 2, 4, 5, 6, 7]))
    assert from_hlo(odd, mesh, 1, "mesh") is None


@pytest.mark.parametrize("raw", [
    '"#sdy.sharding<@mesh, [{\\"x\\", ?}p1, {}p0, {\\"y\\":(2)2}], replicated={\\"z\\"}>"',
    '"#sdy.sharding_per_value<[<@mesh, [{?}]>, <mesh<[\\"a\\"=2]>, [{\\"a\\"}]>]>"',
    '"#sdy<manual_axes{\\"x\\", \\"y\\"}>"',
    '"#sdy.op_sharding_rule<([i, k], [kj])->([i, j]) {i=8, j=16, k=32} reduction={k}>"',
    '"0 : i64"',
    '"#sdy<propagation_direction FORWARD>"',
])
def test_attribute_text_round_trips(raw):
    prefixes = {'"#sdy<m': sdy.MANUAL_AXES, '"#sdy.op': sdy.SHARDING_RULE,
                '"0 : i': sdy.SHARDING_GROUP_ID, '"#sdy<p': sdy.ALLOWED_DIRECTION}
    key = next((k for p, k in prefixes.items() if raw.startswith(p)), sdy.SHARDING)
    assert read_frontend_value(key, raw).kv_text() == raw


def test_open_closed_and_priorities_are_read():
    value = read_frontend_value(sdy.SHARDING, '"#sdy.sharding<@m, [{\\"x\\", ?}p2, {}]>"')
    first, second = value.sharding.dims
    assert (first.axes, first.closed, first.priority) == ((sdy.AxisRef("x"),), False, 2)
    assert (second.axes, second.closed, second.priority) == ((), True, None)


MODULE = '''HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}

ENTRY main {
  p = f32[8,16] parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}, {}]>"}
  ROOT r = f32[8,16] copy(p)%s
}
'''


@pytest.mark.parametrize("attr, message, column", [
    (', frontend_attributes={xla.sdy.shardings="x"}', "unknown Shardy attribute "
     "'xla.sdy.shardings'", 52),
    (', frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\" {}]>"}',
     "expected ','", 99),
    (', frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"w\\"}, {}]>"}',
     'unknown axis "w"', 69),
    (', frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}]>"}',
     "1 dimensions for a rank-2 value", 69),
    (', frontend_attributes={xla.sdy.sharding="#sdy.sharding<@other, [{}, {}]>"}',
     "unknown mesh @other", 69),
    (', frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\", \\"x\\"}, {}]>"}',
     'used twice', 69),
    (', frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"y\\":(1)3}, {}]>"}',
     "does not divide", 69),
])
def test_bad_shardy_attributes_are_reported_where_they_are(attr, message, column):
    with pytest.raises(HloSyntaxError) as e:
        api.parse(MODULE % attr, "m.hlo")
    assert message in str(e.value)
    assert (e.value.line, e.value.column) == (5, column)


def test_unknown_shardy_custom_call_is_named():
    text = MODULE % "" + ""
    text = text.replace("copy(p)", 'custom-call(p), custom_call_target="xla.sdy.Frobnicate"')
    with pytest.raises(HloSyntaxError) as e:
        api.parse(text, "m.hlo")
    assert "unknown Shardy custom-call 'xla.sdy.Frobnicate'" in str(e.value)


def test_unknown_module_shardy_attribute_is_named():
    text = MODULE.replace("xla.sdy.meshes={", 'xla.sdy.meshez="1", xla.sdy.meshes={') % ""
    with pytest.raises(HloSyntaxError) as e:
        api.parse(text, "m.hlo")
    assert "unknown Shardy module attribute 'xla.sdy.meshez'" in str(e.value)
    assert e.value.line == 1
