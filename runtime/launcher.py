"""Running a `gspmdc run` job on MPI: starting `mpiexec`, the work of each rank, and failures.

Two ways in:

- `launch(job)`, from a plain process (`gspmdc run --backend mpi`): writes the prepared job to a
  private run directory, starts `mpiexec -n N python -m gspmdc.runtime.launcher JOB` in its own
  session and supervises it: rank output is passed through live (without MPICH's termination
  banners); every rank keeps a connection to the parent (a Unix socket in the run directory), so a
  rank killed from outside is named, with the instruction it was executing (read from the ranks'
  position board in the run directory, `rank_position.py`), and the job stopped; the job is
  stopped after `--timeout`
  (plus a grace period, as a backstop to the ranks' own watchdogs), and Ctrl-C stops every rank.
  The run directory is removed afterwards.
- `run_in_place(path, options)`, when the process already is an MPI rank (the user ran
  `mpiexec ... gspmdc run`, e.g. across hosts with a hostfile): rank 0 prepares the job and
  broadcasts it; if preparation fails every rank exits with its exit code.

`execute_on_mpi(job)` is the same on every rank: parse the SPMD program, build the MPI backend,
read this partition's shard of every input (memory-mapped slices of the input file, or the seeded
random inputs), evaluate, send the pieces rank 0 needs for each output (`Igatherv` of raw bytes
from the source partitions of each tile only), and on rank 0 assemble, check, write and print
(`job.finish`). Every rank records the instruction it starts on its slot of the position board.
Any exception on any rank prints `gspmdc: error: rank r (partition p): ...` naming the computation
and instruction and calls `MPI_Abort`, which stops every rank at once; `--timeout` arms a watchdog
on every rank that does the same (rank 0 reports where each rank was). Exit codes: 0 success,
1 check mismatch, 2 bad input, 3 runtime failure (also for a killed rank or a timeout).
"""
from __future__ import annotations

import os
import pickle
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gspmdc.errors import EXIT_OK, EXIT_RUNTIME, GspmdcError

from .backends.mpi import wait
from .job import Job, RunOptions, finish, input_sources, prepare_job
from .rank_position import (
    FINISHING, PositionBoard, create_board_file, describe, describe_ranks, read_board_file,
)

#: environment variables that MPI launchers set in every rank
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
#: how long after `--timeout` the parent stops a job whose ranks did not stop themselves
BACKSTOP_SECONDS = 10.0
#: how long `mpiexec` gets to stop its ranks after SIGTERM before it is killed
_TERM_GRACE_SECONDS = 3.0
#: extra time a non-zero rank's watchdog waits, so that rank 0 reports the timeout
_WATCHDOG_STAGGER_SECONDS = 1.0
#: the rank status socket in the run directory
_STATUS_SOCKET = "ranks.sock"
#: the ranks' position board in the run directory (`rank_position.py`)
_POSITIONS = "positions"

_BANNER = re.compile(r"^(=+|=   .*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING.*|"
                     r"This typically refers to a problem with your application\.|"
                     r"Please see the FAQ page for debugging suggestions|"
                     r"Abort\(\d+\) on node \d+.*)$")
#: the line of MPICH's termination banner naming the process that ended the job
_REPORTED_PID = re.compile(r"^=   PID (\d+) RUNNING AT ")


def under_mpi() -> bool:
    """This process was started by an MPI launcher (it is one rank of a job)."""
    return any(name in os.environ for name in _MPI_ENV)


def find_mpiexec(override: str | None = None) -> str:
    """The `mpiexec` to use: `override`, else the one installed beside this Python."""
    path = Path(override) if override else Path(sys.executable).with_name("mpiexec")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise GspmdcError(f"mpiexec not found at {path}; install the MPI extra "
                          "(pip install 'gspmdc[mpi]'), pass --mpiexec PATH, or use "
                          "--backend local")
    return str(path)


# ================================================================================ parent side

def launch(job: Job, mpiexec: str) -> int:
    """Run `job` on `job.num_partitions` MPI ranks and return the exit code (see the module
    docstring). KeyboardInterrupt stops all ranks and propagates."""
    run_dir = Path(tempfile.mkdtemp(prefix="gspmdc-run-"))
    try:
        job_file = run_dir / "job.pickle"
        job_file.write_bytes(pickle.dumps(job))
        create_board_file(run_dir / _POSITIONS, job.num_partitions)
        command = [mpiexec, "-n", str(job.num_partitions), sys.executable, "-m",
                   "gspmdc.runtime.launcher", str(job_file)]
        with _RankMonitor(run_dir / _STATUS_SOCKET) as monitor:
            return _supervise(command, monitor, job, run_dir / _POSITIONS)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


class _RankMonitor:
    """The parent's end of the rank status socket. Each rank connects at start and says
    `rank pid`; it says `done` before a normal exit and `failed` before aborting after reporting
    its own error. A connection that closes without either is a rank that died (killed, crashed):
    the kernel closes its socket the moment it dies, before MPI's launcher stops the other ranks,
    so the first such connection names the culprit (`died`). When the parent was not scheduled
    before several closed, `unannounced` holds them all and `culprit` asks MPICH's report."""

    def __init__(self, path: Path):
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._buffers: dict[socket.socket, bytes] = {}
        self._ranks: dict[socket.socket, tuple[int, int]] = {}
        self._ended: set[socket.socket] = set()
        self.pids: dict[int, int] = {}
        self.died: tuple[int, int] | None = None
        self.unannounced: list[tuple[int, int]] = []
        self.failed = False

    def __enter__(self) -> "_RankMonitor":
        return self

    def __exit__(self, *exc) -> None:
        for conn in list(self._buffers):
            conn.close()
        self._selector.close()
        self._listener.close()

    def poll(self, seconds: float) -> None:
        """Handle connections and messages for up to `seconds`. A rank that closes its
        connection unannounced is recorded in `died`, unless some rank reported its own failure
        (its report precedes its abort, which stops the others)."""
        closed = []
        for key, _ in self._selector.select(seconds):
            if key.fileobj is self._listener:
                try:
                    conn, _ = self._listener.accept()
                except BlockingIOError:
                    continue
                self._buffers[conn] = b""
                self._selector.register(conn, selectors.EVENT_READ)
            elif not self._read(key.fileobj):
                closed.append(key.fileobj)
        for conn in closed:
            self._selector.unregister(conn)
        if self.died is None and not self.failed:
            self.unannounced = [self._ranks[conn] for conn in closed
                                if conn not in self._ended and conn in self._ranks]
            self.died = self.unannounced[0] if self.unannounced else None

    def culprit(self, reported_pids: set[int]) -> tuple[int, int]:
        """(rank, pid) of the rank that died first: of the ranks that closed at once, the one
        whose pid MPICH's termination report names, else the first seen."""
        return next((rank_pid for rank_pid in self.unannounced if rank_pid[1] in reported_pids),
                    self.died)

    def _read(self, conn: socket.socket) -> bool:
        """Read what `conn` sent; False when it is closed."""
        data = conn.recv(4096)
        if not data:
            return False
        self._buffers[conn] += data
        *lines, self._buffers[conn] = self._buffers[conn].split(b"\n")
        for line in lines:
            words = line.split()
            if len(words) == 2 and conn not in self._ranks:
                rank, pid = int(words[0]), int(words[1])
                self._ranks[conn] = (rank, pid)
                self.pids[rank] = pid
            elif words and words[0] in (b"done", b"failed"):
                self._ended.add(conn)
                self.failed = self.failed or words[0] == b"failed"
        return True


def _rank_environment(n: int) -> dict[str, str]:
    """Ranks get an equal share of the cores for their BLAS threads (unless the user chose)."""
    env = dict(os.environ)
    threads = str(max(1, (os.cpu_count() or 1) // n))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, threads)
    return env


def _relay(stream, target, reported_pids: set[int]) -> threading.Thread:
    """Copy a stream of `mpiexec` to ours line by line, without MPICH's termination banner and
    MPI_Abort notices (gspmdc prints its own message); the pids the banner names (`PID 4711
    RUNNING AT host`) go to `reported_pids`."""
    def copy():
        for line in stream:
            line_text = line.rstrip("\n")
            reported = _REPORTED_PID.match(line_text)
            if reported:
                reported_pids.add(int(reported.group(1)))
            elif not _BANNER.match(line_text):
                target.write(line)
                target.flush()
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _supervise(command: list[str], monitor: _RankMonitor, job: Job, positions: Path) -> int:
    proc = None
    reported_pids: set[int] = set()
    timeout = job.options.timeout
    deadline = None if timeout is None else time.monotonic() + timeout + BACKSTOP_SECONDS
    try:                # a Ctrl-C from the moment mpiexec exists stops it and every rank
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=_rank_environment(job.num_partitions))
        relays = [_relay(proc.stdout, sys.stdout, reported_pids),
                  _relay(proc.stderr, sys.stderr, reported_pids)]
        while proc.poll() is None:
            monitor.poll(0.05)
            if monitor.died is not None:
                break
            if deadline is not None and time.monotonic() > deadline:
                _stop(proc, monitor)
                where = describe_ranks(job.spmd_module(),
                                       dict(enumerate(read_board_file(positions))))
                print(f"gspmdc: error: the job did not stop within {timeout:g} s (+"
                      f"{BACKSTOP_SECONDS:g} s grace): {where}; all ranks were stopped",
                      file=sys.stderr)
                return EXIT_RUNTIME
    except KeyboardInterrupt:
        if proc is not None:
            _stop(proc, monitor)
        raise
    if monitor.died is None and proc.returncode not in (0, 1, 2, 3):
        monitor.poll(0)             # mpiexec may end before the dead rank's socket was read
    if monitor.died is not None:
        _stop(proc, monitor)
        for relay in relays:
            relay.join(timeout=5)
        rank, pid = monitor.culprit(reported_pids)
        where = describe(job.spmd_module(), read_board_file(positions)[rank])
        print(f"gspmdc: error: rank {rank} (pid {pid}) terminated unexpectedly (killed or "
              f"crashed) while {where}; the job was stopped", file=sys.stderr)
        return EXIT_RUNTIME
    for relay in relays:
        relay.join(timeout=5)
    code = proc.returncode
    if code in (0, 1, 2, 3):
        return code
    status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    print(f"gspmdc: error: mpiexec failed ({status})", file=sys.stderr)
    return EXIT_RUNTIME


def _stop(proc: subprocess.Popen, monitor: _RankMonitor) -> None:
    """Stop mpiexec (which stops its ranks); kill it and any rank left over if it does not."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(_TERM_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    monitor.poll(0)                 # ranks that announced themselves meanwhile
    for pid in monitor.pids.values():
        if _is_our_rank(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _is_our_rank(pid: int) -> bool:
    """`pid` is still a rank process of a gspmdc job (guards against reused pids)."""
    try:
        return b"gspmdc.runtime.launcher" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# ================================================================================== rank side

def run_in_place(path: str, options: RunOptions, started_at: float | None = None) -> int:
    """This process is one rank of an MPI job started by the user: rank 0 prepares the job, every
    rank runs it (`started_at`: when rank 0's `gspmdc run` started). Returns the exit code (the
    same on every rank)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    job, error = None, None
    if comm.Get_rank() == 0:
        try:
            job = prepare_job(path, _with_world_size(options, comm.Get_size()), started_at)
            if job.num_partitions != comm.Get_size():
                raise GspmdcError(f"the program has {job.num_partitions} partitions but the MPI "
                                  f"job has {comm.Get_size()} ranks (run mpiexec -n "
                                  f"{job.num_partitions})")
        except GspmdcError as e:
            error = (str(e), e.exit_code)
    wait(comm.Ibarrier())           # the other ranks sleep while rank 0 prepares
    job, error = comm.bcast((job, error), root=0)
    if error is not None:
        if comm.Get_rank() == 0:
            print(f"gspmdc: error: {error[0]}", file=sys.stderr)
        return error[1]
    return execute_on_mpi(job)


def _with_world_size(options: RunOptions, size: int) -> RunOptions:
    """Without -n, an MPI job of `size` ranks runs `size` partitions."""
    if options.num_partitions is not None:
        return options
    from dataclasses import replace
    return replace(options, num_partitions=size)


def execute_on_mpi(job: Job, run_dir: Path | None = None) -> int:
    """This rank's part of the job (see the module docstring); the exit code, or the process
    ends through MPI_Abort when anything fails on any rank."""
    from mpi4py import MPI
    from .backends.mpi import MpiBackend
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    status = _StatusLine(run_dir / _STATUS_SOCKET, rank) if run_dir is not None else None
    board = PositionBoard(run_dir / _POSITIONS if run_dir is not None else None, rank,
                          comm.Get_size())
    parsed: list = []               # the module once parsed, for the watchdog's report
    watchdog = _arm_watchdog(comm, job.options.timeout, status, board,
                             lambda: parsed[0] if parsed else None)
    partition = None
    try:
        module = job.spmd_module()
        parsed.append(module)
        backend = MpiBackend(module, comm, deterministic=job.options.deterministic,
                             wait=job.options.mpi_wait)
        partition = backend.partition_id()
        code = _run_partition(job, comm, module, backend, board)
        if status is not None:
            status.say("done")
        return code
    except BaseException as e:  # noqa: BLE001 - every failure stops the whole job
        _abort(comm, rank, partition, e, status,
               describe(parsed[0] if parsed else None, board.get(rank)))
    finally:
        if watchdog is not None:
            watchdog.cancel()


class _StatusLine:
    """A rank's connection to the parent's `_RankMonitor` (kept open for the process's life)."""

    def __init__(self, path: Path, rank: int):
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(str(path))
        self.say(f"{rank} {os.getpid()}")

    def say(self, message: str) -> None:
        self._socket.sendall(message.encode() + b"\n")


def _run_partition(job: Job, comm, module, backend, board: PositionBoard) -> int:
    from .interpreter import evaluate
    from .profile import ProfileRecorder
    from .sharded_io import shard_value, spmd_signature
    n = job.num_partitions
    p = backend.partition_id()
    signature = spmd_signature(module, n)
    sources = input_sources(job, signature)
    args = [shard_value(a, v, p, n, padding=job.options.padding)
            for a, v in zip(sources, signature.parameters)]
    recorder = ProfileRecorder(p, n, job.started_at) if job.options.profile else None
    enter = board.tracker(module)
    if recorder is not None:
        value = recorder.timed(lambda: evaluate(module, args, backend=backend,
                                                on_step=recorder.on_step, on_enter=enter))
    else:
        value = evaluate(module, args, backend=backend, on_enter=enter)
    board.set(FINISHING)
    outputs = _gather_outputs(value, signature, module, comm)
    profiles = comm.gather(recorder.profile() if recorder is not None else None, root=0)
    backend.close()
    code = EXIT_OK
    if comm.Get_rank() == 0:
        code = finish(job, module, outputs, sources, profiles if recorder is not None else None)
        sys.stdout.flush()
    wait(comm.Ibarrier())           # the other ranks sleep while rank 0 checks and writes
    return comm.bcast(code, root=0)


def _gather_outputs(value, signature, module, comm):
    """Rank 0 gets the global result; the others None. Each leaf travels once per tile: the source
    partition of each tile sends its raw bytes, straight into place in rank 0's tile buffer."""
    from mpi4py import MPI
    from gspmdc.ir import dtypes
    from .backends.mpi import rank_of_partition
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
           status: _StatusLine | None, position: str) -> None:
    """Report `error` (with where this rank was, unless the message names the instruction
    already) and stop the job."""
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
    print(f"gspmdc: error: {where}: {message}", file=sys.stderr, flush=True)
    if status is not None:
        status.say("failed")
    _abort_job(comm)


def _abort_job(comm) -> None:
    """Stop every rank of the job with exit code 3 (MPICH's MPI_Abort may return: exit anyway)."""
    comm.Abort(EXIT_RUNTIME)
    os._exit(EXIT_RUNTIME)


def _arm_watchdog(comm, timeout: float | None, status: _StatusLine | None,
                  board: PositionBoard, module_now):
    """A timer that ends the whole job when `timeout` seconds pass. Rank 0 reports it with where
    every rank was (only itself when the board is private); `module_now()` gives the module
    (None while it is being parsed)."""
    if timeout is None:
        return None
    rank = comm.Get_rank()

    def expire():
        if rank == 0:
            ranks = range(comm.Get_size()) if board.shared else [rank]
            where = describe_ranks(module_now(), {r: board.get(r) for r in ranks})
            print(f"gspmdc: error: the run timed out after {timeout:g} s: {where}",
                  file=sys.stderr, flush=True)
        if status is not None:
            status.say("failed")
        _abort_job(comm)
    timer = threading.Timer(timeout + (0 if rank == 0 else _WATCHDOG_STAGGER_SECONDS), expire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: list[str] | None = None) -> int:
    """Rank entry point of `launch`: `python -m gspmdc.runtime.launcher JOB_FILE`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gspmdc.runtime.launcher JOB_FILE (started by gspmdc run)",
              file=sys.stderr)
        return 2
    job_file = Path(args[0])
    job = pickle.loads(job_file.read_bytes())
    return execute_on_mpi(job, job_file.parent)


if __name__ == "__main__":
    sys.exit(main())
