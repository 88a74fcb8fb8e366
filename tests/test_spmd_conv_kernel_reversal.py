"""A convolution over one window covering its whole input and kernel (one output there) with
both tiled alike on that spatial dim contracts it in place, uneven tiles masked (a partial sum
per device, all-reduced); a kernel it reverses is read through a `reverse` sharded as the
kernel flipped (XLA's partitioner aligns a reversed kernel by the reversed sharding after
moving its padding to the front). Bytes by hand from the cost model (all-reduce over 2: the
operand's bytes; a permute: its operand from each source); values against the unpartitioned
program."""
from __future__ import annotations

import pytest

from gspmdc.ir.parser import parse_module, parse_sharding
from gspmdc.passes.spmd.kernel_reversal import reverse_tiled_kernels

from spmd_partition_helpers import check_equivalent, collectives, sent_bytes, \
    busiest_per_collective

CONV = """HloModule m, num_partitions=2

ENTRY main {{
  lhs = f32[{n},8,4] parameter(0), sharding={{devices=[2,1,1]0,1}}
  rhs = f32[{n},8,16] parameter(1), sharding={{devices=[2,1,1]{order}}}
  ROOT conv = f32[1,4,16] convolution(lhs, rhs), window={{size={n}{reversal}}}, dim_labels=0fb_0io->0bf, sharding={{replicated}}
}}
"""


def conv(n: int, order: str, reversal: bool) -> str:
    return CONV.format(n=n, order=order, reversal=" rhs_reversal=1" if reversal else "")


@pytest.mark.parametrize("n,reversal", [(5, False), (4, False), (4, True)],
                         ids=["uneven", "even", "even-reversed"])
def test_a_whole_window_tiled_alike_is_contracted_in_place(n, reversal):
    """Each device convolves its rows of both operands (5 rows: 3 and 2, the padding masked)
    into a partial f32[1,4,16] (256 B), all-reduced over the 2 devices: 256 B, where
    gathering both operands sent 1920 (5 rows) or 1280 (4 rows). A reversed kernel held in
    reversed device order is the input's tiling once flipped: no permute."""
    spmd = check_equivalent(conv(n, "1,0" if reversal else "0,1", reversal), 2)
    assert [c[0] for c in collectives(spmd)] == ["all-reduce"]
    assert sent_bytes(spmd, 2) == 256


def test_an_uneven_reversed_kernel_moves_its_padding_to_the_front():
    """5 kernel rows in 2 tiles, device 1 holding rows 0-2 and device 0 rows 3-4: flipped,
    device 0's tile is rows 4..2 and device 1's rows 1..0 then padding, so device 1 sends its
    last row (8 x 16 x 4 = 512 B) to device 0 (XLA's halo exchange to pad on the left), then
    the partial sums are all-reduced (256 B): 768 B from device 1, 512 on average, XLA's."""
    spmd = check_equivalent(conv(5, "1,0", True), 2)
    assert [c[0] for c in collectives(spmd)] == ["collective-permute", "all-reduce"]
    assert busiest_per_collective(spmd, 2) == 512 + 256
    assert sent_bytes(spmd, 2) == (512 + 2 * 256) / 2


def test_the_kernel_is_read_through_a_reverse_with_the_flipped_sharding():
    module = parse_module(conv(5, "1,0", True))
    reverse_tiled_kernels(module.entry)
    conv_inst = module.entry.root
    reversed_rhs = conv_inst.operands[1]
    assert reversed_rhs.opcode == "reverse" and reversed_rhs.attr("dimensions") == (0,)
    assert reversed_rhs.sharding == parse_sharding("{devices=[2,1,1]0,1}")
    assert not conv_inst.attr("window").dims[0].window_reversal


def test_a_kernel_tiled_unlike_the_input_keeps_its_reversal():
    """The input whole on the window dim: nothing to align, the convolution is left as it is."""
    text = conv(5, "1,0", True).replace("sharding={devices=[2,1,1]0,1}", "sharding={replicated}")
    module = parse_module(text)
    reverse_tiled_kernels(module.entry)
    assert [i.opcode for i in module.entry.instructions].count("reverse") == 0
    check_equivalent(text, 2)
