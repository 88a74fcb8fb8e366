"""MPI and local backends agree on the bundled examples and on XLA's partitioner test cases,
partitioned by gspmdc.

A spread sample of the small cases of `../shared/conformance/xla-partitioner.json` on 2, 4 or 8
devices runs exactly as the conformance scorer runs them (`gspmdc run --check --seed 0
--garbage-padding` on the local backend); the cases it marks equivalent (at least 50 must be) are
then run on MPI, one `mpiexec` launch per device count running all of that count's cases
(`mpi_worker.py`, `rank.execute_on_mpi` as `gspmdc run` does), with `--check` against the
unpartitioned reference. The bundled examples (`gspmdc/examples/*.hlo`) join them and must pass
locally too. Each MPI run must pass its check and its outputs must equal the local backend's:
integers and predicates exactly, floats within the check's tolerance."""
from __future__ import annotations

import contextlib
import io
import json
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir import dtypes
from gspmdc.ir.shapes import TupleShape
from gspmdc.runtime.io import leaf_keys
from gspmdc.runtime.compare import check_tolerance, compare_output_arrays
from gspmdc.prepare import prepare_job, why_no_reference
from gspmdc.runtime.job import RunOptions, execute_local

SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPUS = SHARED / "conformance" / "xla-partitioner.json"
EXAMPLES = Path(__file__).resolve().parents[1] / "gspmdc" / "examples"
MPIEXEC = Path(sys.executable).with_name("mpiexec")
WORKER = Path(__file__).with_name("mpi_worker.py")
#: one mpiexec launch per device count
DEVICE_COUNTS = (2, 4, 8)
#: a case is small when all its instructions' values together take at most this many bytes
MAX_CASE_BYTES = 256 << 10
SAMPLE = 56
MIN_EQUIVALENT = 50

pytestmark = [
    pytest.mark.skipif(not CORPUS.exists(), reason="../shared/conformance is absent"),
    pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv"),
]


def output_types(module) -> dict:
    """{output name: numpy dtype} of the module's outputs (npz stores bf16 and f8 as voids)."""
    root = module.entry.root.shape
    elements = root.elements if isinstance(root, TupleShape) else None
    keys = [kv for i, e in enumerate(elements) for kv in leaf_keys(f"out{i}", e)] \
        if elements is not None else [("out0", root)]
    return {key: dtypes.numpy_dtype(shape.element_type) for key, shape in keys}


def load_outputs(path: str, types: dict) -> dict:
    with np.load(path) as data:
        return {k: data[k].view(types[k]) for k in data.files}


def value_bytes(module) -> int:
    return sum(inst.shape.byte_size for _, inst in module.all_instructions())


def sampled_cases() -> list[dict]:
    """`SAMPLE` cases spread evenly over the small, checkable cases of the corpus (file order)."""
    small = []
    for case in json.loads(CORPUS.read_text())["cases"]:
        if case["num_devices"] not in DEVICE_COUNTS or case.get("expects_error"):
            continue
        try:
            module = api.parse(case["hlo"], case["name"])
        except GspmdcError:
            continue
        if why_no_reference(module) is None and value_bytes(module) <= MAX_CASE_BYTES:
            small.append(case)
    picks = np.unique(np.linspace(0, len(small) - 1, min(SAMPLE, len(small))).round().astype(int))
    return [small[i] for i in picks]


def run_locally(path: Path, num_devices: int | None, folder: Path):
    """(job, exit code, outputs) of `gspmdc run PATH --backend local --check --seed 0
    --garbage-padding`."""
    options = RunOptions(num_partitions=num_devices, seed=0, check=True, padding="garbage",
                         quiet=True, outputs=str(folder / f"{path.stem}.local.npz"))
    job = prepare_job(str(path), options)
    with contextlib.redirect_stdout(io.StringIO()):
        code = execute_local(job)
    return job, code, load_outputs(options.outputs, output_types(job.reference))


def equivalent_jobs(folder: Path):
    """{name: (job, local outputs)} of the bundled examples and of the sampled cases the
    scorer's command passes."""
    jobs = {}
    for example in sorted(EXAMPLES.glob("*.hlo")):
        job, code, outputs = run_locally(example, None, folder)
        assert code == 0, f"{example.name} fails its check on the local backend"
        jobs[f"example_{example.stem}"] = (job, outputs)
    for case in sampled_cases():
        path = folder / f"{case['name']}_{case['line']}.hlo"
        path.write_text(case["hlo"])
        try:
            job, code, outputs = run_locally(path, case["num_devices"], folder)
        except GspmdcError:
            continue
        if code == 0:
            jobs[path.stem] = (job, outputs)
    return jobs


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory):
    """(local results, {name: (MPI exit code, printed, MPI outputs)})."""
    folder = tmp_path_factory.mktemp("corpus")
    local = equivalent_jobs(folder)
    by_count: dict[int, list] = {}
    for name, (job, _) in local.items():
        mpi_job = replace(job, options=replace(job.options,
                                               outputs=str(folder / f"{name}.mpi.npz")))
        (folder / f"{name}.job").write_bytes(pickle.dumps(mpi_job))
        by_count.setdefault(job.num_partitions, []).append([name, str(folder / f"{name}.job")])
    runs = {}
    for n, jobs in sorted(by_count.items()):
        out = folder / f"n{n}"
        out.mkdir()
        (out / "spec.json").write_text(json.dumps({"jobs": jobs, "out": str(out)}))
        proc = subprocess.run([str(MPIEXEC), "-n", str(n), sys.executable, str(WORKER),
                               str(out / "spec.json")], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{n} ranks: {proc.stderr[-3000:]}"
        for name, (code, printed) in json.loads((out / "codes.json").read_text()).items():
            types = output_types(local[name][0].reference)
            runs[name] = (code, printed, load_outputs(str(folder / f"{name}.mpi.npz"), types))
    return local, runs


def test_enough_cases_and_device_counts(corpus_runs):
    local, runs = corpus_runs
    assert len([name for name in local if not name.startswith("example_")]) >= MIN_EQUIVALENT
    assert {f"example_{p.stem}" for p in EXAMPLES.glob("*.hlo")} <= set(local)
    assert set(runs) == set(local)
    counts = {job.num_partitions for job, _ in local.values()}
    assert counts == set(DEVICE_COUNTS)


def test_mpi_runs_pass_their_check_and_equal_the_local_backend(corpus_runs):
    local, runs = corpus_runs
    for name, (job, local_outputs) in sorted(local.items()):
        code, printed, mpi_outputs = runs[name]
        assert code == 0, f"{name} on {job.num_partitions} MPI ranks:\n{printed}"
        tolerance = check_tolerance(job.reference)
        for comparison in compare_output_arrays(mpi_outputs, local_outputs, tolerance):
            assert comparison.ok, f"{name}: MPI vs local {comparison.line()}"
