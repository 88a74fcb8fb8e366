"""Export `transformer_layer.hlo`, a small pre-LayerNorm transformer layer in bf16 written with
JAX, with its inputs and XLA's outputs (jax 0.10.2, CPU): `python tests/data/bf16/make.py`.

The program (batch 2, sequence 16, model 64, 4 heads, MLP 256; bf16 weights and activations,
LayerNorm statistics and the softmax in f32, JAX's tanh GELU) carries Megatron shardings for 4
devices: the QKV and first MLP weights split by columns, the output projections by rows, so the
partitioned program all-reduces bf16 partial sums. Outputs: the layer's result (bf16) and the
same converted to f32.

Files written next to this script:
- `transformer_layer.hlo`: the module as JAX lowers it (GSPMD shardings);
- `inputs.npz`: `arg0..` in parameter order;
- `outputs_xla.npz`: XLA's outputs with its default flags (excess precision allowed), on one device;
- `outputs_xla_per_op.npz`: with `--xla_allow_excess_precision=false`, on one device;
- `outputs_xla_partitioned.npz`, `outputs_xla_partitioned_per_op.npz`: the same two on 4 devices,
  as XLA partitions the program.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCH, SEQ, MODEL, HEADS, MLP = 2, 16, 64, 4, 256


def layer(x, ln1, wqkv, wo, ln2, w1, w2):
    import jax
    import jax.numpy as jnp
    bf16, f32 = jnp.bfloat16, jnp.float32

    def layer_norm(v, gain):
        v32 = v.astype(f32)
        mean = v32.mean(-1, keepdims=True)
        var = ((v32 - mean) ** 2).mean(-1, keepdims=True)
        return ((v32 - mean) * jax.lax.rsqrt(var + 1e-5)).astype(bf16) * gain

    h = layer_norm(x, ln1)
    qkv = h @ wqkv                                               # [B, S, 3D]
    q, k, v = (t.reshape(BATCH, SEQ, HEADS, MODEL // HEADS) for t in jnp.split(qkv, 3, -1))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.asarray(MODEL // HEADS, bf16))
    weights = jax.nn.softmax(scores.astype(f32), axis=-1).astype(bf16)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(BATCH, SEQ, MODEL)
    x = x + attended @ wo
    y = x + jax.nn.gelu(layer_norm(x, ln2) @ w1) @ w2
    return y, y.astype(f32)


def inputs():
    import ml_dtypes
    import numpy as np
    rng = np.random.default_rng(2024)

    def normal(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16)
    return [normal((BATCH, SEQ, MODEL), 1.0), (1 + normal((MODEL,), 0.1)).astype(ml_dtypes.bfloat16),
            normal((MODEL, 3 * MODEL), MODEL ** -0.5), normal((MODEL, MODEL), MODEL ** -0.5),
            (1 + normal((MODEL,), 0.1)).astype(ml_dtypes.bfloat16),
            normal((MODEL, MLP), MODEL ** -0.5), normal((MLP, MODEL), MLP ** -0.5)]


def _specs():
    from jax.sharding import PartitionSpec as P
    return [P(), P(), P(None, "m"), P("m", None), P(), P(None, "m"), P("m", None)]


def export() -> None:
    """The HLO text and the inputs (run in a child with 4 devices)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    mesh = Mesh(np.array(jax.devices()[:4]), ("m",))
    shardings = [NamedSharding(mesh, s) for s in _specs()]
    args = inputs()
    text = jax.jit(layer, in_shardings=shardings).lower(*args).as_text(dialect="hlo")
    (HERE / "transformer_layer.hlo").write_text(text)
    np.savez(HERE / "inputs.npz", **{f"arg{i}": a for i, a in enumerate(args)})


def run(partitioned: bool, path: str) -> None:
    """XLA's outputs under this process's XLA_FLAGS (run in a child)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    args = inputs()
    if partitioned:
        mesh = Mesh(np.array(jax.devices()[:4]), ("m",))
        shardings = [NamedSharding(mesh, s) for s in _specs()]
        args = [jax.device_put(a, s) for a, s in zip(args, shardings)]
        outputs = jax.jit(layer, in_shardings=shardings)(*args)
    else:
        outputs = jax.jit(layer)(*args)
    np.savez(HERE / path, **{f"out{i}": np.asarray(o) for i, o in enumerate(outputs)})


def _child(what: str, excess: bool, *args: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
        "--xla_force_host_platform_device_count=4 "
        f"--xla_allow_excess_precision={'true' if excess else 'false'}"))
    subprocess.run([sys.executable, __file__, what, *args], env=env, check=True)


def main() -> None:
    if len(sys.argv) > 1:
        import jax
        jax.config.update("jax_use_shardy_partitioner", False)
        if sys.argv[1] == "export":
            export()
        else:
            run(sys.argv[2] == "partitioned", sys.argv[3])
        return
    _child("export", True)
    for excess, suffix in ((True, ""), (False, "_per_op")):
        _child("run", excess, "one-device", f"outputs_xla{suffix}.npz")
        _child("run", excess, "partitioned", f"outputs_xla_partitioned{suffix}.npz")


if __name__ == "__main__":
    main()
