"""HLO text -> IR: `parse_module`, `parse_file`, `parse_shape`, `parse_sharding`.

The syntax is XLA's HLO text (grammar in `grammar.lark`; the accepted forms are described in
docs/text-format.md and the reader's design in docs/design/hlo-text.md), plus gspmdc's
named-mesh notation:

* header attribute `mesh={x=2, y=4}` (axis name = size, major to minor), optionally ending with
  `devices=[0,2,4,6,1,3,5,7]` (explicit device order, row-major over the mesh);
* instruction sharding `sharding={mesh_split=[x, _, (y,z)]}`: one entry per tensor dim, an axis
  name, `_` for an unsplit dim, or `(a,b)` for several axes major-to-minor; mesh axes not named are
  replicated. It is lowered at parse time to the standard tiled sharding via `Mesh.sharding`.

Reading is one LALR pass of lark whose callbacks (`grammar_callbacks.py`) turn the text into
plain records with typed attribute values (`parse_records.py`); `module_builder.py` then builds
the IR from the records. Every error, syntactic or semantic, is an `HloSyntaxError` located at
`file:line:col` with the source line and a caret (`parse_errors.py`).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from lark import Lark
from lark.exceptions import UnexpectedInput

from gspmdc.errors import GspmdcError, HloSyntaxError

from .attributes import STACK_FRAME_INDEX
from .fast_reader import read_array_shape, read_records
from .gc_pause import paused_collection
from .grammar_callbacks import Records
from .module import Module
from .module_builder import ModuleBuilder
from .parse_errors import ParseProblem, lark_problem, located_error, problem_at, syntax_error
from .parse_records import MeshSplit, MeshTuple
from .sdy_read import SdyPositionError
from .shapes import Shape
from .sharding import HloSharding

__all__ = ["parse_module", "parse_file", "parse_shape", "parse_sharding", "read_source",
           "STACK_FRAME_INDEX"]


_GRAMMAR: list[Lark] = []


def _lark() -> Lark:
    """The compiled grammar, built on first use in a process. lark keeps the LALR tables in a
    file of the temporary directory keyed by the grammar's hash (`cache=True`): loading them
    takes a quarter of building them, which every MPI rank's start-up saves; an unreadable
    cache file is rebuilt."""
    if not _GRAMMAR:
        grammar = resources.files(__package__).joinpath("grammar.lark").read_text()
        _GRAMMAR.append(Lark(grammar, parser="lalr", lexer="contextual", transformer=Records(),
                             start=["start", "shape_text", "sharding_text"],
                             maybe_placeholders=False, cache=True))
    return _GRAMMAR[0]


def _parse(text: str, filename: str, start: str):
    lark = _lark()
    try:
        try:
            return lark.parse(text, start=start)
        except UnexpectedInput as e:
            raise lark_problem(e, text, lark) from None
    except ParseProblem as problem:
        raise syntax_error(problem, text, filename) from None


def parse_module(text: str, filename: str = "<string>", *, verify: bool = False) -> Module:
    """Parse HLO module text. Raises HloSyntaxError (file:line:col, the line and a caret) for
    malformed text and for semantic errors found while building (undefined names, shape
    mismatches, invalid shardings, uninferable shapes, ...). `verify`: also run the verifier
    (`verifier.verify_module`); its error about an instruction then starts with the
    instruction's file:line:col and shows the line."""
    with paused_collection():
        return _parse_module(text, filename, verify)


def _parse_module(text: str, filename: str, verify: bool) -> Module:
    records = read_records(text) or _parse(text, filename, "start")
    builder = ModuleBuilder(text)
    try:
        module = builder.build(records)
    except ParseProblem as problem:
        raise syntax_error(problem, text, filename) from None
    except SdyPositionError as e:
        line = text.count("\n", 0, e.offset) + 1
        raise syntax_error(ParseProblem(e.message, line, e.offset - text.rfind("\n", 0, e.offset)),
                           text, filename) from None
    if verify:
        from .verifier import verify_module
        try:
            verify_module(module)
        except GspmdcError as e:
            record = builder.texts.get(id(e.instruction))
            if record is None:
                raise
            raise located_error(e, record.name, text, filename) from None
    return module


def parse_file(path) -> Module:
    """Parse an HLO text file (errors name the file)."""
    return parse_module(read_source(path), str(path))


def read_source(path) -> str:
    """The text of an HLO file (`-`: standard input), which must be UTF-8: a byte that is not
    is an HloSyntaxError at its line and column; an unreadable file a GspmdcError."""
    import sys
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except OSError as e:
        raise GspmdcError(f"{name}: cannot read: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1:].decode("utf-8", "replace")) + 1
        text = data.decode("utf-8", "replace")
        source = text.splitlines()[line - 1] if text.splitlines() else None
        raise HloSyntaxError(f"not UTF-8 text: byte 0x{data[e.start]:02x}", filename=name,
                             line=line, column=column, source_line=source) from None


def parse_shape(text: str) -> Shape:
    """A shape such as `f32[8,16]{1,0}` or `(f32[2], s32[])`. One array shape is read by the
    fast reader (`gspmdc run` reads the global signature's shapes, and needs lark for nothing
    else when the module was read fast); anything else, and every error, by the grammar."""
    return read_array_shape(text) or _parse(text, "<shape>", "shape_text")


def parse_sharding(text: str) -> HloSharding:
    """A sharding such as `{devices=[2,1]0,1}` (the named-mesh form needs a module's mesh)."""
    sharding = _parse(text, "<sharding>", "sharding_text")
    if isinstance(sharding, (MeshSplit, MeshTuple)):
        problem = problem_at(sharding.token, "mesh_split= needs a module with a mesh= header")
        raise syntax_error(problem, text, "<sharding>")
    return sharding
