"""A small FileCheck: match `// CHECK...:` directives against a text, line by line.

Directives, in order (`CHECK-NOT` lines apply between the matches around them):

- `CHECK: p`      p matches a line after the previous match (the first line at the start);
- `CHECK-NEXT: p` p matches the line right after the previous match;
- `CHECK-SAME: p` p matches the rest of the previous match's line, after that match;
- `CHECK-NOT: p`  p matches no line between the previous match and the next one (the end of the
  text after the last match).

A pattern is literal text with holes: `{{regex}}` matches the regular expression,
`[[NAME:regex]]` matches it and binds NAME to the text matched, `[[NAME]]` matches exactly what
NAME was bound to earlier. Spaces are literal. `check(text, directives)` raises
`CheckFailure` naming the directive, its source line and where the search was.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("CHECK", "CHECK-NEXT", "CHECK-SAME", "CHECK-NOT")
_DIRECTIVE = re.compile(r"//\s*(CHECK(?:-NEXT|-SAME|-NOT)?):(.*)$")
_HOLE = re.compile(r"\{\{(.*?)\}\}|\[\[([A-Za-z_]\w*)(?::(.*?))?\]\]")


class CheckFailure(AssertionError):
    """A directive did not hold."""


@dataclass(frozen=True)
class Directive:
    kind: str
    pattern: str
    line: int            # where it was written (1-based)

    def __str__(self) -> str:
        return f"line {self.line}: {self.kind}: {self.pattern}"


def directives(source: str) -> list[Directive]:
    """The `// CHECK...:` directives of `source`, in order."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        match = _DIRECTIVE.search(line)
        if match:
            found.append(Directive(match.group(1), match.group(2).strip(), number))
    return found


def compile_pattern(pattern: str, bound: dict[str, str]) -> tuple[re.Pattern, list[str]]:
    """The regular expression of `pattern` and the names it binds (in group order)."""
    parts, names, at = [], [], 0
    for hole in _HOLE.finditer(pattern):
        parts.append(re.escape(pattern[at:hole.start()]))
        regex, name, definition = hole.groups()
        if regex is not None:
            parts.append(f"(?:{regex})")
        elif definition is not None:
            parts.append(f"({definition})")
            names.append(name)
        else:
            if name not in bound:
                raise CheckFailure(f"[[{name}]] is used before it is bound")
            parts.append(re.escape(bound[name]))
        at = hole.end()
    parts.append(re.escape(pattern[at:]))
    return re.compile("".join(parts)), names


def check(text: str, checks: list[Directive]) -> dict[str, str]:
    """Raise CheckFailure unless every directive holds on `text`; the bindings made."""
    lines = text.splitlines()
    bound: dict[str, str] = {}
    line, column = -1, 0           # the previous match: its line and where it ended
    pending_not: list[Directive] = []
    for directive in checks:
        if directive.kind == "CHECK-NOT":
            pending_not.append(directive)
            continue
        regex, names = compile_pattern(directive.pattern, bound)
        if directive.kind == "CHECK-SAME":
            match = regex.search(lines[line], column) if line >= 0 else None
            where = [line] if match else []
        elif directive.kind == "CHECK-NEXT":
            match = regex.search(lines[line + 1]) if line + 1 < len(lines) else None
            where = [line + 1] if match else []
        else:
            where, match = [], None
            for i in range(line + 1, len(lines)):
                match = regex.search(lines[i])
                if match:
                    where = [i]
                    break
        if match is None:
            seen = lines[line + 1] if directive.kind == "CHECK-NEXT" and line + 1 < len(lines) \
                else lines[line][column:] if directive.kind == "CHECK-SAME" and line >= 0 \
                else f"(searched from line {line + 2} of the output)"
            raise CheckFailure(f"{directive} does not match\n  at: {seen}")
        found = where[0]
        _check_absent(pending_not, lines, line, column, found, match.start(), bound)
        pending_not = []
        bound.update(zip(names, match.groups()))
        line, column = found, match.end()
    _check_absent(pending_not, lines, line, column, len(lines), 0, bound)
    return bound


def _check_absent(nots: list[Directive], lines: list[str], from_line: int, from_column: int,
                  to_line: int, to_column: int, bound: dict[str, str]) -> None:
    """Each CHECK-NOT pattern matches nowhere between the two positions."""
    for directive in nots:
        regex, _ = compile_pattern(directive.pattern, bound)
        for i in range(max(from_line, 0), min(to_line + 1, len(lines))):
            start = from_column if i == from_line else 0
            end = to_column if i == to_line else len(lines[i])
            match = regex.search(lines[i][:end], start)
            if match:
                raise CheckFailure(f"{directive} matches output line {i + 1}: {lines[i]}")


__all__ = ["Directive", "CheckFailure", "directives", "check", "KINDS"]
