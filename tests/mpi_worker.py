"""Run under `mpiexec` by the MPI backend tests: evaluate a batch of SPMD modules with the MPI
backend, one partition per rank, and save every partition's result leaves.

    mpiexec -n N python mpi_worker.py SPEC.json

SPEC: {"cases": [{"name", "module" (HLO file), "inputs" (npz with p{partition}_arg{i}),
"deterministic" (bool)}], "wait" (the backend's waiting policy), "out": directory}. Writes `{out}/{name}.p{partition}.npz` with the
result's array leaves `leaf0, leaf1, ...` in pre-order.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from gspmdc.ir import dtypes
from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.mpi import MpiBackend
from gspmdc.runtime.interpreter import evaluate


def leaves(value) -> list:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
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


if __name__ == "__main__":
    main()
