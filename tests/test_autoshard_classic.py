"""Classic sharding results autoshard must find by itself on the modelled machine: data
parallelism for a small MLP with a large batch, Megatron's column then row split of a 2-layer
MLP on a model axis, and 2-D sharding of a Transformer layer on a 2-D mesh when its replicated
weights exceed the memory limit. Each expected layout is written by hand here."""
from __future__ import annotations

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.parser import parse_module
from gspmdc.passes.autoshard import autoshard

import autoshard_models


def planned(text: str, mesh: Mesh, **options):
    module = parse_module(text)
    result = autoshard(module, mesh, **options)
    assert result.fits and result.solution.status == "optimal"
    return result, {i.name: i.sharding.to_text(False) for i in module.entry.instructions}


def test_a_small_mlp_with_a_large_batch_is_data_parallel():
    result, s = planned(autoshard_models.mlp(1024, 64, 64), Mesh(["x", "y"], [2, 4]))
    batch_on_all_devices = "{devices=[8,1]<=[8]}"
    for name in ("x", "h", "a", "y"):
        assert s[name] == batch_on_all_devices, name
    for name in ("w1", "b1", "w2"):
        assert s[name] == "{replicated}", name


def test_a_two_layer_mlp_on_a_model_axis_is_megatron_column_then_row():
    result, s = planned(autoshard_models.mlp(8, 1024, 4096), Mesh(["model"], [4]))
    assert s["x"] == "{replicated}"
    assert s["w1"] == "{devices=[1,4]<=[4]}"        # columns: each device a quarter of f
    assert s["b1"] == "{devices=[4]<=[4]}"
    assert s["h"] == s["a"] == "{devices=[1,4]<=[4]}"
    assert s["w2"] == "{devices=[4,1]<=[4]}"        # rows: each device the matching quarter
    # the row-split dot leaves partial sums: one reduction over the model axis
    # (a reduce-scatter, since the output is free to stay sharded)
    assert s["y"] in ("{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", "{replicated}")


def test_megatron_with_a_batch_axis_pinned_keeps_the_weights_on_the_model_axis():
    batch_on_data = ", sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    result, s = planned(autoshard_models.mlp(16, 1024, 4096, batch_on_data),
                        Mesh(["data", "model"], [2, 4]))
    column_on_model = "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    row_on_model = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert s["w1"] == column_on_model and s["w2"] == row_on_model
    assert s["h"] == s["a"] == "{devices=[2,4]<=[8]}"   # batch on data, hidden on model


def test_a_transformer_layer_under_a_memory_limit_is_sharded_along_both_mesh_axes():
    b, s_, d, heads, f = 8, 64, 256, 4, 1024
    weights = (4 * d * d + 2 * d * f) * 4
    limit = 3 * 2**19                                   # 1.5 MiB: half the replicated weights
    assert weights >= 2 * limit
    result, s = planned(autoshard_models.transformer_layer(b, s_, d, heads, f),
                        Mesh(["x", "y"], [2, 4]), memory_per_device=limit)
    assert result.peak_bytes <= limit
    for name in ("wq", "wk", "wv", "wo", "w1", "w2"):
        assert s[name] != "{replicated}", name
    # the MLP: batch on x, hidden dim on y (w1 by columns and w2 by rows on y, Megatron within
    # data parallelism)
    assert s["f1"] == s["g"] == "{devices=[2,1,4]<=[8]}"
    assert s["w1"] == "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert s["w2"] == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
