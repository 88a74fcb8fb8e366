"""A rank's connection to MPICH's process manager when hydra serves PMI over a port.

With `mpiexec -pmi-port` hydra's proxy gives each process it starts no descriptor for PMI (the
process-management interface through which MPI's library learns its rank and exchanges
addresses at `MPI_Init`), but `PMI_PORT=HOST:PORT` and `PMI_ID` in its environment; MPICH's
PMI-1 client then connects to that port and says which process it is (the `initack` exchange,
MPICH's FULLINIT: `cmd=initack pmiid=ID`, answered by `cmd=initack` and three `cmd=set` lines
giving the job's size, the rank and the debug level). Given a descriptor in `PMI_FD` instead,
with `PMI_RANK` and `PMI_SIZE`, the client uses that connection as it is, as for a process
hydra started with one.

The rank server makes the connection (`connect`) before it forks the rank and keeps its end:
hydra's proxy stops every process of the job as soon as a rank's PMI connection closes before
`MPI_Finalize`, and the server closes its end only once it told the launcher how the rank ended
(`rank_server.py`). The rank, which holds the same connection, says who it is on it and takes it
as its MPI's (`hand_over`): so the server never waits for the proxy, which may not have a core
to answer on.
"""
from __future__ import annotations

import os
import socket

#: how long the proxy may take to answer
_TIMEOUT_SECONDS = 30.0
#: the `cmd=set` lines that follow hydra's `cmd=initack` answer, in their order
_SET = ("size", "rank", "debug")


def connect(environment: dict[str, str]) -> socket.socket:
    """A connection to the PMI port of hydra's proxy named in `environment` (`PMI_PORT`, with
    the `PMI_ID` `hand_over` needs). Raises OSError when there is none or it cannot be
    reached."""
    host, _, port = environment.get("PMI_PORT", "").rpartition(":")
    if not host or not port.isdigit() or not environment.get("PMI_ID", "").isdigit():
        raise OSError(f"no PMI port in the environment (PMI_PORT="
                      f"{environment.get('PMI_PORT')!r}, PMI_ID={environment.get('PMI_ID')!r}): "
                      "mpiexec is not MPICH's hydra with -pmi-port")
    return socket.create_connection((host, int(port)), timeout=_TIMEOUT_SECONDS)


def hand_over(connection: socket.socket, environ=os.environ) -> None:
    """Say on `connection` (`connect`) which process this is, as `PMI_ID` in `environ` tells,
    and set `environ` so that MPI's `MPI_Init` takes the connection (`PMI_FD`: its number,
    which stays open; `PMI_RANK`, `PMI_SIZE`, and `PMI_DEBUG` when hydra debugs) instead of
    making its own (`PMI_PORT` and `PMI_ID` removed). Raises OSError when the proxy does not
    answer as hydra does."""
    connection.settimeout(_TIMEOUT_SECONDS)
    connection.sendall(f"cmd=initack pmiid={environ['PMI_ID']}\n".encode())
    lines = _read_lines(connection, 1 + len(_SET))
    answer = dict(word.split("=", 1) for word in lines[0].split() if "=" in word)
    if answer.get("cmd") != "initack" or answer.get("rc", "0") != "0":
        raise OSError(f"hydra's proxy answered {lines[0]!r} to initack")
    values = {}
    for name, line in zip(_SET, lines[1:]):
        command, _, assignment = line.partition(" ")
        key, _, value = assignment.partition("=")
        if command != "cmd=set" or key != name or not value.lstrip("-").isdigit():
            raise OSError(f"hydra's proxy answered {line!r} where it gives the {name}")
        values[name] = value
    connection.settimeout(None)
    del environ["PMI_PORT"], environ["PMI_ID"]
    environ.update(PMI_FD=str(connection.detach()), PMI_RANK=values["rank"],
                   PMI_SIZE=values["size"])
    if values["debug"] != "0":
        environ["PMI_DEBUG"] = values["debug"]


def _read_lines(connection: socket.socket, count: int) -> list[str]:
    """The `count` lines the proxy answers with (it sends nothing else until it is asked)."""
    data = b""
    while data.count(b"\n") < count:
        chunk = connection.recv(4096)
        if not chunk:
            raise OSError("hydra's proxy closed the PMI connection")
        data += chunk
    lines = data.decode(errors="replace").split("\n")
    if len(lines) != count + 1 or lines[-1]:
        raise OSError(f"hydra's proxy answered {data!r} to initack")
    return lines[:-1]
