"""`gspmdc propagate` and `gspmdc explain`: complete the shardings of a module, and say where a
sharding or a collective came from."""
from __future__ import annotations

import argparse

from gspmdc.commands.compile import add_propagation_options
from gspmdc.errors import EXIT_OK

from .arguments import output_file, positive_int


def cmd_propagate(args: argparse.Namespace) -> int:
    """Give every instruction that can be partitioned a sharding (Shardy's propagation for a
    module in Shardy form, XLA's GSPMD propagation otherwise, or as --propagation says) and
    write the module, one instruction per line, names unchanged, at stage `propagated`."""
    from gspmdc import api
    from gspmdc.ir.gc_pause import paused_collection
    with paused_collection(freeze=True):
        module = api.load(args.file)
        propagate_module(module, args)
        api.write_text(api.to_text(module), args.output)
    return EXIT_OK


def propagate_module(module, args):
    """Propagate `module` in place in the mode the options (or the module's form) select;
    returns the provenance of the shardings (what `explain` reads)."""
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.pipeline import default_propagation
    from gspmdc.passes.propagation import ShardingPropagation, parse_flags
    from gspmdc.passes.shardy import ShardyPropagation, ShardyToGspmd
    from gspmdc.passes.spmd import InlineCalls
    form = default_propagation(module)
    if (args.propagation or form) == "shardy":
        passes = [InlineCalls(), ShardyPropagation(strategy=args.shardy_strategy)]
    else:
        passes = ([ShardyToGspmd()] if form == "shardy" else []) + [ShardingPropagation(
            propagate_to_output=parse_flags(args.propagate_to_output),
            propagate_to_parameters=parse_flags(args.propagate_to_parameters))]
    ctx = PassContext(module.num_partitions or 1)
    run_pipeline(ctx, module, passes)
    return ctx.provenance[passes[-1].name]


def cmd_explain(args: argparse.Namespace) -> int:
    """Say why an instruction is there and has its sharding. In a partitioned module (written by
    `gspmdc compile`): why a collective (or any instruction the partitioner made) exists, what it
    sends, and the chain back to user annotations. In a global program: the chain of rules and
    instructions that gave the instruction its sharding (propagating first when the module's
    stage is `global`). In a module written by `gspmdc autoshard`: the modelled costs of the
    instruction's chosen sharding and the shardings autoshard rejected, with the change of the
    modelled step time each would make."""
    from gspmdc import api
    from gspmdc.passes.autoshard.explain import explain_choice, is_autoshard_output
    from gspmdc.ir.stage import Stage, module_stage
    from gspmdc.passes.propagation import explain
    from gspmdc.passes.spmd import explain_collective
    module = api.load(args.file)
    stage = module_stage(module)
    if stage is Stage.PARTITIONED:
        lines = explain_collective(module, args.instruction)
    elif is_autoshard_output(module):
        lines = explain_choice(module, args.instruction)
    elif stage is Stage.GLOBAL:
        provenance = propagate_module(module, args)
        lines = explain(module, args.instruction, args.n, provenance)
    else:
        lines = explain(module, args.instruction, args.n)
    for line in lines[:args.n] if args.n else lines:
        print(line)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("propagate", help="complete the shardings of a module (XLA's propagation)",
                       description=cmd_propagate.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    p.add_argument("-o", "--output", type=output_file,
                   help="write the propagated module here instead of stdout")
    p.add_argument("--propagate-to-output", default="false", metavar="LIST",
                   help="may propagation set the entry's output sharding: true/false, or one per "
                        "output tuple element, comma-separated (default false)")
    p.add_argument("--propagate-to-parameters", default="false", metavar="LIST",
                   help="may propagation set the entry parameters' shardings: true/false, or one "
                        "per parameter, comma-separated (default false)")
    add_propagation_options(p)
    p.set_defaults(run=cmd_propagate)

    p = sub.add_parser("explain", help="say why an instruction (or a collective) is there",
                       description=cmd_explain.__doc__)
    p.add_argument("file", help="HLO text file: original, propagated, written by autoshard, or "
                        "compiled (SPMD)")
    p.add_argument("instruction", help="instruction name (computation:name when names repeat)")
    p.add_argument("-n", type=positive_int, default=None, metavar="N",
                   help="show at most N lines")
    p.set_defaults(run=cmd_explain, propagate_to_output="false", propagate_to_parameters="false")
    add_propagation_options(p)
