"""Every reference in a comment or docstring resolves inside the repository: no numbered section of a
document outside it, and every path cited (`docs/design/propagation.md#forward-rules`,
`passes/spmd/halo.py`) names a file of the repository, and its `#anchor` a heading of that file.
Design notes live in `docs/design/`. Paths into the team's corpora beside the repository
(`../shared`: `conformance/xla-*.json`, `jax-programs/...`) and files a command writes (`out/...`)
are not references."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the installed package's source folders, the tests and the benchmarks
FOLDERS = ("gspmdc", "ir", "passes", "runtime", "tests", "bench")
#: a path with at least one folder, optionally with a `#anchor`
PATH = re.compile(r"(?<![\w./-])((?:\.\./)?(?:[\w.-]+/)+[\w.-]+\.(?:md|py|lark|hlo|cfg|toml|txt))"
                  r"(#[\w-]+)?")
#: where a cited path is not a file of the repository
NOT_REFERENCES = ("../shared/", "shared/", "conformance/xla-", "jax-programs/", "out/")


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")
                  if ".venv" not in p.parts)


def prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, with their first line."""
    text = path.read_text()
    found = [(tok.start[0], tok.string)
             for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.append((body[0].lineno, body[0].value.value))
    return found


def slug(heading: str) -> str:
    """The anchor a Markdown heading gets (GitHub's rule: lower case, punctuation dropped, spaces
    to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in markdown.read_text().splitlines()
            if line.startswith("#")}


def broken_references(path: Path) -> list[str]:
    bad = []
    where = path.relative_to(ROOT)
    for line, text in prose(path):
        if "§" in text:
            bad.append(f"{where}:{line}: cites a § section outside the repository")
        for match in PATH.finditer(text):
            cited, anchor = match.group(1), match.group(2)
            if cited.startswith(NOT_REFERENCES) or "*" in cited:
                continue
            target = next((base / cited for base in (ROOT, path.parent)
                           if (base / cited).is_file()), None)
            if target is None:
                bad.append(f"{where}:{line}: cites {cited}, which is not in the repository")
            elif anchor and target.suffix == ".md" and anchor[1:] not in anchors(target):
                bad.append(f"{where}:{line}: cites {cited}{anchor}, a heading {cited} lacks")
    return bad


@pytest.mark.parametrize("folder", FOLDERS)
def test_comments_and_docstrings_cite_only_the_repository(folder):
    bad = [b for p in sources() if p.relative_to(ROOT).parts[0] == folder
           for b in broken_references(p)]
    assert bad == []


def test_the_checker_finds_sections_missing_files_and_missing_anchors(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "note.md").write_text("# Note\n\n## The driver\n")
    (tmp_path / "passes").mkdir()
    bad = tmp_path / "passes" / "bad.py"
    bad.write_text('"""See docs/note.md#the-driver and docs/note.md#missing."""\n'
                   "# reference §3.3\nx = 1  # docs/gone.md, ../shared/conformance/xla-a.json\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [b.split(": ", 1)[1] for b in broken_references(bad)] == [
        "cites a § section outside the repository",
        "cites docs/gone.md, which is not in the repository",
        "cites docs/note.md#missing, a heading docs/note.md lacks"]


#: a relative Markdown link `[text](target.md#anchor)`
LINK = re.compile(r"\]\(((?![a-z]+:)[^)#\s]+\.md)?(#[\w-]+)?\)")


def broken_doc_links(markdown: Path) -> list[str]:
    """The numbered-section citations and the relative links of a Markdown page that do not
    resolve."""
    bad = []
    where = markdown.relative_to(ROOT)
    for line, text in enumerate(markdown.read_text().splitlines(), 1):
        if "§" in text:
            bad.append(f"{where}:{line}: cites a § section outside the repository")
        for match in LINK.finditer(text):
            cited, anchor = match.group(1), match.group(2)
            target = markdown.parent / cited if cited else markdown
            if not target.is_file():
                bad.append(f"{where}:{line}: links {cited}, which is not in the repository")
            elif anchor and anchor[1:] not in anchors(target):
                bad.append(f"{where}:{line}: links {cited or ''}{anchor}, a heading it lacks")
    return bad


def test_user_docs_cite_and_link_only_the_repository():
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    assert [b for page in pages for b in broken_doc_links(page)] == []


def test_the_doc_checker_finds_sections_and_broken_links(tmp_path, monkeypatch):
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "docs" / "design" / "note.md").write_text("# Note\n\n## Uneven shards\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("see [a](design/note.md#uneven-shards), [b](design/note.md#gone),\n"
                    "[c](gone.md), [d](https://example.org/x.md) and reference §4.6\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [b.split(": ", 1)[1] for b in broken_doc_links(page)] == [
        "links design/note.md#gone, a heading it lacks",
        "cites a § section outside the repository",
        "links gone.md, which is not in the repository"]
