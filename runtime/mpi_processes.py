"""The operating-system side of an MPI job: which processes and shared-memory segments belong to
it, and how to remove them all (Linux `/proc`; elsewhere these do nothing).

- `die_with_parent(signal)`: `prctl(PR_SET_PDEATHSIG)`, so the kernel sends `signal` to this
  process the moment its parent dies (the rank server dies with the launcher, a rank with the
  server); `prctl` for other options.
- `exit_descriptor(pid)`: a descriptor readable once the process exited; `parent(pid)`;
  `processes_naming(text)`: the processes with `text` in their command line (the reaper finds a
  job's `mpiexec` and stubs by their run directory).
- `name_process(name)`: the name `ps` shows (`gspmdc-rank-R` for a rank, `gspmdc-super-R` for its
  supervisor).
- `host_identity()`: this machine and network namespace (boot id + network namespace inode); two
  processes with the same identity can share files in `/tmp`, Unix sockets and shared memory.
- MPICH's shared memory: each node's ranks share a segment `/dev/shm/mpich_shm_<job>_<node>`
  (and `mpich_vci_...`) that MPICH removes in `MPI_Finalize` only, so every rank that is killed,
  aborts or is stopped by `mpiexec` leaves it behind (4-8 MB each). `mapped_mpich_segments()` are
  the ones this process maps; once every rank of the node is past `MPI_Init`, unlinking their
  names (`unlink_segments`) loses nothing (the mappings stay valid; MPI_Finalize tolerates the
  missing name) and leaves nothing to clean up however the job ends. Segments of a job that failed
  inside `MPI_Init` are found by `sweep_orphan_segments`: MPICH segments of this user created since
  the job started that no live process maps.
- `kill_tree(pids)`: SIGKILL the processes and all their descendants, stopping them first so none
  can start a new child or react while the tree is collected.
- `stop_job(mpiexec, others)`: stop a job started by MPICH's `mpiexec` (hydra) so that hydra
  ends cleanly: its proxy removes the topology file it wrote for the ranks
  (`/tmp/hydra_hwloc_xmlfile_*`, created when the first rank starts MPI) only when it exits
  normally, after every process it started ended; killed, or left without `mpiexec`, it leaves
  the file behind.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

_SHM_DIR = Path("/dev/shm")
_MPICH_PREFIXES = ("mpich_shm_", "mpich_vci_")
_PR_SET_PDEATHSIG = 1
#: an orphan segment must be unmapped at two looks this far apart (a starting job maps its
#: segment right after creating it)
_SWEEP_RECHECK_SECONDS = 0.2
#: how long `kill_tree` waits for the killed processes to be gone, and `stop_job` for `mpiexec`
#: to end on its own
_GONE_SECONDS = 5.0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux; else nothing).
    Called in the child between fork and exec, or first thing in a process."""
    prctl(_PR_SET_PDEATHSIG, sig)


def prctl(option: int, value: int) -> None:
    """`prctl(option, value)` for this thread or process (Linux; where the C library has no
    prctl, nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_descriptor(pid: int) -> int | None:
    """A descriptor that becomes readable when process `pid` exits (Linux's pidfd: a loop can
    wait for it with its sockets), or None where the system has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def name_process(name: str) -> None:
    """The name `ps` and `top` show for this process (`/proc/self/comm`: Linux, 15 characters
    at most; elsewhere nothing)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def host_identity() -> str:
    """`boot-id/netns-inode`: equal for processes on the same machine and network namespace."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        import socket
        return socket.gethostname()
    return f"{boot}/{net}"


def mapped_mpich_segments(pid: int | str = "self") -> set[str]:
    """Paths of the MPICH shared-memory segments process `pid` maps that still have a name."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(str(_SHM_DIR) + "/mpich_") \
                and not fields[5].endswith("(deleted)"):
            found.add(fields[5])
    return found


def unlink_segments(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def sweep_orphan_segments(since: float) -> list[str]:
    """Remove MPICH segments of this user created at or after `since` (a `time.time()`) that no
    live process maps (at two looks `_SWEEP_RECHECK_SECONDS` apart); returns their paths."""
    candidates = _segments_created_since(since)
    if not candidates:
        return []
    candidates -= _all_mapped_segments()
    if not candidates:
        return []
    time.sleep(_SWEEP_RECHECK_SECONDS)
    orphans = sorted(candidates - _all_mapped_segments())
    unlink_segments(orphans)
    return orphans


def _segments_created_since(since: float) -> set[str]:
    try:
        entries = list(os.scandir(_SHM_DIR))
    except OSError:
        return set()
    found = set()
    for entry in entries:
        if not entry.name.startswith(_MPICH_PREFIXES):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == os.getuid() and info.st_ctime >= since - 1.0:
            found.add(entry.path)
    return found


def _all_mapped_segments() -> set[str]:
    mapped = set()
    for pid in _pids():
        mapped |= mapped_mpich_segments(pid)
    return mapped


def processes_naming(text: str) -> list[int]:
    """The live processes whose command line has `text` in one of its arguments."""
    found = []
    for pid in _pids():
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(text.encode() in argument for argument in arguments) and alive(pid):
            found.append(pid)
    return found


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _parent_and_state(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[1]), fields[0]


def parent(pid: int) -> int | None:
    """The parent of process `pid` (None when there is no such process)."""
    info = _parent_and_state(pid)
    return None if info is None else info[0]


def process_started_at() -> float:
    """When this process started, as a `time.time()` (now, where `/proc` does not tell)."""
    try:
        ticks = start_time(os.getpid())
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return time.time()
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), to tell it from a later process that
    reuses the pid; None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    info = _parent_and_state(pid)
    return info is not None and info[1] != "Z"


def _children() -> dict[int, list[int]]:
    """Each live process's live children."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        info = _parent_and_state(pid)
        if info is not None and info[1] != "Z":
            children.setdefault(info[0], []).append(pid)
    return children


def descendants(roots) -> set[int]:
    """The live processes among `roots` and all their descendants."""
    children = _children()
    found, todo = set(), [pid for pid in roots if alive(pid)]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def kill_tree(roots) -> None:
    """SIGKILL `roots` and their descendants: stop them all (collected again until no new one
    appears), kill them, and wait (up to `_GONE_SECONDS`) until none is alive, so that what they
    mapped is unmapped when this returns (a process takes a while to die on a loaded machine)."""
    stopped: set[int] = set()
    while True:
        tree = descendants(set(roots) | stopped)
        new = tree - stopped
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + _GONE_SECONDS
    while any(alive(pid) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.01)


def stop_job(mpiexec: int | None, others) -> None:
    """Stop the job of `mpiexec` (a pid; None: there is none) and `others` (processes of the job
    it did not start: the rank server, ranks forked from it) on this machine, leaving hydra to
    end cleanly: `mpiexec` is asked to stop (SIGTERM, which it forwards to its proxies, so that it
    launches nothing more), then `others` and the processes the proxies started (the
    grandchildren of `mpiexec`: rank stubs, ranks, their supervisors), with all their
    descendants, are killed at once (`kill_tree`). Each proxy then sees its processes gone, tells
    `mpiexec` and exits through its clean-up; `mpiexec` exits after its proxies. What is still
    alive of `mpiexec` and its proxies after `_GONE_SECONDS` is killed with its descendants."""
    hydra: dict[int, int | None] = {}       # mpiexec and its proxies -> their start times
    launched: list[int] = []
    if mpiexec is not None and alive(mpiexec):
        _signal(mpiexec, signal.SIGTERM)
        children = _children()
        proxies = children.get(mpiexec, [])
        launched = [pid for proxy in proxies for pid in children.get(proxy, ())]
        hydra = {pid: start_time(pid) for pid in [mpiexec, *proxies]}
    kill_tree(set(others) | set(launched))
    deadline = time.monotonic() + _GONE_SECONDS
    while any(alive(pid) for pid in hydra) and time.monotonic() < deadline:
        time.sleep(0.01)
    kill_tree([pid for pid, at in hydra.items() if alive(pid) and start_time(pid) == at])


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
