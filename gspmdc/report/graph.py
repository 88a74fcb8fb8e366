"""The program graph of the report: one computation of the partitioned program as SVG.

Every value is a box coloured by its sharding (one colour per distinct sharding, grey for
replicated, listed in a legend); the partitioner's collectives are red-bordered boxes labelled
with the bytes each device sends per run and their modelled time; the partitioner's other
instructions (slices, masks, halo bookkeeping) have dashed borders. Small constants and index
bookkeeping (`partition-id` and the offset tables read with it) are left out of the drawing and
listed in the details of the instructions that read them. Each box carries `data-id`, the key
of its entry in the details the page shows on click.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape
from math import prod

from gspmdc.ir.ops import COLLECTIVES, opcodes
from gspmdc.ir.module import Computation, Instruction
from gspmdc.ir.sharding import HloSharding
from gspmdc.units import format_bytes, format_seconds

from .layout import layout

NODE_HEIGHT = 44
CHAR_WIDTH = 6.6
#: fill colours of shardings, in order of first appearance (replicated is grey)
PALETTE = ("#8ecae6", "#ffb703", "#90be6d", "#f4a261", "#b5a7e6", "#f28482", "#84dcc6",
           "#e9c46a", "#a3c4f3", "#cdb4db", "#ffc8dd", "#b8e0d2", "#f6bd60", "#9ad1d4",
           "#d4a373", "#c1d3fe")
REPLICATED_COLOUR = "#e5e7eb"
NONE_COLOUR = "#ffffff"
#: opcodes of index bookkeeping values (left out when small and integer)
_BOOKKEEPING = opcodes("constant", "partition-id", "replica-id", "dynamic-slice", "reshape",
                       "convert", "add", "subtract", "multiply", "broadcast", "iota", "compare",
                       "select", "clamp", "minimum", "maximum", "divide", "remainder")


@dataclass
class Legend:
    """Sharding text → colour, shared by every graph of a report."""

    colours: dict[str, str]

    def colour(self, sharding: HloSharding | None) -> str:
        if sharding is None:
            return NONE_COLOUR
        if sharding.kind == "replicated":
            return REPLICATED_COLOUR
        text = sharding.to_text(include_metadata=False)
        if text not in self.colours:
            self.colours[text] = PALETTE[len(self.colours) % len(PALETTE)]
        return self.colours[text]


def hidden_instructions(comp: Computation) -> set[Instruction]:
    """What the drawing leaves out: small constants (at most 64 elements, any type), and index
    bookkeeping: small integer values computed from those and `partition-id` only (the
    partitioner's offset tables and what it reads from them)."""
    hidden: set[Instruction] = set()
    for inst in comp.instructions:
        shape = inst.shape
        if inst.opcode == "constant" and inst is not comp.root and not shape.is_tuple and \
                prod(shape.dims) <= 64:
            hidden.add(inst)
            continue
        if inst.opcode not in _BOOKKEEPING or inst is comp.root or shape.is_tuple or \
                shape.element_type not in ("s32", "u32", "s64", "u64", "s16", "u16", "s8",
                                           "u8", "pred") or prod(shape.dims) > 64:
            continue
        if all(o in hidden for o in inst.operands):
            hidden.add(inst)
    return hidden


def computation_svg(comp: Computation, legend: Legend, details: dict, prefix: str,
                    collective_costs: dict[str, dict]) -> str:
    """The SVG of `comp`; adds each node's details to `details` under `prefix/name`."""
    hidden = hidden_instructions(comp)
    shown = [inst for inst in comp.instructions if inst not in hidden]
    labels = {inst: _labels(inst, collective_costs.get(inst.name)) for inst in shown}
    widths = {inst: max(90.0, CHAR_WIDTH * max(len(line) for line in labels[inst]) + 18)
              for inst in shown}
    edges = [(o, inst) for inst in shown for o in inst.operands if o not in hidden]
    drawing = layout(shown, edges, widths)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="program-graph" '
             f'width="{drawing.width:.0f}" height="{drawing.height:.0f}" '
             f'viewBox="0 0 {drawing.width:.0f} {drawing.height:.0f}">',
             '<defs><marker id="arrow-' + prefix + '" viewBox="0 0 10 10" refX="9" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M0,1 L10,5 L0,9 z" fill="#94a3b8"/></marker></defs>',
             '<g class="edges">']
    for (u, v), points in drawing.routes.items():
        parts.append(f'<path class="edge" d="{_path(points, u, v)}" '
                     f'marker-end="url(#arrow-{prefix})"/>')
    parts.append('</g><g class="nodes">')
    for inst in shown:
        key = f"{prefix}/{inst.name}"
        details[key] = _details(inst, comp, hidden, collective_costs.get(inst.name))
        x, y = drawing.positions[inst]
        parts.append(_node(inst, key, x, y, widths[inst], labels[inst], legend))
    parts.append("</g></svg>")
    return "".join(parts)


def _kind(inst: Instruction) -> str:
    metadata = inst.attr("metadata")
    if inst.opcode in COLLECTIVES:
        return "collective"
    if metadata is not None and metadata.get("spmd_reason") is not None:
        return "partitioner"
    if inst.opcode == "parameter":
        return "parameter"
    return "program"


def _labels(inst: Instruction, cost: dict | None) -> list[str]:
    lines = [_clip(inst.name, 34), _clip(f"{inst.opcode} {inst.shape.without_layout()}", 40)]
    if cost is not None:
        lines.append(f"{format_bytes(cost['bytes'])} sent · {format_seconds(cost['seconds'])}")
    return lines


def _node(inst: Instruction, key: str, x: float, y: float, width: float, lines: list[str],
          legend: Legend) -> str:
    kind = _kind(inst)
    height = _height(inst)
    fill = legend.colour(inst.sharding) if kind != "collective" else "#fff1f0"
    left, top = x - width / 2, y - height / 2
    texts = []
    for k, line in enumerate(lines):
        css = ("name", "op", "cost")[k]
        texts.append(f'<text class="{css}" x="{x:.1f}" y="{top + 16 + 14 * k:.1f}">'
                     f'{escape(line)}</text>')
    metadata = inst.attr("metadata")
    reason = metadata.get("spmd_reason") if metadata is not None else None
    tip = inst.name + (f": {reason}" if reason else "")
    return (f'<g class="node {kind}" data-id="{escape(key)}" tabindex="0">'
            f'<title>{escape(tip)}</title>'
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{width:.1f}" height="{height}" '
            f'rx="{10 if kind == "collective" else 5}" fill="{fill}"/>'
            + "".join(texts) + "</g>")


def _height(inst: Instruction) -> int:
    """Collectives have a third line (their cost)."""
    return NODE_HEIGHT + (14 if inst.opcode in COLLECTIVES else 0)


def _path(points: list[tuple[float, float]], u: Instruction, v: Instruction) -> str:
    """A smooth path from the bottom of `u` through the bends to the top of `v`."""
    (x0, y0), (x1, y1) = points[0], points[-1]
    points = [(x0, y0 + _height(u) / 2)] + points[1:-1] + [(x1, y1 - _height(v) / 2 - 1)]
    d = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for (ax, ay), (bx, by) in zip(points, points[1:]):
        middle = (ay + by) / 2
        d.append(f"C{ax:.1f},{middle:.1f} {bx:.1f},{middle:.1f} {bx:.1f},{by:.1f}")
    return " ".join(d)


def _details(inst: Instruction, comp: Computation, hidden: set, cost: dict | None) -> dict:
    metadata = inst.attr("metadata")
    entry = {"name": inst.name, "computation": comp.name, "opcode": inst.opcode,
             "shape": str(inst.shape.without_layout()),
             "sharding": None if inst.sharding is None else
             inst.sharding.to_text(include_metadata=False),
             "operands": [o.name for o in inst.operands if o not in hidden],
             "small_operands": [o.name for o in inst.operands if o in hidden]}
    if metadata is not None:
        for key in ("spmd_reason", "spmd_step", "op_name", "spmd_value", "spmd_from", "spmd_to"):
            if metadata.get(key) is not None:
                entry[key] = str(metadata.get(key))
    if cost is not None:
        entry["cost"] = cost
    return entry


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else text[:length - 1] + "…"


__all__ = ["computation_svg", "Legend", "hidden_instructions"]
