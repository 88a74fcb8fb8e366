"""A rank stub: what `mpiexec` starts for each rank of a `gspmdc run` job on the launcher's machine.

    python -I -S rank_stub.py SERVER_SOCKET

It runs without `site` and imports only built-in modules and `_socket` and `ctypes` (no numpy,
no gspmdc, not even `socket` or `array`, which import as much again as Python's start costs: it
must start in a few milliseconds of CPU). It asks the kernel to kill it when its parent (MPICH's
proxy) dies, connects to the job's rank server (`rank_server.py`), sends it every file descriptor
it has (the PMI socket and control descriptor MPICH's proxy gave it, its standard streams) with
their numbers, its working directory and its environment, in one message; then waits for the exit
status of the rank the server forked for it, and exits with it (3 when the connection closes
without one: the rank's supervisor died). Killing the stub kills its rank (its supervisor sees
the connection close).
"""
import _socket
import os
import sys

#: `prctl` option that makes the kernel signal this process when its parent dies
_PR_SET_PDEATHSIG = 1
_SIGKILL = 9
_EXIT_RUNTIME = 3


def _die_with_parent() -> None:
    try:
        import ctypes
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass


def _open_descriptors(exclude: int) -> list[int]:
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(fd) for fd in range(3)]
    found = []
    for name in names:
        fd = int(name)
        if fd == exclude:
            continue
        try:
            os.fstat(fd)
        except OSError:
            continue                # the directory listing's own descriptor, now closed
        found.append(fd)
    return sorted(found)


def main() -> int:
    _die_with_parent()
    server = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        server.connect(sys.argv[1])
    except OSError as e:
        rank = os.environ.get("PMI_RANK", "?")
        print(f"gspmdc: error: rank {rank}: cannot reach the rank server: {e}", file=sys.stderr)
        return _EXIT_RUNTIME
    descriptors = _open_descriptors(server.fileno())
    environment = "\0".join(f"{k}={v}" for k, v in os.environ.items())
    message = f"{' '.join(map(str, descriptors))}\n{os.getcwd()}\n{environment}" \
        .encode("utf-8", "surrogateescape")
    data = len(message).to_bytes(8, "little") + message     # the server's HEADER_BYTES
    rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in descriptors)     # C ints
    sent = server.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    server.sendall(data[sent:])
    status = b""
    while not status.endswith(b"\n"):
        chunk = server.recv(64)
        if not chunk:
            return _EXIT_RUNTIME
        status += chunk
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
