"""The report's memory plot: bytes live on one device over the entry computation's instructions
(`gspmdc.ir.liveness` timeline), as SVG.

Two series: the bytes live after each instruction (a step line) and the most bytes live while it
ran (bars above the line where a called computation or loop body peaks inside it). The peak is
marked; each point has a tooltip naming the instruction.
"""
from __future__ import annotations

from html import escape

from gspmdc.ir.liveness import MemoryProfile
from gspmdc.units import format_bytes

WIDTH, HEIGHT = 960, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 78, 18, 18, 44


def memory_svg(profile: MemoryProfile, capacity: int | None = None) -> str:
    points = profile.timeline
    if not points:
        return '<p class="note">The entry computation has no instructions to plot.</p>'
    top = max(max(p.peak_bytes for p in points), profile.peak_bytes, 1)
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    step = plot_w / len(points)

    def y(value: float) -> float:
        return MARGIN_TOP + plot_h * (1 - value / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="memory-chart" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
             f'aria-label="bytes live per device over the program">']
    for k in range(5):                                   # grid and y labels
        value = top * k / 4
        parts.append(f'<line class="grid" x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" '
                     f'y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
                     f'<text class="axis" x="{MARGIN_LEFT - 8}" y="{y(value) + 4:.1f}" '
                     f'text-anchor="end">{escape(format_bytes(round(value)))}</text>')
    for i, p in enumerate(points):                       # inner peaks
        if p.peak_bytes > p.after_bytes:
            parts.append(f'<rect class="inner-peak" x="{MARGIN_LEFT + i * step:.1f}" '
                         f'y="{y(p.peak_bytes):.1f}" width="{max(step, 1.5):.1f}" '
                         f'height="{y(p.after_bytes) - y(p.peak_bytes):.1f}">'
                         f'<title>{escape(p.name)} ({p.opcode}): up to '
                         f'{escape(format_bytes(p.peak_bytes))} inside</title></rect>')
    line = [f"M{MARGIN_LEFT},{y(points[0].after_bytes):.1f}"]
    for i, p in enumerate(points):
        line.append(f"H{MARGIN_LEFT + (i + 1) * step:.1f}")
        if i + 1 < len(points):
            line.append(f"V{y(points[i + 1].after_bytes):.1f}")
    area = " ".join(line) + f" V{y(0):.1f} H{MARGIN_LEFT} Z"
    parts.append(f'<path class="live-area" d="{area}"/>')
    parts.append(f'<path class="live-line" d="{" ".join(line)}"/>')
    for i, p in enumerate(points):                       # hover targets
        parts.append(f'<rect class="hover" x="{MARGIN_LEFT + i * step:.1f}" y="{MARGIN_TOP}" '
                     f'width="{max(step, 1.5):.1f}" height="{plot_h}"><title>'
                     f'{escape(p.name)} ({p.opcode}): {escape(format_bytes(p.after_bytes))} '
                     f'live after it, {escape(format_bytes(p.peak_bytes))} at most while it '
                     'ran</title></rect>')
    peak_index = max(range(len(points)), key=lambda i: points[i].peak_bytes)
    px = MARGIN_LEFT + (peak_index + 0.5) * step
    parts.append(f'<circle class="peak" cx="{px:.1f}" cy="{y(points[peak_index].peak_bytes):.1f}" '
                 f'r="4.5"/><text class="peak-label" x="{px:.1f}" '
                 f'y="{y(points[peak_index].peak_bytes) - 8:.1f}" text-anchor="middle">peak '
                 f'{escape(format_bytes(profile.peak_bytes))}</text>')
    if capacity is not None and capacity <= top:
        parts.append(f'<line class="capacity" x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" '
                     f'y1="{y(capacity):.1f}" y2="{y(capacity):.1f}"/>')
    parts.append(f'<line class="axis-line" x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" '
                 f'y1="{y(0):.1f}" y2="{y(0):.1f}"/>'
                 f'<text class="axis" x="{MARGIN_LEFT + plot_w / 2:.1f}" y="{HEIGHT - 10}" '
                 f'text-anchor="middle">instructions of the entry computation, in program '
                 f'order ({len(points)})</text></svg>')
    return "".join(parts)


__all__ = ["memory_svg"]
