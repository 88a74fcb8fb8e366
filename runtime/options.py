"""The options of `gspmdc run` that travel with a job, and the values they take.

Kept apart from the job and the backends (which import numpy and the IR) so that `gspmdc run` can
parse its command line and start `mpiexec` before importing anything heavy.
"""
from __future__ import annotations

from dataclasses import dataclass

#: how MPI ranks wait for each other (`--mpi-wait`; see `backends/mpi.py`)
WAIT_MODES = ("auto", "polite", "blocking")
#: where bf16 results are rounded (`--rounding`; see `rounding.py`)
ROUNDINGS = ("xla", "per-op")
DEFAULT_ROUNDING = ROUNDINGS[0]


@dataclass(frozen=True)
class RunOptions:
    """The options of `gspmdc run` that travel with the job."""

    num_partitions: int | None = None
    inputs: str | None = None
    seed: int = 0
    outputs: str | None = None
    check: bool = False
    profile: bool = False
    timeout: float | None = None
    padding: str = "zeros"
    deterministic: bool = False
    mpi_wait: str = "auto"
    output_sharding: str | None = None
    quiet: bool = False
    #: where bf16 results are rounded, on every rank and in the reference (`rounding.py`)
    rounding: str = DEFAULT_ROUNDING
    #: `--repeat K`: execute the program K more times after the first run and report the times of
    #: those K runs (0: execute it once)
    repeat: int = 0
    #: partitioning: dots at least this big (bytes) run as windowed einsums (None: never)
    windowed_einsum_threshold: int | None = None
    #: write the measured figures (`runtime/profile.measured_figures`) here as JSON
    profile_json: str | None = None

    @property
    def profiling(self) -> bool:
        """Whether partitions record profiles (`--profile` or `--profile-json`)."""
        return self.profile or self.profile_json is not None
