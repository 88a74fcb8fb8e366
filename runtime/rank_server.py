"""The rank server of a `gspmdc run` job on one machine: one process that loads the runtime once
and forks every rank from it.

A rank needs Python, numpy, mpi4py and the runtime's modules before it can start MPI: about 0.3 s
of CPU each, most of a job's start-up when N ranks share a few cores. So `mpiexec` starts N *rank
stubs* (`rank_stub.py`: Python without `site` and nearly without imports), and the launcher
(`launcher.py`) forks this server (`start_rank_server`) from itself: a fork, not a new Python,
once the launcher imported what it needs to prepare the job and every rank needs too (numpy, the
IR, the runtime's job and kernels), so that neither Python's start nor those imports are paid
twice. The server dies with the launcher (`prctl(PR_SET_PDEATHSIG)`), leaves its session and
descriptors (but the standard output and error and the stubs' listening socket; standard input
reads /dev/null), takes fresh standard stream objects, imports the rest of the runtime and mpi4py
(MPI loaded, not started) with the cyclic garbage collector paused and everything frozen, then
serves one connection per stub and supervises the rank it forks for it, until it served as many
stubs as their `PMI_SIZE` and every rank ended:

- the stub sends every file descriptor it has (its standard streams, the PMI socket and control
  descriptor that MPICH's proxy gave it) with their numbers, its working directory and its
  environment (the MPI rank, the PMI descriptors' numbers, the BLAS thread counts);
- the server connects to the launcher for the rank (`rank_link.py`) and forks the rank, which
  holds none of the server's descriptors but that connection (not the other ranks' connections
  or stubs: each must close when its own rank or stub ends), puts the stub's descriptors at the
  stub's numbers, takes the stub's environment, directory and BLAS thread count
  (`_set_blas_threads`), and runs `rank.run_rank`, which says hello and starts MPI
  (`MPI_Init_thread` finds the proxy's PMI descriptor as the stub would have). It ends through
  the C library's `exit` after `MPI_Finalize` (`_exit_rank`: MPICH says goodbye to its proxy at
  exit, and a fork must not return into the server's loop);
- the server waits for its ranks (a pidfd each) and their stubs' connections at once. When a
  rank ends, the server says `ended STATUS` on its connection to the launcher, then sends the
  status to its stub, which exits with it: MPICH's proxy sees the rank's failure after the
  launcher heard who failed, as with a rank it started itself. When a stub's connection closes
  first (the proxy killed it: another rank failed, or the job is being stopped), the server
  kills the rank.

`ps` shows each rank as `gspmdc-rank-R` and the server as `gspmdc-ranks`. A rank dies with the
server (`prctl(PR_SET_PDEATHSIG)`; the launcher then names the rank whose connection closed
first), the server with the launcher; a rank also exits when its launcher connection closes, and
the launcher and its reaper kill the ranks they know by pid.

Ranks on other hosts (`--hostfile`) have no server: they run `python -m gspmdc.runtime.rank`
(`rank.main`), which connects and forks the rank proper, staying its supervisor.
"""
from __future__ import annotations

import gc
import os
import selectors
import signal
import socket
import sys
from contextlib import contextmanager
from typing import Iterator, NoReturn

from gspmdc.errors import EXIT_RUNTIME, RuntimeFailure
from gspmdc.ir.gc_pause import paused_collection

from . import mpi_processes
from .cores import BLAS_THREAD_VARIABLES

#: how many descriptors a stub may send (the kernel's limit for one message is 253)
MAX_DESCRIPTORS = 253
#: bytes of the stub's message header: the length of what follows
HEADER_BYTES = 8
#: UCX's settings for ranks that all run on one machine (`one_host_ucx`)
_ONE_HOST_UCX = {"UCX_TLS": "self,sysv", "UCX_MEM_EVENTS": "n", "UCX_PROTO_ENABLE": "n"}


class RankServer:
    """The launcher's handle on the rank server it forked."""

    def __init__(self, pid: int):
        self.pid = pid
        self._collected = False

    def stop(self) -> None:
        """Kill the server if it still runs (it ends once every rank it forked ended; killing it
        kills those that did not) and collect it."""
        if self._collected:
            return
        if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            mpi_processes.kill_tree([self.pid])
            os.waitpid(self.pid, 0)
        self._collected = True


def one_host_ucx(environment) -> None:
    """Give `environment` (a dict, or `os.environ`) UCX's settings for the ranks of a job that
    all run on this machine, unless the user chose UCX's transports (`UCX_TLS`); a variable the
    user set stays. UCX (MPICH's network layer) then uses only its loopback and System V
    shared-memory transports, through which every rank is reachable: `MPI_Init` takes half the
    CPU it takes with every transport, which probes the network devices and zeroes POSIX
    shared-memory segments. These transports register no memory, so nothing needs to hear of
    memory being unmapped: without memory events (`UCX_MEM_EVENTS=n`) UCX installs no hooks
    into `mmap` and `malloc`, which cost 40 ms of CPU when MPI's library loads (in the server).
    UCX's older protocol selection (`UCX_PROTO_ENABLE=n`) takes 1.5 ms less of each rank's
    `MPI_Init` (of 8); on one machine MPICH moves the ranks' data through its own shared memory,
    so transfers take as long. The launcher gives the ranks these settings, and the server
    takes them before it loads MPI."""
    if "UCX_TLS" in environment:
        return
    for name, value in _ONE_HOST_UCX.items():
        environment.setdefault(name, value)


def listen_for_stubs(path: str) -> socket.socket:
    """A socket listening at `path` (Unix) for the stubs; they may connect before the server
    runs (`start_rank_server`), and wait for it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(1024)
    except OSError as e:
        listener.close()
        raise RuntimeFailure(f"cannot listen for the ranks at {path}: {e}") from None
    return listener


def start_rank_server(listener: socket.socket, launcher_address: str, token: str) -> RankServer:
    """Fork the rank server (see the module docstring), which serves the stubs that connect to
    `listener` (closed here) with ranks connecting to the launcher at `launcher_address` with
    `token`. Call it before this process starts any thread (a lock another thread held at the
    fork would stay held in the server)."""
    try:
        with paused_collection(freeze=True), _blas_loading_single_threaded():
            from . import job, kernels  # noqa: F401 - the launcher's and the ranks' alike
        sys.stdout.flush()          # nothing buffered here is written twice
        sys.stderr.flush()
        launcher = os.getpid()
        pid = os.fork()
    except OSError as e:
        listener.close()
        raise RuntimeFailure(f"cannot start the rank server: {e}") from None
    if pid == 0:
        _run_server(launcher, listener, launcher_address, token)
    listener.close()
    return RankServer(pid)


@contextmanager
def _blas_loading_single_threaded() -> Iterator[None]:
    """Within the block, numpy's BLAS, should it load, starts no threads (OpenBLAS reads its
    thread variables once, at load): the server and the ranks forked from it then hold no pool of
    BLAS threads, which a fork would have them rebuild, its idle threads spinning (each rank
    sets its own count, `_set_blas_threads`). The variables are as before after the block."""
    saved = {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES}
    os.environ.update({name: "1" for name in BLAS_THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_server(launcher: int, listener: socket.socket, launcher_address: str,
                token: str) -> NoReturn:
    """The forked server: leave the launcher's (pid `launcher`) session and descriptors, load
    the runtime, serve the stubs, exit (never returning into the launcher's frames)."""
    code = EXIT_RUNTIME
    try:
        gc.freeze()                 # the launcher's objects are never collected here
        os.setsid()
        mpi_processes.die_with_parent()
        if os.getppid() != launcher:
            return                  # the launcher died before it could be asked to kill us
        _keep_descriptors(listener.fileno())
        _standard_streams()
        _default_signal_handlers()
        mpi_processes.name_process("gspmdc-ranks")
        _load_runtime()
        code = _serve(listener, launcher_address, token)
    except BaseException as error:  # noqa: BLE001 - one line, not a traceback
        print(f"gspmdc: error: the rank server failed: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def _keep_descriptors(listener: int) -> None:
    """Close every descriptor the launcher had open but the standard output and error streams
    and `listener` (the supervisors and ranks outlive the server: none may hold the launcher's
    pipes); standard input reads /dev/null."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.closerange(3, listener)
    os.closerange(listener + 1, os.sysconf("SC_OPEN_MAX"))


def _standard_streams() -> None:
    """The standard streams of a fresh Python on descriptors 0, 1 and 2 (which a rank takes from
    its stub): the launcher's may be anything (a notebook's, a test's capture); Python's fault
    handler, when the launcher had it on, writes to the new standard error."""
    import faulthandler
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    if faulthandler.is_enabled():
        faulthandler.enable(sys.stderr)


def _default_signal_handlers() -> None:
    """The signal handlers of a fresh Python: the launcher's own Python handlers (a program that
    runs `gspmdc run` in its process may have set some) are not the ranks'."""
    for sig in signal.valid_signals():
        handler = signal.getsignal(sig)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.SIG_DFL)


def _load_runtime() -> None:
    """Import what a rank needs beyond what the launcher had imported, MPI loaded but not
    started, the objects frozen (`gc_pause`). Each rank sets its BLAS thread count
    (`_set_blas_threads`)."""
    one_host_ucx(os.environ)        # before MPI's library loads
    import mpi4py
    mpi4py.rc.initialize = False    # each rank starts MPI itself, with its proxy's PMI socket
    mpi4py.rc.finalize = False      # and finalizes it itself (`_exit_rank`)
    with paused_collection(freeze=True):
        from mpi4py import MPI  # noqa: F401
        from . import interpreter, rank  # noqa: F401
        from .backends import mpi  # noqa: F401
        # what the ranks of some jobs import before their first instruction (random inputs,
        # input files read in threads, --profile's recorder) and rank 0 after its last
        # (--check): once here rather than in each rank
        from concurrent.futures import ThreadPoolExecutor  # noqa: F401 - with its queue
        import numpy.random  # noqa: F401
        from . import compare, profile  # noqa: F401
        from .blas import loaded_blas
        loaded_blas()               # found once (cached) for every rank


class _Supervised:
    """A rank the server forked and supervises: its pid, a descriptor readable once it exited,
    its stub's connection and its connection to the launcher."""

    def __init__(self, pid: int, stub: socket.socket, connection: socket.socket):
        self.pid = pid
        self.exit_watch = os.pidfd_open(pid)
        self.stub = stub
        self.connection = connection
        #: the server waits for the stub's connection to close (until it did)
        self.stub_watched = True

    def close(self) -> None:
        """Close the server's descriptors of this rank (in a newly forked rank: they are not
        its own, and must close when the server's do)."""
        os.close(self.exit_watch)
        self.stub.close()
        self.connection.close()


def _serve(listener: socket.socket, launcher_address: str, token: str) -> int:
    """Serve stubs and supervise the ranks forked for them until as many ranks as the job has
    (`PMI_SIZE` of the stubs' environment) were started and every one of them ended (see the
    module docstring)."""
    watch = selectors.DefaultSelector()
    watch.register(listener, selectors.EVENT_READ)
    running: dict[int, _Supervised] = {}
    served, ranks = 0, None
    while ranks is None or served < ranks or running:
        for key, _ in watch.select():
            if key.data is None:    # the listener: a stub connects
                stub, _ = listener.accept()
                descriptors, numbers, directory, environment = _receive(stub)
                served += 1
                if ranks is None and environment.get("PMI_SIZE", "").isdigit():
                    ranks = int(environment["PMI_SIZE"])
                if served == ranks:
                    watch.unregister(listener)
                rank = _start_rank(stub, descriptors, numbers, directory, environment,
                                   launcher_address, token, [listener, watch, *running.values()])
                if rank is not None:
                    running[rank.pid] = rank
                    watch.register(rank.exit_watch, selectors.EVENT_READ, (rank, "exited"))
                    watch.register(rank.stub, selectors.EVENT_READ, (rank, "stub"))
                continue
            rank, event = key.data
            if running.get(rank.pid) is not rank:
                continue            # reported earlier in this look
            watch.unregister(key.fileobj)
            if event == "exited":
                del running[rank.pid]
                if rank.stub_watched:
                    watch.unregister(rank.stub)
                _report_end(rank)
            else:                   # the stub's connection closed: MPICH's proxy killed it
                rank.stub_watched = False
                os.kill(rank.pid, signal.SIGKILL)
    return 0


def _receive(stub: socket.socket) -> tuple[list[int], list[int], str, dict[str, str]]:
    """(descriptors received, the stub's numbers for them, its directory, its environment)."""
    data, descriptors, _, _ = socket.recv_fds(stub, 1 << 16, MAX_DESCRIPTORS)
    message = bytearray(data)
    size = None
    while size is None or len(message) < size:
        if size is None and len(message) >= HEADER_BYTES:
            size = int.from_bytes(message[:HEADER_BYTES], "little")
            del message[:HEADER_BYTES]
            continue
        chunk = stub.recv(1 << 16)
        if not chunk:
            raise ConnectionError("a rank stub closed its connection")
        message += chunk
    numbers, directory, environment = bytes(message).decode("utf-8", "surrogateescape") \
        .split("\n", 2)
    variables = dict(item.split("=", 1) for item in environment.split("\0") if "=" in item)
    return descriptors, [int(n) for n in numbers.split()], directory, variables


def _start_rank(stub: socket.socket, descriptors: list[int], numbers: list[int], directory: str,
                environment: dict[str, str], launcher_address: str, token: str,
                servers: list) -> _Supervised | None:
    """Connect to the launcher for the stub's rank and fork the rank (see the module
    docstring); None when the launcher cannot be reached (the stub was told, with a message on
    its standard error). `servers`: what of the server's the rank must not hold (closed in
    it)."""
    from .rank_link import connect, unreachable_message
    rank_number = environment.get("PMI_RANK", "?")
    try:
        connection = connect(launcher_address)
    except OSError as e:
        _tell_stub(stub, descriptors, numbers, unreachable_message(rank_number, e) + "\n")
        return None
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = EXIT_RUNTIME
        try:
            mpi_processes.die_with_parent(signal.SIGKILL)
            if os.getppid() != server:
                os._exit(code)      # the server died before it could be asked to kill us
            for held in servers:
                held.close()
            stub.close()
            connection = _take_descriptors(descriptors, numbers, connection)
            os.environ.clear()
            os.environ.update(environment)
            os.chdir(directory)
            mpi_processes.name_process(f"gspmdc-rank-{rank_number}")
            _set_blas_threads(int(environment.get("PMI_SIZE", "1")))
            code = _run(connection, token)
        finally:
            _exit_rank(code)
    for fd in descriptors:
        os.close(fd)
    return _Supervised(pid, stub, connection)


def _report_end(rank: _Supervised) -> None:
    """The rank exited: tell the launcher how (`rank_link.report_end`), then its stub, which
    exits with the same status."""
    from .rank_link import report_end
    _, status = os.waitpid(rank.pid, 0)
    os.close(rank.exit_watch)
    _release_stub(rank.stub, report_end(rank.connection, status))


def _release_stub(stub: socket.socket, exit_status: int) -> None:
    """Send the stub the status to exit with, and close its connection."""
    try:
        stub.sendall(f"{exit_status}\n".encode())
    except OSError:
        pass                        # the proxy killed the stub
    stub.close()


def _tell_stub(stub: socket.socket, descriptors: list[int], numbers: list[int],
               message: str) -> None:
    """Write `message` to the stub's standard error and have the stub exit with status 3."""
    if 2 in numbers:
        try:
            os.write(descriptors[numbers.index(2)], message.encode(errors="replace"))
        except OSError:
            pass                    # nowhere to say it: the exit status still tells
    _release_stub(stub, EXIT_RUNTIME)
    for fd in descriptors:
        os.close(fd)


def _set_blas_threads(num_ranks: int) -> None:
    """This rank's BLAS threads: what `mpiexec`'s environment says (`launcher._rank_environment`:
    the user's choice, else a share of the free cores), as a rank that loaded numpy itself would
    have read it."""
    from .blas import loaded_blas
    from .cores import chosen_blas_threads
    library = loaded_blas()
    threads = chosen_blas_threads(num_ranks)
    if library is not None and library.get() != threads:
        library.set(threads)


def _run(connection: socket.socket, token: str) -> int:
    from mpi4py import MPI
    from .rank import run_rank
    return run_rank(connection, token, lambda: MPI.Init_thread(MPI.THREAD_MULTIPLE))


def _exit_rank(code: int) -> None:
    """End a rank without returning into the frames it was forked in: finalize MPI, flush, and
    leave through the C library's `exit` (which says goodbye to MPICH's proxy; `os._exit` would
    not, and the proxy would take the rank for failed)."""
    try:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        import ctypes
        ctypes.CDLL(None).exit(code)
    finally:
        os._exit(code)


def _take_descriptors(descriptors: list[int], numbers: list[int],
                      keep: socket.socket) -> socket.socket:
    """Put each received descriptor at the stub's number for it, by way of numbers above any of
    them (so that none is overwritten before it moved); `keep`, a socket of this process, moves
    above them all too. Returns `keep` at its new number."""
    import fcntl
    base = max(numbers + descriptors + [keep.fileno()]) + 1
    kept = socket.socket(fileno=fcntl.fcntl(keep.fileno(), fcntl.F_DUPFD_CLOEXEC, base))
    keep.close()
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, base) for fd in descriptors]
    for fd in descriptors:
        os.close(fd)
    for fd, number in zip(moved, numbers):
        os.dup2(fd, number)
        os.close(fd)
    return kept

