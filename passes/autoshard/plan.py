"""`autoshard`: choose a sharding for every instruction of a module on a device mesh.

    from gspmdc.passes.autoshard import autoshard
    result = autoshard(module, Mesh(["x", "y"], [2, 4]), memory_per_device=2**30)
    print(result.summary())          # module is annotated in place

Steps: calls are inlined (as the partitioner does); the user's shardings of entry parameters and
of the entry result pin them (with `keep_annotations`, every sharding in the module pins its
instruction; otherwise the others are dropped); the sharding graph (`graph.py`) is built from
the partitioner's rules (`strategies.py`), simplified into a problem (`problem.py`, identical
layers sharing choices: `symmetry.py`) and solved (`solve.py`) under the memory limit
(`memory.py`); under a limit, the plan is partitioned and its peak checked by `gspmdc cost`'s
liveness analysis, plans that miss are excluded and the next solved (`_fitted`); the chosen
shardings are written on every instruction with the record of the alternatives, and the plan's
reshards as `Sharding` custom-calls (`annotate.py`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from gspmdc.errors import GspmdcError, ShardingError
from gspmdc.ir.liveness import memory_profile
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.parser import parse_module
from gspmdc.ir.printer import print_module
from gspmdc.ir.module import Module
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.stage import Stage, module_stage
from gspmdc.passes.pass_manager import PassContext
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.passes.spmd.call_graph import partitioned_computations
from gspmdc.passes.spmd.inline_calls import InlineCalls

from .annotate import annotate
from .costs import DEFAULT_MACHINE, CostModel, Machine
from .graph import build_graph
from .memory import memory_rows, plan_memory
from .problem import Problem, build_problem, plan_cost
from .solve import MemoryRow, Solution, solve
from .strategies import StrategyTable

#: seconds the solver may take before the best plan found is used
DEFAULT_TIME_LIMIT = 60.0
#: plans partitioned and checked against the memory limit before saying none fits
FIT_ATTEMPTS = 4


@dataclass(frozen=True)
class AutoshardResult:
    """What autoshard found: the solution, the modelled seconds of the plan (`seconds`, per
    run, each value resharded once per sharding its users need, as the partitioner does), the
    bytes each device sends in collectives per run (`bytes_sent`), its peak memory per device
    (`peak_bytes`: under a limit, `gspmdc cost`'s figure for the partitioned plan, which the
    limit is checked against; without one, the modelled figure of the memory rows), the
    limit, problem sizes and timings."""

    solution: Solution
    seconds: float
    bytes_sent: float
    peak_bytes: int
    memory_limit: int | None
    nodes: int
    choices: int
    pairs: int
    build_seconds: float

    @property
    def fits(self) -> bool:
        return self.solution.status != "infeasible"

    def summary(self) -> str:
        """The plan in one line (what the annotated module's header records)."""
        limit = "" if self.memory_limit is None else \
            f" by `gspmdc cost` (limit {self.memory_limit} bytes)"
        return (f"modelled step time {self.seconds:.6g} s, {self.bytes_sent:.0f} bytes sent "
                f"and peak memory {self.peak_bytes} bytes per device{limit}; {self.nodes} values in {self.choices} choices, "
                f"{self.pairs} reshard edges; {self.solution.status}")

    def timings(self) -> str:
        return (f"strategies and graph in {self.build_seconds:.2f} s, solved in "
                f"{self.solution.solve_seconds:.2f} s")


def autoshard(module: Module, mesh: Mesh, *, memory_per_device: int | None = None,
              keep_annotations: bool = False, machine: Machine = DEFAULT_MACHINE,
              time_limit: float = DEFAULT_TIME_LIMIT) -> AutoshardResult:
    """Annotate `module` (in place) with the plan of least modelled step time on `mesh` whose
    modelled peak memory per device is at most `memory_per_device` (see the module
    docstring). GspmdcError when the module cannot be planned (a partitioned module, a pin
    that does not fit the mesh); a plan that does not fit the limit is reported, not
    written (`AutoshardResult.fits`)."""
    stage = module_stage(module)
    if stage not in (Stage.GLOBAL, Stage.PROPAGATED):
        raise GspmdcError(f"autoshard takes a global program (stage global or propagated); "
                          f"module {module.name} is at stage {stage.value}")
    started = time.perf_counter()
    InlineCalls().apply(PassContext(mesh.num_devices), module)
    pins, output_pin = _pins(module, mesh, keep_annotations)
    costs = CostModel(machine, mesh.num_devices, module.computations)
    table = StrategyTable(mesh, costs, module.computations)
    graph = build_graph(module, table, pins, output_pin)
    problem = build_problem(graph, costs)
    rows = memory_rows(problem, memory_per_device)
    built = time.perf_counter() - started
    solution = solve(problem, rows, time_limit)
    if solution.status == "infeasible" and rows:
        # identical layers planned alike found no plan: every value free
        problem = build_problem(graph, costs, tie=False)
        rows = memory_rows(problem, memory_per_device)
        solution = solve(problem, rows, time_limit)
    peak, _ = plan_memory(problem, solution.assignment)
    if memory_per_device is not None and solution.status != "infeasible":
        solution, rows, peak = _fitted(module, mesh, problem, solution, rows, memory_per_device,
                                       time_limit)
    seconds, sent = plan_cost(problem, costs, solution.assignment)
    result = AutoshardResult(solution, seconds, sent, peak, memory_per_device,
                             len(graph.nodes), problem.num_choices, len(problem.pairs), built)
    if result.fits:
        annotate(module, mesh, problem, solution, rows, result.summary())
    return result


def _fitted(module: Module, mesh: Mesh, problem: Problem, solution: Solution,
            rows: list[MemoryRow], limit: int, time_limit: float):
    """The solution, its rows and its peak bytes per device as `gspmdc cost` figures them on
    the partitioned plan (padding of uneven shards, halos and reshard buffers included, which
    the rows do not model). While that peak exceeds `limit`, the plan is excluded and the
    problem solved again: first with the rows' limit lowered by the largest excess of a plan
    over its modelled peak seen so far, else under `limit` itself (the next plan by modelled
    step time); at most `FIT_ATTEMPTS` plans are partitioned. When none fits, the solution is
    marked infeasible and says so."""
    tighter = limit
    excluded: list[tuple[int, ...]] = []
    for _ in range(FIT_ATTEMPTS):
        modelled, _ = plan_memory(problem, solution.assignment)
        peak = partitioned_peak(module, mesh, problem, solution, rows)
        if peak <= limit:
            return solution, rows, peak
        excluded.append(tuple(solution.assignment))
        tighter = min(tighter, limit - (peak - modelled))
        retry = None
        if tighter > 0:
            rows = memory_rows(problem, tighter)
            retry = solve(problem, rows, time_limit, tuple(excluded))
        if retry is None or retry.status == "infeasible":
            rows = memory_rows(problem, limit)
            retry = solve(problem, rows, time_limit, tuple(excluded))
        if retry.status == "infeasible":
            break
        solution = retry
    return replace(solution, status="infeasible",
                   message=f"{len(excluded)} plans partitioned (the best by modelled step time "
                           f"within the limit) need more than {limit} bytes per device by "
                           "`gspmdc cost` (padding, halos and reshard buffers included), and "
                           "no other plan fits the modelled limit"
                           if retry.status == "infeasible" else
                           f"the {len(excluded)} best plans within the modelled limit need more "
                           f"than {limit} bytes per device by `gspmdc cost` (padding, halos "
                           "and reshard buffers included): no plan was found that fits"
                   ), rows, peak


def partitioned_peak(module: Module, mesh: Mesh, problem: Problem, solution: Solution,
                     rows: list[MemoryRow]) -> int:
    """Peak bytes per device of the plan partitioned, by the liveness analysis of `gspmdc
    cost` (`module` is left as it is)."""
    trial = parse_module(print_module(module), module.name)
    annotate(trial, mesh, problem, solution, rows, "")
    compile_spmd(trial, mesh.num_devices)
    return memory_profile(trial).peak_bytes


def _pins(module: Module, mesh: Mesh, keep_annotations: bool):
    """The shardings the user fixed: entry parameters' and the entry result's, and with
    `keep_annotations` every other instruction's; the others are removed."""
    pins: dict[tuple[str, str], HloSharding] = {}
    entry = module.entry
    output_pin = None
    for comp in partitioned_computations(module):
        for inst in comp.instructions:
            sharding = inst.sharding
            if sharding is None:
                continue
            kept = keep_annotations or (comp is entry and inst.opcode == "parameter")
            if comp is entry and inst is entry.root:
                output_pin = _checked(sharding, inst, mesh)
                if not kept:
                    inst.sharding = None
                    continue
            if kept:
                pins[(comp.name, inst.name)] = _checked(sharding, inst, mesh)
            else:
                inst.sharding = None
    return pins, output_pin


def _checked(sharding: HloSharding, inst, mesh: Mesh) -> HloSharding:
    try:
        sharding.validate(inst.shape, mesh.num_devices)
    except ShardingError as e:
        raise ShardingError(f"{inst.name}: its sharding does not fit the mesh "
                            f"{mesh.to_text()}: {e}") from None
    if any(leaf.kind in ("manual", "unknown") or leaf.has_unreduced
           for leaf in sharding.leaves()):
        raise ShardingError(f"{inst.name}: autoshard cannot plan around the sharding "
                            f"{sharding.to_text(False)} (manual, unknown and unreduced "
                            "shardings are not pins)")
    return sharding.with_metadata(()).with_shard_group(None)


__all__ = ["autoshard", "AutoshardResult", "DEFAULT_TIME_LIMIT"]
