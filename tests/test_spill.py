"""Values larger than memory (`runtime/spill.py`), the interpreter's dynamic-slice(pad) fusion, and
random inputs drawn in blocks: checked against plain numpy."""
from __future__ import annotations

import errno
import mmap

import numpy as np
import pytest

from gspmdc import api
from gspmdc.runtime import io, spill


def file_backed(a: np.ndarray) -> bool:
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, memoryview) and isinstance(a.obj, mmap.mmap)


def test_small_arrays_live_in_memory_and_large_ones_in_unlinked_files(monkeypatch, tmp_path):
    monkeypatch.setattr(spill, "SPILL_BYTES", 1024)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    small = spill.zeros((16,), np.float32)
    assert type(small) is np.ndarray and not file_backed(small)
    large = spill.full((64, 8), 2.5, np.float32)
    assert type(large) is np.ndarray and file_backed(large)
    np.testing.assert_array_equal(large, np.full((64, 8), 2.5, np.float32))
    assert not (large == 0).any() and not small.any()
    assert list(tmp_path.iterdir()) == []             # the backing file is already unlinked


def test_a_full_disk_is_a_memory_error_not_a_bus_error(monkeypatch):
    monkeypatch.setattr(spill, "SPILL_BYTES", 1024)

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("os.posix_fallocate", no_space)
    with pytest.raises(MemoryError, match="no room for a"):
        spill.zeros((1024,), np.float32)


def _window_of_pad(padding: str, sizes: str, starts: list[int], used_elsewhere: bool = False):
    text = f"""HloModule m
ENTRY e {{
  x = f32[5,7] parameter(0)
  z = f32[] constant(-1)
  p = f32[9,8] pad(x, z), padding={padding}
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  ROOT d = f32[{sizes}] dynamic-slice(p, i, j), dynamic_slice_sizes={{{sizes}}}
}}"""
    if used_elsewhere:
        text = text.replace("ROOT d = f32", "d = f32").replace(
            "}}\"\"\"", "").rstrip("}") + \
            f"  ROOT t = (f32[{sizes}], f32[9,8]) tuple(d, p)\n}}"
    module = api.parse(text)
    x = np.arange(35, dtype=np.float32).reshape(5, 7)
    args = [x, np.int32(starts[0]), np.int32(starts[1])]
    return x, api.evaluate(module, args)


@pytest.mark.parametrize("starts", [[0, 0], [1, 1], [3, 0], [7, 5], [-2, 9], [2, 3]])
def test_dynamic_slice_of_pad_reads_the_window_without_the_padded_array(starts):
    """pad low 1 / high 3 on dim 0, low 0 / high 1 on dim 1; windows inside, across and past
    the operand, starts clamped as HLO clamps them."""
    x, got = _window_of_pad("1_3x0_1", "4,3", starts)
    padded = np.pad(x, ((1, 3), (0, 1)), constant_values=-1)
    i = min(max(starts[0], 0), 9 - 4)
    j = min(max(starts[1], 0), 8 - 3)
    np.testing.assert_array_equal(got, padded[i:i + 4, j:j + 3])
    inside = 1 <= i and i + 4 <= 6 and j + 3 <= 7
    assert np.shares_memory(got, x) == inside


def test_a_pad_used_elsewhere_is_evaluated():
    x, (window, padded) = _window_of_pad("1_3x0_1", "4,3", [0, 0], used_elsewhere=True)
    np.testing.assert_array_equal(padded, np.pad(x, ((1, 3), (0, 1)), constant_values=-1))
    np.testing.assert_array_equal(window, padded[:4, :3])


RANDOM = """HloModule m
ENTRY e {
  a = f32[300,1000] parameter(0)
  b = (s32[5,6], pred[40], bf16[2,3], c64[7]) parameter(1)
  ROOT r = f32[300,1000] copy(a)
}"""


def test_random_inputs_are_the_same_in_memory_and_spilled_and_in_range(monkeypatch):
    module = api.parse(RANDOM)
    want = io.random_inputs(module, 3)
    monkeypatch.setattr(spill, "SPILL_BYTES", 4096)
    monkeypatch.setattr(io, "RANDOM_BLOCK", 1 << 16)   # other blocks: other values
    other = io.random_inputs(module, 3)
    assert not np.array_equal(other[0], want[0])
    monkeypatch.setattr(io, "RANDOM_BLOCK", 1 << 20)
    got = io.random_inputs(module, 3)
    assert file_backed(got[0])
    np.testing.assert_array_equal(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        np.testing.assert_array_equal(g, w)
    a, (s, p, h, c) = want
    assert -1 <= a.min() < -0.99 and 0.99 < a.max() < 1 and abs(a.mean()) < 0.01
    assert s.min() >= 0 and s.max() < 8 and p.any() and not p.all()
    assert np.abs(c.real).max() < 1 and np.abs(c.imag).max() < 1 and c.imag.any()
