"""The report's HTML: one self-contained page (inline CSS, SVG and script; no network, no
server) with the summary, the program graphs, the cost tables, the memory plot, the passes and
the shardings of the inputs and outputs. `render(report)` returns the page's text."""
from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape

from gspmdc.passes.analysis.cost import ProgramCost
from gspmdc.units import format_bytes, format_count, format_range, format_seconds

from .pass_history import PassStep


@dataclass(frozen=True)
class ReportContent:
    """Everything the page shows, already computed."""

    title: str
    source: str
    num_partitions: int
    cost: ProgramCost
    graphs: list[tuple[str, str]]          # (computation name, svg)
    legend: dict[str, str]                 # sharding text -> colour
    details: dict[str, dict]
    memory_svg: str
    input_text: str
    steps: list[PassStep]
    compile_seconds: float
    shardings: str                         # the sharding pictures (plain text)


def render(content: ReportContent) -> str:
    figures = content.cost.figures
    sections = [_summary(content), _graph_section(content), _cost_section(content),
                _memory_section(content), _passes_section(content), _shardings_section(content)]
    details = json.dumps(content.details).replace("</", "<\\/")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(content.title)} — gspmdc report</title>"
            f"<style>{CSS}</style></head><body>"
            f"<header><h1>{escape(figures.module)} <span class=\"sub\">on "
            f"{content.num_partitions} partitions</span></h1>"
            f"<p class=\"source\">{escape(content.source)} · machine "
            f"{escape(content.cost.machine.name)}: {escape(content.cost.machine.description)}</p>"
            "<nav><a href=\"#graph\">Program graph</a><a href=\"#cost\">Cost</a>"
            "<a href=\"#memory\">Memory</a><a href=\"#passes\">Passes</a>"
            "<a href=\"#shardings\">Shardings</a></nav></header><main>"
            + "".join(sections) +
            f"</main><script type=\"application/json\" id=\"details\">{details}</script>"
            f"<script>{SCRIPT}</script></body></html>\n")


def _card(label: str, value: str, note: str = "") -> str:
    return (f'<div class="card"><div class="label">{escape(label)}</div>'
            f'<div class="value">{escape(value)}</div>'
            f'<div class="note">{escape(note)}</div></div>')


def _summary(content: ReportContent) -> str:
    figures, memory = content.cost.figures, content.cost.memory
    utilization = figures.extra["modelled_utilization"]
    capacity = content.cost.machine.memory_bytes
    cards = [
        _card("collectives", str(len(figures.collectives)),
              f"{format_range(figures.total_bytes_sent_per_device, format_bytes)} sent per "
              "device per run"),
        _card("modelled step time", format_seconds(figures.modelled_step_seconds),
              "" if utilization is None else f"{100 * utilization:.1f}% utilization"),
        _card("peak memory per device", format_bytes(memory.peak_bytes),
              "" if capacity is None else f"of {format_bytes(capacity)}"),
        _card("operations per device", f"{format_count(figures.flops_per_device[0])}FLOP",
              f"{format_count(figures.extra['matrix_flops_per_device'])}FLOP in dots and "
              "convolutions"),
        _card("partitioning", format_seconds(content.compile_seconds),
              f"{len(content.steps)} passes"),
    ]
    return f'<section class="summary">{"".join(cards)}</section>'


def _graph_section(content: ReportContent) -> str:
    options = "".join(f'<option value="{k}">{escape(name)}</option>'
                      for k, (name, _) in enumerate(content.graphs))
    graphs = "".join(f'<div class="graph" data-index="{k}"{"" if k == 0 else " hidden"}>'
                     f'{svg}</div>' for k, (_, svg) in enumerate(content.graphs))
    legend = "".join(f'<li><span class="swatch" style="background:{colour}"></span>'
                     f'<code>{escape(text)}</code></li>'
                     for text, colour in content.legend.items())
    return ('<section id="graph"><h2>Program graph</h2>'
            '<p class="help">The partitioned program, one computation at a time. Each value is '
            'coloured by its sharding; <span class="key collective">red boxes</span> are '
            'collectives (bytes each device sends per run, modelled time); '
            '<span class="key partitioner">dashed boxes</span> are other instructions the '
            'partitioner made. Click a box for its details; drag to pan, scroll to zoom.</p>'
            f'<div class="toolbar"><label>computation <select id="computation">{options}'
            '</select></label><button type="button" id="fit">fit</button>'
            '<button type="button" id="zoom-in">+</button>'
            '<button type="button" id="zoom-out">−</button></div>'
            f'<div class="graph-area"><div class="viewport" id="viewport">{graphs}</div>'
            '<aside id="panel"><p class="hint">Click an instruction.</p></aside></div>'
            '<h3>Shardings</h3><ul class="legend"><li><span class="swatch" '
            'style="background:#e5e7eb"></span><code>{replicated}</code></li>'
            f'<li><span class="swatch" style="background:#fff"></span>no sharding (the '
            f'partitioner\'s own values)</li>{legend}</ul></section>')


def _cost_section(content: ReportContent) -> str:
    cost = content.cost
    figures = cost.figures
    rows = []
    for c in figures.collectives:
        rows.append(
            "<tr>" + "".join(f"<td>{escape(v)}</td>" for v in (
                c.name, c.opcode, f"{c.groups} × {c.group_size}",
                "?" if c.calls is None else str(c.calls),
                format_range(c.bytes_sent_per_device, format_bytes),
                format_range(c.bytes_received_per_device, format_bytes),
                format_seconds(c.seconds), c.algorithm or "")) +
            f'<td class="reason">{escape(c.reason or "")}</td></tr>')
    table = ("<table><thead><tr><th>collective</th><th>opcode</th><th>groups</th>"
             "<th>calls</th><th>sent / device</th><th>received / device</th><th>time</th>"
             "<th>algorithm</th><th>why the partitioner put it there</th></tr></thead><tbody>"
             + "".join(rows) + "</tbody></table>") if rows else \
        "<p>No collectives: every device computes on its own data.</p>"
    step = figures.modelled_step_seconds or 0.0
    bar, keys = [], []
    colours = {"compute": "#2a9d8f", "memory": "#8ab17d", "all-reduce": "#e76f51",
               "all-gather": "#f4a261", "reduce-scatter": "#e9c46a", "all-to-all": "#9d4edd",
               "collective-permute": "#d62828"}
    for kind, seconds in sorted(figures.seconds_by_kind.items(), key=lambda kv: -kv[1]):
        share = 100 * seconds / step if step else 0.0
        name = {"compute": "compute-bound", "memory": "memory-bound"}.get(kind, kind)
        colour = colours.get(kind, "#999")
        if share > 0:
            bar.append(f'<span style="width:{share:.2f}%;background:{colour}" '
                       f'title="{escape(name)}: {escape(format_seconds(seconds))}"></span>')
        keys.append(f'<li><span class="swatch" style="background:{colour}"></span>'
                    f'{escape(name)} {escape(format_seconds(seconds))} ({share:.1f}%)</li>')
    top = [t for t in cost.instructions if t.seconds][:12]
    top_rows = "".join(
        "<tr>" + "".join(f"<td>{escape(v)}</td>" for v in (
            f"{t.computation}/{t.name}", t.opcode, str(t.executions), format_count(t.flops),
            format_bytes(t.bytes_accessed), format_seconds(t.seconds), t.bound)) + "</tr>"
        for t in top)
    peak = figures.extra["peak_memory"]
    return ('<section id="cost"><h2>Cost</h2>'
            f'<p class="help">Modelled on {escape(cost.machine.name)} before running: bytes '
            'are per device per run (a loop body\'s collectives once per iteration); times '
            'use the ring or tree algorithm, whichever is faster.</p>'
            f'{table}<h3>Where the time goes</h3><p>modelled step time '
            f'<strong>{escape(format_seconds(figures.modelled_step_seconds))}</strong></p>'
            f'<div class="bar">{"".join(bar)}</div><ul class="legend">{"".join(keys)}</ul>'
            '<h3>Most expensive instructions</h3><table><thead><tr><th>instruction</th>'
            '<th>opcode</th><th>runs</th><th>FLOP / run</th><th>bytes / run</th><th>time</th>'
            f'<th>bound by</th></tr></thead><tbody>{top_rows}</tbody></table>'
            '<h3>Per device</h3><table class="narrow"><tbody>'
            f'<tr><th>operations</th><td>{escape(format_count(figures.flops_per_device[0]))}'
            'FLOP</td></tr>'
            f'<tr><th>peak memory</th><td>{escape(format_bytes(content.cost.memory.peak_bytes))}'
            f' at {escape(peak["at"])}</td></tr>'
            '<tr><th>parameters</th><td>'
            f'{escape(format_bytes(content.cost.memory.parameter_bytes))}</td></tr>'
            '<tr><th>output</th><td>'
            f'{escape(format_bytes(content.cost.memory.output_bytes))}</td></tr>'
            '</tbody></table></section>')


def _memory_section(content: ReportContent) -> str:
    peak = content.cost.figures.extra["peak_memory"]
    memory = content.cost.memory
    return ('<section id="memory"><h2>Memory per device over time</h2>'
            f'<p class="help">Bytes live on one device after each instruction of the entry '
            f'computation (every one of the {content.num_partitions} devices runs the same '
            'program on equal-sized pieces); bars show where a loop or called computation peaks '
            'inside an instruction. From the liveness of the partitioned program: parameters '
            'live throughout, values until their last use.</p>'
            f'{content.memory_svg}'
            f'<p>Peak <strong>{escape(format_bytes(memory.peak_bytes))}</strong> at '
            f'<code>{escape(peak["at"])}</code>: parameters '
            f'{escape(format_bytes(peak["parameters"]))}, output '
            f'{escape(format_bytes(peak["output"]))}, loop state '
            f'{escape(format_bytes(peak["loop_state"]))}, temporaries '
            f'{escape(format_bytes(peak["temporaries"]))}.</p></section>')


def _passes_section(content: ReportContent) -> str:
    items = [f'<details><summary><span class="pass">input</span> the module as given</summary>'
             f'<pre class="module">{escape(content.input_text)}</pre></details>']
    for step in content.steps:
        change = ", ".join([f"+{v} {k}" for k, v in sorted(step.added.items())] +
                           [f"−{v} {k}" for k, v in sorted(step.removed.items())])
        lines = []
        for line in step.diff:
            css = "add" if line.startswith("+") else "del" if line.startswith("-") else \
                "hunk" if line.startswith("@@") else "ctx"
            lines.append(f'<span class="{css}">{escape(line)}</span>')
        diff = "\n".join(lines) if lines else "(the module text did not change)"
        items.append(
            f'<details><summary><span class="pass">{escape(step.name)}</span> '
            f'{escape(format_seconds(step.seconds))} · {step.instructions} instructions'
            f'{" · " + escape(change) if change else ""}</summary>'
            f'<pre class="diff">{diff}</pre><details class="full"><summary>the module after '
            f'{escape(step.name)}</summary><pre class="module">{escape(step.text)}</pre>'
            '</details></details>')
    return ('<section id="passes"><h2>Passes</h2><p class="help">The module after each pass '
            'and what the pass changed (a line diff; instructions added and removed by '
            f'opcode).</p>{"".join(items)}</section>')


def _shardings_section(content: ReportContent) -> str:
    return ('<section id="shardings"><h2>Shardings of the inputs and outputs</h2>'
            f'<pre class="pictures">{escape(content.shardings)}</pre></section>')


CSS = """
:root { --ink:#1f2933; --muted:#5f6c7b; --line:#d9dee5; --bg:#f7f8fa; --accent:#1d4ed8; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
       color:var(--ink); background:var(--bg); }
header { background:#111827; color:#f9fafb; padding:18px 28px 0; }
header h1 { margin:0; font-size:22px; font-weight:650; }
header .sub { font-weight:400; color:#cbd5e1; }
header .source { margin:4px 0 12px; color:#9ca3af; font-size:13px; }
nav { display:flex; gap:4px; }
nav a { color:#e5e7eb; text-decoration:none; padding:8px 14px; border-radius:6px 6px 0 0; }
nav a:hover { background:#1f2937; }
main { padding:0 28px 40px; max-width:1500px; }
section { margin-top:26px; background:#fff; border:1px solid var(--line); border-radius:10px;
          padding:18px 22px; }
section.summary { display:grid; grid-template-columns:repeat(auto-fit,minmax(200px,1fr));
                  gap:14px; background:none; border:none; padding:0; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.card .label { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.card .value { font-size:24px; font-weight:650; margin:2px 0; }
.card .note { color:var(--muted); font-size:12.5px; }
h2 { margin:0 0 6px; font-size:18px; }
h3 { margin:20px 0 8px; font-size:15px; }
.help { color:var(--muted); margin:0 0 12px; max-width:900px; }
.key { padding:0 4px; border-radius:3px; }
.key.collective { border:1.5px solid #d62828; }
.key.partitioner { border:1.5px dashed #6b7280; }
.toolbar { display:flex; gap:8px; align-items:center; margin-bottom:8px; }
.toolbar select, .toolbar button { font:inherit; padding:3px 10px; border:1px solid var(--line);
                                   border-radius:6px; background:#fff; cursor:pointer; }
.graph-area { display:grid; grid-template-columns:minmax(0,1fr) 320px; gap:12px; }
.viewport { height:640px; overflow:hidden; border:1px solid var(--line); border-radius:8px;
            background:#fcfcfd; cursor:grab; position:relative; }
.viewport.dragging { cursor:grabbing; }
.graph svg { display:block; transform-origin:0 0; }
#panel { border:1px solid var(--line); border-radius:8px; padding:12px 14px; height:640px;
         overflow:auto; font-size:13px; background:#fff; }
#panel h4 { margin:0 0 8px; font-size:15px; word-break:break-all; }
#panel dl { margin:0; display:grid; grid-template-columns:auto 1fr; gap:4px 10px; }
#panel dt { color:var(--muted); }
#panel dd { margin:0; word-break:break-word; }
#panel .hint { color:var(--muted); }
.edge { fill:none; stroke:#94a3b8; stroke-width:1.3; }
.node rect { stroke:#475569; stroke-width:1; }
.node.collective rect { stroke:#d62828; stroke-width:2; }
.node.partitioner rect { stroke:#6b7280; stroke-dasharray:4 3; }
.node.parameter rect { stroke-width:1.8; }
.node text { text-anchor:middle; font:11.5px ui-monospace,SFMono-Regular,Menlo,monospace;
             fill:#111827; pointer-events:none; }
.node text.name { font-weight:700; }
.node text.cost { fill:#9b1c1c; font-weight:600; }
.node { cursor:pointer; }
.node:hover rect, .node.selected rect { stroke:#1d4ed8; stroke-width:2.5; }
.legend { list-style:none; padding:0; margin:0; display:flex; flex-wrap:wrap; gap:6px 18px; }
.legend li { display:flex; align-items:center; gap:6px; }
.swatch { display:inline-block; width:14px; height:14px; border-radius:3px;
          border:1px solid #94a3b8; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line);
         vertical-align:top; }
th { color:var(--muted); font-weight:600; background:#f9fafb; }
td.reason { color:#374151; max-width:460px; }
table.narrow { width:auto; }
.bar { display:flex; height:20px; border-radius:5px; overflow:hidden; background:#eef0f3;
       margin:6px 0 8px; }
.bar span { display:block; height:100%; }
.memory-chart .grid { stroke:#e5e7eb; }
.memory-chart .axis { font-size:11px; fill:var(--muted); }
.memory-chart .axis-line { stroke:#9ca3af; }
.memory-chart .live-area { fill:#bfdbfe; opacity:.55; }
.memory-chart .live-line { fill:none; stroke:#1d4ed8; stroke-width:1.8; }
.memory-chart .inner-peak { fill:#f59e0b; opacity:.75; }
.memory-chart .hover { fill:transparent; }
.memory-chart .hover:hover { fill:rgba(29,78,216,.08); }
.memory-chart .peak { fill:#d62828; }
.memory-chart .peak-label { font-size:12px; font-weight:600; fill:#9b1c1c; }
.memory-chart .capacity { stroke:#d62828; stroke-dasharray:6 4; }
details { border:1px solid var(--line); border-radius:8px; margin:8px 0; background:#fff; }
details > summary { cursor:pointer; padding:8px 12px; }
details .pass { font-weight:650; font-family:ui-monospace,Menlo,monospace; margin-right:6px; }
details.full { margin:8px 12px 12px; }
pre { margin:0; padding:10px 12px; overflow:auto; max-height:520px;
      font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace; background:#fbfbfc; }
pre.diff .add { color:#166534; background:#ecfdf3; display:block; }
pre.diff .del { color:#991b1b; background:#fef2f2; display:block; }
pre.diff .hunk { color:#6d28d9; display:block; }
pre.pictures { max-height:none; }
code { font-family:ui-monospace,Menlo,monospace; font-size:12.5px; }
"""

SCRIPT = """
(function () {
  "use strict";
  var details = JSON.parse(document.getElementById("details").textContent);
  var viewport = document.getElementById("viewport");
  var panel = document.getElementById("panel");
  var select = document.getElementById("computation");
  var scale = 1, dx = 0, dy = 0;
  function current() { return viewport.querySelector(".graph:not([hidden]) svg"); }
  function apply() {
    var svg = current();
    if (svg) { svg.style.transform = "translate(" + dx + "px," + dy + "px) scale(" + scale + ")"; }
  }
  function fit() {
    var svg = current();
    if (!svg) { return; }
    var w = svg.width.baseVal.value, h = svg.height.baseVal.value;
    var across = (viewport.clientWidth - 16) / w, down = (viewport.clientHeight - 16) / h;
    // the whole graph when it stays readable, else its full width from the top
    scale = Math.min(1, Math.min(across, down) >= 0.45 ? Math.min(across, down) : across);
    dx = Math.max(8, (viewport.clientWidth - w * scale) / 2);
    dy = Math.max(8, (viewport.clientHeight - h * scale) / 2);
    apply();
  }
  function zoom(factor, cx, cy) {
    var next = Math.max(0.05, Math.min(4, scale * factor));
    dx = cx - (cx - dx) * next / scale; dy = cy - (cy - dy) * next / scale; scale = next;
    apply();
  }
  select.addEventListener("change", function () {
    viewport.querySelectorAll(".graph").forEach(function (g) {
      g.hidden = g.getAttribute("data-index") !== select.value;
    });
    fit();
  });
  document.getElementById("fit").addEventListener("click", fit);
  document.getElementById("zoom-in").addEventListener("click", function () {
    zoom(1.25, viewport.clientWidth / 2, viewport.clientHeight / 2);
  });
  document.getElementById("zoom-out").addEventListener("click", function () {
    zoom(0.8, viewport.clientWidth / 2, viewport.clientHeight / 2);
  });
  viewport.addEventListener("wheel", function (e) {
    e.preventDefault();
    var box = viewport.getBoundingClientRect();
    zoom(e.deltaY < 0 ? 1.1 : 0.9, e.clientX - box.left, e.clientY - box.top);
  }, { passive: false });
  var drag = null;
  viewport.addEventListener("mousedown", function (e) {
    drag = { x: e.clientX, y: e.clientY, dx: dx, dy: dy, moved: false };
    viewport.classList.add("dragging");
  });
  window.addEventListener("mousemove", function (e) {
    if (!drag) { return; }
    if (Math.abs(e.clientX - drag.x) + Math.abs(e.clientY - drag.y) > 3) { drag.moved = true; }
    dx = drag.dx + e.clientX - drag.x; dy = drag.dy + e.clientY - drag.y; apply();
  });
  window.addEventListener("mouseup", function () {
    viewport.classList.remove("dragging");
    setTimeout(function () { drag = null; }, 0);
  });
  function field(dl, label, value) {
    if (value === undefined || value === null || value === "" ||
        (Array.isArray(value) && value.length === 0)) { return; }
    var dt = document.createElement("dt"); dt.textContent = label;
    var dd = document.createElement("dd");
    dd.textContent = Array.isArray(value) ? value.join(", ") : String(value);
    dl.appendChild(dt); dl.appendChild(dd);
  }
  function show(key, node) {
    var d = details[key];
    if (!d) { return; }
    viewport.querySelectorAll(".node.selected").forEach(function (n) {
      n.classList.remove("selected");
    });
    node.classList.add("selected");
    panel.textContent = "";
    var h = document.createElement("h4"); h.textContent = d.name; panel.appendChild(h);
    var dl = document.createElement("dl");
    field(dl, "opcode", d.opcode);
    field(dl, "shape", d.shape + " per device");
    field(dl, "computation", d.computation);
    field(dl, "sharding", d.sharding || "none");
    field(dl, "operands", d.operands);
    field(dl, "constants and indices", d.small_operands);
    if (d.cost) {
      field(dl, "groups", d.cost.groups + " of " + d.cost.group_size);
      field(dl, "calls per run", d.cost.calls);
      field(dl, "sent per device", d.cost.sent);
      field(dl, "received per device", d.cost.received);
      field(dl, "modelled time", d.cost.time + " (" + d.cost.algorithm + ")");
    }
    field(dl, "why", d.spmd_reason);
    field(dl, "step", d.spmd_step);
    field(dl, "for", d.op_name);
    field(dl, "value", d.spmd_value);
    field(dl, "from", d.spmd_from);
    field(dl, "to", d.spmd_to);
    panel.appendChild(dl);
  }
  viewport.addEventListener("click", function (e) {
    if (drag && drag.moved) { return; }
    var node = e.target.closest(".node");
    if (node) { show(node.getAttribute("data-id"), node); }
  });
  viewport.addEventListener("keydown", function (e) {
    var node = e.target.closest && e.target.closest(".node");
    if (node && (e.key === "Enter" || e.key === " ")) { show(node.getAttribute("data-id"), node); }
  });
  fit();
}());
"""

__all__ = ["render", "ReportContent"]
