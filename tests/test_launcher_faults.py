"""Failures of `gspmdc run` must stop the whole job within seconds, name the rank (and the
instruction), exit with code 3, leave no process behind and write no output file: an exception on
one rank, a rank killed from outside, a timeout, Ctrl-C; on the MPI and on the local backend.

The failing programs use test-only custom-call targets registered by a `sitecustomize.py` that the
test puts on PYTHONPATH (so every rank process has them). Every subprocess has a timeout."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fault_table import all_reduce_after, at_all_reduce, rank_pids, tagged_processes, wait_gone

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")

PLUGIN = '''
import os, time
from pathlib import Path
from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS

def _fail(inst, args, ctx):
    if ctx.partition_id == 1:
        raise ValueError("injected failure")
    return args[0]

def _fail_without_stderr(inst, args, ctx):
    if ctx.partition_id == 1:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        raise ValueError("injected failure")
    return args[0]

def _sleep(inst, args, ctx):
    if ctx.partition_id == 1:
        Path(os.environ["GSPMDC_TEST_DIR"], "asleep").touch()
        time.sleep(60)
    return args[0]

CUSTOM_CALL_TARGETS["gspmdc_test.fail_on_partition_1"] = _fail
CUSTOM_CALL_TARGETS["gspmdc_test.fail_without_stderr_on_partition_1"] = _fail_without_stderr
CUSTOM_CALL_TARGETS["gspmdc_test.sleep_on_partition_1"] = _sleep
CUSTOM_CALL_TARGETS["gspmdc_test.identity"] = lambda inst, args, ctx: args[0]
'''

@pytest.fixture
def job(tmp_path):
    """(program path for a target, environment with the plugin and a unique tag, output path)."""
    (tmp_path / "sitecustomize.py").write_text(PLUGIN)
    (tmp_path / "tmp").mkdir()
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(tmp_path), GSPMDC_TEST_TAG=tag,
               GSPMDC_TEST_DIR=str(tmp_path), TMPDIR=str(tmp_path / "tmp"))

    def program(target: str) -> Path:
        path = tmp_path / f"{target}.hlo"
        path.write_text(all_reduce_after(f"gspmdc_test.{target}", 4))
        return path
    yield program, env, tmp_path / "out.npz"
    wait_gone(tag, 10.0)
    assert tagged_processes(tag) == [], "processes left behind"


def run(args, env, timeout=60):
    start = time.monotonic()
    proc = subprocess.run([str(GSPMDC), "run", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.monotonic() - start


needs_mpi = pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")


@needs_mpi
def test_an_exception_on_one_rank_stops_the_job(job):
    program, env, out = job
    proc, seconds = run([program("fail_on_partition_1"), "--outputs", out], env)
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 (partition 1): main/c: custom-call failed: ValueError: injected failure" \
        in proc.stderr
    assert "MPI_Abort" not in proc.stderr and "BAD TERMINATION" not in proc.stdout
    assert seconds < 20 and not out.exists()
    wait_gone(env["GSPMDC_TEST_TAG"])


@needs_mpi
def test_a_failing_rank_is_reported_without_its_standard_error(job):
    """The rank's message reaches `gspmdc run` over its own connection: a rank whose standard
    error goes nowhere (as when MPI_Abort stops MPICH's forwarding of it) is still reported."""
    program, env, out = job
    proc, _ = run([program("fail_without_stderr_on_partition_1"), "--outputs", out], env)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("rank 1 (partition 1): main/c: custom-call failed: ValueError: "
                             "injected failure") == 1, proc.stderr
    assert not out.exists()


@contextlib.contextmanager
def asleep_on_rank_1(job):
    """`gspmdc run` of the program whose rank 1 sleeps in the custom-call (the others then wait
    in the all-reduce), yielded once rank 1 sleeps; killed on the way out if still running. It
    gets the default SIGINT handling a terminal's Ctrl-C meets: a shell starting the test suite
    in the background makes SIGINT ignored, and ignored signals are inherited."""
    program, env, out = job
    proc = subprocess.Popen([str(GSPMDC), "run", str(program("sleep_on_partition_1")),
                             "--outputs", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        asleep = Path(env["GSPMDC_TEST_DIR"], "asleep")
        while not asleep.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert asleep.exists(), "the ranks did not start"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


@needs_mpi
@pytest.mark.parametrize("victim, instruction", [(1, "main/c (custom-call)"),
                                                 (2, "main/r (all-reduce)")])
def test_a_killed_rank_stops_the_job_and_is_named_with_its_instruction(job, victim, instruction):
    """Rank 1 sleeps in the custom-call; the others wait for it in the all-reduce."""
    program, env, out = job
    tag = env["GSPMDC_TEST_TAG"]
    with asleep_on_rank_1(job) as proc:
        if victim != 1:                  # the position board shows it in the all-reduce
            deadline = time.monotonic() + 60
            while not at_all_reduce(Path(env["TMPDIR"]), victim, program("sleep_on_partition_1")
                                    .read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)
        ranks = rank_pids(tag)
        os.kill(ranks[victim], signal.SIGKILL)
        start = time.monotonic()
        stdout, stderr = proc.communicate(timeout=30)
        seconds = time.monotonic() - start
    assert proc.returncode == 3, stderr
    assert f"rank {victim} (pid {ranks[victim]}) terminated unexpectedly (killed by SIGKILL) " \
        f"while executing {instruction}; the job was stopped" in stderr, stderr
    assert "BAD TERMINATION" not in stdout
    assert seconds < 10 and not out.exists()
    wait_gone(tag)


@needs_mpi
def test_a_killed_rank_server_stops_the_job(job):
    """The rank server supervises every rank it forked on this machine: killing it kills them
    all (they die with it), and the job stops with a rank named, exit 3, nothing left."""
    program, env, out = job
    tag = env["GSPMDC_TEST_TAG"]
    with asleep_on_rank_1(job) as proc:
        ranks = rank_pids(tag)
        servers = [pid for pid in tagged_processes(tag)
                   if Path(f"/proc/{pid}/comm").read_text().strip() == "gspmdc-ranks"]
        assert len(servers) == 1, "the server supervises the running ranks"
        os.kill(servers[0], signal.SIGKILL)
        start = time.monotonic()
        stdout, stderr = proc.communicate(timeout=30)
        seconds = time.monotonic() - start
    assert proc.returncode == 3, stderr
    assert any(f"rank {r} (pid {pid}) terminated unexpectedly" in stderr
               for r, pid in ranks.items()), stderr
    assert seconds < 10 and not out.exists()
    wait_gone(tag)


#: makes the rank server pause before it serves any stub (appended to the job's plugin)
PAUSED_SERVER = '''
if "GSPMDC_TEST_SERVER_PAUSE" in os.environ:
    from gspmdc.runtime import rank_server

    def _paused(self):
        Path(os.environ["GSPMDC_TEST_DIR"], "server-paused").touch()
        time.sleep(60)
    rank_server._Server.serve = _paused
'''


@needs_mpi
def test_a_rank_server_killed_before_it_started_a_rank_stops_the_job(job, tmp_path):
    """The stubs of ranks the server never started wait for it: the launcher sees the server
    gone with ranks missing and stops the job (exit 3, the server and the ranks named), leaving
    nothing behind."""
    program, env, out = job
    with open(tmp_path / "sitecustomize.py", "a") as plugin:
        plugin.write(PAUSED_SERVER)
    env = dict(env, GSPMDC_TEST_SERVER_PAUSE="1")
    tag = env["GSPMDC_TEST_TAG"]
    proc = subprocess.Popen([str(GSPMDC), "run", str(program("identity")), "-n", "4",
                             "--outputs", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        paused = tmp_path / "server-paused"
        deadline = time.monotonic() + 60
        while not paused.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert paused.exists(), "the server did not start"
        servers = [pid for pid in tagged_processes(tag)
                   if Path(f"/proc/{pid}/comm").read_text().strip() == "gspmdc-ranks"]
        assert len(servers) == 1
        os.kill(servers[0], signal.SIGKILL)
        start = time.monotonic()
        stdout, stderr = proc.communicate(timeout=30)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr
    assert "the rank server ended (killed by SIGKILL) before ranks 0, 1, 2, 3 connected; the job " \
        "was stopped" in stderr, stderr
    assert seconds < 10 and not out.exists()
    wait_gone(tag)


@needs_mpi
def test_timeout_stops_every_rank(job):
    program, env, out = job
    # the timeout counts from the start of `gspmdc run`: long enough for 4 ranks to start on a
    # loaded machine, so that they are at their instructions when it expires
    proc, seconds = run([program("sleep_on_partition_1"), "--timeout", "12", "--outputs", out],
                        env)
    assert proc.returncode == 3, proc.stderr
    assert "the run timed out after 12 s: rank 1 executing main/c (custom-call); ranks 0, 2, 3 " \
        "executing main/r (all-reduce)" in proc.stderr
    assert seconds < 12 + 3 and not out.exists()
    wait_gone(env["GSPMDC_TEST_TAG"])


@needs_mpi
def test_ctrl_c_stops_every_rank(job):
    program, env, out = job
    tag = env["GSPMDC_TEST_TAG"]
    with asleep_on_rank_1(job) as proc:
        assert len(rank_pids(tag)) == 4
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 3 and "interrupted" in stderr
    assert not out.exists()
    wait_gone(tag)


@needs_mpi
def test_in_place_launch_reports_the_failing_rank(job):
    program, env, _ = job
    proc = subprocess.run([str(MPIEXEC), "-n", "4", str(GSPMDC), "run",
                           str(program("fail_on_partition_1"))], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 (partition 1): main/c: custom-call failed" in proc.stderr, proc.stderr
    wait_gone(env["GSPMDC_TEST_TAG"])


def test_local_backend_failure_and_timeout(job):
    program, env, out = job
    proc, seconds = run([program("fail_on_partition_1"), "--backend", "local", "--outputs", out],
                        env)
    assert proc.returncode == 3
    assert "partition 1: main/c: custom-call failed: ValueError: injected failure" in proc.stderr
    assert not out.exists()
    asleep = Path(env["GSPMDC_TEST_DIR"], "asleep")
    proc, _ = run([program("sleep_on_partition_1"), "--backend", "local", "--timeout", "2",
                   "--outputs", out], env)
    ended = time.time()
    assert proc.returncode == 3 and "timed out after 2 s" in proc.stderr
    assert not out.exists()
    # the local backend's deadline is armed before its threads start, so the job ends within the
    # timeout (and a grace period) of partition 1 beginning its 60 s sleep, however long
    # Python, the imports and the compile took on a loaded machine
    assert asleep.exists() and ended - asleep.stat().st_mtime < 2 + 5


def _session_with_ranks(tmp_path, ranks: list[tuple[int, int]]):
    """A launcher session on a real socket whose `ranks` ((number, pid)) connected and got the
    job; the session and each rank's client end."""
    from gspmdc.runtime import rank_link
    from gspmdc.runtime.job import Job, RunOptions
    from gspmdc.runtime.launcher import _Session
    from gspmdc.runtime.mpi_processes import host_identity
    from gspmdc.runtime.rank_position import create_board_file
    tmp_path.mkdir(exist_ok=True)
    create_board_file(tmp_path / "positions", 4)
    listener, address = rank_link.listen(None, str(tmp_path / "ranks.sock"))
    session = _Session(4, tmp_path, listener, "secret", time.time(), None, on_local_pid=lambda _: None)
    session.job = Job(None, None, None, 4, RunOptions())
    clients = {}
    for rank, pid in ranks:
        client = rank_link.connect(address)
        client.sendall(f"hello {rank} {pid} vm {host_identity()} secret\n".encode())
        clients[rank] = client
    deadline = time.monotonic() + 10
    while len(session.ranks) < len(ranks) and time.monotonic() < deadline:
        session.poll(0.05)
    for client in clients.values():
        assert client.recv(4).startswith(b"job ")      # each got the job
    return session, clients


def test_the_culprit_is_the_rank_whose_supervisor_said_it_ended_whatever_order_is_read(tmp_path):
    """Rank 1's supervisor says its rank was killed (SIGKILL) before MPICH's proxy kills the
    others; the launcher reads everything in one look, in whatever order `epoll` gives: rank 1
    is named, with its signal. A rank that said `done` before its supervisor's `ended 0`, or one
    that reported its own failure, is no culprit."""
    session, clients = _session_with_ranks(tmp_path, [(0, 100), (1, 101), (2, 202), (3, 303)])
    clients[3].sendall(b"done\nended 0\n")
    clients[1].sendall(b"ended -9\n")
    for rank in (0, 1, 2):                              # the proxy kills the others
        clients[rank].close()
    time.sleep(0.2)                                     # everything is there before one look
    for _ in range(3):
        session.poll(0.05)
    assert sorted(r.number for r in session.closed) == [0, 1, 2]
    dead = session._died()
    assert dead.number == 1
    assert session._death(dead) == "rank 1 (pid 101) terminated unexpectedly (killed by " \
        "SIGKILL) while setting up (before the first instruction); the job was stopped"
    session.close()

    crashed, clients = _session_with_ranks(tmp_path / "crash", [(0, 100), (1, 101)])
    clients[0].sendall(b"ended -11\n")
    clients[1].sendall(b"ended 5\n")
    for _ in range(3):
        crashed.poll(0.05)
    deaths = {r.number: crashed._death(r) for r in crashed.deaths}
    assert "(crashed with SIGSEGV)" in deaths[0] and "(exited with status 5)" in deaths[1]
    crashed.close()


def test_without_supervisor_the_culprit_is_the_first_rank_whose_connection_closed(tmp_path):
    """When no supervisor said anything (it was killed itself), the rank whose connection closed
    first is named, not the one MPICH's termination banner names (the first rank of the node,
    whichever died: here rank 0, pid 100), and the banner is not passed through."""
    import io
    from gspmdc.runtime import rank_link
    from gspmdc.runtime.job import Job, RunOptions
    from gspmdc.runtime.launcher import _relay, _Session
    from gspmdc.runtime.mpi_processes import host_identity
    banner = ("=" * 83 + "\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
              "=   PID 100 RUNNING AT vm\n=   EXIT CODE: 9\nrank output\n")
    shown = io.StringIO()
    _relay(io.StringIO(banner), shown).join(timeout=5)
    assert shown.getvalue() == "rank output\n"
    listener, address = rank_link.listen(None, str(tmp_path / "ranks.sock"))
    told = []
    session = _Session(4, tmp_path, listener, "secret", time.time(), None, on_local_pid=told.append)
    session.job = Job(None, None, None, 4, RunOptions())
    clients = {}
    for rank, pid in [(0, 100), (2, 202), (3, 303)]:
        client = rank_link.connect(address)
        client.sendall(f"hello {rank} {pid} vm {host_identity()} secret\n".encode())
        clients[rank] = client
    intruder = rank_link.connect(address)
    intruder.sendall(b"hello 1 101 vm x wrong-token\n")
    deadline = time.monotonic() + 10
    while len(session.ranks) < 3 and time.monotonic() < deadline:
        session.poll(0.05)
    assert sorted(r.number for r in session.ranks.values()) == [0, 2, 3]
    assert sorted(told) == [100, 202, 303]
    for client in clients.values():
        assert client.recv(4).startswith(b"job ")      # each got the job
    for rank in (2, 0, 3):                              # rank 2 died; then the others were killed
        clients[rank].close()
        deadline = time.monotonic() + 10
        while rank not in [r.number for r in session.closed] and time.monotonic() < deadline:
            session.poll(0.05)
    assert [r.number for r in session.closed] == [2, 0, 3]
    assert session._died().number == 2
    assert session._never_connected() == [1]
    session.close()


@needs_mpi
def test_an_mpiexec_that_fails_before_starting_ranks_is_a_runtime_failure(job):
    program, env, out = job
    proc, _ = run([program("fail_on_partition_1"), "--mpiexec", "/bin/false", "--outputs", out],
                  env)
    assert proc.returncode == 3
    assert "mpiexec failed (exit status 1) before any rank started" in proc.stderr
    assert not out.exists()


def _ranks_past_mpi_init(n: int) -> bool:
    """`n` ranks forked (under this process) map an MPICH segment: each is past the start of
    `MPI_Init`, where it asked hydra's proxy for the topology file."""
    from gspmdc.runtime import mpi_processes

    def name(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/comm").read_text()
        except OSError:
            return ""                   # gone meanwhile
    ranks = [pid for pid in mpi_processes.descendants([os.getpid()])
             if name(pid).startswith("gspmdc-rank-")]
    return len(ranks) == n and all(mpi_processes.mapped_mpich_segments(pid) for pid in ranks)


@needs_mpi
def test_a_job_that_fails_to_compile_after_the_ranks_started_leaves_nothing(
        tmp_path, monkeypatch, capfd):
    """With -n, `mpiexec` starts while the program is compiled: a compile error once the ranks are
    in MPI stops them, and hydra's proxy still removes the topology file it wrote for them
    (`/tmp/hydra_hwloc_xmlfile_*`; it does only when it ends normally, not killed). The proxy
    names the file with HYDRA_DEBUG=1."""
    from gspmdc import prepare
    from gspmdc.cli import main
    from gspmdc.errors import GspmdcError
    from fault_table import hydra_files
    program = tmp_path / "p.hlo"
    program.write_text("HloModule m, num_partitions=2\nENTRY e {\n  p = f32[4] parameter(0), "
                       "sharding={devices=[2]<=[2]}\n  ROOT n = f32[4] negate(p), "
                       "sharding={replicated}\n}\n")

    def failing(*args, **kwargs):
        deadline = time.monotonic() + 60
        while not _ranks_past_mpi_init(2) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise GspmdcError("injected compile error")
    monkeypatch.setattr(prepare, "_partition", failing)
    monkeypatch.setenv("HYDRA_DEBUG", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["run", str(program), "-n", "2", "-q"]) == 2
    out, err = capfd.readouterr()
    assert "gspmdc: error: injected compile error" in err
    files = hydra_files(out + err)
    assert files, "the ranks started MPI before the error"
    assert not any(path.exists() for path in files), files
    assert not list(tmp_path.glob("gspmdc-run-*"))


@needs_mpi
@pytest.mark.parametrize("target, code", [("fail_on_partition_1", 3), ("identity", 0)])
def test_a_job_that_ends_by_itself_leaves_hydra_nothing_to_clean(job, target, code):
    """A rank's own failure (MPI_Abort) and a job that succeeds: hydra ends by itself and removes
    its topology file."""
    from fault_table import hydra_files
    program, env, _ = job
    proc, _ = run([program(target), "-q"], dict(env, HYDRA_DEBUG="1"))
    assert proc.returncode == code, proc.stderr
    files = hydra_files(proc.stdout + proc.stderr)
    assert files and not any(path.exists() for path in files), files
