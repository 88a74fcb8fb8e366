"""Numbers as people read them in gspmdc's reports: bytes (KiB, MiB, ...), seconds (ns ... s),
counts (k, M, G, ...)."""
from __future__ import annotations


def format_bytes(n: int | float | None) -> str:
    """`1536` → `1.5 KiB`; None → `?`."""
    if n is None:
        return "?"
    if abs(n) < 1024:
        return f"{n:g} B"
    exponent = 0
    value = float(n)
    while abs(value) >= 1024 and exponent < 5:
        value /= 1024
        exponent += 1
    return f"{value:.1f} {('KiB', 'MiB', 'GiB', 'TiB', 'PiB')[exponent - 1]}"


def format_seconds(s: float | None) -> str:
    """`2.5e-05` → `25.0 µs`; None → `?`."""
    if s is None:
        return "?"
    if s == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def format_count(n: int | float | None) -> str:
    """`132096` → `132.1 k`; None → `?`."""
    if n is None:
        return "?"
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:g}"


def format_range(values, fmt) -> str:
    """One figure when every device has the same, else `min … max`."""
    values = list(values)
    if any(v is None for v in values):
        return fmt(None)
    low, high = min(values), max(values)
    return fmt(low) if low == high else f"{fmt(low)} … {fmt(high)}"


__all__ = ["format_bytes", "format_seconds", "format_count", "format_range"]
