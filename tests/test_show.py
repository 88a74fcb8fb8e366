"""`gspmdc show`: tile ranges (uneven ones with their padding), the devices of each tile worked
out by hand from the tile assignments, mesh axis names, any rank, and the CLI's errors."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.parser import parse_sharding, parse_shape
from gspmdc.sharding_picture import describe_value, device_list, dim_tiles, mesh_mapping

EXAMPLES = Path(__file__).resolve().parents[1] / "gspmdc" / "examples"


def _cells(lines: list[str]) -> list[list[str]]:
    """The device lists of each grid row (text between the box bars)."""
    rows = []
    for line in lines:
        if "│" in line:
            rows.append([cell.strip() for cell in line.split("│")[1:-1]])
    return rows


def test_uneven_tiles_carry_their_padding():
    tiles = dim_tiles(10, 4)
    assert [tiles.label(i) for i in range(4)] == ["[0:3)", "[3:6)", "[6:9)", "[9:10) +2 pad"]
    tiles = dim_tiles(9, 8)
    assert tiles.label(4) == "[8:9) +1 pad" and tiles.label(5) == "empty (+2 pad)"
    assert dim_tiles(8, 1).label(0) == "[0:8)"


def test_device_lists_compress_runs():
    assert device_list([0, 1, 2, 3, 8]) == "0-3,8"
    assert device_list([0, 4]) == "0,4"
    assert device_list([5, 4, 3]) == "5,4,3"


def test_rank_3_value_draws_one_grid_per_leading_tile():
    # devices=[2,2,2]<=[8]: tile (i, j, k) is held by device 4i + 2j + k
    lines = describe_value("v", parse_shape("f32[4,6,8]"), parse_sharding("{devices=[2,2,2]<=[8]}"),
                           8)
    assert "dim 0 [0:2):" in "\n".join(lines) and "dim 0 [2:4):" in "\n".join(lines)
    assert _cells(lines) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]


def test_partial_replication_names_every_holder_and_the_mesh_axes():
    mesh = Mesh(("x", "y"), (2, 4))
    # w1 of the MLP example: columns split over y, replicated over x
    lines = describe_value("w1", parse_shape("f32[64,256]"),
                           parse_sharding("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"),
                           8, mesh)
    text = "\n".join(lines)
    assert "dim 1 split 4 ways over mesh axis y" in text
    assert "each tile is held by 2 devices (mesh axis x)" in text
    assert _cells(lines) == [["0,4", "1,5", "2,6", "3,7"]]
    assert "per-device shard: f32[64,64]" in text


def test_mesh_mapping_finds_axes_and_their_order():
    mesh = Mesh(("x", "y"), (2, 4))
    assert mesh_mapping(mesh.sharding([("y", "x"), None]), mesh, 2) == ([("y", "x"), ()], ())
    assert mesh_mapping(mesh.sharding(["x", None]), mesh, 2) == ([("x",), ()], ("y",))
    # device = 4x + y; tile t = 2y + x when dim 0 is split over (y, x)
    assert mesh_mapping(parse_sharding("{devices=[8,1]0,4,1,5,2,6,3,7}"), mesh, 2) == \
        ([("y", "x"), ()], ())
    assert mesh_mapping(parse_sharding("{devices=[8,1]0,2,4,6,1,3,5,7}"), mesh, 2) is None


def test_uneven_value_shows_padded_tiles():
    lines = describe_value("u", parse_shape("f32[10,13]"), parse_sharding("{devices=[4,2]<=[8]}"),
                           8)
    text = "\n".join(lines)
    assert "[9:10) +2 pad" in text and "[7:13) +1 pad" in text
    assert "(uneven: padded)" in text and "per-device shard: f32[3,7]" in text
    assert _cells(lines) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]


def test_words_for_unsplit_values_and_tuples():
    shape = parse_shape("(f32[4], s32[])")
    lines = describe_value("t", shape, parse_sharding("{{maximal device=3}, {replicated}}"), 4)
    text = "\n".join(lines)
    assert "t{0}: f32[4]" in text and "device 3 holds the whole value" in text
    assert "t{1}: s32[]" in text and "every device (0-3) holds the whole value" in text
    manual = describe_value("m", parse_shape("f32[4]"), parse_sharding("{manual}"), 4)
    assert "each device holds its own value" in "\n".join(manual)


def test_partitioned_module_shows_per_device_shapes():
    lines = describe_value("x", parse_shape("f32[8,64]"),
                           parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"), 8,
                           per_device_shape=True)
    assert "per-device shape: f32[8,64]" in "\n".join(lines)
    assert "[8:16)" in "\n".join(lines)


def _show(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gspmdc", "show", *args], capture_output=True,
                          text=True)


def test_cli_draws_parameters_and_result_by_default():
    done = _show(str(EXAMPLES / "mlp.hlo"), "--mesh", "x=2,y=4", "--color", "never")
    assert done.returncode == 0, done.stderr
    heads = re.findall(r"^(\w+): ", done.stdout, re.MULTILINE)
    assert heads == ["x", "w1", "b1", "w2", "y"]
    assert "\x1b[" not in done.stdout
    coloured = _show(str(EXAMPLES / "mlp.hlo"), "h", "--color", "always")
    assert "\x1b[48;5;" in coloured.stdout          # propagation gave h a sharding


def test_cli_names_the_axes_of_a_shardy_mesh():
    # JAX's default dump declares its mesh in xla.sdy.meshes (x=2, y=4), not in a mesh= header;
    # x.1 is [{"x"}, {}]: rows split over x, each row tile held by the 4 devices along y
    done = _show(str(EXAMPLES / "jax_mlp.hlo"), "x.1", "--color", "never")
    assert done.returncode == 0, done.stderr
    assert "dim 0 split 2 ways over mesh axis x; dim 1 whole" in done.stdout
    assert "held by 4 devices (mesh axis y)" in done.stdout


def test_cli_errors_are_clear():
    done = _show(str(EXAMPLES / "mlp.hlo"), "hh")
    assert done.returncode == 2 and "no instruction named 'hh' (did you mean h" in done.stderr
    done = _show(str(EXAMPLES / "mlp.hlo"), "--mesh", "x=3,y=4")
    assert done.returncode == 2 and "has 12 devices, the program runs on 8" in done.stderr
    done = _show(str(EXAMPLES / "mlp.hlo"), "--mesh", "x2")
    assert done.returncode == 2 and "axis=size" in done.stderr
