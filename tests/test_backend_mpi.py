"""The MPI backend under a real `mpiexec` (8 ranks, oversubscribed on small machines): every
collective in every replica-group spelling, native and folded reductions, raw-byte movement of
pred/bf16/f16/complex, collective-permute patterns that deadlock blocking sends, collectives in a
loop, a non-identity device assignment, and XLA's partitioned programs. Each case runs once on the
MPI backend and once on the local backend; results must agree (bit-exactly where the reduction
order is fixed) and, for the programs, reproduce JAX's outputs.

All cases of one partition count run in one `mpiexec` launch to keep the file fast."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gspmdc.errors import GspmdcError
from gspmdc.ir.parser import parse_module
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.sharded_io import assemble_outputs, split_inputs, spmd_signature

from spmd_helpers import GROUP_FORMS, fold_shift_add, group_of, partition_values, ring_loop, \
    spmd_module
from test_backend_local import xla_output_sharding, xla_programs

MPIEXEC = Path(sys.executable).with_name("mpiexec")
WORKER = Path(__file__).with_name("mpi_worker.py")
N = 8
G = "channel_id=1, use_global_device_ids=true"

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")


def collective_cases():
    """(name, module text, per-partition args, deterministic, exact) for 8 partitions."""
    ints = partition_values(N, (4, 4))
    cases = []
    for form, (spelling, groups) in sorted(GROUP_FORMS.items()):
        g = len(groups[0])
        rg = f"replica_groups={spelling}"
        body = f"""
        ar = s32[4,4] all-reduce(p0), {G}, {rg}, to_apply=add
        arf = s32[4,4] all-reduce(p0), {G}, {rg}, to_apply=shift_add
        ag = s32[4,{4 * g}] all-gather(p0), {G}, {rg}, dimensions={{1}}
        rs = s32[{4 // g},4] reduce-scatter(p0), {G}, {rg}, dimensions={{0}}, to_apply=add
        rsf = s32[{4 // g},4] reduce-scatter(p0), {G}, {rg}, dimensions={{0}}, to_apply=shift_add
        aa = s32[4,4] all-to-all(p0), channel_id=2, {rg}, dimensions={{1}}
        """
        text = spmd_module(N, ["s32[4,4]"], body, f"r = (s32[4,4], s32[4,4], s32[4,{4 * g}], "
                           f"s32[{4 // g},4], s32[{4 // g},4], s32[4,4]) "
                           "tuple(ar, arf, ag, rs, rsf, aa)")
        cases.append((f"groups_{form}", text, [[x] for x in ints], False, True))
    rng = np.random.default_rng(0)
    floats = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(N)]
    floats[3][0, 0] = np.nan
    body = f"""
    sum = f32[3,8] all-reduce(p0), {G}, replica_groups={{}}, to_apply=addf
    max = f32[3,8] all-reduce(p0), {G}, replica_groups={{}}, to_apply=maxf
    rs = f32[3,1] reduce-scatter(p0), {G}, replica_groups={{}}, dimensions={{1}}, to_apply=addf
    """
    text = spmd_module(N, ["f32[3,8]"], body,
                       "r = (f32[3,8], f32[3,8], f32[3,1]) tuple(sum, max, rs)")
    cases.append(("floats_native", text, [[x] for x in floats], False, False))
    cases.append(("floats_deterministic", text, [[x] for x in floats], True, True))
    preds = [rng.integers(0, 2, (5,)).astype(bool) for _ in range(N)]
    bfs = [rng.standard_normal((6,)).astype(ml_dtypes.bfloat16) for _ in range(N)]
    halfs = [rng.standard_normal((2, 3)).astype(np.float16) for _ in range(N)]
    cplx = [(rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)
            for _ in range(N)]
    body = f"""
    or = pred[5] all-reduce(p0), {G}, replica_groups={{{{0,1,2,3}},{{4,5,6,7}}}}, to_apply=orp
    and = pred[5] all-reduce(p0), {G}, replica_groups={{}}, to_apply=andp
    pg = pred[40] all-gather(p0), {G}, replica_groups={{}}, dimensions={{0}}
    bsum = bf16[6] all-reduce(p1), {G}, replica_groups={{}}, to_apply=addbf
    hg = f16[2,12] all-gather(p2), {G}, replica_groups={{{{0,1,2,3}},{{4,5,6,7}}}}, dimensions={{1}}
    csum = c64[3] all-reduce(p3), {G}, replica_groups={{{{7,6,5,4,3,2,1,0}}}}, to_apply=addc
    """
    text = spmd_module(N, ["pred[5]", "bf16[6]", "f16[2,3]", "c64[3]"], body,
                       "r = (pred[5], pred[5], pred[40], bf16[6], f16[2,12], c64[3]) "
                       "tuple(or, and, pg, bsum, hg, csum)")
    cases.append(("types", text, [list(a) for a in zip(preds, bfs, halfs, cplx)], False, False))
    xs = partition_values(N, (3,))
    body = """
    swap = s32[3] collective-permute(p0), channel_id=3, source_target_pairs={{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}
    mixed = s32[3] collective-permute(p0), channel_id=4, source_target_pairs={{0,7},{7,0},{3,3},{1,5},{5,2}}
    tuple_a2a = (s32[3], s32[3]) all-to-all(p0, p1), channel_id=5, replica_groups=[4,2]<=[2,4]T(1,0)
    cross_replica = s32[3] all-reduce(p0), replica_groups={}, to_apply=add
    all_partitions = s32[3] all-reduce(p0), channel_id=6, replica_groups={{0}}, to_apply=add
    id = u32[] partition-id()
    """
    text = spmd_module(N, ["s32[3]", "s32[3]"], body,
                       "r = (s32[3], s32[3], (s32[3], s32[3]), s32[3], s32[3], u32[]) "
                       "tuple(swap, mixed, tuple_a2a, cross_replica, all_partitions, id)",
                       header=", device_assignment={7,6,5,4,3,2,1,0}")
    cases.append(("permutes_reversed_ranks", text, [[x, x + 1000] for x in xs], False, True))
    cases.append(("ring_loop", ring_loop(8, 20), [[x] for x in xs], False, True))
    cubes = partition_values(N, (1, 2, 3))
    body = f"""
    d0 = s32[8,2,3] all-gather(p0), {G}, replica_groups={{}}, dimensions={{0}}
    d1 = s32[1,4,3] all-gather(p0), {G}, replica_groups=[4,2]<=[8], dimensions={{1}}
    d2 = s32[1,2,12] all-gather(p0), {G}, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{2}}
    t = s32[2,1,3] transpose(p0), dimensions={{1,0,2}}
    t2 = s32[2,8,3] all-gather(t), {G}, replica_groups={{}}, dimensions={{1}}
    """
    text = spmd_module(N, ["s32[1,2,3]"], body, "r = (s32[8,2,3], s32[1,4,3], s32[1,2,12], "
                       "s32[2,8,3]) tuple(d0, d1, d2, t2)")
    cases.append(("gathers_in_place_and_moved", text, [[x] for x in cubes], False, True))
    spelling, _ = GROUP_FORMS["iota"]
    body = f"""
    cb = s32[4,4] collective-broadcast(p0), channel_id=7, replica_groups={spelling}
    pair = (s32[4,4], s32[4,4]) collective-broadcast(p0, p1), channel_id=8, replica_groups={{{{3,2,1,0}},{{7,6,5,4}}}}
    """
    text = spmd_module(N, ["s32[4,4]", "s32[4,4]"], body,
                       "r = (s32[4,4], (s32[4,4], s32[4,4])) tuple(cb, pair)")
    cases.append(("broadcasts", text, [[x, -x] for x in ints], False, True))
    return cases


def xla_cases():
    cases = []
    for folder in xla_programs():
        spmd_text = (folder / "xla_spmd.hlo").read_text()
        signature = spmd_signature(parse_module(spmd_text),
                                   output_sharding=xla_output_sharding(folder))
        with np.load(folder / "inputs.npz") as data:
            inputs = [data[f"arg{i}"] for i in range(len(signature.parameters))]
        cases.append((f"xla_{folder.name}", spmd_text, split_inputs(signature, inputs), False,
                      False))
    return cases


def leaves(value) -> list:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def run_mpi(cases, n: int, tmp: Path, wait: str) -> dict[str, list[list[np.ndarray]]]:
    """Run all cases in one mpiexec launch with the given waiting policy (`MpiBackend(wait=)`);
    {name: per-partition result leaves}."""
    spec = {"cases": [], "wait": wait, "out": str(tmp)}
    for name, text, args, deterministic, _ in cases:
        (tmp / f"{name}.hlo").write_text(text)
        np.savez(tmp / f"{name}.in.npz", **{f"p{p}_arg{i}": a for p, per in enumerate(args)
                                            for i, a in enumerate(per)})
        spec["cases"].append({"name": name, "module": str(tmp / f"{name}.hlo"),
                              "inputs": str(tmp / f"{name}.in.npz"),
                              "deterministic": deterministic})
    (tmp / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([str(MPIEXEC), "-n", str(n), sys.executable, str(WORKER),
                           str(tmp / "spec.json")], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {}
    for name, *_ in cases:
        per = []
        for p in range(n):
            with np.load(tmp / f"{name}.p{p}.npz") as data:
                per.append([data[f"leaf{i}"] for i in range(len(data.files))])
        results[name] = per
    return results


@pytest.fixture(scope="module")
def mpi_results(tmp_path_factory):
    cases = collective_cases() + xla_cases()
    return cases, run_mpi(cases, N, tmp_path_factory.mktemp("mpi"), "polite")


def test_mpi_agrees_with_the_local_backend(mpi_results):
    assert_agrees_with_local(*mpi_results)


def test_blocking_waits_agree_with_the_local_backend(tmp_path):
    """The blocking MPI calls (used when every rank has a core of its own)."""
    cases = collective_cases()
    assert_agrees_with_local(cases, run_mpi(cases, N, tmp_path, "blocking"))


def assert_agrees_with_local(cases, results):
    for name, text, args, deterministic, exact in cases:
        local = run_local(parse_module(text), args)
        for p in range(N):
            want = [np.asarray(v) for v in leaves(local[p])]
            got = results[name][p]
            assert len(got) == len(want), name
            for k, (a, b) in enumerate(zip(got, want)):
                a = a.view(b.dtype) if a.dtype != b.dtype else a   # bf16 saved as raw voids
                if exact:
                    np.testing.assert_array_equal(a, b, err_msg=f"{name} p{p} leaf{k}")
                else:
                    np.testing.assert_allclose(a.astype(np.complex128), b.astype(np.complex128),
                                               rtol=1e-5, atol=1e-5,
                                               err_msg=f"{name} p{p} leaf{k}")


def test_mpi_collectives_match_numpy(mpi_results):
    _, results = mpi_results
    ints = partition_values(N, (4, 4))
    for form, (_, groups) in GROUP_FORMS.items():
        g = len(groups[0])
        for p in range(N):
            group, k = group_of(groups, p)
            ar, arf, ag, rs, rsf, aa = results[f"groups_{form}"][p]
            members = [ints[m] for m in group]
            np.testing.assert_array_equal(ar, sum(members))
            np.testing.assert_array_equal(arf, fold_shift_add(members))
            np.testing.assert_array_equal(ag, np.concatenate(members, axis=1))
            b = 4 // g
            np.testing.assert_array_equal(rs, sum(members)[k * b:(k + 1) * b])
            np.testing.assert_array_equal(rsf, fold_shift_add(members)[k * b:(k + 1) * b])
            np.testing.assert_array_equal(
                aa, np.concatenate([m[:, k * b:(k + 1) * b] for m in members], axis=1))


def test_mpi_collective_broadcast_sends_each_groups_first_members_value(mpi_results):
    _, results = mpi_results
    ints = partition_values(N, (4, 4))
    _, groups = GROUP_FORMS["iota"]
    for p in range(N):
        cb, first, second = results["broadcasts"][p]
        group, _ = group_of(groups, p)
        np.testing.assert_array_equal(cb, ints[group[0]])
        source = 3 if p < 4 else 7
        np.testing.assert_array_equal(first, ints[source])
        np.testing.assert_array_equal(second, -ints[source])


def test_mpi_permutes_and_device_assignment(mpi_results):
    _, results = mpi_results
    xs = partition_values(N, (3,))
    mixed_source = {7: 0, 0: 7, 3: 3, 5: 1, 2: 5}
    for p in range(N):
        swap, mixed, a2a0, a2a1, cross, everyone, pid = results["permutes_reversed_ranks"][p]
        np.testing.assert_array_equal(swap, xs[p ^ 1])
        np.testing.assert_array_equal(mixed, xs[mixed_source[p]] if p in mixed_source else 0)
        group = [p % 4, p % 4 + 4]              # [4,2]<=[2,4]T(1,0)
        k = group.index(p)
        operand_k = [xs, [x + 1000 for x in xs]][k]
        np.testing.assert_array_equal(a2a0, operand_k[group[0]])
        np.testing.assert_array_equal(a2a1, operand_k[group[1]])
        np.testing.assert_array_equal(cross, xs[p])
        np.testing.assert_array_equal(everyone, sum(xs))
        assert int(pid) == p
        np.testing.assert_array_equal(results["ring_loop"][p][0], xs[(p - 20) % N])


def test_mpi_native_float_max_keeps_nan_and_deterministic_mode_is_exact(mpi_results):
    cases, results = mpi_results
    floats = dict((c[0], c[2]) for c in cases)["floats_native"]
    stacked = np.stack([a[0] for a in floats])
    for name in ("floats_native", "floats_deterministic"):
        for p in range(N):
            total, maximum, _ = results[name][p]
            assert np.isnan(maximum[0, 0]) and np.isnan(total[0, 0])
            np.testing.assert_array_equal(maximum[1:], stacked.max(axis=0)[1:])
            np.testing.assert_allclose(total[1:], stacked.sum(axis=0)[1:], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not xla_programs(), reason="../shared/jax-programs is absent")
def test_xla_programs_on_mpi_reproduce_jax_outputs(mpi_results):
    _, results = mpi_results
    for folder in xla_programs():
        spmd = parse_module((folder / "xla_spmd.hlo").read_text())
        signature = spmd_signature(spmd, output_sharding=xla_output_sharding(folder))
        per_partition = results[f"xla_{folder.name}"]
        tuple_root = spmd.entry.root.shape.is_tuple
        values = [tuple(leaves_) if tuple_root else leaves_[0] for leaves_ in per_partition]
        result = assemble_outputs(signature, values)
        outputs = list(result) if tuple_root else [result]
        with np.load(folder / "outputs.npz") as expected:
            for k, value in enumerate(outputs):
                np.testing.assert_allclose(value, expected[f"out{k}"], rtol=2e-5, atol=2e-5,
                                           err_msg=f"{folder.name} out{k}")


MATMUL2 = """HloModule matmul, num_partitions=2

ENTRY main {
  x = f32[8,16] parameter(0), sharding={devices=[1,2]<=[2]}
  w = f32[16,4] parameter(1), sharding={devices=[2,1]<=[2]}
  ROOT y = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""


@pytest.mark.parametrize("wait", ["polite", "blocking"])
def test_run_command_takes_the_waiting_policy(tmp_path, wait):
    """`gspmdc run --mpi-wait` reaches the ranks' backends: both policies give checked results."""
    program = tmp_path / "matmul.hlo"
    program.write_text(MATMUL2)
    proc = subprocess.run([str(MPIEXEC.with_name("gspmdc")), "run", str(program),
                           "--mpi-wait", wait, "--check", "--profile", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "check out0" in proc.stdout and " ok" in proc.stdout
    startup = re.search(r"^start-up: ([0-9.]+) s from the start of `gspmdc run` to the first "
                        r"instruction \(slowest partition\)$", proc.stdout, re.M)
    assert startup and 0 < float(startup.group(1)) < 120


def test_the_waiting_policy_travels_with_the_job(tmp_path, monkeypatch):
    from gspmdc.cli import main
    from gspmdc.runtime import launcher
    jobs = []
    monkeypatch.setattr(launcher, "launch",
                        lambda prepare, n, mpiexec, started_at, hostfile: jobs.append(prepare()) or 0)
    program = tmp_path / "matmul.hlo"
    program.write_text(MATMUL2)
    assert main(["run", str(program), "--mpi-wait", "polite"]) == 0
    assert main(["run", str(program)]) == 0
    assert [job.options.mpi_wait for job in jobs] == ["polite", "auto"]


def test_an_unknown_waiting_policy_is_refused():
    from gspmdc.runtime.backends.mpi import Waiter
    with pytest.raises(GspmdcError, match="must be one of auto, polite, blocking, got 'busy'"):
        Waiter("busy", oversubscribed=False)
    proc = subprocess.run([str(MPIEXEC.with_name("gspmdc")), "run", "x.hlo", "--mpi-wait",
                           "busy"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'busy'" in proc.stderr


@pytest.mark.parametrize("program", ["mlp_megatron", "uneven_shapes"])
def test_run_command_reproduces_xla_partitioned_programs(tmp_path, program):
    """`gspmdc run xla_spmd.hlo --inputs inputs.npz --output-sharding S` on 8 ranks: explicit,
    iota, transposed-iota and mesh replica groups between them, inputs fed per the parameter
    shardings; the outputs are JAX's."""
    folder = next((f for f in xla_programs() if f.name == program), None)
    if folder is None:
        pytest.skip(f"../shared/jax-programs/{program} is absent")
    outputs = json.loads((folder / "reference.json").read_text())["outputs"]
    shardings = [o["hlo_sharding"] for o in outputs]
    sharding = shardings[0] if len(shardings) == 1 and \
        not parse_module((folder / "xla_spmd.hlo").read_text()).entry.root.shape.is_tuple \
        else "{" + ", ".join(shardings) + "}"
    out = tmp_path / "out.npz"
    proc = subprocess.run([str(MPIEXEC.with_name("gspmdc")), "run", str(folder / "xla_spmd.hlo"),
                           "--inputs", str(folder / "inputs.npz"), "--outputs", str(out),
                           "--output-sharding", sharding, "-q"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    with np.load(out) as got, np.load(folder / "outputs.npz") as want:
        assert sorted(got.files) == sorted(want.files)
        for name in want.files:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5,
                                       err_msg=f"{program} {name}")


def test_output_sharding_is_only_for_partitioned_programs_without_one(tmp_path, capsys):
    from gspmdc.cli import main
    program = tmp_path / "matmul.hlo"
    program.write_text(MATMUL2)
    assert main(["run", str(program), "--output-sharding", "{replicated}"]) == 2
    assert "--output-sharding only describes the result of an already-partitioned program" in \
        capsys.readouterr().err
    spmd = tmp_path / "spmd.hlo"
    spmd.write_text("HloModule s, num_partitions=2\n\nENTRY main {\n  x = f32[2] parameter(0)\n"
                    "  ROOT p = u32[] partition-id(), sharding={replicated}\n}\n")
    assert main(["run", str(spmd), "--output-sharding", "{replicated}"]) == 2
    assert "the root p has a sharding already" in capsys.readouterr().err
