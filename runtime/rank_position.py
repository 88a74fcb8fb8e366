"""Where each rank of an MPI job is: the instruction it executes, readable after the rank died.

A `PositionBoard` holds one int64 slot per rank. `gspmdc run` keeps it in a file of the job's run
directory that every rank maps shared (`mmap`), so the launcher can read a killed rank's slot and
rank 0's watchdog every rank's slot when the job times out; ranks started by the user (`mpiexec
... gspmdc run`) get a private board that only their own watchdog reads. Before each instruction
the interpreter's position record (`PositionBoard.position`) stores the instruction's number, its
index in `module.all_instructions()`, into the rank's slot: a store into mapped memory, no system
call on the data path. The number names the same instruction in every copy of the job's program
(`describe`). Negative values are phases: `STARTING` (before the first instruction: reading
inputs, building communicators), `WAITING` (MPI started, waiting for the other ranks to start),
`FINISHING` (after the last: assembling the outputs) and `WRITING` (rank 0 checking, writing or
sending the outputs).
"""
from __future__ import annotations

import mmap
from array import array
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # annotations only: the launcher reads boards without importing the IR
    from gspmdc.ir.module import Module

    from .interpreter import Position

STARTING = -1
FINISHING = -2
WRITING = -3
WAITING = -4
#: a slot: a native int64 (`array`/`memoryview` type code)
_SLOT_TYPE = "q"
_SLOT_BYTES = 8


def create_board_file(path: Path, num_ranks: int) -> None:
    """A board file for `num_ranks` ranks, every slot `STARTING` (native int64, as mapped)."""
    path.write_bytes(array(_SLOT_TYPE, [STARTING] * num_ranks).tobytes())


def read_board_file(path: Path) -> list[int]:
    """Every rank's slot of a board file (works after the ranks died)."""
    return memoryview(path.read_bytes()).cast(_SLOT_TYPE).tolist()


class PositionBoard:
    """One rank's view of the board: the shared file at `path` (from `create_board_file`), or a
    private board when `path` is None (then only this rank's slot is known)."""

    def __init__(self, path: Path | None, rank: int, num_ranks: int):
        if path is None:
            self._slots = memoryview(array(_SLOT_TYPE, [STARTING] * num_ranks))
            self._shared = False
        else:
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), _SLOT_BYTES * num_ranks)
            self._slots = memoryview(self._map).cast(_SLOT_TYPE)
            self._shared = True
        self.rank = rank

    @property
    def shared(self) -> bool:
        """Every rank's slot is readable here (not only this rank's)."""
        return self._shared

    def set(self, code: int) -> None:
        """Record a phase (`STARTING`, `WAITING`, `FINISHING`, `WRITING`) or an instruction
        number."""
        self._slots[self.rank] = code

    def get(self, rank: int) -> int:
        return self._slots[rank]

    def position(self, module: Module) -> Position:
        """The interpreter's position record (`evaluate(..., position=)`) writing each
        instruction of `module` into this rank's slot as it starts."""
        from .interpreter import Position
        numbers = {id(inst): i for i, (_, inst) in enumerate(module.all_instructions())}
        return Position(self._slots, self.rank, numbers)


def describe(module: Module | None, code: int) -> str:
    """What a slot value means: `executing computation/instruction (opcode)` or the phase
    (`executing instruction #k` when the module is not at hand)."""
    if code == STARTING:
        return "setting up (before the first instruction)"
    if code == FINISHING:
        return "assembling the outputs (after the last instruction)"
    if code == WAITING:
        return "waiting for the other ranks to start"
    if code == WRITING:
        return "writing the outputs (after the last instruction)"
    if module is None:
        return f"executing instruction #{code}"
    for i, (comp, inst) in enumerate(module.all_instructions()):
        if i == code:
            return f"executing {comp.name}/{inst.name} ({inst.opcode})"
    return f"at an unknown position ({code})"


def describe_ranks(module: Module | None, codes: dict[int, int]) -> str:
    """`rank 1 executing main/c (custom-call); ranks 0, 2, 3 executing main/r (all-reduce)` for
    {rank: code}, the smallest groups first."""
    by_place: dict[str, list[int]] = {}
    for rank, code in sorted(codes.items()):
        by_place.setdefault(describe(module, code), []).append(rank)
    parts = []
    for place, ranks in sorted(by_place.items(), key=lambda item: (len(item[1]), item[1])):
        who = f"rank {ranks[0]}" if len(ranks) == 1 else \
            "ranks " + ", ".join(str(r) for r in ranks)
        parts.append(f"{who} {place}")
    return "; ".join(parts)
