"""The paper-scale Transformer (`gspmdc transformer`): small instances compute what the
unpartitioned program computes; the bytes the cost analysis counts equal the closed form of the
2-D sharding on several meshes; the partitioned program does not grow with the devices."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.passes.analysis.cost import program_cost
from gspmdc.passes.analysis.machine import PRESETS
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.transformer import TransformerConfig, sharding_bytes_per_device, transformer_hlo

from spmd_partition_helpers import assert_close, inputs_for, partition, reference, run_global


def _small(x: int, y: int, layers: int = 2) -> TransformerConfig:
    return TransformerConfig(layers=layers, width=16, heads=4, hidden=32, batch=4, sequence=8,
                             mesh_x=x, mesh_y=y, element_type="f32")


@pytest.mark.parametrize("mesh", [(2, 2), (1, 4), (4, 1)])
def test_small_transformer_matches_the_unpartitioned_program(mesh):
    text = transformer_hlo(_small(*mesh))
    n = mesh[0] * mesh[1]
    spmd = partition(text, n, propagate=True)
    inputs = inputs_for(text)
    assert_close(run_global(spmd, inputs, n), reference(text, inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mesh", [(2, 2), (2, 4), (4, 2), (1, 8), (8, 1), (4, 4)])
def test_bytes_per_device_are_what_the_sharding_predicts(mesh):
    config = TransformerConfig(layers=3, width=32, heads=8, hidden=64, batch=8, sequence=4,
                               mesh_x=mesh[0], mesh_y=mesh[1])
    n = config.devices
    figures = program_cost(compile_spmd(api.parse(transformer_hlo(config)), n), n,
                           PRESETS["tpu-v3"]).figures
    by_kind: dict[str, int] = {}
    for c in figures.collectives:
        assert len(set(c.bytes_sent_per_device)) == 1        # every device alike
        by_kind[c.opcode] = by_kind.get(c.opcode, 0) + c.bytes_sent_per_device[0]
    predicted = {k: v for k, v in sharding_bytes_per_device(config).items() if v}
    assert by_kind == predicted


def test_partitioned_program_does_not_grow_with_the_devices():
    sizes = set()
    for x, y in ((2, 4), (8, 16), (32, 64)):
        config = TransformerConfig(layers=4, width=4096, heads=64, hidden=16384, batch=64,
                                   sequence=512, mesh_x=x, mesh_y=y)
        spmd = compile_spmd(api.parse(transformer_hlo(config)), config.devices)
        sizes.add(sum(1 for _ in spmd.all_instructions()))
    assert len(sizes) == 1


def test_memory_per_device_falls_with_the_devices():
    peaks = {}
    for x, y in ((8, 16), (16, 32)):
        config = TransformerConfig(layers=256, width=8192, heads=128, hidden=32768, batch=64,
                                   sequence=1024, mesh_x=x, mesh_y=y)
        spmd = compile_spmd(api.parse(transformer_hlo(config)), config.devices)
        peaks[config.devices] = program_cost(spmd, config.devices,
                                             PRESETS["tpu-v3"]).memory.peak_bytes
    assert peaks[512] * 512 == pytest.approx(peaks[128] * 128, rel=0.02)


def test_configurations_that_do_not_split_evenly_are_refused():
    with pytest.raises(GspmdcError, match="heads 6 is not a multiple of 4"):
        transformer_hlo(TransformerConfig(1, 24, 6, 48, 4, 8, 2, 4))


def test_cli_writes_a_module(tmp_path):
    out = tmp_path / "t.hlo"
    done = subprocess.run([sys.executable, "-m", "gspmdc", "transformer", "--layers", "2",
                           "--width", "64", "--heads", "4", "--batch", "4", "--sequence", "16",
                           "--mesh", "2x2", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    module = api.load(out)
    assert module.num_partitions == 4 and module.attrs["mesh"].axis_names == ("x", "y")
    bad = subprocess.run([sys.executable, "-m", "gspmdc", "transformer", "--mesh", "2by2"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "expected XxY" in bad.stderr
