"""Piece exchange: a reshard between tilings whose tiles do not nest, as collective-permutes
of the pieces each device's new tile needs (docs/partitioning.md, "Resharding").

Where a dim's tiles do not nest (an uneven dim cut 4 ways to 2 or 8 ways: f32[9] in tiles of 2
to tiles of 3 or of 5), slicing or gathering tiles cannot give the target's tiles, and the plain
plan gathers the dim whole. Each target tile overlaps only a few source tiles, though: every
device takes the part of its new tile that it holds from its own shard and receives each other
part from one device holding it. XLA's partitioner shifts such boundary elements with
collective-permutes too. Where tiles nest, the same exchange replaces the staged plan when it
sends fewer bytes (`reshard_plan._direct_exchange`: no permute after an all-to-all whose new
tiles land on other devices than the target's).

`plan_exchange(dims, source, target)` (two tilings without partial values of an array of `dims`)
lists the pieces: for every target device and every source tile its tile overlaps (in real
elements, padding never travels), the intersection box. A piece the device holds itself is
*local*; the others are assigned to *rounds*, each one `collective-permute` in which a device
sends at most one piece and receives at most one. A round's buffer has the largest of its
pieces' sizes per dim, and every sender of the round sends that much. The rounds are filled two
ways: tile by tile (each piece in the first round with room, a source tile held by several
devices sent by whichever is free, the one sending the fewest pieces first), and largest piece
first, each piece in the round and by the holder that leave the busiest device sending the
fewest elements, then all devices together (so that a small piece does not travel at a large
piece's size, and the pieces of a tile held twice are shared out by their size). The second is
kept where its busiest device sends fewer elements than the first's; on a tie the first, whose
bytes fall on the devices the rest of the program was priced with (a filling that moves bytes
between devices at an equal busiest one gains nothing by the plan's measure and can load a
device other instructions load already). The result says per round, per device, where the
piece it sends starts in its shard and where the piece it receives lies in its new tile; None
when more than `MAX_ROUNDS` rounds would be needed (the gathers cost less then), found before
any piece is listed where some device lacks more pieces than that (the source tiles a target
tile overlaps are counted dim by dim).

`within` lays some of the target's dims out *within coarser tiles*, as XLA's partitioner does
before gathering an uneven dim into fewer tiles that the source's do not gather into (6 elements
in 4 tiles of 2 gathered to 2 tiles of 3): for a dim d mapped to a coarse count c, target tile
`k = g * r + j` (r = its count over c) holds, in its shard of size S, the elements from
`g * D + j * S` of coarse tile g (size D), cut at the coarse tile's end. Gathering the r tiles
of each coarse tile then gives it whole at the start of the gathered shard.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tiling import Tiling

#: more rounds than this and the exchange is not planned
MAX_ROUNDS = 4


@dataclass(frozen=True, eq=False)
class Round:
    """One collective-permute of pieces (or the local pieces when `pairs` is None). Arrays are
    `[N, rank]`, indexed by device: `send_at` where the piece a device sends starts in its
    shard, `place_at` where the piece it receives starts in its new tile, `lo` / `hi` the part
    of its new tile the piece fills (`lo == hi`: it receives nothing)."""

    pairs: np.ndarray | None        # [P, 2] (source, target)
    size: tuple[int, ...]
    send_at: np.ndarray
    place_at: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def plan_exchange(dims: tuple[int, ...], source: Tiling, target: Tiling,
                  within: dict[int, int] | None = None,
                  shifted: tuple[tuple[int, ...], tuple[int, ...]] | None = None
                  ) -> list[Round] | None:
    """The rounds turning `source` into `target` (see the module docstring; `within`: dim ->
    coarse tile count for the dims of `target` laid out within coarser tiles). `shifted =
    (dims', low)`: `target` tiles an array of `dims'` whose element `o` is element `o - low` of
    this one (a `pad` without interior padding): each device's new tile is its tile of that
    array, holding the elements of this one it covers at their places (the rest receive
    nothing)."""
    rank = len(dims)
    n = source.num_devices
    extent = np.asarray(dims, dtype=np.int64)
    held = np.asarray(source.shard_dims(dims), dtype=np.int64)
    tgt = target.coordinates()[:, :rank]
    if shifted is None:
        tile = np.asarray(target.shard_dims(dims), dtype=np.int64)
        t_lo = tgt * tile
        t_hi = np.minimum(t_lo + tile, extent)
    else:
        wide, low = (np.asarray(a, dtype=np.int64) for a in shifted)
        tile = np.asarray(target.shard_dims(shifted[0]), dtype=np.int64)
        t_lo = tgt * tile - low
        t_hi = np.minimum(np.minimum(t_lo + tile, extent), wide - low)
    src = source.coordinates()[:, :rank]
    s_lo = src * held
    for d, coarse in (within or {}).items():
        size = -(-dims[d] // coarse)
        g, j = np.divmod(tgt[:, d], target.counts[d] // coarse)
        t_lo[:, d] = g * size + j * tile[d]
        t_hi[:, d] = np.minimum(np.minimum(t_lo[:, d] + tile[d], (g + 1) * size), dims[d])
    # per device and dim, the source tiles its target tile overlaps: [first, first + count)
    step = np.maximum(held, 1)
    start = np.maximum(t_lo, 0)
    first = start // step
    count = np.where(t_hi > start, -(-t_hi // step) - first, 0)
    spans = count.prod(axis=1)
    own = ((first <= src) & (src < first + count)).all(axis=1)
    if (spans - own > MAX_ROUNDS).any():
        return None                 # some device receives more pieces than rounds allowed
    counts = np.asarray(source.counts[:rank], dtype=np.int64)
    tile_of = np.ravel_multi_index(tuple(src.T), tuple(counts)) if rank else np.zeros(n, int)
    order = np.argsort(tile_of, kind="stable")
    holders = dict(zip(*_runs(tile_of[order], order)))
    shifts = np.indices(tuple(count.max(axis=0, initial=0))).reshape(rank, -1).T if rank \
        else np.zeros((1, 0), dtype=np.int64)
    local: list = []
    pieces: list[tuple[int, int, np.ndarray, np.ndarray]] = []
    for shift in shifts:                                        # a few combinations at most
        inside = np.flatnonzero((shift < count).all(axis=1))
        if not inside.size:
            continue
        tile = first[inside] + shift
        k_lo = tile * held
        lo = np.maximum(t_lo[inside], k_lo)
        hi = np.minimum(t_hi[inside], np.minimum(k_lo + held, extent))
        keys = np.ravel_multi_index(tuple(tile.T), tuple(counts)) if rank else \
            np.zeros(inside.size, int)
        for device, k, piece_lo, piece_hi in zip(inside.tolist(), keys.tolist(), lo, hi):
            if tile_of[device] == k:
                local.append((device, device, piece_lo, piece_hi))
            else:
                pieces.append((device, k, piece_lo, piece_hi))
    fillings = [found for found in (_by_tile(pieces, holders, n), _by_size(pieces, holders, n))
                if found is not None]
    rounds = min(fillings, key=lambda found: _busiest(found, n), default=None)
    if rounds is None:
        return None
    return [_round(members, n, rank, s_lo, t_lo, local=index == 0)
            for index, members in enumerate([local] + rounds) if members]


def _by_tile(pieces: list, holders: dict, n: int) -> list[list] | None:
    """Rounds filled piece by piece in the order of their source tiles (then of their
    receivers), each piece in the first round where its receiver receives nothing yet and one
    of its tile's holders sends nothing yet, sent by the holder that sends the fewest pieces so
    far; None past `MAX_ROUNDS` rounds."""
    rounds: list[list] = []
    receiving: list[set[int]] = []
    sending: list[set[int]] = []
    busy = np.zeros(n, dtype=np.int64)
    for device, k, piece_lo, piece_hi in sorted(pieces, key=lambda p: (p[1], p[0])):
        for index in range(len(rounds)):
            if device in receiving[index]:
                continue
            sender = _free_holder(holders[k], sending[index], busy)
            if sender is not None:
                break
        else:
            if len(rounds) == MAX_ROUNDS:
                return None
            index = len(rounds)
            rounds.append([])
            receiving.append(set())
            sending.append(set())
            sender = _free_holder(holders[k], sending[index], busy)
        busy[sender] += 1
        rounds[index].append((sender, device, piece_lo, piece_hi))
        receiving[index].add(device)
        sending[index].add(sender)
    return rounds


def _by_size(pieces: list, holders: dict, n: int) -> list[list] | None:
    """Rounds filled with the largest pieces first (so that a small piece does not widen a
    round's buffer for the large ones), each piece where it leaves the busiest device sending
    the fewest elements, then all devices together, then in the earliest round: an existing
    round where its receiver receives nothing yet (sent by the free holder of its tile that
    sends the fewest elements so far), or a new one; None past `MAX_ROUNDS` rounds."""
    rounds: list[list] = []
    sizes: list[np.ndarray] = []
    receivers: list[set] = []
    load = np.zeros(n, dtype=np.int64)
    busiest = total = 0
    for device, k, piece_lo, piece_hi in sorted(
            pieces, key=lambda p: (-int(np.prod(p[3] - p[2])), p[1], p[0])):
        extent = piece_hi - piece_lo
        best = None
        for index in range(min(len(rounds) + 1, MAX_ROUNDS)):
            members = rounds[index] if index < len(rounds) else []
            if members and device in receivers[index]:
                continue
            sender = _free_holder(holders[k], {m[0] for m in members}, load)
            if sender is None:
                continue
            before = sizes[index] if members else np.zeros_like(extent)
            size = np.maximum(before, extent)
            grown = int(np.prod(size)) - int(np.prod(before))
            senders = np.array([member[0] for member in members] + [sender], dtype=np.int64)
            added = np.full(len(senders), grown, dtype=np.int64)
            added[-1] = int(np.prod(size))
            score = (max(busiest, int((load[senders] + added).max())),
                     total + int(added.sum()), index)
            if best is None or score < best[0]:
                best = (score, index, senders, added, size)
        if best is None:
            return None
        (busiest, total, _), index, senders, added, size = best
        load[senders] += added
        if index == len(rounds):
            rounds.append([])
            sizes.append(size)
            receivers.append(set())
        else:
            sizes[index] = size
        rounds[index].append((int(senders[-1]), device, piece_lo, piece_hi))
        receivers[index].add(device)
    return rounds


def _busiest(rounds: list[list], n: int) -> int:
    """The elements the busiest device sends in `rounds` (each sender sends a round's buffer,
    the largest of its pieces per dim)."""
    load = np.zeros(n, dtype=np.int64)
    for members in rounds:
        size = np.zeros_like(members[0][2])
        for _, _, piece_lo, piece_hi in members:
            size = np.maximum(size, piece_hi - piece_lo)
        for sender, _, _, _ in members:
            load[sender] += int(np.prod(size))
    return int(load.max(initial=0))


def _free_holder(holders: np.ndarray, taken: set[int], busy: np.ndarray) -> int | None:
    free = [int(h) for h in holders if int(h) not in taken]
    return min(free, key=lambda h: (busy[h], h)) if free else None


def _runs(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """The distinct `keys` (sorted) and, per key, the `values` at its positions."""
    distinct, starts = np.unique(keys, return_index=True)
    return distinct.tolist(), np.split(values, starts[1:])


def _round(members: list, n: int, rank: int, s_lo: np.ndarray, t_lo: np.ndarray,
           local: bool) -> Round:
    size = np.zeros(rank, dtype=np.int64)
    send_at = np.zeros((n, rank), dtype=np.int64)
    place_at = np.zeros((n, rank), dtype=np.int64)
    lo = np.zeros((n, rank), dtype=np.int64)
    hi = np.zeros((n, rank), dtype=np.int64)
    for sender, receiver, piece_lo, piece_hi in members:
        size = np.maximum(size, piece_hi - piece_lo)
        send_at[sender] = piece_lo - s_lo[sender]
        place_at[receiver] = piece_lo - t_lo[receiver]
        lo[receiver] = piece_lo - t_lo[receiver]
        hi[receiver] = piece_hi - t_lo[receiver]
    pairs = None if local else \
        np.array([(sender, receiver) for sender, receiver, _, _ in members], dtype=np.int64)
    for array in (send_at, place_at, lo, hi):
        array.setflags(write=False)
    return Round(pairs, tuple(int(s) for s in size), send_at, place_at, lo, hi)


__all__ = ["Round", "plan_exchange", "MAX_ROUNDS"]
