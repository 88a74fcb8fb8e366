"""`gspmdc cost`: what a partitioned program costs, before running it."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from gspmdc.commands.arguments import (
    add_machine, add_num_partitions, add_windowed_einsum_threshold, output_file, positive_float,
)
from gspmdc.errors import EXIT_OK, GspmdcError


def cmd_cost(args: argparse.Namespace) -> int:
    """Model what FILE costs on N partitions without running it: every collective (groups,
    executions, bytes each device sends and receives per run, time by the ring or tree
    algorithm on the machine, and why the partitioner put it there), operations per device,
    peak memory per device from the liveness of the partitioned program (parameters, output,
    loop state, temporaries), the modelled step time and where it goes. A global program is
    partitioned first. --machine picks a preset or a machine file; --bandwidth, --latency and
    --flops override its figures. --json prints the figures as JSON (the keys `run
    --profile-json` writes measured). --calibrate measures this machine (MPI latency and
    bandwidth between N ranks, numpy's operation rate and memory bandwidth) and writes a
    machine file (-o, default: print it)."""
    from gspmdc.passes.analysis.machine import load_machine
    if args.calibrate:
        return _calibrate(args)
    if args.file is None:
        raise GspmdcError("cost needs FILE (or --calibrate)")
    from gspmdc import api
    from gspmdc.cost_table import format_cost
    from gspmdc.partitioned import load_partitioned
    from gspmdc.passes.analysis.cost import program_cost
    machine = _overridden(load_machine(args.machine), args)
    module, n = load_partitioned(args.file, args.num_partitions, args.windowed_einsum_threshold)
    cost = program_cost(module, n, machine)
    if args.json:
        text = json.dumps(cost.figures.to_json(), indent=1) + "\n"
    else:
        text = format_cost(cost)
    api.write_text(text, args.output)
    return EXIT_OK


def _overridden(machine, args):
    changes = {}
    for flag, field, scale in (("bandwidth", "link_bandwidth", 1e9), ("latency", "latency", 1e-6),
                               ("flops", "flops_per_second", 1e12)):
        value = getattr(args, flag)
        if value is not None:
            if not math.isfinite(value) or value < 0:
                raise GspmdcError(f"--{flag} must be a finite number, at least 0, got {value:g}")
            changes[field] = value * scale
    if not changes:
        return machine
    return dataclasses.replace(machine, name=f"{machine.name} (changed)", **changes)


def _calibrate(args: argparse.Namespace) -> int:
    from gspmdc import api
    from gspmdc.calibrate import calibrate
    if args.file is not None:
        raise GspmdcError("--calibrate measures this machine; it takes no FILE")
    n = args.num_partitions or 2
    if n < 2:
        raise GspmdcError(f"--calibrate needs at least 2 ranks, got -n {n}")
    machine, report = calibrate(n, args.mpiexec)
    print(report, file=sys.stderr)
    api.write_text(json.dumps(machine.to_json(), indent=1) + "\n", args.output)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("cost", help="model a partitioned program's communication, operations, "
                                    "memory and step time without running it",
                       description=cmd_cost.__doc__)
    p.add_argument("file", nargs="?", help="HLO text file, global or partitioned ('-' for stdin)")
    add_num_partitions(p, help="number of partitions (default: the module's num_partitions, "
                               "else the devices its shardings name; --calibrate: ranks, "
                               "default 2)")
    add_machine(p, "the figures")
    p.add_argument("--bandwidth", type=positive_float, metavar="GB/s",
                   help="link bandwidth each device sends at (overrides the machine's)")
    p.add_argument("--latency", type=float, metavar="us",
                   help="latency of one message in microseconds (overrides the machine's)")
    p.add_argument("--flops", type=positive_float, metavar="TFLOP/s",
                   help="peak operation rate per device (overrides the machine's)")
    p.add_argument("--json", action="store_true",
                   help="print the figures as JSON (the layout of run --profile-json)")
    p.add_argument("-o", "--output", type=output_file, metavar="FILE",
                   help="write the report here (atomically)")
    add_windowed_einsum_threshold(p)
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine and write a machine file for --machine")
    p.add_argument("--mpiexec", metavar="PATH",
                   help="--calibrate: the mpiexec to start (default: the one beside this Python)")
    p.set_defaults(run=cmd_cost)
