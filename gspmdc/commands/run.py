"""`gspmdc run`: run a program on N partitions (MPI ranks, or threads of this process)."""
from __future__ import annotations

import argparse

from gspmdc.commands.basic import add_rounding_argument
from gspmdc.commands.compile import add_propagation_options
from gspmdc.errors import GspmdcError
from gspmdc.runtime.options import WAIT_MODES

from .arguments import (add_num_partitions, add_windowed_einsum_threshold, non_negative_int,
                        output_file, positive_float, positive_int)


def cmd_run(args: argparse.Namespace) -> int:
    """Run a module on N partitions: a partitioned (SPMD) program as it is, a global program
    after partitioning it. Inputs come from --inputs (global arrays arg0, arg1, ...) or are random
    (--seed); rank 0 assembles the global outputs (out0, ...) and writes --outputs atomically.
    --check compares them with the global program run on one device (a program with manual
    regions: partitioned at their boundaries only, on N threads). A module's stage comes from
    its header (gspmdc.stage), else from its contents (partition-id or collectives outside
    manual regions: partitioned); --global / --partitioned say it for a module that records
    none."""
    import os
    from gspmdc.runtime import launcher, rank
    from gspmdc.runtime.cores import with_blas_threads
    from gspmdc.runtime.options import RunOptions
    started_at = args.started_at
    options = RunOptions(num_partitions=args.num_partitions, inputs=_absolute(args.inputs),
                         seed=args.seed, outputs=_absolute(args.outputs), check=args.check,
                         profile=args.profile, profile_json=_absolute(args.profile_json),
                         timeout=args.timeout,
                         padding="garbage" if args.garbage_padding else "zeros",
                         deterministic=args.deterministic, mpi_wait=args.mpi_wait,
                         output_sharding=args.output_sharding, quiet=args.quiet,
                         repeat=args.repeat, rounding=args.rounding)

    def prepare(options: RunOptions = options):
        """The job, compiled by the driver (imported when called: with `-n`, `mpiexec` starts
        before numpy, the IR and the partitioner are imported, so the ranks start while this
        process prepares the job)."""
        from gspmdc.ir.gc_pause import paused_collection
        with paused_collection(freeze=True):
            from gspmdc.prepare import CompileOptions, prepare_job
        return prepare_job(args.file, options, started_at,
                           CompileOptions(args.windowed_einsum_threshold, args.stage,
                                          args.propagation, args.shardy_strategy))

    if args.hostfile is not None and args.backend != "mpi":
        raise GspmdcError("--hostfile places MPI ranks: it needs --backend mpi")
    if args.backend == "mpi" and launcher.under_mpi():
        if args.hostfile is not None:
            raise GspmdcError("--hostfile: this process already is a rank of an MPI job (the "
                              "hosts are those of the mpiexec that started it)")
        return rank.run_in_place(prepare, options)
    mpiexec = launcher.find_mpiexec(args.mpiexec) if args.backend == "mpi" else None
    hostfile = _absolute(args.hostfile)
    if hostfile is not None:
        launcher.hostfile_hosts(hostfile)
    if args.backend == "local":
        # before numpy is imported: the BLAS threads of this process share the free cores
        os.environ.update(with_blas_threads(dict(os.environ), args.num_partitions or 1))
        from gspmdc.runtime.job import execute_local
        return execute_local(prepare())
    return launcher.launch(prepare, options.num_partitions, mpiexec, started_at, hostfile)


def _absolute(path: str | None) -> str | None:
    """Ranks may start in another directory (another host): pass paths absolute."""
    import os
    return None if path is None else os.path.abspath(path)


def register(sub) -> None:
    p = sub.add_parser("run", help="run a program on N partitions (MPI ranks or local threads)",
                       description=cmd_run.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    add_num_partitions(p)
    p.add_argument("--backend", choices=("mpi", "local"), default="mpi",
                   help="mpi: one MPI rank per partition, started with mpiexec unless already "
                        "running under MPI (default); local: one thread per partition")
    p.add_argument("--inputs", help="npz file with the global inputs arg0, arg1, ...")
    p.add_argument("--outputs", type=output_file,
                   help="write the global outputs out0, out1, ... here")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the random inputs when --inputs is not given (default 0)")
    p.add_argument("--check", action="store_true",
                   help="compare the outputs with the unpartitioned program on one device "
                        "(exit 1 on mismatch)")
    p.add_argument("--profile", action="store_true",
                   help="print per-partition time in kernels, collectives and interpretation, "
                        "and the bytes each collective sends")
    p.add_argument("--profile-json", type=output_file, metavar="FILE",
                   help="write the measured figures as JSON (the keys of `gspmdc cost --json`: "
                        "bytes each collective sent and received per partition, operations, "
                        "peak of live arrays, wall time)")
    p.add_argument("--repeat", type=positive_int, default=0, metavar="K",
                   help="execute the program K more times after the first run and print the "
                        "median, quartiles and extremes of those K runs' times (the slowest "
                        "partition's, excluding start-up, inputs and outputs); --profile and "
                        "--profile-json then cover those K runs")
    p.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                   help="stop the whole job after S seconds (exit 3)")
    p.add_argument("--hostfile", metavar="FILE",
                   help="run the ranks on these hosts (MPICH hostfile: 'host:count' per line; "
                        "passed to mpiexec -f); every host needs this gspmdc installation at "
                        "the same path and the input file")
    p.add_argument("--mpiexec", metavar="PATH",
                   help="the mpiexec to start (default: the one beside this Python)")
    p.add_argument("--deterministic", action="store_true",
                   help="reduce in group order everywhere (bit-identical runs; slower)")
    p.add_argument("--output-sharding", metavar="SHARDING",
                   help="the sharding of the result of an already-partitioned program whose root "
                        "has none (XLA's partitioned modules drop it), e.g. "
                        "'{devices=[2,1,4]<=[8] last_tile_dim_replicate}'")
    p.add_argument("--mpi-wait", choices=WAIT_MODES, default="auto",
                   help="how MPI ranks wait for each other: blocking (MPI's own wait, fastest "
                        "with a core per rank; it busy-polls), polite (short spins, then sleeps), "
                        "auto: spin while the machine has a free core per rank and waits are "
                        "short, else yield the CPU (default)")
    add_rounding_argument(p)
    p.add_argument("--garbage-padding", action="store_true",
                   help="pad uneven input shards with NaN / the integer maximum instead of zeros "
                        "(shows programs that read padding)")
    add_windowed_einsum_threshold(p)
    stage = p.add_mutually_exclusive_group()
    stage.add_argument("--global", dest="stage", action="store_const", const="global",
                       help="the module is a global program (to partition), whatever it holds")
    stage.add_argument("--partitioned", dest="stage", action="store_const", const="partitioned",
                       help="the module is already partitioned (one SPMD program)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the outputs")
    add_propagation_options(p)
    p.set_defaults(run=cmd_run)
