"""Argument types of the subcommands: values checked while the command line is parsed, so a bad
one is an argparse error (`gspmdc run: error: argument --seed: ...`, exit code 2) before any
work starts.

Numbers: `partition_count` (-n), `positive_int` (counts), `non_negative_int` (--seed, byte
thresholds),
`positive_float` (--timeout). Paths: `output_file` (-o, --outputs: not a directory, in a
directory that exists or can be created, writable) and `output_directory` (--dump-dir: a
directory or a path where one can be created). The options several commands share are added by
one function each (`add_num_partitions`, `add_windowed_einsum_threshold`, `add_pass_reports`,
`add_machine`), so they read and check alike everywhere.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

#: the largest count an option takes (XLA's counts are int64)
MAX_COUNT = 2**63 - 1


def positive_int(text: str) -> int:
    """1 to 2^63-1 (XLA's counts are int64)."""
    return _int_within(text, 1, MAX_COUNT, "a positive integer (at most 2^63-1)")


def partition_count(text: str) -> int:
    """1 to 2^24 partitions (`ir/limits.MAX_DEVICES`: the most devices a program may name)."""
    from gspmdc.ir.limits import MAX_DEVICES
    return _int_within(text, 1, MAX_DEVICES,
                       f"a number of partitions from 1 to {MAX_DEVICES} (2^24)")


def non_negative_int(text: str) -> int:
    return _int_within(text, 0, math.inf, "a non-negative integer")


def _int_within(text: str, low: int, high: float, meaning: str) -> int:
    """The integer `text` when `low <= value <= high`, else the argparse error
    `must be <meaning>, got <text>`."""
    value = _int(text)
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {meaning}, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def output_file(text: str) -> str:
    """A file gspmdc may create or replace: not a directory, and its directory (the nearest
    one that exists, when the rest is to be created) is a directory gspmdc may write in.
    Special files (`/dev/null`, `/dev/stdout`, a named pipe) are written in place."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give the name of a file")
    if path.exists() and not path.is_file():
        if not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text}: permission denied")
        return text
    _check_creatable(path.parent, text)
    return text


def output_directory(text: str) -> str:
    """A directory gspmdc may write files in: one that exists, or a path where one can be
    created."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    _check_creatable(path, text)
    return text


def _check_creatable(directory: Path, text: str) -> None:
    """`directory` exists and is writable, or can be created (its nearest existing ancestor is
    a writable directory)."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {existing} (permission "
                                         "denied)")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def add_num_partitions(parser: argparse.ArgumentParser, *, required: bool = False,
                       help: str = "number of partitions (default: the module's num_partitions, "
                                   "else the devices its shardings name)") -> None:
    """`-n/--num-partitions N`, as every command that partitions or runs takes it."""
    parser.add_argument("-n", "--num-partitions", type=partition_count, required=required,
                        default=None, metavar="N", help=help)


def add_windowed_einsum_threshold(parser: argparse.ArgumentParser) -> None:
    """`--windowed-einsum-threshold BYTES`, as every command that partitions takes it."""
    parser.add_argument("--windowed-einsum-threshold", type=non_negative_int, default=None,
                        metavar="BYTES",
                        help="run dots whose all-gathered operand or reduce-scattered result "
                             "has at least BYTES bytes as windowed einsums (loops of partial "
                             "dots and collective-permutes; default: never)")


def add_pass_reports(parser: argparse.ArgumentParser) -> None:
    """`--dump-dir DIR` and `--time-passes`, as the commands that run passes take them."""
    parser.add_argument("--dump-dir", metavar="DIR", type=output_directory,
                        help="write the module after every pass to DIR/NNN.<pass>.hlo")
    parser.add_argument("--time-passes", action="store_true",
                        help="print each pass's wall time to stderr")


def add_machine(parser: argparse.ArgumentParser, what: str) -> None:
    """`--machine NAME|FILE`: the machine model `what` is computed on (a preset or a machine
    file)."""
    from gspmdc.passes.analysis.machine import PRESETS
    parser.add_argument("--machine", default="tpu-v3", metavar="NAME|FILE",
                        help=f"the machine model of {what}: a preset ({', '.join(PRESETS)}; "
                             "default tpu-v3) or a machine file written by `gspmdc cost "
                             "--calibrate`")


__all__ = ["positive_int", "partition_count", "non_negative_int", "positive_float", "output_file",
           "output_directory", "add_num_partitions", "add_windowed_einsum_threshold",
           "add_pass_reports", "add_machine"]


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_count(text: str) -> int:
    """A positive number of bytes: an integer, or a number with a unit (`512MiB`, `1.5GB`;
    KB/MB/GB/TB are powers of 10, KiB/MiB/GiB/TiB powers of 2)."""
    number = text.strip().rstrip("bBiIkKmMgGtT")
    unit = text.strip()[len(number):].lower()
    if unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"expected a number of bytes (e.g. 1073741824, 512MiB, "
                                         f"16GiB), got {text!r}")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes (e.g. 1073741824, "
                                         f"512MiB, 16GiB), got {text!r}") from None
    total = value * _BYTE_UNITS[unit]
    if not math.isfinite(total) or total < 1 or total > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be a positive number of bytes (at most 2^63-1), "
                                         f"got {text}")
    return int(total)


def mesh_shape(text: str):
    """A device mesh `x=2,y=4`: axis names (identifiers) and sizes (positive), major to minor;
    the devices in iota order."""
    from gspmdc.errors import ShardingError
    from gspmdc.ir.mesh import Mesh
    names, sizes = [], []
    for item in text.split(","):
        name, sep, size = item.strip().partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected axes as name=size separated by commas "
                                             f"(e.g. x=2,y=4), got {text!r}")
        try:
            sizes.append(int(size))
        except ValueError:
            raise argparse.ArgumentTypeError(f"axis {name.strip()!r}: size must be a positive "
                                             f"integer, got {size.strip()!r}") from None
        names.append(name.strip())
    try:
        return Mesh(names, sizes)
    except ShardingError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
