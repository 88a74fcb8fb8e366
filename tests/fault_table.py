"""The fault table of `gspmdc run` on MPI: a fault in a phase of a 2-rank job -> exit code, seconds
to exit, seconds until everything is gone, what was left behind.

    python tests/fault_table.py          # measures every row, prints docs/runtime.md's table

Faults: SIGTERM, SIGINT, SIGKILL of the `gspmdc run` process (the launcher); SIGKILL, SIGSEGV of a
rank; a hang stopped by `--timeout`. Phases, and the rank that is paused there (a test-only plugin,
a `sitecustomize.py` on PYTHONPATH, makes it sleep and touch a marker file when it gets there):

- start-up: rank 1 pauses after `MPI_Init`, before the ranks' start-up barrier (rank 0 waits in
  it; MPICH's shared-memory segment exists and still has its name); the victim rank is rank 1;
- compute: rank 1 pauses in a custom-call (the victim: rank 1);
- collective: rank 1 pauses in the custom-call, rank 0 waits in the all-reduce (the victim:
  rank 0, once the position board shows it in the all-reduce);
- output: rank 0 pauses while sending the outputs to the launcher (the victim: rank 0).

Leftovers looked for: processes carrying the case's tag in their environment (zombies aside), the
case's temporary directory not empty (`TMPDIR` of the run: the `gspmdc-run-*` directory), an
MPICH segment the ranks mapped still in `/dev/shm`, the topology file hydra's proxy wrote for the
ranks still in `/tmp` (hydra ignores `TMPDIR` there: the job runs with `HYDRA_DEBUG=1`, and the
proxy names the file it created in its output), anything in the output directory.

Every wait is on a file or a process, bounded; no sleep is a synchronisation.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hlo_text import reducer

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
PHASES = ("start-up", "compute", "collective", "output")
FAULTS = ("SIGTERM launcher", "SIGINT launcher", "SIGKILL launcher", "SIGKILL rank",
          "SIGSEGV rank", "hang, --timeout")
#: --timeout of the hang rows: counted from the start of `gspmdc run`, long enough for 2 ranks to
#: reach the pause on a loaded machine
TIMEOUT = 10.0
#: how long any one wait may take
_PATIENCE = 60.0



def all_reduce_after(target: str, num_partitions: int, name: str = "faulty") -> str:
    """A program whose every partition calls the test custom-call `target` on a replicated
    `f32[4]` and then all-reduces the result: the collective the other ranks wait in while one
    fails, hangs or sleeps in `target`."""
    return f"""HloModule {name}, num_partitions={num_partitions}

{reducer('addf', 'add')}

ENTRY main {{
  x = f32[4] parameter(0), sharding={{replicated}}
  c = f32[4] custom-call(x), custom_call_target="{target}"
  ROOT r = f32[4] all-reduce(c), channel_id=1, replica_groups={{}}, use_global_device_ids=true, to_apply=addf, sharding={{replicated}}
}}
"""


PROGRAM = all_reduce_after("gspmdc_test.pause", 2)

PLUGIN = '''
import os, time
from pathlib import Path

PHASE = os.environ.get("GSPMDC_FAULT_PHASE")
PAUSER = int(os.environ.get("GSPMDC_FAULT_PAUSER", "-1"))

def _pause():
    Path(os.environ["GSPMDC_TEST_DIR"], "paused").touch()
    time.sleep(120)

if PHASE is not None:
    from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS
    from gspmdc.runtime import rank_link

    def _custom_call(inst, args, ctx):
        if PHASE in ("compute", "collective") and ctx.partition_id == PAUSER:
            _pause()
        return args[0]
    CUSTOM_CALL_TARGETS["gspmdc_test.pause"] = _custom_call

    if PHASE == "start-up":
        _receive_job = rank_link.RankLink.receive_job
        def _receive_then_pause(self):
            job = _receive_job(self)
            if rank_link.rank_from_environment() == PAUSER:
                from mpi4py import MPI
                _pause()
            return job
        rank_link.RankLink.receive_job = _receive_then_pause

    if PHASE == "output":
        _send_outputs = rank_link.RankLink.send_outputs
        def _pause_then_send(self, arrays):
            _pause()
            _send_outputs(self, arrays)
        rank_link.RankLink.send_outputs = _pause_then_send
'''

#: per phase: the rank that pauses, the rank a rank fault hits, what the timeout must name
_PAUSER = {"start-up": 1, "compute": 1, "collective": 1, "output": 0}
VICTIM = {"start-up": 1, "compute": 1, "collective": 0, "output": 0}
HUNG = {"start-up": "rank 0 waiting for the other ranks to start; rank 1 setting up (before the "
                    "first instruction)",
        "compute": "rank 1 executing main/c (custom-call)",
        "collective": "rank 0 executing main/r (all-reduce)",
        "output": "rank 0 writing the outputs (after the last instruction); rank 1 assembling "
                  "the outputs"}


@dataclass
class Result:
    fault: str
    phase: str
    exit_code: int
    seconds_to_exit: float
    seconds_to_clean: float
    leftovers: list[str]
    stderr: str
    victim_pid: int | None = None

    def row(self) -> str:
        code = f"killed ({self.exit_code})" if self.exit_code < 0 else str(self.exit_code)
        exit_time = f"{self.seconds_to_exit:.1f}"
        if self.fault.startswith("hang"):
            exit_time = f"timeout + {self.seconds_to_exit:.1f}"
        return (f"| {self.fault} | {self.phase} | {code} | {exit_time} | "
                f"{self.seconds_to_clean:.1f} | {', '.join(self.leftovers) or 'none'} |")


def run_case(fault: str, phase: str, workdir: Path) -> Result:
    """Run one row of the table in `workdir` (an empty directory)."""
    tag = uuid.uuid4().hex
    tmp, out_dir = workdir / "tmp", workdir / "out"
    tmp.mkdir()
    out_dir.mkdir()
    (workdir / "sitecustomize.py").write_text(PLUGIN)
    program = workdir / "faulty.hlo"
    program.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(workdir), GSPMDC_TEST_TAG=tag, TMPDIR=str(tmp),
               GSPMDC_TEST_DIR=str(workdir), GSPMDC_FAULT_PHASE=phase,
               GSPMDC_FAULT_PAUSER=str(_PAUSER[phase]), HYDRA_DEBUG="1")
    command = [str(GSPMDC), "run", str(program), "--outputs", str(out_dir / "out.npz"), "-q"]
    if fault.startswith("hang"):
        command += ["--timeout", f"{TIMEOUT:g}"]
    started = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_child_setup)
    segments: set[str] = set()
    victim_pid = None
    try:
        _wait_until(lambda: (workdir / "paused").exists() or proc.poll() is not None,
                    "the paused rank")
        if phase == "collective":
            _wait_until(lambda: at_all_reduce(tmp, 0) or proc.poll() is not None,
                        "rank 0 in the all-reduce")
        segments = mapped_segments(tag)
        assert proc.poll() is None, f"the job ended early: {proc.communicate()}"
        injected = time.monotonic()
        if fault.startswith("hang"):
            injected = started + TIMEOUT
        elif fault.endswith("launcher"):
            proc.send_signal(getattr(signal, fault.split()[0]))
        else:
            victim_pid = rank_pids(tag)[VICTIM[phase]]
            os.kill(victim_pid, getattr(signal, fault.split()[0]))
        stdout, stderr = proc.communicate(timeout=_PATIENCE)
        exited = time.monotonic()
        files = hydra_files(stdout + stderr)
        assert files, "hydra's proxy wrote no topology file (it does as the ranks start MPI)"
        clean = _wait_clean(tag, tmp, out_dir, segments, files)
        return Result(fault, phase, proc.returncode, exited - injected, clean - injected,
                      leftovers(tag, tmp, out_dir, segments, files), stderr, victim_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _child_setup() -> None:
    """What a terminal gives a command: default SIGINT handling (a shell starting the tests in
    the background makes it ignored, and that is inherited); no core files from SIGSEGV."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + _PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {_PATIENCE:g} s for {what}")
        time.sleep(0.02)


def _wait_clean(tag: str, tmp: Path, out_dir: Path, segments: set[str],
                hydra: list[Path]) -> float:
    """When nothing is left (at most 20 s after now)."""
    deadline = time.monotonic() + 20.0
    while leftovers(tag, tmp, out_dir, segments, hydra) and time.monotonic() < deadline:
        time.sleep(0.02)
    return time.monotonic()


def at_all_reduce(tmp: Path, rank: int, program: str = PROGRAM) -> bool:
    """The position board of the run under `tmp` (its TMPDIR) shows `rank` in the entry's
    all-reduce of `program` (an `all_reduce_after` program)."""
    from gspmdc.ir.parser import parse_module
    from gspmdc.runtime.rank_position import read_board_file
    boards = list(tmp.glob("gspmdc-run-*/positions"))
    if not boards:
        return False
    module = parse_module(program)
    position = next(i for i, (comp, inst) in enumerate(module.all_instructions())
                    if comp is module.entry and inst.name == "r")     # not the reducer's root
    try:
        return read_board_file(boards[0])[rank] == position
    except (OSError, IndexError):
        return False


def wait_gone(tag: str, seconds: float = 5.0) -> None:
    """Wait up to `seconds` for the processes tagged `tag` to end."""
    deadline = time.monotonic() + seconds
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries GSPMDC_TEST_TAG=tag (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"GSPMDC_TEST_TAG={tag}".encode() not in (entry / "environ").read_bytes():
                continue
            if (entry / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def rank_pids(tag: str) -> dict[int, int]:
    """{rank: pid} of the job's ranks: the processes named `gspmdc-rank-R` (what `ps` shows;
    the rank server that forked them and supervises them is `gspmdc-ranks`)."""
    found = {}
    for pid in tagged_processes(tag):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("gspmdc-rank-") and name[12:].isdigit():
            found[int(name[12:])] = pid
    return found


def mapped_segments(tag: str) -> set[str]:
    """The MPICH segments (named or not any more) the tagged processes map."""
    found = set()
    for pid in tagged_processes(tag):
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/mpich_"):
                found.add(fields[5].split()[0])
    return found


def hydra_files(output: str) -> list[Path]:
    """The files hydra's proxies said they created, in the output of a job run with
    `HYDRA_DEBUG=1` (the topology file for the ranks, `/tmp/hydra_hwloc_xmlfile_*`)."""
    return [Path(line.split("created hwloc xml file ", 1)[1].strip())
            for line in output.splitlines() if "created hwloc xml file " in line]


def leftovers(tag: str, tmp: Path, out_dir: Path, segments: set[str],
              hydra: list[Path] = ()) -> list[str]:
    """What the job left: processes, temporary files (its TMPDIR `tmp`, and the `hydra` files),
    the MPICH `segments` it mapped, output files in `out_dir`."""
    found = []
    processes = tagged_processes(tag)
    if processes:
        found.append(f"{len(processes)} processes")
    if any(not entry.name.startswith(".lark_cache") for entry in tmp.iterdir()):
        found.append("temporary files")      # (lark's parser cache is no leftover)
    shm = [s for s in segments if os.path.exists(s)]
    if shm:
        found.append(f"{len(shm)} shm segments")
    if any(path.exists() for path in hydra):
        found.append("hydra's topology file")
    if any(out_dir.iterdir()):
        found.append("output files")
    return found


def main() -> None:
    import tempfile
    print("| fault | phase | exit code | seconds to exit | seconds until clean | left behind |")
    print("|---|---|---|---|---|---|")
    for fault in FAULTS:
        for phase in PHASES:
            with tempfile.TemporaryDirectory() as workdir:
                print(run_case(fault, phase, Path(workdir)).row(), flush=True)


if __name__ == "__main__":
    main()
