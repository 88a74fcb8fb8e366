"""Packaging: the wheel maps the source folders to gspmdc, gspmdc.ir, gspmdc.passes and
gspmdc.runtime, ships the grammar and the examples, installs no bare top-level package, and imports
from the unpacked wheel alone."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = {"gspmdc": "gspmdc", "ir": "gspmdc/ir", "passes": "gspmdc/passes",
                  "runtime": "gspmdc/runtime"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(ROOT)], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    (path,) = out.glob("gspmdc-*.whl")
    return path


def test_wheel_holds_only_the_gspmdc_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"gspmdc", next(t for t in top if t.endswith(".dist-info"))}, top
    for required in ("gspmdc/cli.py", "gspmdc/ir/parser.py", "gspmdc/ir/grammar.lark",
                     "gspmdc/runtime/interpreter.py", "gspmdc/passes/pass_manager.py",
                     "gspmdc/examples/mlp.hlo"):
        assert required in names, required
    for source, installed in SOURCE_FOLDERS.items():  # every (sub)package of the source tree
        for init in (ROOT / source).rglob("__init__.py"):
            path = f"{installed}/{init.relative_to(ROOT / source).as_posix()}"
            assert path in names, f"{init.relative_to(ROOT)} is missing from the wheel as {path}: " \
                "list its package in setup.cfg"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gspmdc = gspmdc.cli:console_main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_unpacked_wheel_imports_and_parses(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    code = ("import gspmdc.ir.parser, gspmdc.runtime.interpreter, gspmdc.passes.pass_manager, "
            "gspmdc.cli, sys; from pathlib import Path; "
            "m = gspmdc.ir.parser.parse_file(Path(gspmdc.__file__).parent / 'examples' / 'mlp.hlo'); "
            "assert gspmdc.__file__.startswith(sys.argv[1]), gspmdc.__file__; print(m.name)")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "mlp"


def test_editable_install_resolves_to_the_source_tree(tmp_path):
    code = ("import importlib.util, gspmdc.ir, gspmdc.runtime, gspmdc.passes; "
            "print(gspmdc.ir.__file__); print(gspmdc.runtime.__file__); print(gspmdc.passes.__file__); "
            "print(importlib.util.find_spec('ir'), importlib.util.find_spec('runtime'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ir_init, runtime_init, passes_init, bare = proc.stdout.splitlines()
    assert Path(ir_init).resolve() == ROOT / "ir" / "__init__.py"
    assert Path(runtime_init).resolve() == ROOT / "runtime" / "__init__.py"
    assert Path(passes_init).resolve() == ROOT / "passes" / "__init__.py"
    assert bare == "None None"  # no bare `ir` or `runtime` package is importable
