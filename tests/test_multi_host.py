"""`gspmdc run --hostfile` across hosts, for real: each host is a Linux network namespace with its
own hostname, linked to the others by veth pairs on a bridge (MPI between them runs over TCP; no
shared memory crosses a host). `mpiexec` starts each host's proxy through a launcher script that
enters the host's namespace, as `ssh` would log into a machine (`-launcher ssh -launcher-exec`,
passed by a `--mpiexec` wrapper); the launcher itself runs on the first host.

Skipped where namespaces cannot be made (not root, no iproute2, no `unshare`)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from fault_table import all_reduce_after, rank_pids, tagged_processes, wait_gone

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
HOSTS = 3
#: the hosts' addresses: the benchmarking range, on a bridge no other machine can reach
SUBNET = "198.18.0"

PLUGIN = '''
import os, time
from pathlib import Path
from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS

def _sleep(inst, args, ctx):
    if ctx.partition_id == 2:
        Path(os.environ["GSPMDC_TEST_DIR"], "asleep").touch()
        time.sleep(120)
    return args[0]

CUSTOM_CALL_TARGETS["gspmdc_test.sleep_on_partition_2"] = _sleep
'''

DOT = """HloModule dot, num_partitions=3

ENTRY main {
  x = f32[4,7] parameter(0), sharding={devices=[1,3]<=[3]}
  w = f32[7,5] parameter(1), sharding={devices=[3,1]<=[3]}
  ROOT d = f32[4,5] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""

SLEEPY = all_reduce_after("gspmdc_test.sleep_on_partition_2", 3, "sleepy")


def _can_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and unshare"
    if not MPIEXEC.exists():
        return "mpiexec not installed in the venv"
    probe = f"gspmdc-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_WHY_NOT = _can_make_namespaces()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """`HOSTS` namespaces `<prefix>-h1`... (hostnames h1...) at SUBNET.1... on a bridge in
    `<prefix>-sw`; a hostfile, the namespace launcher and an mpiexec wrapper in `directory`."""

    def __init__(self, directory: Path):
        self.prefix = f"gs{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.prefix}-sw"
        self.names = [f"{self.prefix}-h{i}" for i in range(1, HOSTS + 1)]
        self.made: list[str] = []
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        self.hostfile = directory / "hosts"
        self.hostfile.write_text("".join(f"{SUBNET}.{i}:1\n" for i in range(1, HOSTS + 1)))
        enter = directory / "enter-host"
        enter.write_text(
            "#!/bin/sh\n# hydra's ssh launcher calls: -x HOST COMMAND...\n"
            '[ "$1" = "-x" ] && shift\nhost=$1; shift\nn=${host##*.}\n'
            f'exec ip netns exec {self.prefix}-h$n unshare --uts sh -c "hostname h$n; exec $*"\n')
        enter.chmod(0o755)
        self.mpiexec = directory / "mpiexec"
        self.mpiexec.write_text(f"#!/bin/sh\nexec {MPIEXEC} -launcher ssh -launcher-exec {enter} "
                                '-iface gs0 "$@"\n')
        self.mpiexec.chmod(0o755)

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        self.made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names, start=1):
            _ip("netns", "add", name)
            self.made.append(name)
            _ip("link", "add", "gs0", "netns", name, "type", "veth", "peer", "name", f"p{i}",
                "netns", self.switch)
            _ip("-n", name, "addr", "add", f"{SUBNET}.{i}/24", "dev", "gs0")
            _ip("-n", name, "link", "set", "gs0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{i}", "up")

    def command_on_first_host(self, args: list[str]) -> list[str]:
        inner = " ".join(f"'{a}'" for a in args)
        return ["ip", "netns", "exec", self.names[0], "unshare", "--uts", "sh", "-c",
                f"hostname h1; exec {inner}"]

    def namespace_inode(self, host: int) -> int:
        return os.stat(f"/run/netns/{self.names[host - 1]}").st_ino

    def remove(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@pytest.fixture
def hosts(tmp_path):
    made = Hosts(tmp_path)
    yield made
    made.remove()


@pytest.fixture
def env(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(PLUGIN)
    tag = uuid.uuid4().hex
    yield dict(os.environ, PYTHONPATH=str(tmp_path), GSPMDC_TEST_TAG=tag,
               GSPMDC_TEST_DIR=str(tmp_path))
    wait_gone(tag, 10.0)
    assert tagged_processes(tag) == [], "processes left behind"


def test_a_run_across_hosts_gives_the_values_of_one_host(hosts, env, tmp_path):
    program = tmp_path / "dot.hlo"
    program.write_text(DOT)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 7), np.float32), rng.standard_normal((7, 5), np.float32)
    np.savez(tmp_path / "in.npz", arg0=x, arg1=w)
    across, here = tmp_path / "across.npz", tmp_path / "here.npz"
    run = hosts.command_on_first_host(
        [str(GSPMDC), "run", str(program), "--hostfile", str(hosts.hostfile), "--mpiexec",
         str(hosts.mpiexec), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(across),
         "--deterministic", "-q"])
    proc = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(GSPMDC), "run", str(program), "--inputs",
                           str(tmp_path / "in.npz"), "--outputs", str(here), "--deterministic",
                           "-q"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with np.load(across) as a, np.load(here) as b:
        assert np.array_equal(a["out0"], b["out0"])
        np.testing.assert_allclose(a["out0"], x @ w, rtol=1e-5, atol=1e-5)


def test_killing_one_hosts_ranks_stops_the_job_naming_host_and_rank(hosts, env, tmp_path):
    """Partition 2 runs on host h3 and sleeps in a custom-call; the others wait in the
    all-reduce. Killing h3's rank ends the job: exit 3 in under 10 s, naming rank 2 on h3."""
    program = tmp_path / "sleepy.hlo"
    program.write_text(SLEEPY)
    out = tmp_path / "out.npz"
    run = hosts.command_on_first_host(
        [str(GSPMDC), "run", str(program), "--hostfile", str(hosts.hostfile), "--mpiexec",
         str(hosts.mpiexec), "--outputs", str(out)])
    proc = subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "asleep").exists() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "asleep").exists(), proc.communicate(timeout=30)
        inode = hosts.namespace_inode(3)
        victims = [pid for pid in rank_pids(env["GSPMDC_TEST_TAG"]).values()
                   if os.stat(f"/proc/{pid}/ns/net").st_ino == inode]
        assert len(victims) == 1
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, stderr
    assert f"rank 2 (pid {victims[0]} on h3) terminated unexpectedly (killed by SIGKILL)" \
        in stderr, stderr
    assert seconds < 10 and not out.exists()
