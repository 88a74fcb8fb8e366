"""The partitioned program behind a file, for the commands that look at one without running it
(`cost`, `report`, `show`): a partitioned module as it is, a global program partitioned for the
partition count asked for.
"""
from __future__ import annotations

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module
from gspmdc.ir.stage import Stage, module_stage


def partition_count(module: Module, asked: int | None, path: str) -> int:
    """`-n` when given (it must agree with a partitioned module's own count), else the
    module's `num_partitions`, else the devices its shardings name."""
    from gspmdc.prepare import devices_named_by_shardings
    if asked is not None and asked < 1:
        raise GspmdcError(f"-n must be positive, got {asked}")
    if module_stage(module) is Stage.PARTITIONED and asked is not None and \
            module.num_partitions not in (None, asked):
        raise GspmdcError(f"{path} was partitioned for {module.num_partitions} partitions, not "
                          f"{asked}")
    return asked or module.num_partitions or devices_named_by_shardings(module)


def load_partitioned(path: str, asked: int | None,
                     windowed_einsum_threshold: int | None = None) -> tuple[Module, int]:
    """The partitioned module of `path` and its partition count (see the module docstring)."""
    from gspmdc.passes.pipeline import compile_spmd
    module = api.load(path)
    n = partition_count(module, asked, path)
    if module_stage(module) is not Stage.PARTITIONED:
        module = compile_spmd(module, n, windowed_einsum_threshold=windowed_einsum_threshold)
    return module, n


__all__ = ["load_partitioned", "partition_count"]
