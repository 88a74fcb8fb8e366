"""XLA's Shardy pipeline as an oracle (test-only; needs jax==0.10.2, which product code never
imports).

`xla_shardy(text, n)` compiles a module in Shardy form the way JAX does with its default
partitioner (HLO -> StableHLO -> XLA with `use_shardy_partitioner`) on `n` CPU devices, dumping
every HLO pass, and returns XLA's module just before its Shardy pass (`before`: calls inlined,
otherwise the input), just after it (`after`: every instruction's HloSharding as Shardy chose it,
the original instruction name in `metadata={op_name=...}`) and after SPMD partitioning (`spmd`).

Run in a subprocess (`run_in_subprocess`, which first inlines calls with gspmdc: see `inlined`) so
that jax's device count and flags never leak into the test process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def jax_available() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _compile(text: str, n: int, dump: str) -> None:
    import numpy as np
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import _jax, xla_client as xc
    from jaxlib import _hlo
    module = _hlo.hlo_module_from_text(text)
    stablehlo = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_replicas = 1
    build.num_partitions = n
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True
    build.device_assignment = xc.DeviceAssignment.create(np.arange(n).reshape(1, n))
    build.debug_options.xla_dump_to = dump
    build.debug_options.xla_dump_hlo_pass_re = ".*"
    devices = xc.DeviceList(tuple(jax.devices()[:n]))
    xla_bridge.get_backend("cpu").compile_and_load(stablehlo, devices, options)


def _dumps(dump: str, failure: str | None = None) -> dict:
    files = sorted(f for f in os.listdir(dump) if f.endswith(".txt") and ".00" in f)
    after = [i for i, f in enumerate(files) if ".after_shardy-xla." in f]
    spmd = [f for f in files if ".after_spmd-partitioning." in f]
    if not after:
        raise RuntimeError(f"XLA ran no Shardy pass: {failure}" if failure else
                           f"XLA ran no Shardy pass (it fell back to GSPMD): {files[:6]}")

    def read(name):
        return Path(dump, name).read_text()

    return {"before": read(files[after[0] - 1]), "after": read(files[after[0]]),
            "spmd": read(spmd[0]) if spmd else None}


def xla_shardy(text: str, n: int) -> dict:
    """{'before', 'after', 'spmd'}: XLA's modules around its Shardy pass (see the docstring);
    'spmd' is None (and 'partition_error' says why) when XLA's partitioner then fails."""
    with tempfile.TemporaryDirectory() as dump:
        failure = None
        try:
            _compile(text, n, dump)
        except Exception as e:      # XLA's partitioner may fail after its Shardy pass ran
            failure = f"{type(e).__name__}: {e}"[:2000]
        answer = _dumps(dump, failure)
        if failure is not None:
            answer["partition_error"] = failure
        return answer


def inlined(text: str) -> str:
    """`text` with its calls inlined by gspmdc (shard_map bodies stay), as XLA's pipeline does
    before its Shardy pass: XLA's HLO-to-StableHLO import turns a called computation's sharded
    root into a GSPMD-style result sharding, and then falls back to GSPMD propagation. For the same
    reason a shard_map body's root keeps only its Shardy sharding."""
    from gspmdc import api
    from gspmdc.passes.pass_manager import PassContext
    from gspmdc.passes.spmd.inline_calls import InlineCalls
    from gspmdc.ir.sdy import instruction_shardings
    module = api.parse(text)
    InlineCalls().apply(PassContext(), module)
    for comp in module.computations.values():
        if comp is not module.entry and instruction_shardings(comp.root) is not None:
            comp.root.sharding = None     # the Shardy sharding says it; XLA would see GSPMD's
    return api.to_text(module)


def run_in_subprocess(texts: list[str], n: int, timeout: float = 600) -> list[dict]:
    """`xla_shardy` for each text, in a fresh Python with `n` host devices; a failed compile gives
    {'error': message} for that text."""
    payload = json.dumps({"texts": [inlined(t) for t in texts], "n": n})
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
    done = subprocess.run([sys.executable, __file__], input=payload, capture_output=True,
                          text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the Shardy oracle failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def _main() -> None:
    request = json.loads(sys.stdin.read())
    results = []
    for text in request["texts"]:
        try:
            results.append(xla_shardy(text, request["n"]))
        except Exception as e:     # XLA rejects the module: report it, go on with the others
            results.append({"error": f"{type(e).__name__}: {e}"[:2000]})
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    _main()
