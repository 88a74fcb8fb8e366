"""What a rank of `gspmdc run` inherits on the launcher's machine, where the rank server that forks
it is itself a fork of `gspmdc run` (`runtime/rank_server.py`): none of the launcher's descriptors
(its reaper must see the launcher's pipe close when the launcher dies, whatever ranks still run)
nor its Python signal handlers, and UCX restricted to its loopback and System V shared-memory
transports unless the user chose (`launcher._rank_environment`). Checked on real jobs: a
test-only custom-call (registered by a `sitecustomize.py` on PYTHONPATH in every process, or by
the test itself for a launch in its process) writes what its rank holds."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).with_name("mpiexec")
GSPMDC = MPIEXEC.with_name("gspmdc")

PROGRAM = """HloModule inspect, num_partitions=2

ENTRY main {
  x = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  ROOT y = f32[8] custom-call(x), custom_call_target="gspmdc_test.inspect", sharding={devices=[2]<=[2]}
}
"""

#: registers `gspmdc_test.inspect`: the identity, writing the rank's UCX settings and its
#: descriptors (what each one is) to a file, and its parent's descriptors to another
PLUGIN = '''
import os
from pathlib import Path
if "GSPMDC_TEST_DIR" in os.environ:
    from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS
    UCX = ("UCX_TLS", "UCX_MEM_EVENTS", "UCX_PROTO_ENABLE")

    def _held(process):
        held = []
        for name in os.listdir(f"/proc/{process}/fd"):
            try:
                held.append(os.readlink(f"/proc/{process}/fd/{name}"))
            except OSError:
                pass
        return held

    def _inspect(inst, args, ctx):
        directory = Path(os.environ["GSPMDC_TEST_DIR"])
        (directory / f"rank-{os.getpid()}").write_text(
            " ".join(os.environ.get(name, "-") for name in UCX) + "\\n"
            + "\\n".join(_held("self")))
        (directory / f"parent-{os.getpid()}").write_text("\\n".join(_held(os.getppid())))
        return args[0]
    CUSTOM_CALL_TARGETS["gspmdc_test.inspect"] = _inspect
'''


def _run(tmp_path: Path, extra_env: dict[str, str], extra_args=(), pass_fds=()):
    program = tmp_path / "inspect.hlo"
    program.write_text(PROGRAM)
    (tmp_path / "sitecustomize.py").write_text(PLUGIN)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), GSPMDC_TEST_DIR=str(tmp_path), **extra_env)
    for name in ("UCX_TLS", "UCX_MEM_EVENTS", "UCX_PROTO_ENABLE"):
        if name not in extra_env:
            env.pop(name, None)
    proc = subprocess.run([str(GSPMDC), "run", str(program), "-q", *extra_args],
                          capture_output=True, text=True, timeout=300, env=env,
                          pass_fds=pass_fds)
    assert proc.returncode == 0, proc.stderr
    reports = [path.read_text().split("\n") for path in tmp_path.glob("rank-*")]
    assert len(reports) == 2                    # one per rank
    return reports


@pytest.mark.skipif(not MPIEXEC.exists() or not Path("/proc/self/fd").is_dir(),
                    reason="needs mpiexec in the venv and Linux /proc")
def test_ranks_hold_none_of_the_launchers_descriptors(tmp_path):
    read, write = os.pipe()
    high = os.dup2(write, 200)          # above the numbers the server's files take
    try:
        pipe = f"pipe:[{os.fstat(high).st_ino}]"
        reports = _run(tmp_path, {}, pass_fds=(high,))      # `gspmdc run` holds it
    finally:
        for fd in (read, write, high):
            os.close(fd)
    for _, *held in reports:
        assert held                             # the listing is real
        assert pipe not in held


@pytest.mark.skipif(not MPIEXEC.exists() or not Path("/proc/self/fd").is_dir(),
                    reason="needs mpiexec in the venv and Linux /proc")
def test_a_rank_shares_only_its_own_connection_with_the_rank_server(tmp_path):
    """The server that forks the ranks holds every rank's connection to the launcher and to
    MPICH's process manager (`pmi_port.py`): a rank holding another rank's would keep it open
    after that rank died, and the death would go unseen (or be seen late by MPICH's proxy)."""
    _run(tmp_path, {})
    for report in tmp_path.glob("rank-*"):
        held = {target for target in report.read_text().split("\n")[1:]
                if target.startswith("socket:")}
        server = set((tmp_path / report.name.replace("rank-", "parent-")).read_text().split("\n"))
        assert len(held & server) == 2          # its own connections to the launcher and PMI


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
@pytest.mark.parametrize("placement, user, seen", [
    ("one host", {}, "self,sysv n n"),
    ("one host", {"UCX_TLS": "self,tcp"}, "self,tcp - -"),   # the user's choice stands
    ("one host", {"UCX_MEM_EVENTS": "y"}, "self,sysv y n"),
    ("hostfile", {}, "- - -"),                  # ranks that may be on other hosts: UCX's default
])
def test_ucx_settings_of_the_ranks(tmp_path, placement, user, seen):
    """`UCX_TLS UCX_MEM_EVENTS UCX_PROTO_ENABLE` as the ranks see them (`-`: unset)."""
    extra = []
    if placement == "hostfile":
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"{socket.gethostname()}:2\n")
        extra = ["--hostfile", str(hostfile)]
    reports = _run(tmp_path, user, extra)
    assert [report[0] for report in reports] == [seen, seen]


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
def test_ranks_of_an_in_process_launch_have_a_fresh_pythons_signal_handlers(tmp_path, monkeypatch):
    """`gspmdc.cli.main` called by a program that handles SIGTERM itself: its ranks do not."""
    import signal
    from gspmdc.cli import main
    from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS

    def record(inst, args, ctx):
        default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        (tmp_path / f"rank-{os.getpid()}").write_text(str(default))
        return args[0]
    monkeypatch.setitem(CUSTOM_CALL_TARGETS, "gspmdc_test.inspect", record)
    program = tmp_path / "inspect.hlo"
    program.write_text(PROGRAM)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        assert main(["run", str(program), "-q"]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert [path.read_text() for path in tmp_path.glob("rank-*")] == ["True", "True"]


def _stub_moved(pid: int, number: int, path: Path, stub: subprocess.Popen) -> None:
    """Wait until the stub's shell put `path` at its descriptor `number` (a redirection)."""
    while True:
        assert stub.poll() is None, stub.stderr.read()
        try:
            if os.readlink(f"/proc/{pid}/fd/{number}") == str(path):
                return
        except OSError:
            pass
        os.sched_yield()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir() or not hasattr(os, "pidfd_open"),
                    reason="needs Linux /proc and pidfd_open")
@pytest.mark.parametrize("moment", ["writing its request", "waiting for its status"])
def test_a_rank_takes_its_stubs_standard_streams_whatever_the_stubs_shell_is_doing(
        tmp_path, moment):
    """The server takes a rank's standard streams from its stub's `/proc` entries once the stub
    asked (`rank_server._Stub`), while the stub's shell may be inside a redirection that moved
    its descriptor 1 (to the FIFO it writes its request to) or 0 (to the FIFO it reads its status
    from): the rank must get the pipes the stub was started with, never those FIFOs (a rank 0
    whose standard output was the requests FIFO lost its whole output). The stub is held inside
    each redirection: the requests FIFO full, or its exit FIFO open with nothing written yet."""
    from gspmdc.runtime.rank_server import _Stub, stub_command, stub_requests
    requests = stub_requests(tmp_path)
    command = stub_command(tmp_path, 1)
    exit_fifo = os.open(tmp_path / "exit-0", os.O_RDWR)
    if moment == "writing its request":
        filler = os.open(tmp_path / "stubs", os.O_WRONLY | os.O_NONBLOCK)
        try:
            while True:
                os.write(filler, b"\n" * 4096)
        except BlockingIOError:
            pass
        os.close(filler)
    stub = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PMI_ID": "0", "PATH": os.defpath})
    taken = None
    try:
        if moment == "writing its request":
            _stub_moved(stub.pid, 1, tmp_path / "stubs", stub)    # blocked in `echo`'s write
        else:
            assert requests.readline().split() == [str(stub.pid).encode(), b"1"]
            _stub_moved(stub.pid, 0, tmp_path / "exit-0", stub)   # blocked in `read`
        taken = _Stub(stub.pid)
        own = [stub.stdin, stub.stdout, stub.stderr]
        assert ([os.fstat(fd).st_ino for fd in taken.streams]
                == [os.fstat(pipe.fileno()).st_ino for pipe in own])
        if moment == "waiting for its status":
            os.write(exit_fifo, b"5\n")
            assert stub.wait(timeout=60) == 5               # it exits with its rank's status
    finally:
        if taken is not None:
            taken.close_streams()
            os.close(taken.watch)
        stub.kill()
        stub.communicate()
        os.close(exit_fifo)
        requests.close()
