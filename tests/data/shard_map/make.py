"""How the files beside this script were made (JAX 0.10.2 on CPU, 8 host devices, GSPMD mode):
a jitted function whose middle is a `shard_map` on a 2x4 mesh with `psum`, `ppermute`,
`all_to_all` and `axis_index` inside.

- `program.hlo`: `jax.jit(f).lower(...).as_text(dialect="hlo")`, the global program;
- `inputs.npz` / `outputs.npz`: the global inputs and JAX's outputs;
- `xla_spmd.hlo`: XLA's module right after its SPMD partitioner (per-device shapes).

Run with jax installed and the team's XLA oracle on the path (`../shared/xla-oracle`):
    python tests/data/shard_map/make.py
Not part of the test suite; the tests read the files only.
"""
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "shared" / "xla-oracle"))
import xla_oracle as xo  # noqa: E402

xo.init_jax(8)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import shard_map  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))


def f(a, w, b):
    h = jnp.tanh(a) @ w                                           # [16, 32], global

    def body(h, b):                                               # h [8, 8], b [8, 16]
        s = jax.lax.psum(h, "y")                                  # all-reduce over y
        r = jax.lax.ppermute(s, "x", [(0, 1), (1, 0)])            # collective-permute over x
        t = jax.lax.all_to_all(b, "y", 1, 0, tiled=True)          # [8, 16] -> [32, 4]
        i = jax.lax.axis_index("y").astype(jnp.float32)           # partition-id arithmetic
        return r * 2.0 + i, t * 3.0
    r, t = shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P("x", None)),
                     out_specs=(P("x", "y"), P("x", "y")))(h, b)
    return jnp.sin(r), t.sum(axis=1)


rng = np.random.default_rng(0)
a = rng.standard_normal((16, 24)).astype(np.float32)
w = rng.standard_normal((24, 32)).astype(np.float32)
b = rng.standard_normal((16, 16)).astype(np.float32)
jitted = jax.jit(f, in_shardings=(NamedSharding(mesh, P("x", None)),
                                  NamedSharding(mesh, P(None, "y")),
                                  NamedSharding(mesh, P("x", None))))
text = jitted.lower(a, w, b).as_text(dialect="hlo")
out = jitted(a, w, b)
(HERE / "program.hlo").write_text(text)
np.savez(HERE / "inputs.npz", arg0=a, arg1=w, arg2=b)
np.savez(HERE / "outputs.npz", out0=np.asarray(out[0]), out1=np.asarray(out[1]))
(HERE / "xla_spmd.hlo").write_text(xo.xla_partition_hlo_text(text, 8)["spmd"])
