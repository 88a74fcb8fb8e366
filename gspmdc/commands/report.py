"""`gspmdc report`: one self-contained HTML page about a partitioned program."""
from __future__ import annotations

import argparse

from gspmdc.commands.arguments import (
    add_machine, add_num_partitions, add_windowed_einsum_threshold, output_file,
)
from gspmdc.errors import EXIT_OK, GspmdcError


def cmd_report(args: argparse.Namespace) -> int:
    """Write one self-contained HTML page (no network, no server: open it in any browser) about
    FILE partitioned for N devices: the program as a graph, each value coloured by its sharding
    and each collective marked with its cost and the partitioner's reason; the module after each
    pass with what the pass changed; the cost table (as `gspmdc cost`); the memory per device
    over the program; pictures of the inputs' and outputs' shardings."""
    from gspmdc import api
    from gspmdc.passes.analysis.machine import load_machine
    from gspmdc.report import build_report
    if not args.output:
        raise GspmdcError("report needs -o FILE (the HTML page to write)")
    page = build_report(args.file, args.num_partitions, load_machine(args.machine),
                        args.windowed_einsum_threshold)
    api.write_text(page, args.output)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("report", help="write one self-contained HTML page about a partitioned "
                                      "program (graph, collectives, passes, cost, memory)",
                       description=cmd_report.__doc__)
    p.add_argument("file", help="HLO text file, global or partitioned ('-' for stdin)")
    add_num_partitions(p)
    p.add_argument("-o", "--output", type=output_file, metavar="FILE",
                   help="the HTML page to write (atomically)")
    add_machine(p, "the cost table")
    add_windowed_einsum_threshold(p)
    p.set_defaults(run=cmd_report)
