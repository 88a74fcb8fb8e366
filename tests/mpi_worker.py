"""Run under `mpiexec` by the MPI backend tests, one partition per rank, many cases per launch.

    mpiexec -n N python mpi_worker.py SPEC.json

Two kinds of SPEC:

- modules: {"cases": [{"name", "module" (HLO file), "inputs" (npz with p{partition}_arg{i}),
  "deterministic" (bool)}], "wait" (the backend's waiting policy), "out": directory}: evaluate each
  SPMD module with the MPI backend and write `{out}/{name}.p{partition}.npz` with the result's
  array leaves `leaf0, leaf1, ...` in pre-order;
- jobs: {"jobs": [[name, pickled `runtime.job.Job` file], ...], "out": directory}: run each job as
  `gspmdc run` does on every rank (`rank.execute_on_mpi`: inputs sharded from the seed or the
  input file, outputs assembled and written by rank 0, `--check` when the job asks) and write
  `{out}/codes.json`: {name: [exit code, what rank 0 printed]}.
"""
from __future__ import annotations

import contextlib
import io
import json
import pickle
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from gspmdc.ir import dtypes
from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.mpi import MpiBackend
from gspmdc.runtime.interpreter import evaluate
from gspmdc.runtime.rank import execute_on_mpi


def leaves(value) -> list:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def run_modules(spec: dict) -> None:
    out = Path(spec["out"])
    for case in spec["cases"]:
        module = parse_module(Path(case["module"]).read_text())
        backend = MpiBackend(module, MPI.COMM_WORLD, deterministic=case["deterministic"],
                             wait=spec["wait"])
        p = backend.partition_id()
        with np.load(case["inputs"]) as data:   # bf16 comes back as raw 2-byte voids: view it
            args = [data[f"p{p}_arg{i}"].view(dtypes.numpy_dtype(param.shape.element_type))
                    for i, param in enumerate(module.entry.parameters)]
        result = evaluate(module, args, backend=backend)
        np.savez(out / f"{case['name']}.p{p}.npz",
                 **{f"leaf{i}": np.asarray(v) for i, v in enumerate(leaves(result))})
        backend.close()


def run_jobs(spec: dict) -> None:
    codes = {}
    for name, path in spec["jobs"]:
        job = pickle.loads(Path(path).read_bytes())
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = execute_on_mpi(job)
        codes[name] = [code, printed.getvalue()]
    if MPI.COMM_WORLD.Get_rank() == 0:
        (Path(spec["out"]) / "codes.json").write_text(json.dumps(codes))


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    (run_jobs if "jobs" in spec else run_modules)(spec)


if __name__ == "__main__":
    main()
