"""Pictures of a sharding in the terminal: which device holds which tile of a value.

`describe_value(name, shape, sharding, num_devices, mesh)` gives the lines `gspmdc show` prints
for one value:

- a summary: each dimension split how many ways (over which mesh axes, when a mesh names them),
  the devices that hold each tile (partial replication, and over which axes), the tile shape;
- a grid per 2-D slab of tiles: the last two dimensions are the rows and columns (one row for a
  rank-1 value, one cell for a scalar), and every combination of tiles of the leading dimensions
  gets its own grid, titled with its index ranges. Column widths follow the tiles' extents, so
  uneven tiles look uneven; a tile's range is `[start:limit)`, with `+k pad` when its shard is
  padded (the last tiles of an uneven dimension) and `empty` when it holds only padding. Each cell
  lists the devices holding the tile (`0-3` for a run of ids).

Replicated, maximal (one device), manual (per-device values), unknown and unreduced values are
said in words; tuples show each element.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import prod
from typing import Sequence

from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, Shape

#: grids drawn per value at most (the rest are counted)
MAX_GRIDS = 16
#: background colours of tiles (ANSI 256-colour codes, light enough for black text)
_COLOURS = (153, 187, 223, 218, 194, 230, 189, 152, 224, 195, 229, 183, 158, 217, 151, 225)


@dataclass(frozen=True)
class DimTiles:
    """One dimension: its size, tile count, and each tile's `(start, limit, padding)`."""

    size: int
    count: int
    tiles: tuple[tuple[int, int, int], ...]

    def label(self, i: int) -> str:
        start, limit, padding = self.tiles[i]
        if start == limit:
            return f"empty (+{padding} pad)"
        text = f"[{start}:{limit})"
        return text + (f" +{padding} pad" if padding else "")


def dim_tiles(size: int, count: int) -> DimTiles:
    """The tiles of a dimension of `size` cut `count` ways (the shard is `ceil(size/count)`
    everywhere; the last tiles are clamped and padded)."""
    shard = -(-size // count) if count else size
    tiles = []
    for i in range(count):
        start, limit = min(i * shard, size), min((i + 1) * shard, size)
        tiles.append((start, limit, shard - (limit - start)))
    return DimTiles(size, count, tuple(tiles))


def device_list(devices: Sequence[int]) -> str:
    """`[0,1,2,3,8]` → `0-3,8` (runs of consecutive ids in the order given)."""
    parts = []
    run: list[int] = []
    for d in list(devices) + [None]:
        if run and d is not None and d == run[-1] + 1:
            run.append(d)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else
                         f"{run[0]},{run[1]}" if len(run) == 2 else f"{run[0]}-{run[-1]}")
        run = [] if d is None else [d]
    return ",".join(parts)


def mesh_mapping(sharding: HloSharding, mesh: Mesh, rank: int):
    """The mesh axes behind a tiled sharding (only replicated subgroups): for each dimension the
    tuple of axis names splitting it (major to minor), and the axes it is replicated over; None
    when no assignment of the mesh's axes gives this sharding."""
    if sharding.kind != "tiled" or set(sharding.subgroup_types) - {"replicated"} or \
            sharding.data_rank != rank or mesh.num_devices != sharding.tile_assignment.num_devices:
        return None
    axes = [a for a, s in zip(mesh.axis_names, mesh.axis_sizes) if s > 1]
    target = HloSharding.tiled(sharding.tile_assignment, sharding.subgroup_types)
    for placement in itertools.product(range(rank + 1), repeat=len(axes)):
        by_dim = [[a for a, d in zip(axes, placement) if d == dim] for dim in range(rank)]
        if any(prod(mesh.axis_size(a) for a in names) != count
               for names, count in zip(by_dim, sharding.tile_counts)):
            continue
        for orders in itertools.product(*(itertools.permutations(n) for n in by_dim)):
            mapping = [tuple(o) if o else None for o in orders]
            try:
                candidate = mesh.sharding(mapping, rank)
            except Exception:   # noqa: BLE001 - an impossible assignment is just not this one
                continue
            if candidate == target:
                replicated = tuple(a for a, d in zip(axes, placement) if d == rank)
                return [tuple(o) for o in orders], replicated
    return None


def describe_value(name: str, shape: Shape, sharding: HloSharding | None, num_devices: int,
                   mesh: Mesh | None = None, colour: bool = False, width: int = 72,
                   per_device_shape: bool = False) -> list[str]:
    """The lines picturing value `name` (see the module docstring). `per_device_shape`: the
    shape is one device's (a partitioned module), the global one is its tiles put together."""
    if sharding is not None and sharding.kind == "tuple":
        lines = []
        for i, (leaf_shape, leaf) in enumerate(zip(shape.leaves(), sharding.leaf_shardings(shape))):
            lines += describe_value(f"{name}{{{i}}}", leaf_shape, leaf, num_devices, mesh, colour,
                                    width, per_device_shape)
        return lines
    if not isinstance(shape, ArrayShape):
        leaves = list(shape.leaves())
        lines = []
        for i, leaf_shape in enumerate(leaves):
            lines += describe_value(f"{name}{{{i}}}", leaf_shape, sharding, num_devices, mesh,
                                    colour, width, per_device_shape)
        return lines
    text = "none (replicated unless propagation gives it one)" if sharding is None \
        else sharding.to_text(include_metadata=False)
    head = f"{name}: {shape.without_layout()}  sharding={text}"
    if sharding is None or sharding.kind == "replicated":
        return [head, f"  every device (0-{num_devices - 1}) holds the whole value", ""]
    if sharding.kind == "maximal":
        return [head, f"  device {sharding.device} holds the whole value; the others hold "
                      "nothing", ""]
    if sharding.kind == "manual":
        return [head, "  manual: each device holds its own value of this shape (per-device "
                      "data, not tiles of one array)", ""]
    if sharding.kind in ("unknown", "unreduced"):
        return [head, f"  {sharding.kind}: " + (
            "each device holds an addend; the value is their sum" if sharding.kind == "unreduced"
            else "any sharding may be chosen"), ""]
    return _tiled(head, shape, sharding, mesh, colour, width, per_device_shape)


def _tiled(head: str, shape: ArrayShape, sharding: HloSharding, mesh: Mesh | None,
           colour: bool, width: int, per_device_shape: bool) -> list[str]:
    counts = sharding.tile_counts
    dims = tuple(d * c for d, c in zip(shape.dims, counts)) if per_device_shape else shape.dims
    tiles = [dim_tiles(size, count) for size, count in zip(dims, counts)]
    named = mesh_mapping(sharding, mesh, shape.rank) if mesh is not None else None
    lines = [head] + _summary(sharding, tiles, named, shape, per_device_shape)
    rank = shape.rank
    grid_dims = list(range(max(rank - 2, 0), rank))
    leading = list(range(max(rank - 2, 0)))
    combos = list(itertools.product(*(range(counts[d]) for d in leading)))
    for combo in combos[:MAX_GRIDS]:
        if leading:
            lines.append("  " + ", ".join(f"dim {d} {tiles[d].label(i)}"
                                          for d, i in zip(leading, combo)) + ":")
        lines += _grid(sharding, tiles, combo, grid_dims, colour, width)
    if len(combos) > MAX_GRIDS:
        lines.append(f"  ... {len(combos) - MAX_GRIDS} more slabs of tiles")
    lines.append("")
    return lines


def _summary(sharding: HloSharding, tiles: list[DimTiles], named, shape: ArrayShape,
             per_device_shape: bool) -> list[str]:
    parts = []
    for d, t in enumerate(tiles):
        axes = named[0][d] if named is not None else ()
        over = f" over mesh axis {'×'.join(axes)}" if axes else ""
        uneven = " (uneven: padded)" if t.count > 1 and t.size % t.count else ""
        parts.append(f"dim {d} whole" if t.count == 1 else
                     f"dim {d} split {t.count} ways{over}{uneven}")
    lines = ["  " + "; ".join(parts) if parts else "  a scalar"]
    replicas = sharding.subgroup_size("replicated")
    if replicas > 1:
        axes = named[1] if named is not None else ()
        over = f" (mesh axis {'×'.join(axes)})" if axes else ""
        lines.append(f"  each tile is held by {replicas} devices{over}")
    unreduced = sharding.subgroup_size("unreduced")
    if unreduced > 1:
        lines.append(f"  unreduced: the {unreduced} devices of a cell each hold an addend of the "
                     "tile; the tile is their sum")
    manual = sharding.subgroup_size("manual")
    if manual > 1:
        lines.append(f"  manual subgroups of {manual}: the devices of a cell hold their own "
                     "values of the tile")
    shard = tuple(-(-t.size // t.count) for t in tiles)
    what = "shape" if per_device_shape else "shard"
    lines.append(f"  per-device {what}: {shape.element_type}[{','.join(map(str, shard))}]")
    return lines


def _grid(sharding: HloSharding, tiles: list[DimTiles], combo: tuple, grid_dims: list[int],
          colour: bool, width: int) -> list[str]:
    """The grid of the last (up to) two dims at leading tile index `combo`."""
    row_dim = grid_dims[0] if len(grid_dims) == 2 else None
    col_dim = grid_dims[-1] if grid_dims else None
    rows = range(tiles[row_dim].count) if row_dim is not None else [None]
    cols = range(tiles[col_dim].count) if col_dim is not None else [None]

    def index(r, c):
        return combo + tuple(i for i in (r, c) if i is not None)

    labels = {(r, c): device_list(int(d) for d in sharding.devices_for_tile(index(r, c)))
              for r in rows for c in cols}
    row_labels = [tiles[row_dim].label(r) if row_dim is not None else "" for r in rows]
    col_labels = [tiles[col_dim].label(c) if col_dim is not None else "" for c in cols]
    left = max((len(s) for s in row_labels), default=0)
    widths = _column_widths(tiles[col_dim] if col_dim is not None else None, list(cols),
                            [max(len(labels[r, c]) for r in rows) for c in cols], col_labels,
                            width - left - 4)
    pad = " " * (left + 3)
    lines = [(pad + "".join(f" {label:^{w}}" for label, w in zip(col_labels, widths))).rstrip()]
    lines.append(pad + "┌" + "┬".join("─" * w for w in widths) + "┐")
    for k, r in enumerate(rows):
        cells = []
        for c, w in zip(cols, widths):
            text = f"{labels[r, c]:^{w}}"
            if colour:
                code = _COLOURS[_linear(index(r, c), sharding.tile_counts) % len(_COLOURS)]
                text = f"\x1b[48;5;{code}m\x1b[30m{text}\x1b[0m"
            cells.append(text)
        lines.append(f"  {row_labels[k]:>{left}} │" + "│".join(cells) + "│")
        if k != len(rows) - 1:
            lines.append(pad + "├" + "┼".join("─" * w for w in widths) + "┤")
    lines.append(pad + "└" + "┴".join("─" * w for w in widths) + "┘")
    return lines


def _column_widths(tiles: DimTiles | None, cols: list, needed: list[int], labels: list[str],
                   room: int) -> list[int]:
    """Columns as wide as their tiles' extents (shares of `room`), never narrower than their
    labels and device lists."""
    minimum = [max(n, len(label)) + 2 for n, label in zip(needed, labels)]
    if tiles is None:
        return [max(minimum[0], 12)]
    shard = -(-tiles.size // tiles.count)
    extents = [max(tiles.tiles[c][1] - tiles.tiles[c][0], 0) for c in cols]
    unit = max(room / max(shard * len(cols), 1), max(minimum) / shard)
    return [max(m, round(e * unit)) for m, e in zip(minimum, extents)]


def _linear(index: tuple, counts: tuple) -> int:
    value = 0
    for i, c in zip(index, counts):
        value = value * c + i
    return value


__all__ = ["describe_value", "dim_tiles", "device_list", "mesh_mapping", "DimTiles"]
