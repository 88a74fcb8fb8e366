"""The `gspmdc` command line.

Exit codes, shared by every subcommand: 0 success, 1 numeric mismatch (checks), 2 bad input or
unsupported feature (one clear message, never a traceback), 3 runtime failure.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gspmdc import __version__
from gspmdc.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUNTIME, GspmdcError


def _cmd_parse(args: argparse.Namespace) -> int:
    """Parse, verify and print a module canonically."""
    from gspmdc import api
    module = api.load(args.file, verify=not args.no_verify)
    api.write_text(api.to_text(module), args.output)
    return EXIT_OK


def _cmd_eval(args: argparse.Namespace) -> int:
    """Run the unpartitioned module on one device with the reference interpreter."""
    from gspmdc import api
    from gspmdc.runtime import io
    module = api.load(args.file)
    if args.inputs:
        inputs = io.read_inputs(args.inputs, module)
    else:
        inputs = io.random_inputs(module, args.seed)
    outputs = io.output_arrays(module, api.evaluate(module, inputs))
    if args.outputs:
        io.write_npz_atomic(args.outputs, outputs)
    if not args.quiet:
        for name, value in outputs.items():
            print(f"{name}: {_describe(value)}")
    return EXIT_OK


def _describe(value) -> str:
    import numpy as np
    from gspmdc.ir import dtypes
    text = f"{dtypes.element_type_of(value.dtype)}{list(value.shape)}"
    if value.size == 0:
        return text + " (empty)"
    with np.printoptions(precision=6, threshold=8, edgeitems=3, linewidth=100):
        return text + " " + np.array2string(value.astype(np.float64) if value.dtype.kind == "V"
                                             else value, separator=", ")


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

    p = sub.add_parser("parse", help="check a module and print it in canonical HLO text",
                       description=_cmd_parse.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    p.add_argument("-o", "--output", help="write the canonical text here instead of stdout")
    p.add_argument("--no-verify", action="store_true", help="skip the shape/sharding verifier")
    p.set_defaults(run=_cmd_parse)

    p = sub.add_parser("eval", help="run a module on one device with the reference interpreter",
                       description=_cmd_eval.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    p.add_argument("--inputs", help="npz file with arg0, arg1, ... (by parameter number)")
    p.add_argument("--outputs", help="write out0, out1, ... (one per tuple element of the root) here")
    p.add_argument("--seed", type=int, default=0,
                   help="seed for random inputs when --inputs is not given (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the outputs")
    p.set_defaults(run=_cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except GspmdcError as e:
        print(f"gspmdc: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gspmdc: interrupted", file=sys.stderr)
        return EXIT_RUNTIME
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # an internal bug: report it as one message, not a traceback
        if args.traceback:
            raise
        print(f"gspmdc: internal error: {type(e).__name__}: {e}\n"
              "(this is a bug in gspmdc; rerun with --traceback for details)", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
