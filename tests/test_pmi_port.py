"""A rank's PMI connection over hydra's port (`runtime/pmi_port.py`): the `initack` exchange
as MPICH's PMI-1 client says it and hydra's proxy answers it (MPICH's FULLINIT, wire v1:
`cmd=initack pmiid=ID`, then `cmd=initack` and `cmd=set` lines for size, rank and debug), and
the environment MPI's `MPI_Init` then takes the connection from. A listening socket in the test
plays the proxy; the real one is exercised by every MPI test on one machine."""
from __future__ import annotations

import socket
import threading

import pytest

from gspmdc.runtime import pmi_port


def _proxy(answer: bytes):
    """A one-connection proxy on a free port: records what it is told, answers `answer`."""
    listener = socket.create_server(("127.0.0.1", 0))
    heard = []

    def serve():
        conn, _ = listener.accept()
        with conn:
            heard.append(conn.recv(4096))
            conn.sendall(answer)            # and closes: a short answer ends there
        listener.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{listener.getsockname()[1]}", heard, thread


def test_the_rank_says_its_id_and_its_mpi_gets_the_connection_and_what_hydra_answered():
    port, heard, thread = _proxy(b"cmd=initack\ncmd=set size=8\ncmd=set rank=3\n"
                                 b"cmd=set debug=0\n")
    environ = {"PMI_PORT": port, "PMI_ID": "3", "OTHER": "x"}
    connection = pmi_port.connect(environ)
    pmi_port.hand_over(connection, environ)
    fd = int(environ.pop("PMI_FD"))
    assert environ == {"PMI_RANK": "3", "PMI_SIZE": "8", "OTHER": "x"}     # no PMI_PORT, PMI_ID
    socket.socket(fileno=fd).close()        # the descriptor is open, and now closed
    thread.join(timeout=10)
    assert heard == [b"cmd=initack pmiid=3\n"]


def test_hydras_debug_level_is_passed_on():
    port, _, thread = _proxy(b"cmd=initack rc=0\ncmd=set size=2\ncmd=set rank=0\n"
                             b"cmd=set debug=1\n")
    environ = {"PMI_PORT": port, "PMI_ID": "0"}
    pmi_port.hand_over(pmi_port.connect(environ), environ)
    socket.socket(fileno=int(environ["PMI_FD"])).close()
    thread.join(timeout=10)
    assert environ["PMI_DEBUG"] == "1"


@pytest.mark.parametrize("answer", [b"cmd=initack rc=1\ncmd=set size=2\ncmd=set rank=0\n"
                                    b"cmd=set debug=0\n",
                                    b"cmd=initack\ncmd=set rank=0\ncmd=set size=2\n"
                                    b"cmd=set debug=0\n",
                                    b"cmd=initack\n"])           # then closed
def test_an_answer_not_hydras_is_an_error(answer):
    port, _, thread = _proxy(answer)
    environ = {"PMI_PORT": port, "PMI_ID": "0"}
    connection = pmi_port.connect(environ)
    with pytest.raises(OSError):
        pmi_port.hand_over(connection, environ)
    connection.close()
    thread.join(timeout=10)
    assert "PMI_FD" not in environ


def test_an_environment_without_a_pmi_port_is_an_error():
    with pytest.raises(OSError, match="not MPICH's hydra with -pmi-port"):
        pmi_port.connect({"PMI_FD": "5", "PMI_RANK": "0"})
