"""The `gspmdc` command line.

Exit codes, shared by every subcommand: 0 success, 1 numeric mismatch (checks), 2 bad input or
unsupported feature (one clear message, never a traceback), 3 runtime failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from gspmdc import __version__
from gspmdc.commands import COMMANDS
from gspmdc.errors import EXIT_OK, EXIT_RUNTIME, GspmdcError, InternalError

#: how an internal error ends: the user can do nothing about it but report it
_BUG_HINT = "(this is a bug in gspmdc; rerun with --traceback for details)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gspmdc",
        description="SPMD partitioning compiler for XLA HLO text (GSPMD in Python).",
        epilog="exit codes: 0 success, 1 numeric mismatch, 2 bad input or unsupported feature, "
               "3 runtime failure")
    parser.add_argument("--version", action="version", version=f"gspmdc {__version__}")
    parser.add_argument("--traceback", action="store_true",
                        help="show Python tracebacks of internal errors (for gspmdc developers)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None, started_at: float | None = None) -> int:
    """Run the command `argv` (default: this process's arguments) and return its exit code.
    `started_at` (a `time.time()`) is when the command started, from which `run --timeout` and
    the profile's start-up count: the `gspmdc` command passes its process's start; a call from a
    running program (tests, notebooks) leaves it to default to the call."""
    started_at = time.time() if started_at is None else started_at
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started_at = started_at
    try:
        return args.run(args)
    except InternalError as e:
        if args.traceback:
            raise
        print(f"gspmdc: internal error: {e}\n{_BUG_HINT}", file=sys.stderr)
        return e.exit_code
    except GspmdcError as e:
        print(f"gspmdc: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gspmdc: interrupted", file=sys.stderr)
        return EXIT_RUNTIME
    except MemoryError as e:
        print(f"gspmdc: error: out of memory{f' ({e})' if str(e) else ''}", file=sys.stderr)
        return EXIT_RUNTIME
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # an internal bug: report it as one message, not a traceback
        if args.traceback:
            raise
        print(f"gspmdc: internal error: {type(e).__name__}: {e}\n{_BUG_HINT}", file=sys.stderr)
        return EXIT_RUNTIME


def console_main() -> None:
    """The `gspmdc` command: `main()`, then exit without the interpreter's teardown, the standard
    streams flushed. When `main` returns, every file a command wrote is closed (written
    atomically) and its work is done: the teardown would only free the objects one by one, which
    with numpy, the parser and the passes loaded takes longer than many commands, and after
    `gspmdc run` on MPI ranks, whose fork of the rank server left this process's memory
    copy-on-write, faults its pages in again (1,700 page faults of the example's run while the
    reaper was a fork too)."""
    from gspmdc.runtime.mpi_processes import process_started_at
    code = main(started_at=process_started_at())
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass                        # the reader is gone: nothing more can be told
    os._exit(code)


if __name__ == "__main__":
    console_main()
