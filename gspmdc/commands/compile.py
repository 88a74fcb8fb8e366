"""`gspmdc compile`: partition a module into the SPMD program for N partitions."""
from __future__ import annotations

import argparse

from gspmdc.errors import EXIT_OK

from .arguments import (
    add_num_partitions, add_pass_reports, add_windowed_einsum_threshold, output_file,
)

#: the choices of --shardy-strategy (passes.shardy.options.STRATEGIES, not imported at start-up)
SHARDY_STRATEGIES = ("aggressive", "basic", "basic-then-aggressive")


def cmd_compile(args: argparse.Namespace) -> int:
    """Partition FILE for N partitions: sharding propagation (unless --no-propagate), explicit
    reshards, padding masks, lowering to per-partition shapes with partition-id tables and
    collectives. Writes the SPMD module as HLO text (stdout, or -o atomically); --dump-dir writes
    the module after every pass (NNN.<pass>.hlo); --time-passes prints each pass's wall time;
    --windowed-einsum-threshold BYTES turns big dots into windowed einsums; --propagation picks
    Shardy's or GSPMD's propagation (default: Shardy for JAX's default dumps, which carry
    xla.sdy.meshes); --global takes a module that records no stage as a global program whatever
    it holds (as XLA's partitioner takes every module), where its contents alone would call it
    partitioned (a partition-id or a collective outside manual regions)."""
    from gspmdc import api
    from gspmdc.ir.gc_pause import paused_collection
    from gspmdc.passes.pipeline import compile_spmd
    from gspmdc.ir.stage import claim_global
    with paused_collection(freeze=True):
        module = api.load(args.file)
        if args.claim_global:
            claim_global(module, args.file)
        spmd = compile_spmd(module, args.num_partitions, dump_dir=args.dump_dir,
                            time_passes=args.time_passes, propagate=not args.no_propagate,
                            windowed_einsum_threshold=args.windowed_einsum_threshold,
                            propagation=args.propagation, shardy_strategy=args.shardy_strategy)
        api.write_text(api.to_text(spmd), args.output)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("compile", help="partition a module into one SPMD program for N partitions",
                       description=cmd_compile.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    add_num_partitions(p, required=True, help="number of partitions")
    p.add_argument("-o", "--output", type=output_file,
                   help="write the SPMD module here instead of stdout")
    add_pass_reports(p)
    p.add_argument("--no-propagate", action="store_true",
                   help="skip sharding propagation: unsharded instructions are replicated")
    add_windowed_einsum_threshold(p)
    add_propagation_options(p)
    p.add_argument("--global", dest="claim_global", action="store_true",
                   help="the module is a global program (to partition), whatever it holds")
    p.set_defaults(run=cmd_compile)


def add_propagation_options(p) -> None:
    """`--propagation` and `--shardy-strategy` (compile, run, propagate, explain)."""
    p.add_argument("--propagation", choices=("shardy", "gspmd"), default=None,
                   help="sharding propagation: Shardy's (default for modules in Shardy form, "
                        "i.e. with xla.sdy.meshes, what JAX prints by default) or XLA's GSPMD "
                        "(default otherwise)")
    p.add_argument("--shardy-strategy", choices=SHARDY_STRATEGIES, default="aggressive",
                   help="Shardy's factor propagation strategy: aggressive resolves conflicts "
                        "between factors (the default), basic only propagates what all agree "
                        "on")
