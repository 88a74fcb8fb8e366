"""`gspmdc report` in a real browser: headless Chromium loads the page from disk, which must
render the program graph (a box per value, the collectives with their cost), answer a click on a
box, draw the memory plot, raise no console error and fetch nothing from the network. A
screenshot of each page lands in the test's output directory (pytest's tmp_path)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from headless_chromium import Chromium, find_chromium

EXAMPLES = Path(__file__).resolve().parents[1] / "gspmdc" / "examples"
PROGRAMS = Path(__file__).resolve().parents[2] / "shared" / "jax-programs"

needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="headless Chromium is not installed")

VISIBLE_NODES = "document.querySelectorAll('.graph:not([hidden]) g.node').length"
COLLECTIVE_LABELS = ("Array.from(document.querySelectorAll('.graph:not([hidden]) g.node.collective"
                     " text.cost')).map(t => t.textContent)")
GRAPH_SIZE = ("(() => { const r = document.querySelector('.graph:not([hidden]) svg')"
              ".getBoundingClientRect(); return [r.width, r.height]; })()")
CLICK = ("(() => { const n = document.querySelector('.graph:not([hidden]) g.node.collective')"
         " || document.querySelector('.graph:not([hidden]) g.node');"
         " n.dispatchEvent(new MouseEvent('click', {bubbles: true}));"
         " return [n.querySelector('text.name').textContent,"
         " document.querySelector('#panel h4').textContent]; })()")
MEMORY_POINTS = "document.querySelectorAll('.memory-chart rect.hover').length"
PASSES = "document.querySelectorAll('#passes details > summary .pass').length"


def _report(program: Path, n: int, out: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "gspmdc", "report", str(program), "-n", str(n),
                           "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out.read_text()


def _entry_collectives(spmd_text: str) -> int:
    entry = spmd_text[spmd_text.index("\nENTRY"):]
    entry = entry[:entry.index("\n}")]
    return len(re.findall(r"= \S+ (all-reduce|all-gather|reduce-scatter|all-to-all|"
                          r"collective-permute)\(", entry))


def _check_page(html_path: Path, shot: Path, spmd_text: str) -> dict:
    with Chromium() as browser:
        page = browser.load(html_path.as_uri(), [VISIBLE_NODES, COLLECTIVE_LABELS, GRAPH_SIZE,
                                                 CLICK, MEMORY_POINTS, PASSES], str(shot))
    assert page.errors == []
    assert page.external_requests == []
    values = page.values
    assert values[VISIBLE_NODES] >= 5
    width, height = values[GRAPH_SIZE]
    assert width > 100 and height > 100
    labels = values[COLLECTIVE_LABELS]
    assert len(labels) == _entry_collectives(spmd_text)
    assert all(re.match(r"[\d.]+ (B|KiB|MiB|GiB) sent · ", label) for label in labels)
    clicked, shown = values[CLICK]
    assert clicked == shown
    assert values[MEMORY_POINTS] > 0
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    return values


@needs_chromium
def test_report_of_the_mlp_example_renders_in_chromium(tmp_path):
    html = _report(EXAMPLES / "mlp.hlo", 8, tmp_path / "mlp.html")
    spmd = subprocess.run([sys.executable, "-m", "gspmdc", "compile", str(EXAMPLES / "mlp.hlo"),
                           "-n", "8"], capture_output=True, text=True, check=True).stdout
    values = _check_page(tmp_path / "mlp.html", tmp_path / "mlp.png", spmd)
    assert values[PASSES] == 1 + 7            # the input and the seven passes compile runs
    assert "all-reduce" in html and "the local dot leaves partial results" in html


@needs_chromium
@pytest.mark.parametrize("name", ["moe_layer", "pipeline_shift"])
def test_report_of_jax_programs_renders_in_chromium(tmp_path, name):
    program = PROGRAMS / name / "program.hlo"
    if not program.is_file():
        pytest.skip(f"{program} not found")
    _report(program, 8, tmp_path / f"{name}.html")
    spmd = subprocess.run([sys.executable, "-m", "gspmdc", "compile", str(program), "-n", "8"],
                          capture_output=True, text=True, check=True).stdout
    _check_page(tmp_path / f"{name}.html", tmp_path / f"{name}.png", spmd)


def test_report_is_self_contained(tmp_path):
    html = _report(EXAMPLES / "pipeline.hlo", 4, tmp_path / "pipeline.html")
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\((?!#)", html)
    assert re.findall(r"https?://[^\"'\s<]+", html) == ["http://www.w3.org/2000/svg"] * \
        html.count("http://www.w3.org/2000/svg")
    # a loop body gets its own graph
    assert ">body (body of main/loop)</option>" in html


def test_report_needs_an_output_file(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gspmdc", "report",
                           str(EXAMPLES / "mlp.hlo")], capture_output=True, text=True)
    assert done.returncode == 2 and "-o FILE" in done.stderr
