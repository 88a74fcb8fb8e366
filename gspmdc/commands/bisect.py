"""`gspmdc bisect`: find the first instruction whose partitioned value is wrong."""
from __future__ import annotations

import argparse

from gspmdc.commands.arguments import (
    add_num_partitions, add_windowed_einsum_threshold, non_negative_int,
)
from gspmdc.errors import EXIT_MISMATCH, EXIT_OK, GspmdcError


def cmd_bisect(args: argparse.Namespace) -> int:
    """Run the global program FILE on one device and its partitioned program on N local
    threads from the same inputs, and name the first instruction (in execution order: program
    order, through loops, calls and branches) whose partitioned value differs from the
    unpartitioned one: both values and where they differ most, the partitions whose pieces are
    wrong, its sharding, its operands' shardings and the partitioner's instructions for it
    (reshards with their reasons). --partitioned SPMD checks that partitioned program (e.g. an
    edited `gspmdc compile` output) instead of partitioning FILE. Exit 1 when a value differs,
    0 when none does."""
    from gspmdc import api
    from gspmdc.bisect import bisect, format_result
    from gspmdc.ir.stage import Stage, module_stage
    from gspmdc.partitioned import partition_count
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.pipeline import compile_spmd
    from gspmdc.passes.spmd import InlineCalls
    from gspmdc.prepare import why_no_reference
    from gspmdc.runtime import io
    module = api.load(args.file)
    if module_stage(module) is Stage.PARTITIONED:
        raise GspmdcError(f"{args.file} is partitioned: bisect needs the global program (give "
                          "its partitioned program with --partitioned)")
    reason = why_no_reference(module)
    if reason is not None:
        raise GspmdcError(f"{args.file}: bisect cannot compare {reason}")
    n = partition_count(module, args.num_partitions, args.file)
    inputs = io.read_inputs(args.inputs, module) if args.inputs else \
        io.random_inputs(module, args.seed)
    if args.partitioned is not None:
        spmd = api.load(args.partitioned)
        if module_stage(spmd) is not Stage.PARTITIONED:
            raise GspmdcError(f"{args.partitioned} is not a partitioned program")
        if spmd.num_partitions not in (None, n):
            raise GspmdcError(f"{args.partitioned} was partitioned for {spmd.num_partitions} "
                              f"partitions, not {n}")
    else:
        spmd = compile_spmd(api.load(args.file), n,
                            windowed_einsum_threshold=args.windowed_einsum_threshold)
        spmd = api.parse(api.to_text(spmd), f"{args.file} (partitioned)")
    reference = run_pipeline(PassContext(n), module, [InlineCalls()])
    result = bisect(reference, spmd, n, inputs)
    for line in format_result(result, n):
        print(line)
    return EXIT_OK if result.difference is None and result.divergence is None \
        else EXIT_MISMATCH


def register(sub) -> None:
    p = sub.add_parser("bisect", help="name the first instruction whose partitioned value "
                                      "differs from the unpartitioned one",
                       description=cmd_bisect.__doc__)
    p.add_argument("file", help="the global program (HLO text; '-' for stdin)")
    add_num_partitions(p)
    p.add_argument("--inputs", help="npz file with the global inputs arg0, arg1, ...")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the random inputs when --inputs is not given (default 0)")
    p.add_argument("--partitioned", metavar="SPMD",
                   help="check this partitioned program of FILE instead of partitioning FILE")
    add_windowed_einsum_threshold(p)
    p.set_defaults(run=cmd_bisect)
