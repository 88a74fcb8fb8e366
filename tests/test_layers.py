"""The layers point one way: `ir` ← `passes` ← driver (`gspmdc/`: load, compile to a job,
format output; the commands) → `runtime`, which executes a partitioned module. Checked on the
source by static analysis of every import, lazy imports inside functions included: `ir` imports
neither passes, runtime nor driver; `passes` neither runtime nor driver; `runtime` neither passes
nor driver. All may import the shared base modules `gspmdc.errors` and `gspmdc.atomic`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: source folder of each installed package (setup.cfg's package_dir)
LAYERS = {"ir": "gspmdc.ir", "passes": "gspmdc.passes", "runtime": "gspmdc.runtime"}
SHARED = ("gspmdc.errors", "gspmdc.atomic")
FORBIDDEN = {
    "gspmdc.ir": ("gspmdc.passes", "gspmdc.runtime", "driver"),
    "gspmdc.passes": ("gspmdc.runtime", "driver"),
    "gspmdc.runtime": ("gspmdc.passes", "driver"),
}


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    package = LAYERS.get(folder, folder)
    parts = [p for p in rest if p != "__init__"]
    return ".".join([package, *parts])


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports (absolute names, relative imports resolved), with lines."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from gspmdc import api` imports the module gspmdc.api
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return sorted(found)


def layer_of(module: str) -> str | None:
    """The layer a gspmdc module belongs to: a package of LAYERS, `driver` for the rest of
    gspmdc, None for shared base modules and anything outside gspmdc."""
    if module == "gspmdc" or not module.startswith("gspmdc.") or \
            any(module == s or module.startswith(s + ".") for s in SHARED):
        return None
    for package in LAYERS.values():
        if module == package or module.startswith(package + "."):
            return package
    return "driver" if module != "gspmdc.__version__" else None


def violations(folder: str) -> list[str]:
    own = LAYERS[folder]
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, target in imports(path):
            if layer_of(target) in FORBIDDEN[own]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {target}")
    return bad


@pytest.mark.parametrize("folder", list(LAYERS))
def test_layer_imports_point_one_way(folder):
    assert violations(folder) == []


def test_the_checker_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    """A function-level `from gspmdc.commands ...` and a relative `from ..passes ...` in the
    runtime are both found."""
    fake = tmp_path / "runtime"
    fake.mkdir()
    (fake / "bad.py").write_text(
        "def f():\n    from gspmdc.commands.basic import cmd_parse\n"
        "from ..passes.pass_manager import run_pipeline\n"
        "from gspmdc import api\n"
        "from gspmdc.errors import GspmdcError\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [v.split(": ", 1)[1] for v in violations("runtime")] == [
        "gspmdc.runtime imports gspmdc.commands.basic.cmd_parse",
        "gspmdc.runtime imports gspmdc.passes.pass_manager.run_pipeline",
        "gspmdc.runtime imports gspmdc.api"]


def test_the_package_holds_and_imports_no_test_tooling():
    """The conformance scorers and the XLA oracle are test tooling (`tests/conformance/`): no
    module of the installed package is one, and none imports them."""
    bad = []
    for folder in ("gspmdc", *LAYERS):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "conformance" in path.stem:
                bad.append(f"{path.relative_to(ROOT)}: test tooling inside the package")
            for line, target in imports(path):
                if target.split(".")[0] in ("conformance", "tests") or \
                        target.startswith("gspmdc.conformance"):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert bad == []
