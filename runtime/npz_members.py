"""Reading single arrays of an `.npz` file without loading the rest: headers, and memory maps.

An `.npz` file is a zip archive of `.npy` members. `np.savez` stores members uncompressed, so the
bytes of a member's array sit contiguously in the file: `member_array` finds them (the member's
local zip header gives the offset of its `.npy` data, whose own header gives dtype, shape and order)
and returns an `np.memmap` of them. Slicing the map reads only the slice, which is how each MPI rank
reads just its shard of every input. Members of `np.savez_compressed` files cannot be mapped; they
are decompressed whole (once per process). `member_header` reads only the headers (for checking an
input file before launching a job).
"""
from __future__ import annotations

import os
import struct
import zipfile
from dataclasses import dataclass

import numpy as np

from gspmdc.errors import GspmdcError

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")    # zip local file header, 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"


@dataclass(frozen=True)
class MemberHeader:
    """What an `.npy` member holds, and where its data starts (None when compressed)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int | None


def member_names(path: str | os.PathLike) -> list[str]:
    """The array names of an npz file (member names without `.npy`)."""
    with _open(path) as archive:
        return [n[:-4] for n in archive.namelist() if n.endswith(".npy")]


def member_header(path: str | os.PathLike, name: str) -> MemberHeader:
    """The `.npy` header of array `name` (reads a few hundred bytes)."""
    with _open(path) as archive:
        info = _info(archive, path, name)
        with archive.open(info) as member:
            shape, fortran, dtype = _read_npy_header(member, path, name)
    offset = None
    if info.compress_type == zipfile.ZIP_STORED:
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            fields = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
            if fields[0] != _LOCAL_SIGNATURE:
                raise GspmdcError(f"{path}: member {name}: bad zip local header")
            name_length, extra_length = fields[-2], fields[-1]
            f.seek(info.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
            _read_npy_header(f, path, name)
            offset = f.tell()
    return MemberHeader(shape, dtype, fortran, offset)


def member_array(path: str | os.PathLike, name: str) -> np.ndarray:
    """Array `name` of the npz file: a read-only memory map when the member is stored
    uncompressed and not empty, else the decompressed array."""
    header = member_header(path, name)
    if header.data_offset is None or 0 in header.shape or not header.shape:
        with np.load(path, allow_pickle=False) as data:
            return data[name]
    return np.memmap(path, dtype=header.dtype, mode="r", offset=header.data_offset,
                     shape=header.shape, order="F" if header.fortran_order else "C")


def _open(path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise GspmdcError(f"{path}: cannot read as an npz file: {e}") from None


def _info(archive: zipfile.ZipFile, path, name: str) -> zipfile.ZipInfo:
    try:
        return archive.getinfo(name + ".npy")
    except KeyError:
        raise GspmdcError(f"{path}: no array {name!r} (the file has "
                          f"{sorted(n[:-4] for n in archive.namelist() if n.endswith('.npy'))})"
                          ) from None


def _read_npy_header(f, path, name):
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        return np.lib.format.read_array_header_2_0(f)
    except ValueError as e:
        raise GspmdcError(f"{path}: array {name!r}: not an .npy member: {e}") from None
