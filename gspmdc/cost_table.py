"""`gspmdc cost`'s text report of a `ProgramCost`: the collectives, operations, memory, the
modelled step time and where it goes, and the most expensive instructions."""
from __future__ import annotations

from gspmdc.passes.analysis.cost import ProgramCost
from gspmdc.units import format_bytes, format_count, format_range, format_seconds

#: instructions listed under "most expensive instructions"
TOP_INSTRUCTIONS = 8


def format_cost(cost: ProgramCost) -> str:
    figures, memory, machine = cost.figures, cost.memory, cost.machine
    n = figures.num_partitions
    lines = [f"{figures.module} on {n} partition{'s' if n != 1 else ''}, machine {machine.name}: "
             f"{machine.description}", ""]
    lines += _collectives(cost)
    flops = figures.flops_per_device[0]
    matrix = figures.extra["matrix_flops_per_device"]
    lines += ["", f"operations per device: {format_count(flops)}FLOP"
              + (f" ({format_count(matrix)}FLOP in dots and convolutions)" if matrix else "")]
    peak = figures.extra["peak_memory"]
    capacity = "" if machine.memory_bytes is None else \
        f" of {format_bytes(machine.memory_bytes)}" + \
        ("" if figures.extra["fits_in_memory"] else "  (DOES NOT FIT)")
    lines += ["", f"peak memory per device: {format_bytes(memory.peak_bytes)}{capacity}, "
              f"at {peak['at']}",
              f"  parameters {format_bytes(peak['parameters'])}, output "
              f"{format_bytes(peak['output'])}, loop state {format_bytes(peak['loop_state'])}, "
              f"temporaries {format_bytes(peak['temporaries'])}",
              f"  (whole program: parameters {format_bytes(memory.parameter_bytes)}, output "
              f"{format_bytes(memory.output_bytes)})"]
    lines += [""] + _time(cost)
    return "\n".join(lines) + "\n"


def _collectives(cost: ProgramCost) -> list[str]:
    figures = cost.figures
    if not figures.collectives:
        return ["collectives: none"]
    rows = [("collective", "opcode", "groups", "calls", "sent/device", "received/device",
             "time", "algorithm", "why")]
    for c in figures.collectives:
        rows.append((c.name, c.opcode, f"{c.groups}x{c.group_size}",
                     "?" if c.calls is None else str(c.calls),
                     format_range(c.bytes_sent_per_device, format_bytes),
                     format_range(c.bytes_received_per_device, format_bytes),
                     format_seconds(c.seconds), c.algorithm or "", c.reason or ""))
    rows.append(("total", "", "", "", format_range(figures.total_bytes_sent_per_device,
                                                   format_bytes),
                 format_range(figures.total_bytes_received_per_device, format_bytes),
                 format_seconds(sum(c.seconds or 0.0 for c in figures.collectives)), "", ""))
    return ["collectives (bytes and time per run):"] + _table(rows)


def _time(cost: ProgramCost) -> list[str]:
    figures = cost.figures
    step = figures.modelled_step_seconds
    if step is None:
        endless = figures.extra.get("endless_loops")
        if not endless:
            return ["modelled step time: unknown (a loop's trip count is not static)"]
        return ["modelled step time: unknown (a loop never terminates once entered)"] + \
            [f"  {loop['computation']}/{loop['name']}: its condition reads "
             + (f"only element{'s' * (len(loop['condition_reads']) > 1)} "
                f"{', '.join(map(str, loop['condition_reads']))} of the loop state, "
                "which the body passes through unchanged" if loop["condition_reads"]
                else "nothing of the loop state")
             for loop in endless]
    lines = [f"modelled step time: {format_seconds(step)}"]
    utilization = figures.extra["modelled_utilization"]
    if utilization is not None:
        lines[0] += f", utilization {100 * utilization:.1f}% of the peak operation rate"
    lines.append("where the time goes:")
    shares = sorted(figures.seconds_by_kind.items(), key=lambda kv: -kv[1])
    for kind, seconds in shares:
        label = {"compute": "compute-bound instructions",
                 "memory": "memory-bound instructions"}.get(kind, kind)
        lines.append(f"  {label:<28} {format_seconds(seconds):>10}  "
                     f"{100 * seconds / step if step else 0.0:5.1f}%")
    top = [t for t in cost.instructions if t.seconds][:TOP_INSTRUCTIONS]
    if top:
        lines += ["most expensive instructions:"]
        rows = [("instruction", "opcode", "runs", "FLOP/run", "bytes/run", "time", "bound")]
        for t in top:
            rows.append((f"{t.computation}/{t.name}", t.opcode, str(t.executions),
                         format_count(t.flops), format_bytes(t.bytes_accessed),
                         format_seconds(t.seconds), t.bound))
        lines += _table(rows)
    return lines


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
            for row in rows]


__all__ = ["format_cost"]
