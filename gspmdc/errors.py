"""The error hierarchy shared by every part of gspmdc.

Each error carries the process exit code the CLI uses for it:
0 success, 1 numeric mismatch (checks), 2 bad input or unsupported feature, 3 runtime failure.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 3


class GspmdcError(Exception):
    """Base class: an error the CLI reports as one clear message (no traceback)."""

    exit_code = EXIT_BAD_INPUT
    #: the IR instruction a semantic error is about, when there is one (the parser uses it to
    #: add the instruction's file:line:col)
    instruction = None


class HloSyntaxError(GspmdcError):
    """Malformed HLO text: `file:line:col: expected X, found Y`, then the line and a caret."""

    def __init__(self, message: str, *, filename: str = "<string>", line: int = 0,
                 column: int = 0, source_line: str | None = None):
        self.filename, self.line, self.column = filename, line, column
        self.source_line = source_line
        self.bare_message = message
        text = f"{filename}:{line}:{column}: {message}"
        if source_line is not None:
            text += "\n" + source_line.rstrip("\n") + "\n" + " " * max(column - 1, 0) + "^"
        super().__init__(text)


class ShardingError(GspmdcError, ValueError):
    """An invalid sharding (bad tile assignment, rank mismatch, ...)."""


class VerificationError(GspmdcError):
    """The IR is well-formed text but violates HLO semantics (shape mismatch, bad operand, ...)."""


class UnsupportedError(GspmdcError):
    """A valid HLO feature that gspmdc does not implement (I/O ops, elided constants, ...)."""


class InternalError(GspmdcError):
    """An inconsistency inside gspmdc (a bug, whatever the input): reported as an internal
    error, exit code 3, never as bad input."""

    exit_code = EXIT_RUNTIME


class RuntimeFailure(GspmdcError):
    """Execution failed (a kernel raised, a rank died, a timeout)."""

    exit_code = EXIT_RUNTIME
