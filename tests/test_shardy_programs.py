"""JAX's default dumps end to end: partitioned after Shardy's propagation, run on the MPI backend,
they reproduce JAX's outputs and move no more collective bytes than XLA's Shardy pipeline; and
propagation agrees with XLA's instruction by instruction."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gspmdc import api
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.traffic import collective_traffic

from spmd_helpers import SHARED

sys.path.insert(0, str(Path(__file__).parent))
from shardy_oracle import jax_available  # noqa: E402

GSPMDC = Path(sys.executable).with_name("gspmdc")
DATA = Path(__file__).parent / "data" / "shardy"
PROGRAMS = sorted(p.parent for p in (SHARED / "jax-programs").glob("*/program_shardy.hlo"))


def _bytes(module, n) -> tuple[int, float]:
    traffic = collective_traffic(module, n)
    return sum(c.total_result_bytes for c in traffic), sum(c.total_sent_bytes for c in traffic)


@pytest.mark.skipif(not PROGRAMS, reason="../shared/jax-programs is absent")
@pytest.mark.parametrize("folder", PROGRAMS, ids=lambda p: p.name)
def test_collective_bytes_at_most_xlas_shardy_pipeline(folder):
    ours = compile_spmd(api.load(folder / "program_shardy.hlo"), 8)
    xla = api.load(folder / "xla_spmd_shardy.hlo", verify=False)
    (result, sent), (xla_result, xla_sent) = _bytes(ours, 8), _bytes(xla, 8)
    assert result <= xla_result and sent <= xla_sent
    reported = json.loads((folder / "reference.json").read_text())["collectives"]["shardy_spmd"]
    assert xla_result == reported["total_dynamic_bytes"]     # the measure is XLA's own


@pytest.mark.skipif(not PROGRAMS, reason="../shared/jax-programs is absent")
@pytest.mark.parametrize("folder", PROGRAMS, ids=lambda p: p.name)
def test_runs_on_mpi_and_reproduces_jax_outputs(folder, tmp_path):
    out = tmp_path / "out.npz"
    proc = subprocess.run([str(GSPMDC), "run", str(folder / "program_shardy.hlo"), "-n", "8",
                           "--inputs", str(folder / "inputs.npz"), "--outputs", str(out),
                           "--check", "-q"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "mismatch" not in proc.stdout
    with np.load(out) as got, np.load(folder / "outputs.npz") as want:
        assert sorted(got.files) == sorted(want.files)
        for name in want.files:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5,
                                       err_msg=f"{folder.name} {name}")


OWN = sorted(DATA.glob("*.hlo"))
#: the shard_map programs as JAX prints them with Shardy turned off (GSPMD form)
OWN_GSPMD = sorted((DATA / "gspmd").glob("*.hlo"))


@pytest.mark.parametrize("path", OWN + OWN_GSPMD,
                         ids=lambda p: p.stem + ("[gspmd]" if p.parent.name == "gspmd" else ""))
def test_own_dumps_run_and_check(path):
    """Every JAX dump of tests/data/shardy, shard_maps (psum, ppermute, all_to_all, psum_scatter,
    all_gather; fully and partially manual) included, in Shardy and in GSPMD form, runs from
    global inputs and matches the program run on one device."""
    from gspmdc.cli import main
    assert main(["run", str(path), "-n", "8", "--backend", "local", "--check", "-q"]) == 0


@pytest.mark.parametrize("path", [p for p in OWN if not p.stem.startswith("shard_map")],
                         ids=lambda p: p.stem)
def test_own_dumps_run_and_check_propagated_the_gspmd_way(path):
    from gspmdc.cli import main
    assert main(["run", str(path), "-n", "8", "--backend", "local", "--check", "-q",
                 "--propagation", "gspmd"]) == 0


@pytest.mark.skipif(not (PROGRAMS and jax_available()),
                    reason="needs ../shared/jax-programs and jax (the [xla] extra)")
def test_agrees_with_xla_on_the_jax_programs():
    from shardy_differential import Agreement, agreement
    from shardy_oracle import run_in_subprocess
    texts = [(f / "program_shardy.hlo").read_text() for f in PROGRAMS]
    total = Agreement()
    for folder, answer in zip(PROGRAMS, run_in_subprocess(texts, 8)):
        assert "error" not in answer, answer.get("error")
        total.add(agreement(answer["before"], answer["after"], folder.name))
    assert total.compared > 300
    assert total.ratio >= 0.99, total.differences


def test_explain_speaks_of_mesh_axes(tmp_path, capsys):
    """`explain` on a Shardy dump propagates the Shardy way and names shardings by mesh axes, on
    the propagated module and on the compiled one."""
    from gspmdc.cli import main
    source = DATA / "mlp_out_shardings.hlo"
    assert main(["explain", str(source), "dot_general.3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith('dot_general.3  [{"x"}, {}]')
    assert "user annotation" in out.splitlines()[-1]
    compiled = tmp_path / "c.hlo"
    assert main(["compile", str(source), "-n", "8", "-o", str(compiled)]) == 0
    collective = next(line.split()[0].lstrip("%") for line in compiled.read_text().splitlines()
                      if " all-reduce(" in line)
    assert main(["explain", str(compiled), collective]) == 0
    out = capsys.readouterr().out
    assert 'unreduced={"y"}' in out and '[{"x"}, {}]' in out


def test_propagate_command_keeps_shardy_form_and_is_idempotent(tmp_path):
    """`propagate` writes every instruction's Shardy sharding and the HloSharding; propagating
    its output again changes nothing."""
    from gspmdc.cli import main
    once, twice = tmp_path / "once.hlo", tmp_path / "twice.hlo"
    assert main(["propagate", str(DATA / "while_loop.hlo"), "-o", str(once)]) == 0
    assert main(["propagate", str(once), "-o", str(twice)]) == 0
    first, second = api.load(once), api.load(twice)
    for (_, a), (_, b) in zip(first.all_instructions(), second.all_instructions()):
        assert a.sharding == b.sharding, a.name
    assert 'xla.sdy.sharding="#sdy.sharding_per_value' in once.read_text()


def test_gspmd_mode_on_a_shardy_dump_drops_the_shardy_form(tmp_path):
    from gspmdc.cli import main
    out = tmp_path / "p.hlo"
    assert main(["propagate", str(DATA / "sharding_groups.hlo"), "--propagation", "gspmd",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "xla.sdy.sharding=" not in text and "xla.sdy.ShardingGroup" not in text


@pytest.mark.skipif(not jax_available(), reason="needs jax (the [xla] extra)")
def test_agrees_with_xla_on_random_modules():
    """Random modules in Shardy form (tests/shardy_random.py): at least 99% of the named
    instructions get XLA's sharding."""
    from shardy_differential import random_agreement
    total, rejected = random_agreement(40, seed=7)
    assert len(rejected) <= 2, rejected
    assert total.compared > 100
    assert total.ratio >= 0.99, total.differences


def test_gspmd_form_partial_shard_map_keeps_its_manual_axis():
    """JAX's GSPMD form of a shard_map manual over x only leaves every dim of the boundary pair
    unspecified: refined by the [x, y]-tiled input, the boundary keeps x manual and tiles the
    columns by y (the layout Shardy's propagation gives the same program), and the all-to-all
    inside takes it."""
    from gspmdc.ir.parser import parse_sharding
    from gspmdc.passes.propagation import propagate
    module = propagate(api.load(DATA / "gspmd" / "shard_map_all_to_all.hlo"))
    by_name = {i.name: i for _, i in module.all_instructions()}
    want = parse_sharding("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dims={manual}}")
    assert by_name["shard_map.6"].sharding == want
    assert by_name["all_to_all.5"].sharding == want
