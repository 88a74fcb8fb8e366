"""The partitioner's fixed pipeline: what `gspmdc compile` runs, built from the pass table.

    from gspmdc.passes.pipeline import compile_spmd
    spmd = compile_spmd(module, num_partitions=8, dump_dir="dumps", time_passes=True)

| pass              | what it does                                                          |
|-------------------|-----------------------------------------------------------------------|
| `inline-calls`    | inline `call`s of the entry, loop bodies and branches (as XLA does)   |
| `propagate`       | complete the shardings (optional; see `passes/propagation`)           |
| `shardy-propagate`| (Shardy mode, instead) Shardy's propagation (`passes/shardy`)         |
| `shardy-to-gspmd` | a Shardy-form module in GSPMD form (shard_maps, result shardings)     |
| `insert-reshards` | choose each op's strategy; make every reshard an explicit node        |
| `windowed-einsum` | (with a threshold) big dots as loops of partial dots and permutes     |
| `pad-uneven`      | mask padding before reductions and contractions over uneven dims      |
| `halo-exchange`   | record on windowed ops the halos each partition receives (`halo=`)    |
| `lower-spmd`      | the per-partition program: local shapes, partition-id tables, collectives |
| `cleanup`         | tuple simplification, CSE, DCE                                        |

Each pass records the stage it leaves the module at (`gspmdc.ir.stage`); any other order of
passes can run through `gspmdc opt` (`pass_table.parse_pipeline`).
"""
from __future__ import annotations

import sys
from pathlib import Path

from gspmdc.atomic import atomic_output
from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module
from gspmdc.ir.printer import print_module
from gspmdc.ir.sdy import module_meshes
from gspmdc.ir.stage import Stage, module_stage
from gspmdc.passes.pass_manager import (
    ModulePass, PassContext, PipelineCallback, PipelineError, run_pipeline,
)
from gspmdc.passes.pass_table import PASSES
from gspmdc.passes.spmd.windowed_einsum import WindowedEinsum


def partitioner_pipeline(*, propagate: bool = True, windowed_einsum_threshold: int | None = None,
                         start: Stage = Stage.GLOBAL, propagation: str = "gspmd",
                         shardy_strategy: str = "aggressive",
                         shardy_form: bool = False) -> list[ModulePass]:
    """The passes of `gspmdc compile`, in order (`propagate` unless told not to;
    `windowed-einsum` only with a threshold), for a module at stage `start`: the passes that
    brought a module to `start` are left out (from `resharded`: pad-uneven onwards, with
    windowed-einsum first when asked for). `propagation`: `gspmd` (XLA's sharding propagation)
    or `shardy` (Shardy's, for a module in Shardy form: `shardy-propagate` with
    `shardy_strategy`, then `shardy-to-gspmd`); a module in Shardy form (`shardy_form`)
    propagated the GSPMD way is lowered to GSPMD form first (`shardy-to-gspmd`)."""
    if propagation == "shardy":
        passes = [PASSES["inline-calls"](),
                  PASSES["shardy-propagate"](strategy=shardy_strategy, propagate=propagate),
                  PASSES["shardy-to-gspmd"](after_propagation=True)]
    else:
        passes = ([PASSES["shardy-to-gspmd"]()] if shardy_form else []) + \
            [PASSES["inline-calls"]()] + ([PASSES["propagate"]()] if propagate else [])
    passes.append(PASSES["insert-reshards"]())
    if windowed_einsum_threshold is not None:
        passes.append(WindowedEinsum(threshold=windowed_einsum_threshold))
    passes += [PASSES[name]() for name in ("pad-uneven", "halo-exchange", "lower-spmd", "cleanup")]
    order = list(Stage)
    return [p for p in passes
            if (order.index(p.produces) > order.index(start) if p.produces is not None
                else max(order.index(s) for s in p.accepts) >= order.index(start))]


def compile_spmd(module: Module, num_partitions: int, *, dump_dir=None, time_passes: bool = False,
                 propagate: bool = True, windowed_einsum_threshold: int | None = None,
                 verify_each: bool = False, propagation: str | None = None,
                 shardy_strategy: str = "aggressive") -> Module:
    """Partition `module` (rewritten in place and returned) into the SPMD program for
    `num_partitions` partitions; a module at a later stage than `global` (a dump) runs the rest
    of the pipeline only. `dump_dir`: write `000.input.hlo` and `NNN.<pass>.hlo` after
    every pass there; `time_passes`: print each pass's wall time to stderr; `propagate`: run
    sharding propagation first (unsharded instructions are otherwise replicated);
    `windowed_einsum_threshold`: run dots whose gathered operand or reduce-scattered result
    has at least that many bytes as windowed einsums (default: never); `verify_each`: run the
    verifier after every pass; `propagation`: `shardy` or `gspmd` (default: shardy for a module
    in Shardy form, i.e. with `xla.sdy.meshes`); `shardy_strategy`: Shardy's factor propagation
    strategy.
    Raises GspmdcError (ShardingError, UnsupportedError, PipelineError) for inputs it cannot
    partition."""
    if num_partitions < 1:
        raise GspmdcError(f"the number of partitions must be positive, got {num_partitions}")
    stage = module_stage(module)
    if stage is Stage.PARTITIONED:
        raise PipelineError(f"module {module.name} is already partitioned (stage "
                            f"{stage.value}); compile takes a global program")
    form = default_propagation(module)
    pipeline = partitioner_pipeline(propagate=propagate,
                                    windowed_einsum_threshold=windowed_einsum_threshold,
                                    start=stage, propagation=propagation or form,
                                    shardy_strategy=shardy_strategy,
                                    shardy_form=form == "shardy")
    ctx = PassContext(num_partitions, verify_each=verify_each)
    return run_pipeline(ctx, module, pipeline, dump_callback(dump_dir, time_passes, module))


def default_propagation(module: Module) -> str:
    """`shardy` for a module in Shardy form (it declares `xla.sdy.meshes`), else `gspmd`."""
    return "shardy" if module_meshes(module) is not None else "gspmd"


def dump_callback(dump_dir, time_passes: bool, module: Module) -> PipelineCallback:
    """The callback of `run_pipeline` behind `--dump-dir` and `--time-passes`; writes
    `000.input.hlo` (the module as given) at once."""
    directory = None if dump_dir is None else Path(dump_dir)
    if directory is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise GspmdcError(f"the dump directory {directory} exists and is not a "
                              "directory") from None
        except OSError as e:
            raise GspmdcError(f"cannot create the dump directory {directory}: "
                              f"{e.strerror}") from None
        _dump(directory / "000.input.hlo", module)

    def after(index, pass_, result, seconds):
        if time_passes:
            print(f"{pass_.name:<16} {seconds * 1000:9.2f} ms", file=sys.stderr)
        if directory is not None:
            _dump(directory / f"{index + 1:03d}.{pass_.name}.hlo", result)
    return after


def _dump(path: Path, module: Module) -> None:
    with atomic_output(path, "w") as f:
        f.write(print_module(module))


__all__ = ["compile_spmd", "partitioner_pipeline", "dump_callback", "default_propagation"]
