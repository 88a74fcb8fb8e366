"""The JAX-exported programs of ../shared/jax-programs as run-side benchmarks: one program on N
devices, executed by XLA through JAX (the anchor) and by `gspmdc run`, timed per execution.

Each program was exported for 8 devices; for N devices its shardings are rewritten for the mesh
JAX's exporter used there (`reference.json`, `timing.devices_N.mesh_shape`: e.g. the 2x4 mesh
becomes 1x2): every tiled sharding keeps the mesh axes each of its tile dimensions spans, with
the axes' new sizes (`remesh`). Both sides then run the same text on the same inputs
(`inputs.npz`, global arrays).

The XLA side runs in a worker process (`python bench/jax_programs.py --jax-worker FILE N INPUTS
EXECUTIONS`, INPUTS `-` for gspmdc's seeded random inputs: JAX must see N host devices before it
is imported): XLA partitions the program for N devices (its own sharding propagation and SPMD
partitioner) and compiles it, the per-device arguments are cut from the global inputs by the
parameters' shardings, and one execution is `execute_sharded` until every output is ready; the
median of EXECUTIONS executions after a first one is printed. Needs jax/jaxlib 0.10.x (the `[xla]`
extra). The gspmdc side is `gspmdc run --repeat` on the same file and inputs.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

PYTHON = sys.executable
GSPMDC = str(Path(PYTHON).with_name("gspmdc"))
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "jax-programs"

_SHARDING = re.compile(r"sharding=\{")
_REPEAT = re.compile(r"^repeat: \d+ runs? after the first: median ([0-9.]+) ms per run", re.M)
_BLAS = re.compile(r"; BLAS: (OpenBLAS's \w+ kernels, \d+ threads? per partition)$", re.M)


def jax_available() -> bool:
    """jax and jaxlib are importable by this Python (without importing them here)."""
    import importlib.util
    return all(importlib.util.find_spec(name) is not None for name in ("jax", "jaxlib"))


def programs() -> list[Path]:
    """The folders of the JAX programs (empty when ../shared is absent)."""
    if not (SHARED / "index.json").exists():
        return []
    index = json.loads((SHARED / "index.json").read_text())
    return [SHARED / p["dir"] for p in index["programs"]]


def program_text(folder: Path, n: int) -> str:
    """`program.hlo` of `folder` with its shardings rewritten for `n` devices (see the module
    docstring)."""
    from gspmdc.ir.parser import parse_sharding
    reference = json.loads((folder / "reference.json").read_text())
    old = tuple(reference["mesh"]["shape"])
    new = tuple(reference["timing"][f"devices_{n}"]["mesh_shape"])
    text = (folder / "program.hlo").read_text()
    pieces, at = [], 0
    for match in _SHARDING.finditer(text):
        end = _closing_brace(text, match.end() - 1)
        sharding = parse_sharding(text[match.end() - 1:end])
        pieces += [text[at:match.end() - 1], remesh(sharding, old, new).to_text(False)]
        at = end
    return "".join(pieces) + text[at:]


def _closing_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced braces from offset {start}")


def remesh(sharding, old: tuple[int, ...], new: tuple[int, ...]):
    """`sharding` (over the row-major devices of mesh `old`) over mesh `new` (same number of
    axes): each tile dimension spans the same mesh axes, major to minor, at their new sizes."""
    from gspmdc.ir.sharding import HloSharding
    from gspmdc.ir.tile_assignment import TileAssignment
    if sharding.kind == "tuple":
        return HloSharding.tuple([remesh(e, old, new) for e in sharding.elements])
    if sharding.kind != "tiled":
        return sharding
    devices = sharding.tile_assignment.array
    coordinates = np.unravel_index(devices, old)                 # per mesh axis, like devices
    order, dims = [], []
    for dim in range(devices.ndim):
        spans = []                      # (where the axis's coordinate first changes, axis)
        for axis, coordinate in enumerate(coordinates):
            along = np.moveaxis(coordinate, dim, 0).reshape(devices.shape[dim], -1)[:, 0]
            changes = np.flatnonzero(np.diff(along))
            if changes.size:
                spans.append((int(changes[0]), axis))
        axes = [axis for _, axis in sorted(spans, reverse=True)]     # major (changes last) first
        order += axes
        dims.append(int(np.prod([new[a] for a in axes])))
    grouped = np.arange(int(np.prod(new))).reshape(new).transpose(
        order + [a for a in range(len(new)) if a not in order])
    return HloSharding.tiled(TileAssignment.from_array(grouped.reshape(dims)),
                             sharding.subgroup_types)


# ------------------------------------------------------------------------------------ gspmdc

def gspmdc_seconds_per_execution(path: Path, n: int, inputs: Path | None, executions: int,
                                 backend: str = "mpi", env: dict[str, str] | None = None) -> float:
    """The median time of one execution of `path` on `n` partitions (`gspmdc run --repeat`), on
    the global inputs of the file `inputs` (None: the seeded random inputs); `gspmdc run` gets
    the environment `env` (None: this process's)."""
    return gspmdc_execution(path, n, inputs, executions, backend, env)[0]


def gspmdc_execution(path: Path, n: int, inputs: Path | None, executions: int,
                     backend: str = "mpi", env: dict[str, str] | None = None
                     ) -> tuple[float, str | None]:
    """`gspmdc_seconds_per_execution`, and the BLAS the runs used as `gspmdc run` names it (its
    kernels and threads per partition; None when numpy's BLAS is not an OpenBLAS)."""
    proc = subprocess.run([GSPMDC, "run", str(path), "-n", str(n), "--backend", backend,
                           "--repeat", str(executions), "-q"]
                          + (["--inputs", str(inputs)] if inputs is not None else []),
                          capture_output=True, text=True, timeout=900, cwd=path.parent, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"gspmdc run {path} -n {n}: {proc.stderr.strip()}")
    blas = _BLAS.search(proc.stdout)
    return float(_REPEAT.search(proc.stdout).group(1)) / 1e3, blas and blas.group(1)


# --------------------------------------------------------------------------------------- XLA

def jax_seconds_per_execution(path: Path, n: int, inputs: Path | None, executions: int) -> float:
    """The median time of one execution of `path` on `n` devices by XLA (the worker process), on
    the inputs of `gspmdc_seconds_per_execution`."""
    proc = subprocess.run([PYTHON, __file__, "--jax-worker", str(path), str(n),
                           "-" if inputs is None else str(inputs), str(executions)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"XLA on {path} -n {n}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["median"]


def _jax_worker(path: str, n: int, inputs: str, executions: int) -> None:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import time
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import _jax, xla_client
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from jaxlib import _hlo
    text = Path(path).read_text()
    options = xla_client.CompileOptions()
    build = options.executable_build_options
    build.num_replicas, build.num_partitions, build.use_spmd_partitioning = 1, n, n > 1
    build.device_assignment = xla_client.DeviceAssignment.create(np.arange(n).reshape(1, n))
    devices = jax.devices()[:n]
    stablehlo = _jax.mlir.hlo_to_stablehlo(
        _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto())
    executable = xla_bridge.get_backend("cpu").compile_and_load(
        stablehlo, xla_client.DeviceList(tuple(devices)), options)
    mesh = Mesh(np.array(devices), ("d",))
    arguments = []
    for pieces in _device_arguments(path, n, inputs):
        shards = [jax.device_put(np.ascontiguousarray(p), d) for p, d in zip(pieces, devices)]
        if pieces[0].ndim == 0:
            arguments.append(jax.device_put(pieces[0], NamedSharding(mesh, PartitionSpec())))
            continue
        shape = (n * pieces[0].shape[0],) + pieces[0].shape[1:]
        arguments.append(jax.make_array_from_single_device_arrays(
            shape, NamedSharding(mesh, PartitionSpec("d")), shards))

    def execute() -> float:
        start = time.perf_counter()
        results = executable.execute_sharded(arguments)
        for per_output in results.disassemble_into_single_device_arrays():
            for array in per_output:
                array.block_until_ready()
        return time.perf_counter() - start
    execute()                                        # the first run is not counted
    times = [execute() for _ in range(executions)]
    print(json.dumps({"median": statistics.median(times), "min": min(times)}))


def _device_arguments(path: str, n: int, inputs: str) -> list[list[np.ndarray]]:
    """Per entry parameter, the argument of each device, cut from the global inputs (the file
    `inputs`, or `-`: gspmdc's seeded random inputs) by the parameter's sharding (as gspmdc and
    XLA both lay them out: shards of ceil(S/t), padded)."""
    from gspmdc.prepare import prepare_job
    from gspmdc.runtime.job import input_sources
    from gspmdc.runtime.options import RunOptions
    from gspmdc.runtime.sharded_io import split_inputs
    job = prepare_job(path, RunOptions(num_partitions=n, inputs=None if inputs == "-" else inputs))
    per_device = split_inputs(job.signature, input_sources(job, job.signature))
    return [[np.asarray(per_device[d][i]) for d in range(n)]
            for i in range(len(job.signature.parameters))]


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--jax-worker":
        _jax_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        print(__doc__)
