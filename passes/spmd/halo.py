"""Halo exchange: giving each partition the input window its outputs read
(docs/design/partitioning.md#halo-exchange).

A windowed op reads, for output `o` of a dim, the elements `o*stride - pad_low + k*dilation` of
the base (the operand dilated by `base_dilation`: `b - 1` holes between elements). When the
operand is tiled `n` ways on that dim (shard `I = cdiv(S, n)`, shard `i` holding `[I*i, I*(i+1))`)
and the output is tiled the same `n` ways (shard `W = cdiv(wc, n)` outputs), shard `i`'s outputs
need elements owned by its neighbours: the *halo*.

Contract (one dim, `WindowedDim` → `HaloPlan`, pure arithmetic, numpy over shards):

- quantities are in *local base* units: the base as if each shard were dilated locally (`b - 1`
  holes after every element, holes = the pad value), shard `Ib = b * I`, real data at base
  positions `[0, valid)`, `valid = b*(S-1) + 1`; only whole undilated elements travel and the
  concatenation is dilated after the exchange;
- shard `i`'s local window input covers base positions `[start(i), start(i) + window_input)`,
  `start(i) = stride*W*i - pad_low`, `window_input = stride*(W-1) + (window-1)*dilation + 1`
  (shards computing overlapping ranges of outputs give their own first output and `W`:
  `WindowedDim.firsts`, `start(i) = stride*firsts[i] - pad_low`);
- `left(i) = Ib*i - start(i)` and `right(i) = start(i) + window_input - Ib*(i+1)`: the elements
  before / after its own data that window covers (negative: own elements not needed). These are
  XLA's halo sizes: affine in `i`, *static* when equal for all shards, else read from a
  partition-id-indexed table;
- the exchange moves only what *real* outputs read from real data (`outputs`, default
  `[0, wc)`): `from_left` elements from the shards to the left, `from_right` from the right. A
  halo longer than a shard takes several hops (one `collective-permute` each, distance 1, 2, ...).
  The exchange is contiguous: it covers the span of the reads (with window dilation, elements
  between taps may travel although no output reads them). A shard receives only the hops whose
  elements its own real outputs read: hops `skip(i) + 1 .. reach(i)` on each side (`reach_left`,
  `skip_left`, `reach_right`, `skip_right`); the permute of any other hop has no pair into it
  (as XLA trims the halos of shards without output), so its buffer there stays zero and is
  never read. Of each hop's piece only the elements some receiver's real outputs read travel
  (`pieces(side)`: the part of a far shard a window starting or ending inside it reads, as
  XLA's compact halo exchange sends): the receiver pads it back to the hop's size with zeros
  it never reads. Where the receivers of one hop read parts of its piece none of which covers
  the others (`parts(side, hop)`, recorded as `parts_left` / `parts_right`), each part travels
  in a permute of its own and every shard selects its own part (XLA's compact exchange);
- `mask`: whether real outputs read positions outside `[0, valid)` (explicit padding, uneven
  padding garbage, zeros from missing neighbours): those are replaced by the pad value.

Emission (`exchange_halo`, in lower-spmd): `[left hops..., own shard, right hops...]` is
concatenated, dilated (base dilation), padded to cover every shard's window, cut with a
(dynamic-)slice at `from_left - left(i)` and masked; running the op on the result with padding 0
and no base dilation on this dim yields exactly the shard's `W` outputs. Several dims are
exchanged one after another (`windowed_input`, in `exchange_order`: the order sending least):
corners arrive through the later exchanges. A dilated dim with exchanges after it is cut to the
undilated elements its windows span (`HaloPlan.undilated_window`) and dilated, padded, cut and
masked once every exchange is done, so that no later exchange carries its holes or padding
(XLA exchanges undilated data and leaves the dilation to the local op).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from gspmdc.errors import GspmdcError
from gspmdc.ir.attributes import PadDim, SliceDim
from gspmdc.ir.frontend_attributes import HALO, frontend_attribute
from gspmdc.ir.module import Instruction

from .reshard import EmitContext
from .tiling import Tiling, cdiv


@dataclass(frozen=True)
class WindowedDim:
    """One windowed dim of an op, in the terms of a `window={...}` entry, on an operand dim of
    global `size` tiled into `shards`. `outputs`: the range of output positions whose values
    matter (default all); shards holding none of them are left unserved (garbage)."""

    size: int
    shards: int
    window: int = 1
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    base_dilation: int = 1
    window_dilation: int = 1
    outputs: tuple[int, int] | None = None
    #: per shard, the first output it computes, and the outputs each computes, where shards
    #: compute overlapping ranges of outputs (a select-and-scatter's windows: a shard may run
    #: every window overlapping its data); default `W*i` and `W = cdiv(wc, n)`
    firsts: tuple[int, ...] | None = None
    per_shard: int | None = None

    @property
    def extent(self) -> int:
        """The window's span `(window - 1) * window_dilation + 1`."""
        return (self.window - 1) * self.window_dilation + 1

    @property
    def output_count(self) -> int:
        """Output elements `wc` of the whole op on this dim."""
        padded = self.base_dilation * (self.size - 1) + 1 + self.padding_low + self.padding_high
        return max(0, (padded - self.extent) // self.stride + 1) if self.size else 0


@dataclass(frozen=True, eq=False)
class HaloPlan:
    """The halo exchange of one `WindowedDim` tiled `shards` ways (see the module docstring);
    arrays are indexed by shard ordinal. `to_text` / `from_text`: the whole plan as the text
    the halo-exchange pass records and lower-spmd reads."""

    shards: int
    base_dilation: int
    input_shard: int          # Ib: local base elements per shard (after local dilation)
    output_shard: int         # W
    window_input: int         # local window input length
    valid: int                # base positions [0, valid) hold real data
    start: np.ndarray         # base position of each shard's window input
    left: np.ndarray
    right: np.ndarray
    from_left: int
    from_right: int
    mask: bool
    offsets: np.ndarray       # where each shard's window starts in the padded concatenation
    pad_left: int             # elements padded before / after the concatenation
    pad_right: int
    reach_left: np.ndarray    # per shard, the farthest hop to the left its real outputs read
    reach_right: np.ndarray
    skip_left: np.ndarray     # per shard, the nearest hops to the left it does not read
    skip_right: np.ndarray
    #: per hop to the left / right, the elements [lo, hi) of its piece that travel (empty:
    #: every piece whole)
    span_left: tuple[tuple[int, int], ...] = ()
    span_right: tuple[tuple[int, int], ...] = ()
    #: per hop to the left / right, the `[n, 2]` elements [lo, hi) of its piece each receiving
    #: shard reads, where receivers read different parts (empty: each reads the hop's span)
    parts_left: tuple[np.ndarray, ...] = ()
    parts_right: tuple[np.ndarray, ...] = ()
    #: per shard, whether it holds a real output (None: every shard does); a partition whose
    #: shard on one dim holds none computes nothing real, so it receives no halo on the
    #: other dims (`windowed_input`, as XLA trims such shards from its windowed-input reshard)
    real: np.ndarray | None = None

    def pieces(self, side: str) -> list[tuple[int, int, int]]:
        """Per hop from `side` (distance 1, 2, ...): its size and the range `[lo, hi)` of
        its elements that travel (undilated elements of the piece)."""
        sizes = self.hops(self.from_left if side == "left" else self.from_right)
        spans = (self.span_left if side == "left" else self.span_right) or \
            tuple((0, size) for size in sizes)
        return [(size, lo, hi) for size, (lo, hi) in zip(sizes, spans)]

    def parts(self, side: str, hop: int) -> np.ndarray:
        """`[n, 2]`: per receiving shard, the elements [lo, hi) of hop `hop`'s piece from
        `side` it reads (its span where receivers read alike; meaningful where it
        `receives` the hop)."""
        parts = self.parts_left if side == "left" else self.parts_right
        if parts:
            return parts[hop - 1]
        _, lo, hi = self.pieces(side)[hop - 1]
        return np.tile(np.array([lo, hi], dtype=np.int64), (self.shards, 1))

    def senders(self) -> np.ndarray:
        """Per shard, whether it sends some hop to a shard that receives it."""
        sends = np.zeros(self.shards, dtype=bool)
        for side, step in (("left", 1), ("right", -1)):
            amount = self.from_left if side == "left" else self.from_right
            for hop in range(1, len(self.hops(amount)) + 1):
                receiver = np.arange(self.shards) + step * hop
                inside = (receiver >= 0) & (receiver < self.shards)
                sends[inside] |= self.receives(side, hop)[receiver[inside]]
        return sends

    def receives(self, side: str, hop: int) -> np.ndarray:
        """Per shard, whether it receives hop `hop` from the `side` ("left" or "right")."""
        reach, skip = (self.reach_left, self.skip_left) if side == "left" else \
            (self.reach_right, self.skip_right)
        return (skip < hop) & (hop <= reach)

    @property
    def static(self) -> bool:
        """Whether every shard has the same halo sizes."""
        return bool((self.left == self.left[0]).all() and (self.right == self.right[0]).all())

    @property
    def identity(self) -> bool:
        """Whether each shard's own data is already its window input (nothing to do)."""
        return self.from_left == self.from_right == 0 and not self.mask and \
            self.base_dilation == 1 and self.window_input == self.input_shard and \
            self.pad_left == self.pad_right == 0 and not self.offsets.any()

    @property
    def needed(self) -> bool:
        """Whether the plan is recorded: it moves or masks something, or some shards hold no
        real output (an identity plan still trims those partitions from the exchanges of the
        other dims, `windowed_input`, as XLA trims a dim with fewer windows than shards)."""
        return not self.identity or self.real is not None

    def undilated_window(self) -> tuple[int, np.ndarray]:
        """`(U, first)`: the undilated elements of the concatenation `[left hops, own, right
        hops]` each shard's window input spans, `first[i]` the index of shard `i`'s first one
        (negative or past the end: padding) and `U` the most any shard's window holds (at
        least 1): what a dilated dim's exchange keeps for the exchanges after it."""
        b = self.base_dilation
        lo = self.offsets - self.pad_left
        first = -(-lo // b)
        last = -(-(lo + self.window_input) // b)
        return max(1, int((last - first).max(initial=0))), first

    @property
    def carried(self) -> int:
        """This dim's length in what the exchanges after it carry: the window input, or for
        a dilated dim its undilated elements (`undilated_window`: holes and padding are
        added once every exchange is done, so that no later piece carries them)."""
        return self.window_input if self.base_dilation == 1 else self.undilated_window()[0]

    @property
    def exchanged(self) -> int:
        """Elements of this dim each partition sends (and receives), undilated."""
        return (self.from_left + self.from_right) // self.base_dilation

    def hops(self, amount: int) -> list[int]:
        """Sizes of the pieces received from distance 1, 2, ... for a halo of `amount` local
        base elements, in undilated elements (whole shards, then the rest)."""
        shard = self.input_shard // self.base_dilation
        full, rest = divmod(amount // self.base_dilation, shard)
        return [shard] * full + ([rest] if rest else [])

    def describe(self) -> str:
        """`left=1,right=1,from_left=1,from_right=1,mask` (tables as `[..]` when per shard)."""
        text = f"left={_table(self.left)},right={_table(self.right)}," \
               f"from_left={self.from_left},from_right={self.from_right}"
        if self.base_dilation > 1:
            text += f",dilate={self.base_dilation}"
        return text + (",mask" if self.mask else "")

    def to_text(self) -> str:
        """`describe()` followed by the rest of the plan: `shards=n,input=Ib,output=W,
        window=window_input,valid=v,offsets=..`, `pad=low_high` when there is padding and
        `reach_left=..` / `skip_left=..` (and right) when some shard needs fewer hops than the
        others, `span_left=[lo,hi,...]` (and right) when some hop's piece travels in part."""
        text = f"{self.describe()},shards={self.shards},input={self.input_shard}," \
               f"output={self.output_shard},window={self.window_input},valid={self.valid}," \
               f"offsets={_table(self.offsets)}"
        if self.pad_left or self.pad_right:
            text += f",pad={self.pad_left}_{self.pad_right}"
        for side, reach, amount in (("left", self.reach_left, self.from_left),
                                    ("right", self.reach_right, self.from_right)):
            if (reach != _full_reach(self.shards, len(self.hops(amount)), side)).any():
                text += f",reach_{side}={_table(reach)}"
        for side, skip in (("left", self.skip_left), ("right", self.skip_right)):
            if skip.any():
                text += f",skip_{side}={_table(skip)}"
        for side in ("left", "right"):
            pieces = self.pieces(side)
            if any((lo, hi) != (0, size) for size, lo, hi in pieces):
                text += f",span_{side}=[" + \
                    ",".join(f"{lo},{hi}" for _, lo, hi in pieces) + "]"
        for side in ("left", "right"):
            parts = self.parts_left if side == "left" else self.parts_right
            if parts:
                text += f",parts_{side}=" + _table(np.concatenate(parts).ravel())
        if self.real is not None:
            text += f",real={_table(self.real.astype(np.int64))}"
        return text

    @classmethod
    def from_text(cls, text: str) -> "HaloPlan":
        """The plan `to_text` wrote (ValueError naming what is wrong otherwise); `start` comes
        from `left` and is checked against `right`."""
        fields: dict[str, str] = {}
        for match in _FIELD.finditer(text):
            if match.group(1) in fields:
                raise ValueError(f"{match.group(1)} given twice")
            fields[match.group(1)] = match.group(2)
        if _FIELD.sub("", text).strip(", "):
            raise ValueError(f"cannot read {text!r}")
        missing = [k for k in _REQUIRED if k not in fields]
        unknown = sorted(set(fields) - set(_REQUIRED) -
                         {"dilate", "mask", "pad", "reach_left", "reach_right", "skip_left",
                          "skip_right", "span_left", "span_right", "parts_left",
                          "parts_right", "real"})
        if missing or unknown:
            raise ValueError(f"missing {missing}" if missing else f"unknown {unknown}")
        n = _int(fields, "shards")
        number = {k: _int(fields, k) for k in ("input", "output", "window", "valid",
                                               "from_left", "from_right")}
        left, right, offsets = (_array(fields[k], n, k) for k in ("left", "right", "offsets"))
        dilation = _int(fields, "dilate") if "dilate" in fields else 1
        low, _, high = fields.get("pad", "0_0").partition("_")
        if fields.get("mask", "") or n < 1 or dilation < 1:
            raise ValueError(f"cannot read {text!r}")
        ib, window = number["input"], number["window"]
        start = ib * np.arange(n, dtype=np.int64) - left
        if (start + window - ib * (np.arange(n) + 1) != right).any():
            raise ValueError("right does not agree with left, input and window")
        try:
            pad_left, pad_right = int(low), int(high)
        except ValueError:
            raise ValueError(f"pad={fields['pad']} is not low_high") from None
        plan = cls(n, dilation, ib, number["output"], window, number["valid"], start, left,
                   right, number["from_left"], number["from_right"], "mask" in fields, offsets,
                   pad_left, pad_right, *[np.zeros(n, np.int64)] * 4)
        got = {}
        for side in ("left", "right"):
            hops = len(plan.hops(number[f"from_{side}"]))
            full = _full_reach(n, hops, side)
            reach = _array(fields[f"reach_{side}"], n, f"reach_{side}") \
                if f"reach_{side}" in fields else full
            skip = _array(fields[f"skip_{side}"], n, f"skip_{side}") \
                if f"skip_{side}" in fields else np.zeros(n, np.int64)
            if ((reach < 0) | (reach > full)).any():
                raise ValueError(f"reach_{side} must lie between 0 and the hops to the edge")
            if ((skip < 0) | (skip > np.maximum(reach, 0))).any():
                raise ValueError(f"skip_{side} must lie between 0 and reach_{side}")
            got[f"reach_{side}"], got[f"skip_{side}"] = reach, skip
            if f"span_{side}" in fields:
                sizes = plan.hops(number[f"from_{side}"])
                bounds = _array(fields[f"span_{side}"], 2 * len(sizes), f"span_{side}")
                spans = tuple(zip(bounds[0::2].tolist(), bounds[1::2].tolist()))
                if any(not 0 <= lo < hi <= size for (lo, hi), size in zip(spans, sizes)):
                    raise ValueError(f"span_{side} must hold 0 <= lo < hi <= size per hop")
                got[f"span_{side}"] = spans
            if f"parts_{side}" in fields:
                sizes = plan.hops(number[f"from_{side}"])
                flat = _array(fields[f"parts_{side}"], 2 * n * len(sizes), f"parts_{side}")
                parts = tuple(flat.reshape(len(sizes), n, 2))
                if any(((part < 0) | (part > size)).any() or (part[:, 0] > part[:, 1]).any()
                       for part, size in zip(parts, sizes)):
                    raise ValueError(f"parts_{side} must hold 0 <= lo <= hi <= size per hop "
                                     "and shard")
                got[f"parts_{side}"] = parts
        if "real" in fields:
            real = _array(fields["real"], n, "real")
            if ((real != 0) & (real != 1)).any() or real.all():
                raise ValueError("real must be a table of 0 and 1 with some 0")
            got["real"] = real.astype(bool)
        return replace(plan, **got)


_FIELD = re.compile(r"([a-z_]+)(?:=(\[[-0-9,]*\]|-?\d+(?:_-?\d+)?))?(?=,|$)")
_REQUIRED = ("left", "right", "from_left", "from_right", "shards", "input", "output", "window",
             "valid", "offsets")


def _table(values: np.ndarray) -> str:
    """One number when all shards agree, else `[a,b,...]`."""
    return str(int(values[0])) if (values == values[0]).all() else \
        "[" + ",".join(str(int(v)) for v in values) + "]"


def _int(fields: dict[str, str], key: str) -> int:
    try:
        return int(fields[key])
    except (TypeError, ValueError):
        raise ValueError(f"{key}={fields[key]} is not an integer") from None


def _array(text: str | None, n: int, key: str) -> np.ndarray:
    try:
        values = [int(v) for v in text.strip("[]").split(",")] if text else []
    except ValueError:
        raise ValueError(f"{key}={text} is not a table of integers") from None
    if len(values) == 1:
        values *= n
    if len(values) != n:
        raise ValueError(f"{key} has {len(values)} entries for {n} shards")
    return np.array(values, dtype=np.int64)


def plan_halo(dim: WindowedDim) -> HaloPlan:
    """The halo plan of `dim` (vectorized over shards)."""
    n, s, b = dim.shards, dim.stride, dim.base_dilation
    if n < 1 or s < 1 or b < 1 or dim.window < 1 or dim.window_dilation < 1:
        raise ValueError(f"invalid windowed dim {dim}")
    ib = b * cdiv(dim.size, n)
    wc = dim.output_count
    w = cdiv(wc, n) if dim.per_shard is None else dim.per_shard
    window_input = s * (w - 1) + dim.extent if w else 0
    valid = b * (dim.size - 1) + 1 if dim.size else 0
    i = np.arange(n, dtype=np.int64)
    firsts = w * i if dim.firsts is None else np.array(dim.firsts, dtype=np.int64)
    start = s * firsts - dim.padding_low
    left = ib * i - start
    right = start + window_input - ib * (i + 1)
    lo, hi = dim.outputs if dim.outputs is not None else (0, wc)
    first = np.maximum(firsts, lo)
    last = np.minimum(firsts + w, hi)                        # exclusive
    real = first < last
    need_lo = s * first - dim.padding_low                    # base range the real outputs read
    need_hi = s * (last - 1) + dim.extent - dim.padding_low
    data_lo, data_hi = np.maximum(need_lo, 0), np.minimum(need_hi, valid)
    # only the real elements (base positions b*k) of that range travel: trimmed to the first
    # and last of them, a read of holes alone (the pad value, rebuilt locally) needs nothing
    data_lo, data_hi = b * -(-data_lo // b), b * ((data_hi - 1) // b) + 1
    reads_data = real & (data_lo < data_hi)
    need_left = np.where(reads_data, np.maximum(ib * i - data_lo, 0), 0)
    need_right = np.where(reads_data, np.maximum(data_hi - ib * (i + 1), 0), 0)
    # whole elements travel (their holes are rebuilt locally): round up to multiples of b
    from_left = b * cdiv(int(need_left.max(initial=0)), b)
    from_right = b * cdiv(int(need_right.max(initial=0)), b)
    mask = bool((real & ((need_lo < 0) | (need_hi > valid))).any())
    offsets = from_left - left
    pad_left = int(max(0, -offsets[real].min(initial=0)))
    offsets = offsets + pad_left
    length = pad_left + from_left + ib + from_right
    pad_right = int(max(0, max(int((offsets[real] + window_input).max(initial=0)),
                               window_input) - length))
    offsets = np.where(real, offsets, np.clip(offsets, 0, length + pad_right - window_input))
    plan = HaloPlan(n, b, ib, w, window_input, valid, start, left, right, from_left,
                    from_right, mask, offsets, pad_left, pad_right, *[np.zeros(n, np.int64)] * 4)
    # the hops whose elements the real outputs read: [data_lo, data_hi) against each hop's
    # base range (the last `size` elements of shard i - h, the first of shard i + h)
    got = {}
    for side, amount in (("left", from_left), ("right", from_right)):
        needed = np.zeros((n, 0), dtype=bool)
        spans, parts = [], []
        for hop, size in enumerate(plan.hops(amount), 1):
            if side == "left":
                hop_lo, hop_hi = ib * (i - hop + 1) - b * size, ib * (i - hop + 1)
            else:
                hop_lo, hop_hi = ib * (i + hop), ib * (i + hop) + b * size
            reads = reads_data & (hop_lo < data_hi) & (data_lo < hop_hi)
            needed = np.column_stack([needed, reads])
            # the piece's elements (base hop_lo + b*k) within [data_lo, data_hi) of a reader
            lo = np.where(reads, np.clip(-(-(data_lo - hop_lo) // b), 0, size), 0)
            hi = np.where(reads, np.clip(-(-(data_hi - hop_lo) // b), 0, size), 0)
            spans.append((int(lo[reads].min()), int(hi[reads].max())) if reads.any()
                         else (0, size))
            parts.append(np.column_stack([lo, hi]).astype(np.int64))
        if any(span != (0, size) for span, size in zip(spans, plan.hops(amount))):
            got[f"span_{side}"] = tuple(spans)
        # receivers of one hop reading parts of its piece none of which covers the others
        # (windows starting at different offsets of a far shard): each part travels in a
        # permute of its own (XLA's compact halo exchange), so every sender sends less
        if any(_split(part[needed[:, k]]) for k, part in enumerate(parts)):
            got[f"parts_{side}"] = tuple(parts)
        count = needed.shape[1]
        any_hop = needed.any(axis=1)
        reach = np.where(any_hop, count - np.argmax(needed[:, ::-1], axis=1), 0) if count else \
            np.zeros(n, np.int64)
        skip = np.where(any_hop, np.argmax(needed, axis=1), 0) if count else np.zeros(n, np.int64)
        full = _full_reach(n, n, side)
        got[f"reach_{side}"] = np.minimum(reach, full).astype(np.int64)
        got[f"skip_{side}"] = np.minimum(skip, got[f"reach_{side}"]).astype(np.int64)
    if not real.all():
        got["real"] = real
    return replace(plan, **got)


def _split(parts: np.ndarray) -> bool:
    """Whether the `[k, 2]` parts [lo, hi) its receivers read of one piece are worth a permute
    each: they differ and none spans them all (else one permute of the span sends no more from
    any device)."""
    if len(parts) < 2:
        return False
    span = (parts[:, 0].min(), parts[:, 1].max())
    return not ((parts[:, 0] == span[0]) & (parts[:, 1] == span[1])).any()


def _full_reach(n: int, hops: int, side: str) -> np.ndarray:
    """Per shard, the hops of `hops` that have a sender on `side` (none past the edge)."""
    distance = np.arange(n, dtype=np.int64)
    return np.minimum(hops, distance if side == "left" else n - 1 - distance)


def halo_sent(plans: Mapping[int, HaloPlan], local_dims: Sequence[int], width: int,
              num_devices: int) -> tuple[float, float]:
    """(bytes the busiest partition sends, bytes all `num_devices` partitions together send)
    to exchange `plans` (dim → plan) on a value whose local shard has `local_dims`, the dims
    exchanged in `exchange_order` (earlier exchanges widen later pieces), as `windowed_input`
    emits them: a partition sends a dim's pieces to the receivers that are `served`
    (`_served_on`)."""
    return busiest_and_total(_sent_per_ordinals(plans, local_dims), width, num_devices)


def busiest_and_total(sent: np.ndarray, width: int, num_devices: int) -> tuple[float, float]:
    """(the busiest partition's bytes, all `num_devices` partitions' bytes) from `sent`, the
    elements sent per combination of shard ordinals (every combination held by as many
    partitions), of `width` bytes each."""
    return (float(sent.max(initial=0)) * width,
            float(sent.sum()) * (num_devices // max(sent.size, 1)) * width)


def _sent_per_ordinals(plans: Mapping[int, HaloPlan], local_dims: Sequence[int],
                       order: Sequence[int] | None = None) -> np.ndarray:
    """Elements sent by a partition per combination of its shard ordinals on the dims of
    `plans` (flat, the dims in increasing order; every partition with those ordinals sends as
    much): per dim, what its ordinal there sends (`_sent_by_dim`) when its receivers (the
    partitions with its other ordinals) are served, times the elements of the other dims."""
    dims = sorted(plans)
    if not dims:
        return np.zeros(1, dtype=np.int64)
    grid = np.indices([plans[d].shards for d in dims]).reshape(len(dims), -1).T
    ordinals = np.zeros((len(grid), len(local_dims)), dtype=np.int64)
    ordinals[:, dims] = grid
    order = exchange_order(plans, local_dims) if order is None else list(order)
    sent = np.zeros(len(grid), dtype=np.int64)
    for d, (by_ordinal, other) in zip(order, _sent_by_dim(plans, local_dims, order)):
        part = by_ordinal[ordinals[:, d]] * other
        sent += np.where(_served_on(plans, order, d, ordinals), part, 0)
    return sent


def _served_on(plans: Mapping[int, HaloPlan], order: Sequence[int], d: int,
               ordinals: np.ndarray) -> np.ndarray:
    """Per row of `ordinals` (a partition's shard ordinal on each dim), whether it receives
    the halo of dim `d`: a partition whose shard on another dim holds no real output
    (`HaloPlan.real`) receives none, except on a dim exchanged before one on which it sends
    (that later exchange forwards what it holds: the corners)."""
    position = {e: k for k, e in enumerate(order)}
    served = np.ones(len(ordinals), dtype=bool)
    for e, plan in plans.items():
        if e != d and plan.real is not None:
            needed = plan.real if position[e] < position[d] else plan.real | plan.senders()
            served &= needed[ordinals[:, e]]
    return served


def sent_per_partition(plans: Mapping[int, HaloPlan], local_dims: Sequence[int],
                       counts: Sequence[int]) -> np.ndarray:
    """Elements each partition sends to exchange `plans` (`_sent_per_ordinals`, as
    `halo_sent` prices them) as an array of the tiling's `counts`, indexed by the partition's
    shard ordinals. Exchanges priced together add these arrays, so that their busiest
    partition is one partition (a select-and-scatter's halos in and its results' halos back,
    `returned_per_partition`, leave from different partitions)."""
    shape = [plans[d].shards if d in plans else 1 for d in range(len(counts))]
    return np.broadcast_to(_sent_per_ordinals(plans, local_dims).reshape(shape), tuple(counts))


def _sent_by_dim(plans: Mapping[int, HaloPlan], local_dims: Sequence[int],
                 order: Sequence[int]):
    """Per exchanged dim (in `order`): the elements of that dim each shard ordinal sends (to
    the shards whose `reach` covers it: the part of each hop's piece its receiver reads) and
    the elements of the other dims one such element carries."""
    dims = [int(d) for d in local_dims]
    for d in order:
        plan = plans[d]
        dims[d] = plan.input_shard
        other = int(np.prod(dims)) // max(dims[d], 1)
        n = plan.shards
        sent = np.zeros(n, dtype=np.int64)
        for side, step in (("left", 1), ("right", -1)):
            for hop in range(1, len(plan.pieces(side)) + 1):
                receiver = np.arange(n) + step * hop          # the sender's receiver
                inside = (receiver >= 0) & (receiver < n)
                reads = np.zeros(n, dtype=bool)
                reads[inside] = plan.receives(side, hop)[receiver[inside]]
                part = np.zeros(n, dtype=np.int64)
                read = plan.parts(side, hop)
                part[inside] = (read[:, 1] - read[:, 0])[receiver[inside]]
                sent += np.where(reads, part, 0)
        yield sent, other
        dims[d] = plan.carried


# ---- the plans of an instruction, as the halo-exchange pass records them (`halo=`) ------------


def describe_plans(plans: list[dict[int, HaloPlan]]) -> str:
    """`operand 0 dim 1: left=...; ...` ("" when nothing is exchanged): each plan's
    `HaloPlan.to_text`."""
    return "; ".join(f"operand {k} dim {d}: {plan.to_text()}"
                     for k, by_dim in enumerate(plans) for d, plan in sorted(by_dim.items()))


def recorded_plans(inst: Instruction, num_devices: int) -> list[dict[int, HaloPlan]]:
    """Per operand, the halo plans the halo-exchange pass recorded on `inst` (none without
    the attribute; a prefix scan's entry is not a halo plan). GspmdcError for a plan that
    does not parse or does not fit its operand's tiling."""
    plans: list[dict[int, HaloPlan]] = [{} for _ in inst.operands]
    text = frontend_attribute(inst, HALO)
    for entry in filter(None, (e.strip() for e in (text or "").split(";"))):
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise GspmdcError(f"{inst.name}: cannot read the halo plan {entry!r} "
                              "(expected 'operand K dim D: ...')")
        k, d, body = int(match.group(1)), int(match.group(2)), match.group(3)
        if body.startswith("prefix scan"):
            continue
        if k >= len(inst.operands) or d >= inst.operands[k].shape.rank:
            raise GspmdcError(f"{inst.name}: the halo plan names operand {k} dim {d}, which "
                              f"{inst.opcode} does not have")
        operand = inst.operands[k]
        try:
            plan = HaloPlan.from_text(body)
        except ValueError as e:
            raise GspmdcError(f"{inst.name}: malformed halo plan of operand {k} dim {d}: "
                              f"{e}") from None
        tiling = Tiling(operand.sharding, operand.shape.rank, num_devices)
        local = tiling.shard_dims(operand.shape.dims)[d]
        if plan.shards != tiling.counts[d] or plan.input_shard != plan.base_dilation * local:
            raise GspmdcError(f"{inst.name}: the halo plan of operand {k} dim {d} is for "
                              f"{plan.shards} shards of {plan.input_shard // plan.base_dilation}"
                              f", but {operand.name} has {tiling.counts[d]} shards of {local} "
                              "there")
        plans[k][d] = plan
    return plans


_ENTRY = re.compile(r"operand (\d+) dim (\d+): (.*)")


# ---- emission ---------------------------------------------------------------------------------

def windowed_input(ctx: EmitContext, value: Instruction, tiling: Tiling,
                   plans: Mapping[int, HaloPlan], pad_value: Instruction | None) -> Instruction:
    """`value` (this partition's shard under `tiling`) with every dim of `plans` replaced by its
    window input (dims in `exchange_order`). `pad_value`: the scalar masked positions and
    dilation holes take (may be None only when no plan masks or dilates). A partition whose
    shard on one dim holds no real output receives no halo on the others (`HaloPlan.real`),
    except on a dim exchanged before one on which it sends: that later exchange forwards what
    it holds (the corners)."""
    ordinals = tiling.coordinates()
    order = exchange_order(plans, value.shape.dims)
    dilated_later = []
    for k, d in enumerate(order):
        served = _served_on(plans, order, d, ordinals)
        if plans[d].base_dilation > 1 and k + 1 < len(order):
            value = _undilated_window(ctx, _exchanged(ctx, value, d, tiling, plans[d], served),
                                      d, tiling, plans[d], pad_value)
            dilated_later.append(d)
        else:
            value = exchange_halo(ctx, value, d, tiling, plans[d], pad_value, served)
    for d in dilated_later:
        value = _dilated_window(ctx, value, d, tiling, plans[d], _need(pad_value))
    return value


def exchange_order(plans: Mapping[int, HaloPlan], local_dims: Sequence[int]) -> list[int]:
    """The order the dims of `plans` are exchanged in on a shard of `local_dims`: the one whose
    busiest partition sends least (then all partitions; then increasing dims, the first of
    equals). Each exchange carries what the earlier ones made of the other dims (the corners),
    so any order is exact, but not equally cheap: a dim whose window crops its shard (a
    dilated dim: the undilated elements its windows span, `HaloPlan.carried`) first makes every
    later piece smaller, one whose window grows it first makes them larger. Without base
    dilation, increasing (XLA's order, which the per-partition trimming of halos,
    `HaloPlan.real`, is measured against); with it, up to three dims every order is tried,
    beyond that increasing and dilated last."""
    dims = sorted(plans)
    if len(dims) < 2 or all(plans[d].base_dilation == 1 for d in dims):
        return dims
    orders = itertools.permutations(dims) if len(dims) <= 3 else \
        (dims, sorted(dims, key=lambda d: (plans[d].base_dilation > 1, d)))
    best, best_key = None, None
    for order in orders:
        sent = _sent_per_ordinals(plans, local_dims, order=order)
        busiest, total = int(sent.max(initial=0)), int(sent.sum())
        if best_key is None or (busiest, total) < best_key:
            best, best_key = list(order), (busiest, total)
    return best


def exchange_halo(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling,
                  plan: HaloPlan, pad_value: Instruction | None,
                  served: np.ndarray | None = None) -> Instruction:
    """Dim `dim` of the local `value` (tiled `plan.shards` ways on `dim` by `tiling`)
    replaced by this partition's window input of `plan.window_input` elements: collective-permutes
    per hop, concatenation, dilation, (dynamic-)slice and mask. `served`: per device id,
    whether it receives its halo (None: every device); the others get zeros."""
    if plan.identity:
        return value
    b = ctx.builder
    value = _exchanged(ctx, value, dim, tiling, plan, served)
    if plan.base_dilation > 1:
        value = _dilate(b, value, dim, plan.base_dilation, _need(pad_value))
    if plan.pad_left or plan.pad_right:
        fill = pad_value if pad_value is not None else b.zero(value.shape.element_type)
        value = _pad_dim(b, value, dim, plan.pad_left, plan.pad_right, fill)
    value = _cut(ctx, value, dim, tiling, plan.offsets, plan.window_input)
    if plan.mask:
        value = _mask(ctx, value, dim, plan.start[tiling.coordinates()[:, dim]], plan.valid,
                      _need(pad_value))
    return value


def _exchanged(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling,
               plan: HaloPlan, served: np.ndarray | None) -> Instruction:
    """The concatenation `[left hops..., own shard, right hops...]` of undilated elements on
    `dim` (`exchange_halo`'s permutes)."""
    if tiling.counts[dim] != plan.shards:
        raise ValueError(f"halo plan for {plan.shards} shards on a dim tiled "
                         f"{tiling.counts[dim]} ways")
    pieces = [_receive(ctx, value, dim, tiling, h, piece, plan.receives("left", h),
                       from_left=True, parts=plan.parts("left", h), served=served)
              for h, piece in reversed(list(enumerate(plan.pieces("left"), 1)))]
    pieces.append(value)
    pieces += [_receive(ctx, value, dim, tiling, h, piece, plan.receives("right", h),
                        from_left=False, parts=plan.parts("right", h), served=served)
               for h, piece in enumerate(plan.pieces("right"), 1)]
    return _concatenate(ctx.builder, pieces, dim)


def _undilated_window(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling,
                      plan: HaloPlan, pad_value: Instruction | None) -> Instruction:
    """The concatenation `value` of a dilated dim cut to the `U` undilated elements this
    partition's window input spans (`HaloPlan.undilated_window`; padded with the pad value
    where the window reaches past the concatenation): what the later exchanges carry."""
    b = ctx.builder
    count, first = plan.undilated_window()
    length = value.shape.dims[dim]
    low = max(0, -int(first.min()))
    high = max(0, int((first + count).max()) - length)
    if low or high:
        value = _pad_dim(b, value, dim, low, high, _need(pad_value))
    return _cut(ctx, value, dim, tiling, first + low, count)


def _dilated_window(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling,
                    plan: HaloPlan, pad_value: Instruction) -> Instruction:
    """`_undilated_window`'s elements on `dim` dilated into this partition's window input:
    holes and padding take `pad_value`, then the positions outside the data are masked (as
    `exchange_halo` leaves it)."""
    count, first = plan.undilated_window()
    b = plan.base_dilation
    # shard i's window starts `behind[i]` positions (holes or padding) before its first element
    behind = b * first - (plan.offsets - plan.pad_left)
    low = int(behind.max())
    high = max(0, int((plan.window_input - behind).max()) - (b * (count - 1) + 1))
    value = _pad_dim(ctx.builder, value, dim, low, high, pad_value, interior=b - 1)
    value = _cut(ctx, value, dim, tiling, low - behind, plan.window_input)
    if plan.mask:
        value = _mask(ctx, value, dim, plan.start[tiling.coordinates()[:, dim]], plan.valid,
                      pad_value)
    return value


def _cut(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling, starts: np.ndarray,
         length: int) -> Instruction:
    """`length` elements of `dim` from `starts[i]` on shard `i` of that dim (a slice where all
    shards agree, else a dynamic-slice at a table entry)."""
    starts = starts[tiling.coordinates()[:, dim]]
    if (starts == starts[0]).all():
        return _slice_dim(ctx.builder, value, dim, int(starts[0]), int(starts[0]) + length)
    offsets = [ctx.tables.zero()] * value.shape.rank
    offsets[dim] = ctx.tables.lookup(starts, f"halo.offset.{dim}")
    sizes = list(value.shape.dims)
    sizes[dim] = length
    return ctx.builder.dynamic_slice(value, offsets, sizes)


def return_halo(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling,
                plan: HaloPlan, fill: Instruction) -> Instruction:
    """The transpose of `exchange_halo` for additive results: `value` holds, on dim `dim`, one
    value per position of this partition's window input (`plan.window_input`, `fill` = 0 where
    nothing landed); the parts lying on neighbours' shards are sent back to them by the reverse
    permutes and added to theirs. Returns this shard's `plan.input_shard` elements (no base
    dilation)."""
    if plan.identity:
        return value
    b = ctx.builder
    dims = list(value.shape.dims)
    length = plan.pad_left + plan.from_left + plan.input_shard + plan.from_right + plan.pad_right
    dims[dim] = length
    buffer = b.broadcast(fill, dims)
    starts = [ctx.tables.zero()] * value.shape.rank
    starts[dim] = ctx.tables.lookup(plan.offsets[tiling.coordinates()[:, dim]],
                                    f"halo.offset.{dim}")
    buffer = b.add("dynamic-update-slice", buffer.shape.with_dims(dims), [buffer, value, *starts])
    at = plan.pad_left
    lefts = list(reversed(list(enumerate(plan.hops(plan.from_left), 1))))
    own_at = at + plan.from_left
    own = _slice_dim(b, buffer, dim, own_at, own_at + plan.input_shard)
    pieces = []
    for h, size in lefts:        # belongs to the last `size` elements of shard i - h
        piece = _slice_dim(b, buffer, dim, at, at + size)
        pieces.append((_send(ctx, piece, dim, tiling, h, toward_left=True), size, True))
        at += size
    at = own_at + plan.input_shard
    for h, size in enumerate(plan.hops(plan.from_right), 1):   # the first `size` of shard i + h
        piece = _slice_dim(b, buffer, dim, at, at + size)
        pieces.append((_send(ctx, piece, dim, tiling, h, toward_left=False), size, False))
        at += size
    for received, size, at_end in pieces:
        low, high = (plan.input_shard - size, 0) if at_end else (0, plan.input_shard - size)
        if low or high:
            received = _pad_dim(b, received, dim, low, high, fill)
        own = b.binary("add", own, received)
    return own


def returned_per_partition(plans: Mapping[int, HaloPlan], value_dims: Sequence[int],
                           counts: Sequence[int], order: Sequence[int]) -> np.ndarray:
    """Elements each partition sends (an array of the tiling's `counts`, indexed by its shard
    ordinals, as `sent_per_partition`) returning the halos of `plans` from a value of
    `value_dims` (the window input on those dims) by `return_halo`, one dim after another in
    `order`: every hop's piece whole, from every shard with a neighbour at that distance."""
    sent = np.zeros(tuple(counts), dtype=np.int64)
    dims = [int(n) for n in value_dims]
    for d in order:
        plan = plans[d]
        i = np.arange(plan.shards, dtype=np.int64)
        by_ordinal = np.zeros(plan.shards, dtype=np.int64)
        for hop, size in enumerate(plan.hops(plan.from_left), 1):    # toward the left
            by_ordinal += np.where(i >= hop, size, 0)
        for hop, size in enumerate(plan.hops(plan.from_right), 1):   # toward the right
            by_ordinal += np.where(i < plan.shards - hop, size, 0)
        axis = [1] * len(counts)
        axis[d] = plan.shards
        sent = sent + (by_ordinal * (int(np.prod(dims)) // max(dims[d], 1))).reshape(axis)
        dims[d] = plan.input_shard
    return sent


def _send(ctx: EmitContext, piece: Instruction, dim: int, tiling: Tiling, hop: int,
          toward_left: bool) -> Instruction:
    """Each shard sends `piece` to the shard `hop` positions to its left / right."""
    n = tiling.counts[dim]
    low = np.take(tiling.devices, np.arange(0, n - hop), axis=dim).ravel()
    high = np.take(tiling.devices, np.arange(hop, n), axis=dim).ravel()
    pairs = np.stack([high, low], axis=1) if toward_left else np.stack([low, high], axis=1)
    return ctx.builder.collective_permute(piece, pairs, ctx.channels())


def _need(pad_value: Instruction | None) -> Instruction:
    if pad_value is None:
        raise ValueError("this halo plan masks or dilates: it needs a pad value")
    return pad_value


def _receive(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling, hop: int,
             piece: tuple[int, int, int], receives: np.ndarray,
             from_left: bool, parts: np.ndarray | None = None,
             served: np.ndarray | None = None) -> Instruction:
    """The piece each shard receives from the shard `hop` positions to its left (the sender's
    last `size` elements) or right (its first `size`), `piece = (size, lo, hi)`, for the
    shards that `receives` it (by ordinal); the others (and shards without a sender) get
    zeros. Only the piece's elements `[lo, hi)` travel; zeros stand for the rest. With
    `parts` (`HaloPlan.parts`: per receiver the elements it reads), each distinct part travels
    in a permute of its own to the shards reading it, and each shard selects its own."""
    local = value.shape.dims[dim]
    size, lo, hi = piece
    at = local - size if from_left else 0
    if parts is None:
        parts = np.tile(np.array([lo, hi], dtype=np.int64), (len(receives), 1))
    b = ctx.builder
    groups = sorted({(int(p[0]), int(p[1])) for p, r in zip(parts, receives) if r})
    received = None
    for lo, hi in groups or [(lo, hi)]:
        group = receives & (parts[:, 0] == lo) & (parts[:, 1] == hi)
        got = _sent_piece(ctx, value, dim, tiling, hop, at + lo, at + hi, group, from_left,
                          served)
        if (lo, hi) != (0, size):
            got = _pad_dim(b, got, dim, lo, size - hi, b.zero(value.shape.element_type))
        if received is not None:            # this partition's group picks its part
            ordinals = tiling.coordinates()[:, dim]
            mine = ctx.tables.lookup(group[ordinals].astype(np.int32),
                                     f"halo.part.{dim}")
            chosen = b.compare(mine, ctx.tables.lookup(np.ones(len(ordinals), np.int32),
                                                       "one"), "EQ")
            got = b.select(b.broadcast(chosen, got.shape.dims), got, received)
        received = got
    return received


def _sent_piece(ctx: EmitContext, value: Instruction, dim: int, tiling: Tiling, hop: int,
                start: int, limit: int, receives: np.ndarray, from_left: bool,
                served: np.ndarray | None = None) -> Instruction:
    """Elements `[start, limit)` of the sender's `value`, received from `hop` shards to the
    left / right by the shards that `receives` it and the devices `served` (by id; None: all),
    zeros elsewhere."""
    n = tiling.counts[dim]
    piece = _slice_dim(ctx.builder, value, dim, start, limit)
    devices = tiling.devices
    low = np.take(devices, np.arange(0, n - hop), axis=dim).ravel()
    high = np.take(devices, np.arange(hop, n), axis=dim).ravel()
    ordinals = np.take(np.indices(devices.shape)[dim], np.arange(hop, n), axis=dim).ravel()
    receiving = receives[ordinals - hop if not from_left else ordinals]
    pairs = np.stack([low, high], axis=1) if from_left else np.stack([high, low], axis=1)
    if served is not None:
        receiving = receiving & served[pairs[:, 1]]
    pairs = pairs[receiving]
    if not len(pairs):
        b = ctx.builder
        return b.broadcast(b.zero(piece.shape.element_type), piece.shape.dims)
    return ctx.builder.collective_permute(piece, pairs, ctx.channels())


def _slice_dim(b, x: Instruction, dim: int, start: int, limit: int) -> Instruction:
    if (start, limit) == (0, x.shape.dims[dim]):
        return x
    spec = [SliceDim(0, n) for n in x.shape.dims]
    spec[dim] = SliceDim(start, limit)
    dims = list(x.shape.dims)
    dims[dim] = limit - start
    return b.add("slice", x.shape.with_dims(dims), [x], {"slice": tuple(spec)})


def _concatenate(b, pieces: list[Instruction], dim: int) -> Instruction:
    if len(pieces) == 1:
        return pieces[0]
    dims = list(pieces[0].shape.dims)
    dims[dim] = sum(p.shape.dims[dim] for p in pieces)
    return b.add("concatenate", pieces[0].shape.with_dims(dims), pieces, {"dimensions": (dim,)})


def _pad_dim(b, x: Instruction, dim: int, low: int, high: int, fill: Instruction,
             interior: int = 0) -> Instruction:
    spec = [PadDim(0, 0)] * x.shape.rank
    spec[dim] = PadDim(low, high, interior)
    dims = list(x.shape.dims)
    n = dims[dim]
    dims[dim] = low + high + n + max(n - 1, 0) * interior
    return b.add("pad", x.shape.with_dims(dims), [x, fill], {"padding": tuple(spec)})


def _dilate(b, x: Instruction, dim: int, factor: int, fill: Instruction) -> Instruction:
    """`factor - 1` holes after every element (so shards concatenate into the dilated base)."""
    return _pad_dim(b, x, dim, 0, factor - 1, fill, interior=factor - 1)


def _mask(ctx: EmitContext, x: Instruction, dim: int, starts: np.ndarray, valid: int,
          fill: Instruction) -> Instruction:
    """Positions `start + j` of dim `dim` outside `[0, valid)` replaced by `fill`."""
    b = ctx.builder
    dims = x.shape.dims
    index = b.binary("add", b.iota("s32", dims, dim),
                     b.broadcast(ctx.tables.lookup(starts, f"halo.start.{dim}"), dims))
    inside = b.binary("and", b.compare(index, b.broadcast(ctx.tables.zero(), dims), "GE"),
                      b.compare(index, b.broadcast(b.constant(valid, "s32"), dims), "LT"))
    return b.select(inside, x, b.broadcast(fill, dims))


__all__ = ["WindowedDim", "HaloPlan", "plan_halo", "halo_sent", "busiest_and_total",
           "sent_per_partition", "returned_per_partition",
           "describe_plans", "recorded_plans", "windowed_input", "exchange_order",
           "exchange_halo", "return_halo"]
