"""The rank server of a `gspmdc run` job on one machine: one process that loads the runtime once
and forks every rank from it.

A rank needs Python, numpy, mpi4py and the runtime's modules before it can start MPI: about 0.3 s
of CPU each, most of a job's start-up when N ranks share a few cores. So `mpiexec -pmi-port`
starts N *rank stubs* (`rank_stub.sh`: a shell, not a Python), and the launcher (`launcher.py`)
forks this server (`start_rank_server`) from itself: a fork, not a new Python, once the launcher
imported what it needs to prepare the job and every rank needs too (numpy, the IR, the runtime's
job and kernels), so that neither Python's start nor those imports are paid twice. The server
dies with the launcher (`prctl(PR_SET_PDEATHSIG)`), leaves its session and descriptors (but the
standard output and error and the stubs' FIFO; standard input reads /dev/null), takes fresh
standard stream objects, imports the rest of the runtime and mpi4py (MPI loaded, not started)
with the cyclic garbage collector paused and everything frozen, then serves the stubs and
supervises the rank it forks for each, until it served as many stubs as the job has ranks and
every rank ended:

- a stub writes its pid and the number of ranks on one line to the FIFO `RUN_DIR/stubs`
  (`stub_requests`); MPICH's proxy gave it no descriptor but its standard streams (with
  `-pmi-port` a rank reaches the proxy's PMI service over TCP, at `PMI_PORT`, as `PMI_ID`), so
  the server takes what the rank needs from `/proc`: the stub's environment and working
  directory, and its standard streams (pipes to the proxy, opened again by their `/proc` names),
  which the stub keeps at descriptors 7, 8 and 9 before it asks: its shell moves 0, 1 and 2
  while it writes the request (1 is the FIFO then) and waits for its status (0 is its exit
  FIFO), and a rank that took those would write its output into the FIFO, lost;
- the server connects to the launcher for the rank (`rank_link.py`) and forks the rank, which
  holds none of the server's descriptors but that connection (not the other ranks' connections
  or exit FIFOs: each must close when its own rank ends), puts the stub's standard streams at 0,
  1 and 2, takes the stub's environment, directory and the BLAS thread count (`_set_blas_threads`),
  and runs `rank.run_rank`, which says hello and starts MPI (`MPI_Init_thread` reaches the
  proxy at `PMI_PORT` as the stub would have). It ends through the C library's `exit` after
  `MPI_Finalize` (`_exit_rank`: MPICH says goodbye to its proxy at exit, and a fork must not
  return into the server's loop);
- the server waits for its ranks, their stubs and the stubs' parent (MPICH's proxy) at once (a
  pidfd each). When a rank ends, the server says `ended STATUS` on its connection to the
  launcher, then writes the status to the stub's FIFO `RUN_DIR/exit-RANK`, and the stub exits
  with it: MPICH's proxy sees the rank's failure after the launcher heard who failed, as with a
  rank it started itself. When a stub ends first (the proxy killed it: another rank failed, or
  the job is being stopped), or the proxy itself ends, the server kills the rank.

`ps` shows each rank as `gspmdc-rank-R` and the server as `gspmdc-ranks`. A rank dies with the
server (`prctl(PR_SET_PDEATHSIG)`; the launcher then names the rank whose connection closed
first), the server with the launcher; a stub whose server died reads the end of its FIFO and
exits (3); a rank also exits when its launcher connection closes, and the launcher and its
reaper kill the ranks they know by pid.

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
from pathlib import Path
from typing import BinaryIO, Iterator, NoReturn

from gspmdc.errors import EXIT_RUNTIME, RuntimeFailure
from gspmdc.ir.gc_pause import paused_collection

from . import mpi_processes, pmi_port
from .cores import BLAS_THREAD_VARIABLES

#: the stub MPICH's proxy starts for each rank
STUB = Path(__file__).with_name("rank_stub.sh")
#: where the stub keeps its standard streams (`rank_stub.sh`), which its rank takes: never 0, 1
#: and 2, which the stub's shell moves while it writes its request and waits for its status
_STUB_STREAMS = (7, 8, 9)
#: the rank's standard streams
_STREAMS = (0, 1, 2)
#: UCX's settings for ranks that all run on one machine (`one_host_ucx`)
_ONE_HOST_UCX = {"UCX_TLS": "self,sysv", "UCX_MEM_EVENTS": "n", "UCX_PROTO_ENABLE": "n"}


class RankServer:
    """The launcher's handle on the rank server it forked."""

    def __init__(self, pid: int):
        self.pid = pid
        #: how the server ended (`os.waitpid`'s status), once it was collected
        self.status: int | None = None

    def ended(self) -> bool:
        """Whether the server ended (it is collected then)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid != 0:
                self.status = status
        return self.status is not None

    def stop(self) -> None:
        """Kill the server if it still runs (it ends once every rank it forked ended; killing it
        kills those that did not) and collect it."""
        if not self.ended():
            mpi_processes.kill_tree([self.pid])
            self.status = os.waitpid(self.pid, 0)[1]


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


def stub_requests(run_dir: Path) -> BinaryIO:
    """The FIFO `RUN_DIR/stubs` on which the stubs ask for their ranks (`rank_stub.sh`), made and
    opened for reading and writing: the server reads it, and that it is open for writing too
    keeps it from reading end-of-file between two stubs. A stub that asks before the server runs
    (`start_rank_server`) finds a reader, and its line waits in the FIFO."""
    path = run_dir / "stubs"
    try:
        os.mkfifo(path, 0o600)
        return open(path, "r+b", buffering=0)
    except OSError as e:
        raise RuntimeFailure(f"cannot make the ranks' FIFO {path}: {e}") from None


def stub_command(run_dir: Path, num_ranks: int) -> list[str]:
    """What `mpiexec -pmi-port -n NUM_RANKS` starts for each rank: the stub; makes the FIFO
    `RUN_DIR/exit-R` on which the stub of rank R hears its rank's exit status, for every R."""
    try:
        for rank in range(num_ranks):
            os.mkfifo(run_dir / f"exit-{rank}", 0o600)
    except OSError as e:
        raise RuntimeFailure(f"cannot make the ranks' FIFOs in {run_dir}: {e}") from None
    return ["/bin/sh", str(STUB), str(run_dir), str(num_ranks)]


def start_rank_server(requests: BinaryIO, run_dir: Path, launcher_address: str,
                      token: str) -> RankServer:
    """Fork the rank server (see the module docstring), which serves the stubs that ask on the
    FIFO `requests` (`stub_requests`; closed here) in `run_dir` with ranks connecting to the
    launcher at `launcher_address` with `token`. Call it before this process starts any thread
    (a lock another thread held at the fork would stay held in the server)."""
    try:
        with paused_collection(freeze=True), _blas_loading_single_threaded():
            from . import job, kernels  # noqa: F401 - the launcher's and the ranks' alike
        sys.stdout.flush()          # nothing buffered here is written twice
        sys.stderr.flush()
        launcher = os.getpid()
        pid = os.fork()
    except OSError as e:
        requests.close()
        raise RuntimeFailure(f"cannot start the rank server: {e}") from None
    if pid == 0:
        _run_server(launcher, _Server(requests, run_dir, launcher_address, token))
    requests.close()
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


def _run_server(launcher: int, server: _Server) -> NoReturn:
    """The forked server: leave the launcher's (pid `launcher`) session and descriptors, load
    the runtime, serve the stubs, exit (never returning into the launcher's frames)."""
    code = EXIT_RUNTIME
    try:
        gc.freeze()                 # the launcher's objects are never collected here
        os.setsid()
        mpi_processes.die_with_parent()
        if os.getppid() != launcher:
            return                  # the launcher died before it could be asked to kill us
        _keep_descriptors(server.requests.fileno())
        _standard_streams()
        _default_signal_handlers()
        mpi_processes.name_process("gspmdc-ranks")
        _load_runtime()
        code = server.serve()
    except BaseException as error:  # noqa: BLE001 - one line, not a traceback
        print(f"gspmdc: error: the rank server failed: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def _keep_descriptors(requests: int) -> None:
    """Close every descriptor the launcher had open but the standard output and error streams
    and `requests` (the ranks outlive the server: none may hold the launcher's pipes); standard
    input reads /dev/null."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.closerange(3, requests)
    os.closerange(requests + 1, os.sysconf("SC_OPEN_MAX"))


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


class _Stub:
    """A stub that asked for its rank: its pid, a descriptor readable once it exited, its parent
    (MPICH's proxy, None when unknown) and what its rank takes from it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.watch = os.pidfd_open(pid)     # from now on `pid` is this stub, whatever happens
        try:
            self.parent = mpi_processes.parent(pid)
            self.environment = _environment(Path(f"/proc/{pid}/environ").read_bytes())
            self.directory = os.readlink(f"/proc/{pid}/cwd")
            #: its standard streams (pipes to MPICH's proxy), opened here again by their names
            #: in /proc, with the stub's access modes; closed once its rank has them
            self.streams = _reopen_streams(pid)
        except OSError:
            os.close(self.watch)
            raise

    def rank(self) -> str:
        """The stub's rank, as MPICH's proxy names it for the PMI service at `PMI_PORT`."""
        return self.environment.get("PMI_ID", "?")

    def close_streams(self) -> None:
        for fd in self.streams:
            os.close(fd)
        self.streams = []


def _environment(data: bytes) -> dict[str, str]:
    """`/proc/PID/environ` (`NAME=VALUE` entries ending in NUL) as a dict."""
    items = data.decode("utf-8", "surrogateescape").split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def _reopen_streams(pid: int) -> list[int]:
    """The standard streams stub `pid` keeps (`_STUB_STREAMS`), opened by their names in /proc
    with its access modes (and appending where it appends); a pipe so opened is the same pipe."""
    streams: list[int] = []
    try:
        for number in _STUB_STREAMS:
            with open(f"/proc/{pid}/fdinfo/{number}") as info:
                flags = next(int(line.split()[1], 8) for line in info
                             if line.startswith("flags:"))
            streams.append(os.open(f"/proc/{pid}/fd/{number}",
                                   flags & (os.O_ACCMODE | os.O_APPEND) | os.O_CLOEXEC))
    except (OSError, StopIteration, ValueError) as e:
        for fd in streams:
            os.close(fd)
        if isinstance(e, OSError):
            raise
        raise OSError(f"/proc/{pid}/fdinfo has no flags") from None
    return streams


class _Supervised:
    """A rank the server forked and supervises: its pid, a descriptor readable once it exited,
    its stub, the stub's exit FIFO (open for writing), the rank's PMI connection
    (`pmi_port.py`: the server holds it too, so that MPICH's proxy sees it close only once the
    server told the launcher how the rank ended) and its connection to the launcher."""

    def __init__(self, pid: int, stub: _Stub, exit_fifo: int, pmi: socket.socket,
                 connection: socket.socket):
        self.pid = pid
        self.exit_watch = os.pidfd_open(pid)
        self.stub = stub
        self.exit_fifo = exit_fifo
        self.pmi = pmi
        self.connection = connection
        #: the server waits for the stub to end (until it did)
        self.stub_watched = True

    def close(self) -> None:
        """Close the server's descriptors of this rank (in a newly forked rank: they are not
        its own, and must close when the server's do)."""
        os.close(self.exit_watch)
        os.close(self.stub.watch)
        os.close(self.exit_fifo)
        self.pmi.close()
        self.connection.close()


class _Server:
    """The server's work (see the module docstring): the stubs' FIFO `requests` in `run_dir`,
    the ranks it forked and supervises, MPICH's proxies it watches."""

    def __init__(self, requests: BinaryIO, run_dir: Path, launcher_address: str, token: str):
        self.requests = requests
        self.run_dir = run_dir
        self.launcher_address = launcher_address
        self.token = token
        self.watch: selectors.BaseSelector | None = None
        self.running: dict[int, _Supervised] = {}
        #: each proxy of the stubs -> a descriptor readable once it exited
        self.proxies: dict[int, int] = {}
        #: the job's number of ranks, as the first stub said
        self.ranks: int | None = None
        self.served = 0

    def serve(self) -> int:
        """Serve stubs and supervise the ranks forked for them until as many ranks as the job
        has were started and every one of them ended."""
        self.watch = selectors.DefaultSelector()
        self.watch.register(self.requests, selectors.EVENT_READ)
        asked = b""
        while self.ranks is None or self.served < self.ranks or self.running:
            for key, _ in self.watch.select():
                if key.data is None:            # stubs asked: `PID NUM_RANKS` lines
                    asked += self.requests.read(1 << 16)
                    *lines, asked = asked.split(b"\n")
                    for line in lines:
                        pid, ranks = (int(word) for word in line.split())
                        self.ranks = ranks
                        self.served += 1
                        self._start_rank(pid)
                    if self.served == self.ranks:
                        self.watch.unregister(self.requests)
                    continue
                what, event = key.data
                if event == "proxy":
                    self._proxy_ended(what)
                    continue
                rank = what
                if self.running.get(rank.pid) is not rank:
                    continue        # reported earlier in this look
                self.watch.unregister(key.fileobj)
                if event == "exited":
                    del self.running[rank.pid]
                    if rank.stub_watched:
                        self.watch.unregister(rank.stub.watch)
                    _report_end(rank)
                else:               # the stub ended: MPICH's proxy killed it
                    rank.stub_watched = False
                    os.kill(rank.pid, signal.SIGKILL)
        return 0

    def close(self) -> None:
        """Close every descriptor of the server's (in a newly forked rank)."""
        self.requests.close()
        self.watch.close()
        for rank in self.running.values():
            rank.close()
        for watch in self.proxies.values():
            os.close(watch)

    def _start_rank(self, stub_pid: int) -> None:
        """Connect to the launcher for the rank of the stub `stub_pid` and fork the rank (see
        the module docstring). A stub that ended before it was served gets no rank (MPICH's
        proxy saw it fail); one whose rank cannot start is told why, on its standard error or
        the server's, and exits with status 3."""
        from .rank_link import connect, unreachable_message
        try:
            stub = _Stub(stub_pid)
        except OSError as e:
            if mpi_processes.alive(stub_pid):
                _refuse(stub_pid, f"cannot take what its rank needs from /proc: {e}")
            return                  # else it ended before it was served
        try:
            exit_fifo = os.open(self.run_dir / f"exit-{stub.rank()}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            stub.close_streams()
            os.close(stub.watch)
            _refuse(stub_pid, f"rank {stub.rank()}: no exit FIFO: {e}")
            return
        try:
            connection = connect(self.launcher_address)
        except OSError as e:
            _tell_stub(stub, exit_fifo, unreachable_message(stub.rank(), e) + "\n")
            return
        try:
            pmi = pmi_port.connect(stub.environment)
        except OSError as e:
            connection.close()
            _tell_stub(stub, exit_fifo, f"gspmdc: error: rank {stub.rank()}: cannot reach "
                                        f"MPICH's process manager: {e}\n")
            return
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = EXIT_RUNTIME
            try:
                mpi_processes.die_with_parent(signal.SIGKILL)
                if os.getppid() != server:
                    os._exit(code)  # the server died before it could be asked to kill us
                self.close()
                os.close(stub.watch)
                os.close(exit_fifo)
                connection = _take_descriptors(stub.streams, list(_STREAMS), connection)
                os.environ.clear()
                os.environ.update(stub.environment)
                os.chdir(stub.directory)
                mpi_processes.name_process(f"gspmdc-rank-{stub.rank()}")
                _set_blas_threads(self.ranks)
                code = _run(connection, pmi, self.token)
            finally:
                _exit_rank(code)
        stub.close_streams()
        rank = _Supervised(pid, stub, exit_fifo, pmi, connection)
        self.running[pid] = rank
        self.watch.register(rank.exit_watch, selectors.EVENT_READ, (rank, "exited"))
        self.watch.register(stub.watch, selectors.EVENT_READ, (rank, "stub"))
        if stub.parent is not None and stub.parent not in self.proxies:
            try:
                self.proxies[stub.parent] = os.pidfd_open(stub.parent)
            except ProcessLookupError:
                return              # already gone: its stubs end, and so their ranks
            self.watch.register(self.proxies[stub.parent], selectors.EVENT_READ,
                                (stub.parent, "proxy"))

    def _proxy_ended(self, proxy: int) -> None:
        """MPICH's proxy `proxy` ended: kill the ranks of its stubs (their ends are reported as
        any other)."""
        self.watch.unregister(self.proxies[proxy])
        os.close(self.proxies.pop(proxy))
        for rank in self.running.values():
            if rank.stub.parent == proxy:
                os.kill(rank.pid, signal.SIGKILL)


def _report_end(rank: _Supervised) -> None:
    """The rank exited: tell the launcher how (`rank_link.report_end`), then its stub, which
    exits with the same status."""
    from .rank_link import report_end
    _, status = os.waitpid(rank.pid, 0)
    os.close(rank.exit_watch)
    _release_stub(rank.stub, rank.exit_fifo, report_end(rank.connection, status))
    rank.pmi.close()


def _release_stub(stub: _Stub, exit_fifo: int, exit_status: int) -> None:
    """Write the status the stub is to exit with to its FIFO, and close the server's ends."""
    os.write(exit_fifo, f"{exit_status}\n".encode())   # a few bytes: a FIFO takes them at once
    os.close(exit_fifo)
    os.close(stub.watch)


def _tell_stub(stub: _Stub, exit_fifo: int, message: str) -> None:
    """Write `message` to the stub's standard error and have the stub exit with status 3."""
    try:
        os.write(stub.streams[2], message.encode(errors="replace"))
    except OSError:
        pass                        # nowhere to say it: the exit status still tells
    stub.close_streams()
    _release_stub(stub, exit_fifo, EXIT_RUNTIME)


def _refuse(stub_pid: int, reason: str) -> None:
    """A stub whose rank cannot start: say why on the server's standard error and kill it
    (MPICH's proxy then stops the job)."""
    print(f"gspmdc: error: the rank of stub {stub_pid} cannot start: {reason}", file=sys.stderr,
          flush=True)
    try:
        os.kill(stub_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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


def _run(connection: socket.socket, pmi: socket.socket, token: str) -> int:
    """The rank: take the PMI connection the server made (`pmi_port.hand_over`) and run."""
    from mpi4py import MPI
    from .rank import run_rank
    try:
        pmi_port.hand_over(pmi)
    except OSError as e:
        print(f"gspmdc: error: rank {os.environ.get('PMI_ID', '?')}: cannot reach MPICH's "
              f"process manager: {e}", file=sys.stderr, flush=True)
        return EXIT_RUNTIME
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

