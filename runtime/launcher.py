"""`gspmdc run --backend mpi` from a plain process: start `mpiexec`, supervise the ranks, stop the
whole job on any failure, and leave nothing behind.

`launch(prepare, num_partitions, mpiexec, started_at, hostfile)`:

- makes a private run directory (the ranks' position board, `rank_position.py`; the Unix
  sockets; the output being received) and starts the *reaper* (`reaper.py`), which cleans up if
  this process is killed;
- starts `mpiexec -pmi-port -n N /bin/sh rank_stub.sh RUN_DIR N` (one host; `rank_stub.sh`,
  `rank_server.py`) or `mpiexec -n N -f HOSTFILE python -m gspmdc.runtime.rank ADDRESS TOKEN` in
  its own session, without a fork of this process (a fork would leave its memory copy-on-write
  while it compiles); if this process dies, the kernel kills the rank server with it
  (`prctl(PR_SET_PDEATHSIG)`) and the reaper stops `mpiexec` (SIGTERM, which MPICH's proxies
  pass on to their processes) and what is left;
- on one host, then forks the *rank server* (`rank_server.py`) once it imported what it and the
  ranks both need: the server loads the rest of the runtime while this process prepares the job
  (`prepare()`: parsing, partitioning, checks), and forks every rank. So when the number of
  partitions is known beforehand (`-n`), the ranks start MPI while this process partitions the
  program; if preparing fails, the ranks are stopped and the error is raised. Otherwise the
  server is forked first, the job prepared (the server loading meanwhile), then `mpiexec`
  started;
- accepts each rank's connection (`rank_link.py`; a Unix socket, or TCP when a hostfile puts
  ranks on other hosts), learns its pid and host, and sends it the job (pickled once);
- passes rank output through live (without MPICH's termination banners), and prints the error
  a failing rank reports over its connection (`rank_link.py`: not through MPICH's forwarding of
  its standard error), then stops the job;
- stops the job (every process of it on this machine but `mpiexec` and its proxies killed at
  once, those then left to end cleanly so that hydra removes its temporary files,
  `mpi_processes.stop_job`; ranks elsewhere exit when their connection closes) when a rank ends
  without `done`/`failed` (named with its host, pid, how it ended and the instruction it was
  executing), at `--timeout` (naming where every rank was), when preparing the job fails after
  `mpiexec` started, or on SIGTERM, SIGINT or SIGHUP;
- receives the outputs from rank 0 and writes the output file (atomically) only after every rank
  finished: an output never appears after `gspmdc run` returned;
- removes MPICH shared-memory segments that a job which failed during `MPI_Init` left behind, and
  the run directory.

Exit codes: those of the ranks (0 success, 1 check mismatch, 2 bad input, 3 runtime failure), and
3 for a killed rank, a timeout, a signal, or `mpiexec` failing.
"""
from __future__ import annotations

import json
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable

from gspmdc.errors import EXIT_RUNTIME, GspmdcError, RuntimeFailure

from . import mpi_processes, rank_link
from .cores import with_blas_threads
from .rank_position import create_board_file, describe, describe_ranks, read_board_file
from .rank_server import (RankServer, one_host_ucx, start_rank_server, stub_command,
                          stub_requests)
from .reaper import Reaper, start_reaper

if TYPE_CHECKING:       # annotations only: the ranks start before these are imported
    import zipfile

    from .job import Job

#: environment variables that MPI launchers set in every rank
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
#: how often the launcher looks at its ranks, mpiexec, the clock and signals
_POLL_SECONDS = 0.05
#: after mpiexec ended, how long the ranks' connections may take to close
_DRAIN_SECONDS = 5.0
#: signals that stop the job (exit 3)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: signals a process raises on itself when it fails (a rank killed by one of them crashed)
_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT,
                  signal.SIGSYS, signal.SIGTRAP)


_BANNER = re.compile(r"^(=+|=   .*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING.*|"
                     r"This typically refers to a problem with your application\.|"
                     r"Please see the FAQ page for debugging suggestions|"
                     r"Abort\(\d+\) on node \d+.*)$")


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
    return str(path.absolute())     # a relative path is not looked up in $PATH


def hostfile_hosts(path: str) -> list[str]:
    """The host names of an MPICH hostfile (`host[:count]` per line, `#` comments)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise GspmdcError(f"--hostfile {path}: cannot read: {e}") from None
    hosts = [line.split("#")[0].strip().split(":")[0] for line in lines]
    hosts = [host for host in hosts if host]
    if not hosts:
        raise GspmdcError(f"--hostfile {path}: names no host")
    return hosts


def address_towards(host: str) -> str:
    """The address of this machine on the route to `host` (what ranks there connect back to)."""
    try:
        target = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect(target)           # a UDP connect sends nothing: it picks the route
            return probe.getsockname()[0]
        finally:
            probe.close()
    except OSError as e:
        raise GspmdcError(f"--hostfile: cannot find a route to host {host}: {e}") from None


# ====================================================================================== launch

def launch(prepare: Callable[[], Job], num_partitions: int | None, mpiexec: str,
           started_at: float, hostfile: str | None = None) -> int:
    """Run the job `prepare()` returns on MPI ranks, one per partition, and return the exit code
    (see the module docstring). `num_partitions`: the number of partitions when it is known
    before the job is prepared (it must then be the job's), else None. `started_at` (a
    `time.time()`): when `gspmdc run` started, from which `--timeout` counts."""
    address_host = address_towards(hostfile_hosts(hostfile)[0]) if hostfile else None
    run_dir = Path(tempfile.mkdtemp(prefix="gspmdc-run-"))
    reaper = start_reaper(run_dir, started_at)
    listener = stubs = server = session = signals = None
    try:
        listener, address = rank_link.listen(address_host, str(run_dir / "ranks.sock"))
        token = os.urandom(16).hex()
        if hostfile is None:
            stubs = stub_requests(run_dir)
        job = None
        if num_partitions is None:      # the job says how many ranks: prepare it first
            if stubs is not None:       # (the server loading meanwhile)
                server = _start_server(stubs, run_dir, address, token, reaper)
            job = prepare()
        n = job.num_partitions if job is not None else num_partitions
        create_board_file(run_dir / "positions", n)
        session = _Session(n, run_dir, listener, token, started_at, one_host=hostfile is None,
                           on_local_pid=lambda pid: reaper.tell_process("pid", pid))
        if hostfile is None:
            command = [mpiexec, "-pmi-port", "-n", str(n), *stub_command(run_dir, n)]
        else:
            command = [mpiexec, "-n", str(n), "-f", hostfile, sys.executable, "-m",
                       "gspmdc.runtime.rank", address, token]
        session.start(command)
        reaper.tell_process("mpiexec", session.proc.pid)
        if stubs is not None and server is None:
            # after mpiexec started: its proxy and the stubs start while this process imports
            server = _start_server(stubs, run_dir, address, token, reaper)
        session.server = server
        session.relay_output()          # threads: after the server's fork
        if job is None:
            job = prepare()             # while the ranks start
        signals = _SignalRecorder()
        return session.supervise(job, signals)
    finally:
        if session is not None:
            session.close()
        elif listener is not None:
            listener.close()
        if stubs is not None:
            stubs.close()
        if server is not None:
            server.stop()
        if signals is not None:
            signals.restore()
        shutil.rmtree(run_dir, ignore_errors=True)
        reaper.tell("done")             # it exits on its own: no need to wait for it
        reaper.close()


def _start_server(stubs: BinaryIO, run_dir: Path, address: str, token: str,
                  reaper: Reaper) -> RankServer:
    """Fork the rank server (`rank_server.py`) serving the stubs that ask on the FIFO `stubs`;
    the reaper learns its pid."""
    server = start_rank_server(stubs, run_dir, address, token)
    reaper.tell_process("pid", server.pid)
    return server


class _SignalRecorder:
    """Records SIGTERM, SIGINT and SIGHUP instead of dying of them (the launcher polls `caught`
    and stops the job); `restore()` puts the previous handlers back."""

    def __init__(self):
        self.caught: int | None = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._record)

    def _record(self, signum, frame) -> None:
        if self.caught is None:
            self.caught = signum

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class _Rank:
    """What the launcher knows of a connected rank."""

    number: int
    pid: int
    host: str
    local: bool
    ready: bool = False
    #: `done` or `failed` once the rank said so
    ended: str | None = None
    #: how the rank ended, as its supervisor said (`ended STATUS`: an exit status, or minus a
    #: signal)
    status: int | None = None

    def name(self) -> str:
        where = "" if self.local else f" on {self.host}"
        return f"rank {self.number} (pid {self.pid}{where})"


class _Session:
    """One running job: mpiexec, the ranks' connections, the output being received."""

    def __init__(self, num_partitions: int, run_dir: Path, listener: socket.socket, token: str,
                 started: float, one_host: bool, on_local_pid: Callable[[int], None]):
        self.num_partitions = num_partitions
        #: the job, set by `supervise` before any rank's hello is answered
        self.job: Job | None = None
        self.started = started
        self.on_local_pid = on_local_pid
        self.run_dir = run_dir
        self.identity = mpi_processes.host_identity()
        self.listener = listener
        self.token = token
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.buffers: dict[socket.socket, bytearray] = {}
        self.ranks: dict[socket.socket, _Rank] = {}
        self.closed: list[_Rank] = []         # ranks whose connection closed, in order
        self.deaths: list[_Rank] = []         # ranks that ended unannounced, as supervisors said
        self.output: _OutputReceiver | None = None
        self.proc: subprocess.Popen | None = None
        #: readable when `mpiexec` exited (`poll` then returns at once); None once it did
        self.exit_watch: int | None = None
        #: the ranks all run on this machine (no hostfile)
        self.one_host = one_host
        #: the rank server (`rank_server.py`) once started, None with a hostfile
        self.server: RankServer | None = None
        self.relays: list[threading.Thread] = []
        self.payloads: dict[str | None, bytes] = {}

    # ---------------------------------------------------------------------------- supervising
    def start(self, command: list[str]) -> None:
        """Start `mpiexec` (the ranks connect, and wait for the job until `supervise`); its
        output waits in its pipes until `relay_output`."""
        try:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                env=_rank_environment(self.num_partitions, self.one_host))
        except OSError as e:
            raise RuntimeFailure(f"cannot start {command[0]}: {e}") from None
        self.exit_watch = mpi_processes.exit_descriptor(self.proc.pid)
        if self.exit_watch is not None:
            self.selector.register(self.exit_watch, selectors.EVENT_READ)

    def relay_output(self) -> None:
        """Pass `mpiexec`'s output on to ours, from threads (start no process after this: a lock
        a thread held at the fork would stay held in the child)."""
        self.relays = [_relay(self.proc.stdout, sys.stdout), _relay(self.proc.stderr, sys.stderr)]

    def supervise(self, job: Job, signals: _SignalRecorder) -> int:
        """Send `job` to the ranks and watch them until the job ends; the exit code."""
        self.job = job
        if job.options.outputs is not None:
            self.output = _OutputReceiver(self.run_dir / "outputs.npz")
        timeout = job.options.timeout
        deadline = None if timeout is None else self.started + timeout
        while True:
            self.poll(_POLL_SECONDS)
            if signals.caught is not None:
                self.stop()
                name = signal.Signals(signals.caught).name
                what = "interrupted" if signals.caught == signal.SIGINT else "stopped"
                return self._fail(f"{what} by {name}; all ranks were stopped")
            dead = self._died()
            if dead is not None:
                self.stop()
                return self._fail(self._death(dead))
            if self._a_rank_failed():
                self.stop()             # the rank's error was printed
                return EXIT_RUNTIME
            missing = self._never_connected()
            if missing and self.server is not None and self.server.ended():
                self.stop()             # their stubs wait for ranks nobody will start
                return self._fail(f"the rank server ended ({_how(self.server.status)}) before "
                                  f"{_ranks(missing)} connected; the job was stopped")
            if self.proc.poll() is not None:
                return self._ended()
            if deadline is not None and time.time() > deadline:
                where = self._where_everyone()
                self.stop()
                return self._fail(f"the run timed out after {timeout:g} s: {where}; all ranks "
                                  "were stopped")

    def _ended(self) -> int:
        """mpiexec exited: wait for the ranks' connections to close, then judge."""
        for relay in self.relays:
            relay.join(timeout=_DRAIN_SECONDS)
        deadline = time.monotonic() + _DRAIN_SECONDS
        while self.buffers and time.monotonic() < deadline:
            self.poll(_POLL_SECONDS)
        dead = self._died()
        code = self.proc.returncode
        if dead is not None:
            return self._fail(self._death(dead))
        if self._a_rank_failed():
            return code if code in (2, 3) else EXIT_RUNTIME     # its error was printed
        if code in (0, 1) and self._all_done():
            if self.output is not None:
                self.output.commit(self.job.options.outputs)
            return code
        status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        missing = self._never_connected()
        if len(missing) == self.num_partitions:
            return self._fail(f"mpiexec failed ({status}) before any rank started; the launcher "
                              f"was {self.proc.args[0]}")
        if missing:
            return self._fail(f"{_ranks(missing)} terminated during start-up, before connecting "
                              f"to gspmdc (mpiexec: {status})")
        return self._fail(f"mpiexec failed ({status})")

    def _fail(self, message: str) -> int:
        sys.stdout.flush()
        print(f"gspmdc: error: {message}", file=sys.stderr, flush=True)
        return EXIT_RUNTIME

    def _everyone(self) -> list[_Rank]:
        return self.closed + list(self.ranks.values())

    def _a_rank_failed(self) -> bool:
        """Whether a rank reported its own failure (`failed`; the launcher printed it)."""
        return any(r.ended == "failed" for r in self._everyone())

    def _all_done(self) -> bool:
        everyone = self._everyone()
        return len(everyone) == self.num_partitions and \
            all(r.ended == "done" for r in everyone)

    def _never_connected(self) -> list[int]:
        seen = {r.number for r in self._everyone()}
        return [r for r in range(self.num_partitions) if r not in seen]

    def _died(self) -> _Rank | None:
        """The rank that died first (None while none did, or when a rank reported its own
        failure, which stops the others): the first whose supervisor said `ended` before the
        rank said `done`/`failed`. Its supervisor said so before exiting, hence before MPICH's
        proxy killed any other rank (with SIGKILL, like a rank killed from outside), so this
        does not depend on the order in which the connections are read. Failing that (the
        supervisor itself was killed), the first rank whose connection closed unannounced as
        the launcher saw them: connections that close within one look of `epoll` come in no
        particular order. MPICH's own termination report is no help: it names the first rank
        of the node, whichever died."""
        if self._a_rank_failed():
            return None
        if self.deaths:
            return self.deaths[0]
        return next((r for r in self.closed if r.ended is None), None)

    def _death(self, dead: _Rank) -> str:
        """The message naming `dead`, how it ended and where."""
        if dead.status is None:
            how = "killed or crashed"
        elif dead.status >= 0:
            how = f"exited with status {dead.status}"
        else:
            try:
                name = signal.Signals(-dead.status).name
            except ValueError:
                name = f"signal {-dead.status}"
            how = f"crashed with {name}" if -dead.status in _CRASH_SIGNALS else f"killed by {name}"
        return f"{dead.name()} terminated unexpectedly ({how}) while {self._position(dead)}; " \
            "the job was stopped"

    def _position(self, rank: _Rank) -> str:
        if not rank.local:
            return "running on another host"
        board = read_board_file(self.run_dir / "positions")
        return describe(self.job.spmd, board[rank.number])

    def _where_everyone(self) -> str:
        board = read_board_file(self.run_dir / "positions")
        remote = {r.number: r for r in self.ranks.values() if not r.local}
        local = {n: code for n, code in enumerate(board) if n not in remote}
        parts = [describe_ranks(self.job.spmd, local)] if local else []
        parts += [f"rank {n} running on {remote[n].host}" for n in sorted(remote)]
        return "; ".join(parts)

    # ---------------------------------------------------------------------------- connections
    def poll(self, seconds: float) -> None:
        """Accept connections and read what ranks sent, for up to `seconds` or until `mpiexec`
        exited."""
        for key, _ in self.selector.select(seconds):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj == self.exit_watch:
                self._unwatch_exit()
            elif not self._read(key.fileobj):
                self._close(key.fileobj)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(True)
        self.buffers[conn] = bytearray()
        self.selector.register(conn, selectors.EVENT_READ)

    def _unwatch_exit(self) -> None:
        self.selector.unregister(self.exit_watch)
        os.close(self.exit_watch)
        self.exit_watch = None

    def _close(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        self.buffers.pop(conn, None)
        rank = self.ranks.pop(conn, None)
        if rank is not None:
            self.closed.append(rank)
        conn.close()

    def _read(self, conn: socket.socket) -> bool:
        """Read what `conn` sent; False when it is closed (or spoke out of turn)."""
        try:
            data = conn.recv(1 << 20)
        except OSError:
            return False
        if not data:
            return False
        buffer = self.buffers[conn]
        buffer += data
        while buffer:
            if self.output is not None and self.output.receiving:
                taken = self.output.write(buffer)
                del buffer[:taken]
                continue
            end = buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(buffer[:end]).decode(errors="replace")
            del buffer[:end + 1]
            if not self._message(conn, line):
                return False
        return True

    def _message(self, conn: socket.socket, line: str) -> bool:
        rank = self.ranks.get(conn)
        words = line.split()
        if rank is None:
            return self._hello(conn, words)
        if words == ["ready"]:
            rank.ready = True
        elif words == ["done"]:
            rank.ended = "done"
        elif words and words[0] == "failed":
            rank.ended = "failed"
            self._report(line[len("failed"):])
        elif len(words) == 2 and words[0] == "ended" and words[1].lstrip("-").isdigit():
            rank.status = int(words[1])
            if rank.ended is None:
                self.deaths.append(rank)
        elif len(words) == 3 and words[0] == "output" and self.output is not None \
                and rank.number == 0:
            self.output.begin(words[1], int(words[2]))
        return True

    @staticmethod
    def _report(error: str) -> None:
        """Print the error a rank reported (`failed MESSAGE`, the message a JSON string)."""
        try:
            message = json.loads(error)
        except ValueError:
            message = error.strip()
        sys.stdout.flush()
        print(f"gspmdc: error: {message}", file=sys.stderr, flush=True)

    def _hello(self, conn: socket.socket, words: list[str]) -> bool:
        if len(words) != 6 or words[0] != "hello" or words[5] != self.token \
                or not (words[1].lstrip("-").isdigit() and words[2].isdigit()):
            return False
        number, pid, host, identity = int(words[1]), int(words[2]), words[3], words[4]
        rank = _Rank(number, pid, host, identity == self.identity)
        self.ranks[conn] = rank
        if rank.local:
            self.on_local_pid(pid)
        board = str(self.run_dir / "positions") if rank.local else None
        payload = self.payloads.get(board)
        if payload is None:             # pickled once for the local ranks, once for the others
            payload = self.payloads[board] = pickle.dumps((self.job, board),
                                                          pickle.HIGHEST_PROTOCOL)
        try:
            conn.sendall(f"job {len(payload)}\n".encode() + payload)
        except OSError:
            return False
        return True

    # ------------------------------------------------------------------------------- stopping
    def stop(self) -> None:
        """Kill every process of the job on this machine at once but mpiexec and its proxies,
        which then end cleanly (`mpi_processes.stop_job`: a proxy killed leaves its temporary
        files); ranks on other hosts exit when their connection closes (`close`) or their proxy
        ends."""
        others = [self.server.pid] if self.server is not None else []
        others += [r.pid for r in self.ranks.values() if r.local]
        mpi_processes.stop_job(self.proc.pid if self.proc is not None else None, others)
        if self.proc is not None:
            self.proc.wait()
            for relay in self.relays:
                relay.join(timeout=_DRAIN_SECONDS)

    def close(self) -> None:
        """Stop what is left, close every connection, remove what a failed start-up left."""
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        for conn in list(self.buffers):
            self.selector.unregister(conn)
            conn.close()
        if self.exit_watch is not None:
            self._unwatch_exit()
        self.selector.close()
        self.listener.close()
        if self.output is not None:
            self.output.discard()
        everyone = self._everyone()
        if len(everyone) < self.num_partitions or not all(r.ready for r in everyone):
            mpi_processes.sweep_orphan_segments(self.started)


class _OutputReceiver:
    """The output file as rank 0 sends it, member by member (`output NAME NBYTES` + the `.npy`
    bytes), into a zip file in the run directory; `commit(target)` writes it to `target`
    atomically once the job has finished."""

    def __init__(self, path: Path):
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self._member = None
        self._left = 0

    @property
    def receiving(self) -> bool:
        return self._member is not None

    def begin(self, name: str, nbytes: int) -> None:
        import zipfile
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path, "w", allowZip64=True)
        self._member = self._zip.open(name + ".npy", "w", force_zip64=True)
        self._left = nbytes
        if nbytes == 0:
            self._end_member()

    def write(self, data: bytearray) -> int:
        """Write what of `data` belongs to the current member; returns how much was taken."""
        taken = min(self._left, len(data))
        with memoryview(data) as view, view[:taken] as part:
            self._member.write(part)
        self._left -= taken
        if self._left == 0:
            self._end_member()
        return taken

    def _end_member(self) -> None:
        self._member.close()
        self._member = None

    def commit(self, target: str) -> None:
        import zipfile
        from gspmdc.atomic import atomic_output
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path, "w")
        self._zip.close()
        with open(self.path, "rb") as source, atomic_output(target) as f:
            shutil.copyfileobj(source, f, 1 << 22)

    def discard(self) -> None:
        if self._member is not None:
            self._member.close()
            self._member = None
        if self._zip is not None and self._zip.fp is not None:
            self._zip.close()
        self.path.unlink(missing_ok=True)


def _rank_environment(n: int, one_host: bool) -> dict[str, str]:
    """Ranks get an equal share of the free cores for their BLAS threads (unless the user chose;
    `cores.py`); on one machine (`one_host`), UCX's settings for ranks that share it
    (`rank_server.one_host_ucx`)."""
    environment = with_blas_threads(dict(os.environ), n)
    if one_host:
        one_host_ucx(environment)
    return environment


def _how(status: int) -> str:
    """How a process ended, from `os.waitpid`'s `status`."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _ranks(numbers: list[int]) -> str:
    """`rank 3`, `ranks 0, 1`."""
    return f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _relay(stream, target) -> threading.Thread:
    """Copy a stream of `mpiexec` to ours line by line, without MPICH's termination banner and
    MPI_Abort notices (gspmdc prints its own message)."""
    def copy():
        for line in stream:
            if not _BANNER.match(line.rstrip("\n")):
                try:
                    target.write(line)
                    target.flush()
                except (OSError, ValueError):
                    pass
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread
