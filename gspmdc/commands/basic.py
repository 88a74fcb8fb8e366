"""`gspmdc parse` and `gspmdc eval`: check/print a module, run it on one device."""
from __future__ import annotations

import argparse

from gspmdc.errors import EXIT_OK

from .arguments import non_negative_int, output_file


def cmd_parse(args: argparse.Namespace) -> int:
    """Parse, verify and print a module canonically."""
    from gspmdc import api
    module = api.load(args.file, verify=not args.no_verify)
    api.write_text(api.to_text(module), args.output)
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    """Run the unpartitioned module on one device with the reference interpreter. bf16 results
    are rounded as XLA's CPU backend rounds them by default (--rounding xla), or each to its type
    (--rounding per-op, XLA with --xla_allow_excess_precision=false)."""
    from gspmdc import api
    from gspmdc.runtime import io
    module = api.load(args.file)
    if args.inputs:
        inputs = io.read_inputs(args.inputs, module)
    else:
        inputs = io.random_inputs(module, args.seed)
    outputs = io.output_arrays(module, api.evaluate(module, inputs, rounding=args.rounding))
    if args.outputs:
        io.write_npz_atomic(args.outputs, outputs)
    if not args.quiet:
        for name, value in outputs.items():
            print(f"{name}: {io.describe_value(value)}")
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("parse", help="check a module and print it in canonical HLO text",
                       description=cmd_parse.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    p.add_argument("-o", "--output", type=output_file,
                   help="write the canonical text here instead of stdout")
    p.add_argument("--no-verify", action="store_true", help="skip the shape/sharding verifier")
    p.set_defaults(run=cmd_parse)

    p = sub.add_parser("eval", help="run a module on one device with the reference interpreter",
                       description=cmd_eval.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    p.add_argument("--inputs", help="npz file with arg0, arg1, ... (by parameter number)")
    p.add_argument("--outputs", type=output_file,
                   help="write out0, out1, ... (one per tuple element of the root) here")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed for random inputs when --inputs is not given (default 0)")
    add_rounding_argument(p)
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the outputs")
    p.set_defaults(run=cmd_eval)


def add_rounding_argument(parser) -> None:
    """`--rounding` of `eval` and `run` (the interpreter's `rounding`)."""
    from gspmdc.runtime.options import DEFAULT_ROUNDING, ROUNDINGS
    parser.add_argument("--rounding", choices=ROUNDINGS, default=DEFAULT_ROUNDING,
                        help="where bf16 results are rounded: xla, as XLA's CPU backend with its "
                             "default flags (a convert to f32 and a bf16 all-reduce read the f32 "
                             "value of the arithmetic op before them; the default); per-op, every "
                             "result to its type (XLA with --xla_allow_excess_precision=false)")
