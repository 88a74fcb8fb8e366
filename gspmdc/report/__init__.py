"""`gspmdc report`: one self-contained HTML page about a partitioned program (no network, no
server): its graph coloured by sharding with every collective's cost and reason, the module
after each pass with what the pass changed, the cost table and the memory per device over
time.

    html = build_report("model.hlo", 8, PRESETS["tpu-v3"])
"""
from __future__ import annotations

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir.flops import executed_computations
from gspmdc.ir.printer import print_module
from gspmdc.ir.stage import Stage, module_stage
from gspmdc.passes.analysis.cost import program_cost
from gspmdc.passes.analysis.machine import Machine
from gspmdc.passes.pass_manager import PassContext, run_pipeline
from gspmdc.passes.propagation import ShardingPropagation
from gspmdc.units import format_bytes, format_seconds

from .graph import Legend, computation_svg
from .memory_chart import memory_svg
from .page import ReportContent, render
from .pass_history import partition_with_history

#: computations drawn at most (the entry first, then loop bodies and the rest)
MAX_GRAPHS = 12


def build_report(path: str, num_partitions: int | None, machine: Machine,
                 windowed_einsum_threshold: int | None = None) -> str:
    """The report page of the program in `path` (a global program is partitioned, keeping the
    module after each pass; a partitioned one is shown as it is)."""
    from gspmdc.partitioned import partition_count
    from gspmdc.sharding_picture import describe_value
    module = api.load(path)
    n = partition_count(module, num_partitions, path)
    if module_stage(module) is Stage.PARTITIONED:
        spmd, input_text, steps, seconds = module, print_module(module), [], 0.0
    else:
        spmd, input_text, steps, seconds = partition_with_history(module, n,
                                                                  windowed_einsum_threshold)
        seconds = sum(step.seconds for step in steps)
    cost = program_cost(spmd, n, machine)
    costs = _collective_costs(cost)
    legend = Legend({})
    details: dict[str, dict] = {}
    graphs = []
    roles = _roles(spmd)
    for k, comp in enumerate(executed_computations(spmd)[:MAX_GRAPHS]):
        graphs.append((comp.name + roles.get(comp.name, ""),
                       computation_svg(comp, legend, details, f"c{k}", costs.get(comp.name, {}))))
    if not graphs:
        raise GspmdcError(f"{path}: nothing to draw")
    pictures = []
    original = api.load(path)
    stage = module_stage(original)
    if stage is Stage.GLOBAL:
        run_pipeline(PassContext(n), original, [ShardingPropagation()])
    for inst in original.entry.parameters + [original.entry.root]:
        pictures += describe_value(inst.name, inst.shape, inst.sharding, n,
                                   original.attrs.get("mesh"),
                                   per_device_shape=stage is Stage.PARTITIONED)
    return render(ReportContent(
        title=spmd.name, source=str(path), num_partitions=n, cost=cost, graphs=graphs,
        legend=legend.colours, details=details,
        memory_svg=memory_svg(cost.memory, machine.memory_bytes), input_text=input_text,
        steps=steps, compile_seconds=seconds, shardings="\n".join(pictures)))


def _roles(module) -> dict[str, str]:
    """What runs each called computation: ` (body of main/loop)` and the like."""
    roles = {}
    for comp, inst in module.all_instructions():
        for attr, role in (("body", "body"), ("condition", "condition"), ("to_apply", "callee"),
                           ("true_computation", "branch"), ("false_computation", "branch")):
            callee = inst.attr(attr) if inst.opcode in ("while", "call", "conditional") else None
            if callee is not None and hasattr(callee, "name"):
                roles.setdefault(callee.name, f" ({role} of {comp.name}/{inst.name})")
        for branch in inst.attr("branch_computations") or () if inst.opcode == "conditional" \
                else ():
            roles.setdefault(branch.name, f" (branch of {comp.name}/{inst.name})")
    return roles


def _collective_costs(cost) -> dict[str, dict[str, dict]]:
    """Per computation, per collective: what its box and details show."""
    found: dict[str, dict[str, dict]] = {}
    for c in cost.figures.collectives:
        sent = [b for b in c.bytes_sent_per_device if b is not None]
        found.setdefault(c.computation, {})[c.name] = {
            "bytes": max(sent) if sent else None, "seconds": c.seconds,
            "groups": c.groups, "group_size": c.group_size,
            "calls": "?" if c.calls is None else c.calls,
            "sent": _range(c.bytes_sent_per_device),
            "received": _range(c.bytes_received_per_device),
            "time": format_seconds(c.seconds), "algorithm": c.algorithm or ""}
    return found


def _range(values) -> str:
    from gspmdc.units import format_range
    return format_range(values, format_bytes)


__all__ = ["build_report"]
