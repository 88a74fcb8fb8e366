"""`gspmdc opt`: run any passes, alone or in any valid order, on a module."""
from __future__ import annotations

import argparse

from gspmdc.errors import EXIT_OK, GspmdcError

from .arguments import add_num_partitions, add_pass_reports, output_file


def cmd_opt(args: argparse.Namespace) -> int:
    """Run the passes of a textual pipeline on FILE and write the result, e.g.
    -p 'propagate,insert-reshards,pad-uneven,halo-exchange,lower-spmd,cleanup'
    (options in braces: windowed-einsum{threshold=1048576}). Each pass checks the module's
    stage first (the header's gspmdc.stage) and records the stage it leaves it at, so a pipeline
    can start from a dump of another one. -n: the partition count (default: the module's
    num_partitions, else the devices its shardings name). --list: the passes and their
    options."""
    from gspmdc import api
    from gspmdc.ir.gc_pause import paused_collection
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.pass_table import PASSES, parse_pipeline
    from gspmdc.passes.pipeline import dump_callback
    from gspmdc.prepare import devices_named_by_shardings
    if args.list:
        for name, cls in PASSES.items():
            print(f"{name:<16} {_pass_summary(cls)}")
        return EXIT_OK
    if args.file is None or args.passes is None:
        raise GspmdcError("opt needs FILE and -p PIPELINE (or --list)")
    passes = parse_pipeline(args.passes)
    with paused_collection(freeze=True):
        module = api.load(args.file)
        n = args.num_partitions or module.num_partitions or devices_named_by_shardings(module)
        ctx = PassContext(n, verify_each=args.verify_each)
        module = run_pipeline(ctx, module, passes,
                              dump_callback(args.dump_dir, args.time_passes, module))
        api.write_text(api.to_text(module), args.output)
    return EXIT_OK


def _pass_summary(cls) -> str:
    """The first line of a pass's docstring, then its options with their defaults."""
    from dataclasses import fields
    from gspmdc.passes.pass_table import format_option
    doc = (cls.__doc__ or "").strip().splitlines()[0]
    options = ",".join(f"{f.name}={format_option(f.default)}" for f in fields(cls))
    return doc + (f"\n{'':<17}{{{options}}}" if options else "")


def register(sub) -> None:
    p = sub.add_parser("opt", help="run any passes on a module (a textual pipeline)",
                       description=cmd_opt.__doc__)
    p.add_argument("file", nargs="?", help="HLO text file ('-' for standard input)")
    p.add_argument("-p", "--passes", metavar="PIPELINE",
                   help="comma-separated passes, each with optional {option=value,...}")
    add_num_partitions(p)
    p.add_argument("-o", "--output", type=output_file,
                   help="write the module here instead of stdout")
    add_pass_reports(p)
    p.add_argument("--verify-each", action="store_true",
                   help="run the verifier after every pass")
    p.add_argument("--list", action="store_true", help="list the passes and their options")
    p.set_defaults(run=cmd_opt)
