"""The SPMD partitioner: from a module with shardings to one program per partition.

    from gspmdc.passes.spmd import compile_spmd
    spmd = compile_spmd(module, num_partitions=8, dump_dir="dumps", time_passes=True)

Pipeline (each a registered pass; `--dump-dir` writes the module after each):

| pass              | what it does                                                          |
|-------------------|-----------------------------------------------------------------------|
| `inline-calls`    | inline `call`s of the entry, loop bodies and branches (as XLA does)   |
| `propagate`       | complete the shardings (optional; see `passes/propagation`)           |
| `insert-reshards` | choose each op's strategy; make every reshard an explicit node        |
| `windowed-einsum` | (with a threshold) big dots as loops of partial dots and permutes     |
| `pad-uneven`      | mask padding before reductions and contractions over uneven dims      |
| `halo-exchange`   | record on windowed ops the halos each partition receives (`halo=`)    |
| `lower-spmd`      | the per-partition program: local shapes, partition-id tables, collectives |
| `cleanup`         | tuple simplification, CSE, DCE                                        |

Up to `halo-exchange` the IR is the ordinary global program (global shapes, shardings, reshard
nodes as `Sharding` custom-calls, masks as identity ops), so every dump re-parses and evaluates to
the original result; `lower-spmd` rewrites shapes to per-partition ones. Windowed ops keep
their windowed dims tiled and exchange halos with their neighbours (`halo.py`). Loop bodies,
conditions, branches and called computations are partitioned with their call sites' shardings at
their boundary (`call_graph.py`, `op_rules_control.py`); manual regions run per device unchanged
(`op_rules_manual.py`); pure ops without a rule run replicated (the default action).
"""
from __future__ import annotations

import sys
from pathlib import Path

from gspmdc.atomic import atomic_output
from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module
from gspmdc.passes.pass_manager import ModulePass, get_pass, run_pipeline

from . import (  # noqa: F401  (each module registers its rules)
    op_rules_data, op_rules_dot, op_rules_elementwise, op_rules_passthrough, op_rules_reduce,
)
from . import op_rules_gather  # noqa: F401  (gather)
from . import op_rules_random  # noqa: F401  (rng, rng-bit-generator)
from . import op_rules_indexed  # noqa: F401  (dynamic-(update-)slice, sort, TopK)
from . import op_rules_ragged  # noqa: F401  (ragged-dot)
from . import op_rules_control, op_rules_manual  # noqa: F401  (control flow; manual regions)
from . import op_rules_window  # noqa: F401  (reduce-window, pad, slice, concatenate, reverse)
from . import op_rules_conv  # noqa: F401  (convolution)
from .cleanup import Cleanup
from .explain import collective_result_bytes, collective_sent_bytes, explain_collective
from .halo_exchange import HaloExchange
from .inline_calls import InlineCalls
from .insert_reshards import InsertReshards
from .lower_spmd import GLOBAL_SIGNATURE, LowerSpmd
from .pad_uneven import PadUneven
from .windowed_einsum import WindowedEinsum


def spmd_pipeline(num_partitions: int, *, propagate: bool = True,
                  windowed_einsum_threshold: int | None = None) -> list[ModulePass]:
    """The partitioner's passes, in order (`windowed-einsum` only with a threshold)."""
    passes: list[ModulePass] = [InlineCalls()]
    if propagate:
        import gspmdc.passes.propagation  # noqa: F401  (registers "propagate")
        passes.append(get_pass("propagate"))
    passes.append(InsertReshards(num_partitions))
    if windowed_einsum_threshold is not None:
        passes.append(WindowedEinsum(num_partitions, windowed_einsum_threshold))
    passes += [PadUneven(), HaloExchange(num_partitions),
               LowerSpmd(num_partitions), Cleanup()]
    return passes


def compile_spmd(module: Module, num_partitions: int, *, dump_dir=None, time_passes: bool = False,
                 propagate: bool = True, windowed_einsum_threshold: int | None = None) -> Module:
    """Partition `module` (rewritten in place and returned) into the SPMD program for
    `num_partitions` partitions. `dump_dir`: write `000.input.hlo` and `NNN.<pass>.hlo` after
    every pass there; `time_passes`: print each pass's wall time to stderr; `propagate`: run
    sharding propagation first (unsharded instructions are otherwise replicated);
    `windowed_einsum_threshold`: run dots whose gathered operand or reduce-scattered result
    has at least that many bytes as windowed einsums (default: never).
    Raises GspmdcError (ShardingError, UnsupportedError) for inputs it cannot partition."""
    if num_partitions < 1:
        raise GspmdcError(f"the number of partitions must be positive, got {num_partitions}")
    declared = module.attrs.get("num_partitions")
    if declared not in (None, 1, num_partitions):
        raise GspmdcError(f"module {module.name} declares num_partitions={declared}, "
                          f"but {num_partitions} partitions were requested")
    if windowed_einsum_threshold is not None and windowed_einsum_threshold < 0:
        raise GspmdcError(f"the windowed einsum threshold must not be negative, got "
                          f"{windowed_einsum_threshold}")
    module.attrs["num_partitions"] = num_partitions
    directory = None if dump_dir is None else Path(dump_dir)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        _dump(directory / "000.input.hlo", module)

    def after(index, pass_, result, seconds):
        if time_passes:
            print(f"{pass_.name:<16} {seconds * 1000:9.2f} ms", file=sys.stderr)
        if directory is not None:
            _dump(directory / f"{index + 1:03d}.{pass_.name}.hlo", result)

    pipeline = spmd_pipeline(num_partitions, propagate=propagate,
                             windowed_einsum_threshold=windowed_einsum_threshold)
    return run_pipeline(module, pipeline, after)


def _dump(path: Path, module: Module) -> None:
    from gspmdc.ir.printer import print_module
    with atomic_output(path, "w") as f:
        f.write(print_module(module))


__all__ = ["compile_spmd", "spmd_pipeline", "explain_collective", "collective_sent_bytes",
           "collective_result_bytes", "GLOBAL_SIGNATURE"]
