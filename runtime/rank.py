"""One MPI rank of a `gspmdc run` job.

Two ways in:

- `run_rank(connection, token, start_mpi)`: the rank proper, forked from its supervisor, which
  connected to the launcher (`rank_link.py`) and waits for it to tell the launcher how it ended
  (`rank_link.report_end`). It says hello (from then on the launcher knows its pid and host and
  names it if it dies), starts MPI (`start_mpi()`) and only then receives the job, while the
  launcher may still be partitioning the program; from then on it exits (3) if the launcher's
  connection closes. Once every rank is past `MPI_Init`, the names of MPICH's shared-memory
  segments are removed (`mpi_processes.py`), so nothing is left in `/dev/shm` however the job
  ends. Rank 0 sends the outputs to the launcher, which writes the file once every rank has
  finished. Timeouts are the launcher's. On the launcher's machine the rank server forks the
  rank, the runtime already loaded, and is its supervisor (`rank_server.py`); on other hosts
  `main` does:
- `main`: `python -m gspmdc.runtime.rank ADDRESS TOKEN`, started by the launcher's `mpiexec` on
  other hosts. First thing, the process asks the kernel to kill it when its parent (MPICH's
  proxy) dies, connects to the launcher and forks: the parent stays the supervisor, the child
  (killed with its supervisor) imports the runtime (numpy, the interpreter, the kernels, the MPI
  backend; never the parser or the passes) and starts MPI in `run_rank`.
- `run_in_place(prepare, options)`, when the process already is an MPI rank (the user ran
  `mpiexec ... gspmdc run`, or `srun`): rank 0 prepares the job and broadcasts it; if
  preparation fails every rank exits with its exit code. Rank 0 writes the outputs (atomically);
  `--timeout` arms a watchdog on every rank.

`execute_on_mpi(job)` is the same on every rank: build the MPI backend for the SPMD program (the
job carries it as IR: a rank imports neither the parser nor the passes),
read this partition's shard of every input (memory-mapped slices of the input file, or the seeded
random inputs), evaluate, send the pieces rank 0 needs for each output (`Igatherv` of raw bytes
from the source partitions of each tile only), and on rank 0 assemble, check, write and print
(`job.finish`). Every rank records the instruction it starts on its slot of the position board.
Any exception on any rank reports `gspmdc: error: rank r (partition p): ...` naming the computation
and instruction: the rank sends it to the launcher, which prints it and stops the job (the rank
exits: MPICH's `mpiexec` ends an `MPI_Abort` without removing its temporary files); under the
user's own `mpiexec` the rank prints it and calls `MPI_Abort`, which stops every rank at once.
Exit codes: 0 success, 1 check mismatch, 2 bad input, 3 runtime failure.
"""
from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from gspmdc.errors import EXIT_RUNTIME
from gspmdc.ir.gc_pause import paused_collection

from . import mpi_processes
from .rank_link import (RankLink, connect, rank_from_environment, supervise_rank,
                        unreachable_message)

#: extra time a non-zero rank's watchdog waits, so that rank 0 reports the timeout
_WATCHDOG_STAGGER_SECONDS = 1.0
#: time a failing rank of the user's own mpiexec leaves MPICH to forward its message before
#: MPI_Abort
_FORWARDING_SECONDS = 0.5


def main(argv: list[str] | None = None) -> int:
    """Rank entry point of `launcher.launch` for ranks on other hosts (see the module
    docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m gspmdc.runtime.rank ADDRESS TOKEN (started by gspmdc run)",
              file=sys.stderr)
        return 2
    mpi_processes.die_with_parent(signal.SIGKILL)
    try:
        connection = connect(args[0])
    except OSError as e:
        return unreachable(e)
    rank_pid = os.fork()
    if rank_pid:
        mpi_processes.name_process(f"gspmdc-super-{rank_from_environment()}")
        return supervise_rank(rank_pid, connection)
    mpi_processes.die_with_parent(signal.SIGKILL)
    mpi_processes.name_process(f"gspmdc-rank-{rank_from_environment()}")
    return run_rank(connection, args[1], _load_runtime)


def run_rank(connection: socket.socket, token: str, start_mpi: Callable[[], None]) -> int:
    """The rank proper, forked from its supervisor, which holds the same `connection` to the
    launcher: say hello, `start_mpi()` (with whatever it still has to import) and receive the
    job (the launcher may still be partitioning the program meanwhile), wait for every rank to be
    past `MPI_Init`, remove MPICH's segment names, run the job. The exit code."""
    try:
        link = RankLink(connection, token, rank_from_environment(), socket.gethostname(),
                        mpi_processes.host_identity())
        with paused_collection(freeze=True):
            start_mpi()
            job, board_path = link.receive_job()
        link.watch_launcher(_launcher_lost)
    except (OSError, ConnectionError) as e:
        return unreachable(e)
    from mpi4py import MPI
    from .backends.mpi import wait
    from .rank_position import STARTING, WAITING, PositionBoard
    board = PositionBoard(Path(board_path) if board_path is not None else None,
                          MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    board.set(WAITING)
    wait(MPI.COMM_WORLD.Ibarrier())     # every rank of every node is past MPI_Init
    board.set(STARTING)
    mpi_processes.unlink_segments(mpi_processes.mapped_mpich_segments())
    link.say("ready")
    return execute_on_mpi(job, link, board)


def unreachable(error: OSError | ConnectionError) -> int:
    """Report that this rank cannot reach its launcher; the exit code."""
    print(unreachable_message(rank_from_environment(), error), file=sys.stderr)
    return EXIT_RUNTIME


def _load_runtime() -> None:
    """Import what executing a job needs and start MPI (importing `mpi4py.MPI` initialises it):
    the rank does this while the launcher prepares the job."""
    from mpi4py import MPI  # noqa: F401
    from . import interpreter, job  # noqa: F401
    from .backends import mpi  # noqa: F401


def _launcher_lost() -> None:
    """The launcher died or stopped the job: leave nothing behind and exit."""
    mpi_processes.unlink_segments(mpi_processes.mapped_mpich_segments())
    os._exit(EXIT_RUNTIME)


def run_in_place(prepare, options) -> int:
    """This process is one rank of an MPI job started by the user: rank 0 prepares the job
    (`prepare(options)`: the driver compiles the program into a `Job`), every rank runs it.
    Returns the exit code (the same on every rank)."""
    from mpi4py import MPI
    from gspmdc.errors import GspmdcError
    from .backends.mpi import wait
    comm = MPI.COMM_WORLD
    job, error = None, None
    if comm.Get_rank() == 0:
        try:
            job = prepare(_with_world_size(options, comm.Get_size()))
            if job.num_partitions != comm.Get_size():
                raise GspmdcError(f"the program has {job.num_partitions} partitions but the MPI "
                                  f"job has {comm.Get_size()} ranks (run mpiexec -n "
                                  f"{job.num_partitions})")
        except GspmdcError as e:
            error = (str(e), e.exit_code)
    wait(comm.Ibarrier())           # the other ranks sleep while rank 0 prepares
    mpi_processes.unlink_segments(mpi_processes.mapped_mpich_segments())
    job, error = comm.bcast((job, error), root=0)
    if error is not None:
        if comm.Get_rank() == 0:
            print(f"gspmdc: error: {error[0]}", file=sys.stderr)
        return error[1]
    return execute_on_mpi(job)


def _with_world_size(options, size: int):
    """Without -n, an MPI job of `size` ranks runs `size` partitions."""
    if options.num_partitions is not None:
        return options
    from dataclasses import replace
    return replace(options, num_partitions=size)


def execute_on_mpi(job, link: RankLink | None = None, board=None) -> int:
    """This rank's part of the job (see the module docstring); the exit code, or the process
    ends through MPI_Abort when anything fails on any rank. With a `link` (started by the
    launcher) rank 0 sends the outputs to the launcher, and the launcher handles timeouts;
    without, rank 0 writes them and `--timeout` arms a watchdog here. `board`: this rank's
    position board (a private one when None)."""
    from mpi4py import MPI
    from .allocation import keep_freed_memory
    from .backends.mpi import MpiBackend
    from .rank_position import PositionBoard, describe
    keep_freed_memory()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if board is None:
        board = PositionBoard(None, rank, comm.Get_size())
    module = job.spmd
    watchdog = _arm_watchdog(comm, job.options.timeout, job.started_at, board, module) \
        if link is None else None
    partition = None
    try:
        backend = MpiBackend(module, comm, deterministic=job.options.deterministic,
                             wait=job.options.mpi_wait)
        partition = backend.partition_id()
        code = _run_partition(job, comm, module, backend, board, link)
        if link is not None:
            link.finish()
        return code
    except BaseException as e:  # noqa: BLE001 - every failure stops the whole job
        _abort(comm, rank, partition, e, link, describe(module, board.get(rank)))
    finally:
        if watchdog is not None:
            watchdog.cancel()


def _run_partition(job, comm, module, backend, board, link: RankLink | None) -> int:
    from time import perf_counter
    from gspmdc.errors import EXIT_OK
    from .interpreter import Executable
    from .job import finish, input_sources
    from .rank_position import FINISHING, WRITING
    from .sharded_io import shard_value
    n = job.num_partitions
    p = backend.partition_id()
    signature = job.signature
    sources = input_sources(job, signature)
    args = [shard_value(a, v, p, n, padding=job.options.padding)
            for a, v in zip(sources, signature.parameters)]
    recorder = None
    if job.options.profiling:
        from .profile import ProfileRecorder
        recorder = ProfileRecorder(p, n, job.started_at, module)
    executable = Executable(module, backend, position=board.position(module),
                            on_step=recorder.on_step if recorder is not None else None,
                            live_arrays=recorder.live_arrays if recorder is not None else None,
                            rounding=job.options.rounding)

    def run():
        return executable(args) if recorder is None else recorder.timed(lambda: executable(args))
    value = run()
    run_times = []
    for _ in range(job.options.repeat):
        if recorder is not None and not run_times:
            recorder.reset()                # the profile covers the runs after the first
        # every run starts on every rank together, released as the collectives are (a
        # backed-off sleep could leave a rank up to its step behind, inside the timed run)
        backend.waiter.wait([comm.Ibarrier()])
        start = perf_counter()
        value = run()
        run_times.append(perf_counter() - start)
    board.set(FINISHING)
    outputs = _gather_outputs(value, signature, module, comm)
    # what else rank 0 reports (the same options on every rank: all gather, or none)
    profiles = comm.gather(recorder.profile(), root=0) if recorder is not None else None
    rank_times = comm.gather(run_times, root=0) if job.options.repeat else None
    backend.close()
    code = EXIT_OK
    if comm.Get_rank() == 0:
        board.set(WRITING)
        write = link.send_outputs if link is not None else None
        slowest = [max(times) for times in zip(*rank_times)] if rank_times else []
        from .blas import blas_in_use
        code = finish(job, module, outputs, sources, profiles, write_outputs=write,
                      run_times=slowest,            # a run lasts until every rank ended it
                      blas=blas_in_use())           # the count the rank server set
        sys.stdout.flush()
    return _rank_0s_code(comm, code)


def _rank_0s_code(comm, code: int) -> int:
    """Rank 0's exit code `code`, on every rank: the others sleep while rank 0 checks and writes
    (a nonblocking broadcast and the backend's polite wait, where MPI's blocking broadcast
    would keep them spinning)."""
    import numpy as np
    from .backends.mpi import wait
    buffer = np.array([code], np.int64)
    wait(comm.Ibcast(buffer, root=0))
    return int(buffer[0])


def _gather_outputs(value, signature, module, comm):
    """Rank 0 gets the global result; the others None. Each leaf travels once per tile: the source
    partition of each tile sends its raw bytes, straight into place in rank 0's tile buffer."""
    import numpy as np
    from mpi4py import MPI
    from gspmdc.ir import dtypes
    from .backends.mpi import rank_of_partition, wait
    from .sharded_io import assemble_tiles, flatten_value, source_partitions, unflatten_value
    n = signature.num_partitions
    ranks = np.asarray(rank_of_partition(module, n))
    me = comm.Get_rank()
    leaves = flatten_value(value, signature.output.local_shape)
    assembled = []
    for piece, leaf in zip(leaves, signature.output.leaves):
        sources = source_partitions(leaf, n)
        nbytes = int(np.prod(leaf.local_shape.dims)) * \
            dtypes.numpy_dtype(leaf.local_shape.element_type).itemsize
        senders = ranks[sources]
        counts = np.zeros(n, np.int64)
        counts[senders] = nbytes
        displacements = np.zeros(n, np.int64)
        displacements[senders] = np.arange(len(sources)) * nbytes
        mine = np.ascontiguousarray(piece).reshape(-1).view(np.uint8) if counts[me] \
            else np.empty(0, np.uint8)
        if me == 0:
            tiles = np.empty(len(sources) * nbytes, np.uint8)
            wait(comm.Igatherv(mine, [tiles, counts, displacements, MPI.BYTE], root=0))
            dtype = dtypes.numpy_dtype(leaf.local_shape.element_type)
            shaped = tiles.view(dtype).reshape((len(sources),) + leaf.local_shape.dims)
            assembled.append(assemble_tiles(shaped, leaf))
        else:
            wait(comm.Igatherv(mine, None, root=0))
    return unflatten_value(assembled, signature.output.global_shape) if me == 0 else None


def _abort(comm, rank: int, partition: int | None, error: BaseException,
           link: RankLink | None, position: str) -> None:
    """Report `error` (with where this rank was, unless the message names the instruction
    already) and stop the job: with a `link`, the launcher stops it (this rank exits), else
    `MPI_Abort`."""
    from gspmdc.errors import GspmdcError
    where = f"rank {rank}" + (f" (partition {partition})" if partition is not None else "")
    if isinstance(error, KeyboardInterrupt):
        message = "interrupted"
    elif isinstance(error, GspmdcError):
        message = str(error)
    else:
        message = f"internal error: {type(error).__name__}: {error}"
    named = position.startswith("executing ") and \
        message.startswith(position.split()[1] + ":")
    if not named:
        message = f"{message} (while {position})"
    sys.stdout.flush()
    try:
        if link is not None:
            link.fail(f"{where}: {message}")    # the launcher prints it and stops the job
            os._exit(EXIT_RUNTIME)              # (an MPI_Abort would leave hydra's files)
    except OSError:
        link = None                             # the launcher is gone: stderr is all there is
    if link is None:
        print(f"gspmdc: error: {where}: {message}", file=sys.stderr, flush=True)
        # the message reaches the user only through MPICH's
        # forwarding of this rank's stderr, which MPI_Abort can cut off (the proxies are killed
        # before they pass on what they read): give it a moment
        time.sleep(_FORWARDING_SECONDS)
    _abort_job(comm)


def _abort_job(comm) -> None:
    """Stop every rank of the job with exit code 3 (MPICH's MPI_Abort may return: exit anyway)."""
    comm.Abort(EXIT_RUNTIME)
    os._exit(EXIT_RUNTIME)


def _arm_watchdog(comm, timeout: float | None, started_at: float | None, board, module):
    """A timer that ends the whole job `timeout` seconds after `started_at` (a `time.time()`;
    None: now). Rank 0 reports it with where it was in `module`."""
    if timeout is None:
        return None
    from .rank_position import describe_ranks
    rank = comm.Get_rank()

    def expire():
        if rank == 0:
            where = describe_ranks(module, {rank: board.get(rank)})
            print(f"gspmdc: error: the run timed out after {timeout:g} s: {where}",
                  file=sys.stderr, flush=True)
        _abort_job(comm)
    left = timeout if started_at is None else max(timeout - (time.time() - started_at), 0.0)
    timer = threading.Timer(left + (0 if rank == 0 else _WATCHDOG_STAGGER_SECONDS), expire)
    timer.daemon = True
    timer.start()
    return timer


if __name__ == "__main__":
    exit_code = main()
    # Every object so far is exempt from the collections of the interpreter's teardown, which
    # would otherwise walk all of numpy's and the run's objects: longer than a small run.
    gc.freeze()
    sys.exit(exit_code)
