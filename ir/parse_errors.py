"""Parse errors: a problem found at a place in the text, and its report.

`ParseProblem` is raised while reading HLO text, carrying a message and a 1-based line and
column; `syntax_error` turns it into the user-facing `HloSyntaxError` (file:line:col, the
source line and a caret). `lark_problem` translates one of lark's exceptions into the located
`expected X, found Y` problem, naming terminals in words and listing only the terminals the
parser could really shift there. `located_error` prefixes another GspmdcError (the verifier's,
about one instruction) with the instruction's place in the text.
"""
from __future__ import annotations

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.parsers.lalr_analysis import Shift

from gspmdc.errors import GspmdcError, HloSyntaxError

class ParseProblem(Exception):
    """An error at a known line and column, raised while parsing (`syntax_error` adds the file)."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def problem_at(token: Token, message: str) -> ParseProblem:
    """The problem `message` at `token`'s line and column."""
    return ParseProblem(message, token.line, token.column)


def syntax_error(problem: ParseProblem, text: str, filename: str) -> HloSyntaxError:
    """The user-facing error for `problem` in `text` read from `filename`."""
    lines = text.splitlines()
    source = lines[problem.line - 1] if 0 < problem.line <= len(lines) else None
    return HloSyntaxError(problem.message, filename=filename, line=problem.line,
                          column=problem.column, source_line=source)


#: readable descriptions of the regex terminals of grammar.lark (string terminals print as quoted)
_TERMINAL_TEXT = {
    "NAME": "a name", "OPCODE": "an opcode", "PARAMETER": "'parameter'", "CONSTANT": "'constant'",
    "ATTR_NAME": "an attribute (name=value)", "ARRAY_SHAPE": "a shape such as f32[8]",
    "INT": "an integer", "STRING": "a quoted string",
    "QUOTED": "a quoted axis name such as 'x'", "WORD": "a value",
    "PAD": "padding such as 0_0x1_1",
    "DXD": "sizes such as 3x3", "DIM_LABELS": "dimension labels such as b01f_01io->b01f",
    "COMMA_DEVICE_IDS": "', device_ids='", "KV_FLAT": "{key=value ...}", "ELIDED": "'{...}'", "ARRAY_LITERAL": "an array literal",
    "LIT_SCALAR": "a literal value", "FRAME_SECTION": "a stack frame table",
    "$END": "end of input",
}


def _expected_text(names, lark: Lark) -> str:
    names = set(names or ())
    if "ATTR_NAME" in names:   # the `name=` keywords are attribute names too
        names = {n for n in names if not _terminal_pattern(lark, n).endswith("=")} | {"ATTR_NAME"}
    if "OPCODE" in names:
        names -= {"PARAMETER", "CONSTANT"}
    texts = sorted({_TERMINAL_TEXT.get(n) or f"'{_terminal_pattern(lark, n)}'" for n in names})
    if not texts:
        return "nothing"
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " or " + texts[-1]


def _terminal_pattern(lark: Lark, name: str) -> str:
    try:
        return lark.get_terminal(name).pattern.value
    except KeyError:
        return name


def lark_problem(e: UnexpectedInput, text: str, lark: Lark) -> ParseProblem:
    """The located `expected X, found Y` problem for one of lark's exceptions."""
    candidates = e.allowed if isinstance(e, UnexpectedCharacters) else e.expected
    expected = _expected_text(_viable(e.state, candidates), lark)
    position = e.pos_in_stream
    if position is not None and text.startswith("/*", position):
        return ParseProblem("unterminated /* comment", e.line, e.column)
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        found = e.token.value if len(e.token.value) <= 40 else e.token.value[:37] + "..."
        return ParseProblem(f"expected {expected}, found '{found}'", e.token.line, e.token.column)
    if isinstance(e, UnexpectedCharacters):
        found = text[position]
        found = "end of line" if found == "\n" else f"'{found}'"
        return ParseProblem(f"expected {expected}, found {found}", e.line, e.column)
    return ParseProblem(f"expected {expected}, found end of input", *_end_position(text))


def _viable(parser_state, candidates) -> set[str]:
    """The candidate terminals the parser would really shift from `parser_state` (LALR's merged
    states announce lookaheads of other contexts too; this replays the reductions on a copy of
    the state stack, without callbacks, to keep only the real ones)."""
    candidates = set(candidates or ())
    stack = getattr(parser_state, "state_stack", None)
    if stack is None:
        return candidates
    states = parser_state.parse_conf.states
    viable = set()
    for terminal in candidates:
        trial = list(stack)
        while True:
            step = states[trial[-1]].get(terminal)
            if step is None:
                break
            action, arg = step
            if action is Shift:
                viable.add(terminal)
                break
            if arg.expansion:
                del trial[-len(arg.expansion):]
            trial.append(states[trial[-1]][arg.origin.name][1])
    return viable or candidates


def _end_position(text: str) -> tuple[int, int]:
    end = len(text.rstrip())
    return text.count("\n", 0, end) + 1, end - text.rfind("\n", 0, end)


def token_position(token: Token, offset: int) -> tuple[int, int]:
    """Line and column of the character `offset` characters into `token`."""
    before = token.value[:offset]
    newlines = before.count("\n")
    if not newlines:
        return token.line, token.column + offset
    return token.line + newlines, offset - before.rfind("\n")


def located_error(error: GspmdcError, token: Token, text: str, filename: str) -> GspmdcError:
    """`error` (same class) with `file:line:col:` of `token`, the line and a caret."""
    lines = text.splitlines()
    message = f"{filename}:{token.line}:{token.column}: {error}"
    if 0 < token.line <= len(lines):
        message += "\n" + lines[token.line - 1].rstrip("\n") + "\n" + \
            " " * max(token.column - 1, 0) + "^"
    located = type(error)(message)
    located.instruction = error.instruction
    return located
