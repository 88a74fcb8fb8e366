"""The connection between `gspmdc run` (the launcher) and each of its MPI ranks.

A rank connects first thing, before MPI starts, to the launcher's address: `unix:PATH` (a socket
in the launcher's private run directory) or `tcp:HOST:PORT` (ranks on other hosts), and speaks in
lines:

    rank -> launcher                          launcher -> rank
    hello RANK PID HOST IDENTITY TOKEN
                                              job NBYTES, then the pickled (Job, board path or
                                              None): the board is shared with ranks on the
                                              launcher's machine (same `host_identity`)
    ready                (MPI started, its shared-memory names removed)
    output NAME NBYTES, then NBYTES bytes: one `.npy` member of the output file (rank 0)
    done                 (before a normal exit)
    failed MESSAGE       (the rank's error, as a JSON string on one line, before it exits: the
                          launcher prints it and stops the job, so that neither depends on MPICH
                          forwarding the rank's standard error, nor on its MPI_Abort, after
                          which MPICH's mpiexec leaves its temporary files)
    ended STATUS         (from the rank's supervisor once the rank ended: its exit status, or
                          minus the signal that killed it)

The rank's supervisor connects and forks the rank proper (`rank.py`): on the launcher's machine
the rank server (`rank_server.py`), which supervises every rank it forks, on other hosts the
process MPICH's proxy started (`rank.main`, `supervise_rank`). The rank says everything but
`ended`; its supervisor holds the same connection, waits for the rank and says `ended`
(`report_end`). A rank that dies without `done`/`failed` is named by its `ended` line, which its
supervisor sends before the process MPICH's proxy started exits (the supervisor itself, or the
rank stub the server then releases), so before MPICH's proxy, seeing that process fail, kills
the other ranks: the first `ended` without `done`/`failed` names the rank that died first
whatever order the launcher reads its connections in. The connection closes when both processes
have ended (or the supervisor is killed: the kernel kills its ranks with it), and its closing is
how each side learns the other died; a connection that closes without `done`, `failed` or
`ended` names its rank too, but only by the order in which the launcher saw the closes. A rank
whose launcher's connection closed (the launcher was killed, or stopped the job) removes the
MPICH segments it maps and exits (`watch_launcher`).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import signal
import socket
import threading


def listen(address_host: str | None, unix_path: str) -> tuple[socket.socket, str]:
    """A listening socket and its address for the ranks: a Unix socket at `unix_path`, or TCP on
    `address_host` (any free port) when ranks run on other hosts."""
    if address_host is None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(unix_path)
        address = f"unix:{unix_path}"
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((address_host, 0))
        address = f"tcp:{address_host}:{listener.getsockname()[1]}"
    listener.listen(1024)
    listener.setblocking(False)
    return listener, address


def connect(address: str, timeout: float = 30.0) -> socket.socket:
    kind, _, rest = address.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(rest)
    else:
        host, _, port = rest.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.settimeout(None)
    return sock


class RankLink:
    """A rank's end of the connection (see the module docstring)."""

    def __init__(self, connection: socket.socket, token: str, rank: int, host: str,
                 identity: str):
        self._socket = connection
        self._lock = threading.Lock()
        self.finished = False
        self.say(f"hello {rank} {os.getpid()} {host} {identity} {token}")

    def say(self, message: str) -> None:
        with self._lock:
            self._socket.sendall(message.encode() + b"\n")

    def receive_job(self):
        """(Job, board path or None), as the launcher sends them after `hello`."""
        header = self._read_line()
        word, _, size = header.partition(" ")
        if word != "job":
            raise ConnectionError(f"expected the job from the launcher, got {header!r}")
        return pickle.loads(self._read_exactly(int(size)))

    def send_outputs(self, arrays: dict) -> None:
        """Send each array as a `.npy` member (header, then the raw bytes)."""
        import numpy as np
        for name, array in arrays.items():
            array = np.require(array, requirements="C")     # keeps 0-d arrays 0-d
            header = io.BytesIO()
            info = np.lib.format.header_data_from_array_1_0(array)
            try:
                np.lib.format.write_array_header_1_0(header, info)
            except ValueError:
                header = io.BytesIO()
                np.lib.format.write_array_header_2_0(header, info)
            head = header.getvalue()
            with self._lock:
                self._socket.sendall(f"output {name} {len(head) + array.nbytes}\n".encode())
                self._socket.sendall(head)
                if array.nbytes:
                    self._socket.sendall(memoryview(array.reshape(-1).view(np.uint8)))

    def finish(self) -> None:
        """Say `done`; the launcher's closing is expected from now on."""
        self.finished = True
        self.say("done")

    def fail(self, message: str) -> None:
        """Say `failed` with the error `message` (the launcher prints it); the launcher's closing
        is expected from now on."""
        self.finished = True
        self.say(f"failed {json.dumps(message)}")

    def watch_launcher(self, on_lost) -> None:
        """Call `on_lost()` from a daemon thread when the launcher's side closes before this rank
        finished."""
        def watch():
            while True:
                try:
                    data = self._socket.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    break
            if not self.finished:
                on_lost()
        threading.Thread(target=watch, daemon=True, name="gspmdc-launcher-watch").start()

    def _read_line(self) -> str:
        data = b""
        while not data.endswith(b"\n"):
            chunk = self._socket.recv(1)
            if not chunk:
                raise ConnectionError("the launcher closed the connection")
            data += chunk
        return data.decode().strip()

    def _read_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._socket.recv(min(1 << 20, size - len(data)))
            if not chunk:
                raise ConnectionError("the launcher closed the connection")
            data += chunk
        return bytes(data)


def supervise_rank(pid: int, connection: socket.socket) -> int:
    """The supervisor's part on another host (the parent the rank proper was forked from,
    sharing its connection, and the process MPICH's proxy started): wait for the rank to end,
    tell the launcher how (`report_end`) and return the exit status to end with, so that MPICH's
    proxy sees the same failure. Signals that would stop the supervisor before the rank are
    ignored: the rank gets its own, and the supervisor follows it."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _, status = os.waitpid(pid, 0)
    return report_end(connection, status)


def report_end(connection: socket.socket, status: int) -> int:
    """Tell the launcher over the rank's `connection` (then closed) how the rank ended
    (`ended CODE`: `status` is what `os.waitpid` returned); the exit status the process MPICH's
    proxy started must end with (a signal `S` as `128 + S`, as a shell reports it)."""
    code = os.waitstatus_to_exitcode(status)
    try:
        connection.sendall(f"ended {code}\n".encode())
    except OSError:
        pass                        # the launcher is gone or stopped the job
    connection.close()
    return code if code >= 0 else 128 - code


def unreachable_message(rank: int | str, error: OSError | ConnectionError) -> str:
    """The error line of rank `rank` that cannot reach its launcher."""
    return f"gspmdc: error: rank {rank}: cannot reach the launcher: {error}"


def rank_from_environment() -> int:
    """This process's rank as MPI launchers announce it before MPI starts (-1 if none does)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if name in os.environ:
            try:
                return int(os.environ[name])
            except ValueError:
                pass
    return -1
