"""Regenerate the JAX dumps in this folder (needs jax==0.10.2; not run by the tests).

    .venv/bin/python tests/data/shardy/generate.py

Each program is lowered with `jax.jit(...).lower(...).as_text(dialect="hlo")`, JAX's default
(Shardy) form, on 8 CPU devices, and written as `<name>.hlo`. The hand-written modules
(`handwritten_*.hlo`: priorities, sub-axes, explicit replication) are not touched. The
tutorial's example, `gspmdc/examples/jax_mlp.hlo`, is written too. The shard_map programs are
lowered once more with Shardy turned off (`jax_use_shardy_partitioner=False`, JAX's GSPMD form)
into `gspmd/<name>.hlo`.
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import shard_map  # noqa: E402
from jax.experimental.shard_alike import shard_alike  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = Path(__file__).resolve().parent
MESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
EXPLICIT = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)


def named(*spec):
    return NamedSharding(MESH, P(*spec))


def shard_map_psum_ppermute(a, b):
    def body(a, b):
        s = jax.lax.psum(a @ b, "y")
        return jax.lax.ppermute(s, "x", [(0, 1), (1, 0)])
    return shard_map(body, mesh=MESH, in_specs=(P("x", "y"), P("y", None)),
                     out_specs=P("x", None))(a, b)


def shard_map_all_to_all(a):
    def body(a):
        return jax.lax.all_to_all(a, "x", 0, 1, tiled=True) * 2
    return shard_map(body, mesh=MESH, in_specs=P("x", None), out_specs=P(None, "x"),
                     axis_names={"x"})(a)


def shard_map_manual_all_to_all(a):
    def body(a):
        return jax.lax.all_to_all(a, "y", 1, 0, tiled=True) + 1
    return shard_map(body, mesh=MESH, in_specs=P("x", "y"), out_specs=P(("x", "y"), None))(a)


def shard_map_two_outputs(a):
    def body(a):
        total = jax.lax.psum(a.sum(axis=0), ("x", "y"))
        gathered = jax.lax.all_gather(a, "y", axis=1, tiled=True)
        return total, gathered
    return shard_map(body, mesh=MESH, in_specs=P("x", "y"), out_specs=(P(), P("x", None)), check_vma=False)(a)


def shard_map_psum_scatter(a):
    def body(a):
        return jax.lax.psum_scatter(a, "y", scatter_dimension=0, tiled=True)
    return shard_map(body, mesh=MESH, in_specs=P(None, "x"), out_specs=P("y", "x"))(a)


def open_dims(a, b):
    c = a @ b
    c = jax.lax.with_sharding_constraint(c, named("x", P.UNCONSTRAINED))
    return jnp.tanh(c)


def sharding_groups(a, b):
    x = a * 2
    y = jnp.sin(b.T)
    x2, y2 = shard_alike(x[:8, :], y)
    return x2 + y2


def unreduced(a, b):
    c = jnp.einsum("ij,jk->ik", a, b, out_sharding=P("x", None, unreduced={"y"}))
    return jax.sharding.reshard(c, P("x", None))


def while_loop(w, x):
    def step(i, h):
        h = jnp.tanh(h @ w)
        return jax.lax.with_sharding_constraint(h, named("x", "y"))
    return jax.lax.fori_loop(0, 3, step, x)


def mlp_out_shardings(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    return (h @ w2).sum(axis=1), h


def jax_mlp(x, w1, w2):
    """The tutorial's example (written to gspmdc/examples/jax_mlp.hlo)."""
    h = jax.nn.relu(x @ w1)
    h = jax.lax.with_sharding_constraint(h, named("x", "y"))
    return h @ w2


def reshape_split(x):
    return (x.reshape(2, 4, 16) * 3).sum(axis=2)


def softmax_rows(x):
    return jax.nn.softmax(x, axis=-1)


def _f32(*shape):
    return jnp.ones(shape, jnp.float32)


PROGRAMS = {
    "shard_map_psum_ppermute": (shard_map_psum_ppermute, (_f32(16, 32), _f32(32, 8)),
                                dict(in_shardings=(named("x", "y"), named("y", None)))),
    "shard_map_all_to_all": (shard_map_all_to_all, (_f32(16, 32),),
                             dict(in_shardings=named("x", "y"))),
    "shard_map_partial_all_to_all": (shard_map_all_to_all, (_f32(16, 32),),
                                     dict(in_shardings=named("x", None))),
    "shard_map_manual_all_to_all": (shard_map_manual_all_to_all, (_f32(16, 32),), {}),
    "shard_map_two_outputs": (shard_map_two_outputs, (_f32(16, 32),), {}),
    "shard_map_psum_scatter": (shard_map_psum_scatter, (_f32(32, 16),), {}),
    "open_dims": (open_dims, (_f32(16, 32), _f32(32, 8)), {}),
    "sharding_groups": (sharding_groups, (_f32(16, 32), _f32(32, 8)),
                        dict(in_shardings=(named("x", "y"), None))),
    "while_loop": (while_loop, (_f32(32, 32), _f32(16, 32)),
                   dict(in_shardings=(named(None, "y"), named("x", None)))),
    "mlp_out_shardings": (mlp_out_shardings, (_f32(16, 64), _f32(64, 128), _f32(128, 32)),
                          dict(in_shardings=(named("x", None), named(None, "y"),
                                             named("y", None)),
                               out_shardings=(named("x"), named("x", "y")))),
    "reshape_split": (reshape_split, (_f32(8, 16),), dict(in_shardings=named(("x", "y"), None))),
    "softmax_rows": (softmax_rows, (_f32(16, 24),), dict(in_shardings=named("x", "y"))),
}


def main() -> None:
    for name, (fn, args, kwargs) in PROGRAMS.items():
        text = jax.jit(fn, **kwargs).lower(*args).as_text(dialect="hlo")
        (HERE / f"{name}.hlo").write_text(text)
        print("wrote", name)
    example = jax.jit(jax_mlp, in_shardings=(named("x", None), named(None, "y"), named("y", None)),
                      out_shardings=named("x", None))
    text = example.lower(_f32(16, 64), _f32(64, 256), _f32(256, 64)).as_text(dialect="hlo")
    (HERE.parents[2] / "gspmdc" / "examples" / "jax_mlp.hlo").write_text(text)
    print("wrote gspmdc/examples/jax_mlp.hlo")
    with jax.sharding.set_mesh(EXPLICIT):
        a = jax.device_put(_f32(16, 32), NamedSharding(EXPLICIT, P("x", "y")))
        b = jax.device_put(_f32(32, 8), NamedSharding(EXPLICIT, P("y", None)))
        (HERE / "unreduced.hlo").write_text(jax.jit(unreduced).lower(a, b).as_text(dialect="hlo"))
        print("wrote unreduced")
    jax.config.update("jax_use_shardy_partitioner", False)
    (HERE / "gspmd").mkdir(exist_ok=True)
    for name, (fn, args, kwargs) in PROGRAMS.items():
        if name.startswith("shard_map"):
            text = jax.jit(fn, **kwargs).lower(*args).as_text(dialect="hlo")
            (HERE / "gspmd" / f"{name}.hlo").write_text(text)
            print("wrote gspmd/" + name)


if __name__ == "__main__":
    main()
