"""A rank stub: what `mpiexec` starts for each rank of a `gspmdc run` job on the launcher's machine.

    python -I -S rank_stub.py SERVER_SOCKET

It runs without `site` and imports only built-in modules and `_socket` (no numpy, no gspmdc, not
even `socket`, `array` or `ctypes`, which import as much again as Python's start costs: it must
start in a few milliseconds of CPU). It connects to the job's rank server (`rank_server.py`),
sends it every file descriptor it has (the PMI socket and control descriptor MPICH's proxy gave
it, its standard streams) with their numbers, its working directory and its environment, in one
message; then waits for the exit status of the rank the server forked for it, and exits with it
(3 when the connection closes without one: the server died, and the rank with it). Killing the
stub kills its rank (the server sees the connection close). When its parent (MPICH's proxy) dies
it exits too, within `_PARENT_CHECK_SECONDS` (without `ctypes` it cannot ask the kernel for a
signal then).
"""
import _socket
import os
import sys

_EXIT_RUNTIME = 3
#: how often the stub looks whether its parent is still there while it waits
_PARENT_CHECK_SECONDS = 1.0


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
    parent = os.getppid()
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
    try:
        sent = server.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        server.sendall(data[sent:])
        server.settimeout(_PARENT_CHECK_SECONDS)
        status = b""
        while not status.endswith(b"\n"):
            try:
                chunk = server.recv(64)
            except TimeoutError:
                if os.getppid() != parent:
                    return _EXIT_RUNTIME    # the proxy died: the server kills the rank
                continue
            if not chunk:
                return _EXIT_RUNTIME
            status += chunk
    except OSError:
        return _EXIT_RUNTIME                # the server died (and the rank with it)
    return int(status)


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)                  # without the interpreter's teardown
