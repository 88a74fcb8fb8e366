"""gather / scatter / dynamic-slice / dynamic-update-slice run through the parser and interpreter,
against references written here from XLA's operation semantics with explicit loops over output
(gather) or update (scatter) elements."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.interpreter import evaluate

from hlo_text import reducer

RNG = np.random.default_rng(7)


def run(text, *args):
    return evaluate(parse_module(text), list(args))


def hlo_list(values):
    return "{" + ",".join(map(str, values)) + "}"


# --------------------------------------------------------------------------------------- gather

def gather_by_definition(operand, indices, offset_dims, collapsed, start_map, ivd, sizes,
                         operand_batching=(), indices_batching=()):
    """XLA's gather, one output element at a time."""
    if ivd == indices.ndim:
        indices = indices[..., None]
    batch_dims_of_indices = [d for d in range(indices.ndim) if d != ivd]
    kept = [d for d in range(operand.ndim) if d not in collapsed and d not in operand_batching]
    out_rank = len(offset_dims) + len(batch_dims_of_indices)
    batch_positions = [p for p in range(out_rank) if p not in offset_dims]
    out_shape = [0] * out_rank
    for p, d in zip(batch_positions, batch_dims_of_indices):
        out_shape[p] = indices.shape[d]
    for p, d in zip(offset_dims, kept):
        out_shape[p] = sizes[d]
    out = np.zeros(out_shape, operand.dtype)
    for out_index in itertools.product(*map(range, out_shape)):
        batch = [out_index[p] for p in batch_positions]
        where = list(batch)
        where.insert(ivd, slice(None))
        vector = indices[tuple(where)]
        start = [0] * operand.ndim
        for k, d in enumerate(start_map):
            start[d] = int(vector[k])
        for od, idd in zip(operand_batching, indices_batching):
            start[od] = batch[batch_dims_of_indices.index(idd)]
        start = [min(max(s, 0), operand.shape[d] - sizes[d]) for d, s in enumerate(start)]
        full = list(start)
        for p, d in zip(offset_dims, kept):
            full[d] += out_index[p]
        out[out_index] = operand[tuple(full)]
    return out


def gather_hlo(operand, indices, out_shape, offset_dims, collapsed, start_map, ivd, sizes,
               operand_batching=(), indices_batching=()):
    batching = ""
    if operand_batching:
        batching = (f", operand_batching_dims={hlo_list(operand_batching)}, "
                    f"start_indices_batching_dims={hlo_list(indices_batching)}")
    return f"""HloModule g
ENTRY e {{
  p = f32[{",".join(map(str, operand.shape))}] parameter(0)
  i = s32[{",".join(map(str, indices.shape))}] parameter(1)
  ROOT g = f32[{",".join(map(str, out_shape))}] gather(p, i), offset_dims={hlo_list(offset_dims)}, collapsed_slice_dims={hlo_list(collapsed)}, start_index_map={hlo_list(start_map)}, index_vector_dim={ivd}, slice_sizes={hlo_list(sizes)}{batching}
}}
"""


GATHER_CASES = {
    # embedding lookup with ids out of range on both sides (clamped)
    "rows": dict(operand=(5, 3), indices=np.array([0, 4, -2, 9]), offset_dims=(1,),
                 collapsed=(0,), start_map=(0,), ivd=1, sizes=(1, 3)),
    # windows of 2 rows that would overrun the end are moved back inside
    "windows_clamped": dict(operand=(5, 3), indices=np.array([[-1], [4], [2]]),
                            offset_dims=(1, 2), collapsed=(), start_map=(0,), ivd=1,
                            sizes=(2, 3)),
    # index vector in dim 0, permuted start_index_map, offset dim between batch dims
    "vector_first": dict(operand=(4, 6, 2), indices=np.array([[1, 5, 0], [3, 0, 2]]),
                         offset_dims=(1,), collapsed=(0, 1), start_map=(1, 0), ivd=0,
                         sizes=(1, 1, 2)),
    # implicit index vector (index_vector_dim == rank), batch dims around an offset dim
    "implicit_vector": dict(operand=(7, 4), indices=np.array([[6, 0], [2, 3], [5, 1]]),
                            offset_dims=(1, 3), collapsed=(), start_map=(0,), ivd=2,
                            sizes=(3, 2)),
    "batching": dict(operand=(2, 5, 3), indices=np.array([[[4], [0], [7]], [[1], [2], [-3]]]),
                     offset_dims=(2,), collapsed=(1,), start_map=(1,), ivd=2, sizes=(1, 1, 3),
                     operand_batching=(0,), indices_batching=(0,)),
    # JAX's take_along_axis form: two batching dims, index vector last
    "two_batching_dims": dict(operand=(3, 2, 4), indices=RNG.integers(-1, 5, (3, 2, 5, 1)),
                              offset_dims=(), collapsed=(2,), start_map=(2,), ivd=3,
                              sizes=(1, 1, 1), operand_batching=(0, 1),
                              indices_batching=(0, 1)),
    "empty_indices": dict(operand=(5, 3), indices=np.zeros((0,), np.int64), offset_dims=(1,),
                          collapsed=(0,), start_map=(0,), ivd=1, sizes=(1, 3)),
}


@pytest.mark.parametrize("case", GATHER_CASES)
def test_gather(case):
    c = dict(GATHER_CASES[case])
    operand = RNG.standard_normal(c.pop("operand")).astype(np.float32)
    indices = c.pop("indices").astype(np.int32)
    expected = gather_by_definition(operand, indices, **c)
    out = run(gather_hlo(operand, indices, expected.shape, **c), operand, indices)
    np.testing.assert_array_equal(out, expected)


def test_gather_hand_computed_clamping():
    operand = np.arange(10, dtype=np.float32).reshape(5, 2)
    indices = np.array([[-7], [3], [100]], np.int32)
    out = run(gather_hlo(operand, indices, (3, 2, 2), offset_dims=(1, 2), collapsed=(),
                         start_map=(0,), ivd=1, sizes=(2, 2)), operand, indices)
    np.testing.assert_array_equal(out, [[[0, 1], [2, 3]], [[6, 7], [8, 9]], [[6, 7], [8, 9]]])


def test_gather_unsigned_64_bit_indices_clamp():
    operand = np.arange(4, dtype=np.float32)
    indices = np.array([2**64 - 1, 1], np.uint64)
    text = """HloModule g
ENTRY e {
  p = f32[4] parameter(0)
  i = u64[2] parameter(1)
  ROOT g = f32[2] gather(p, i), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1}
}
"""
    np.testing.assert_array_equal(run(text, operand, indices), [3, 1])


# -------------------------------------------------------------------------------------- scatter

def scatter_by_definition(operands, indices, updates, combine, window_dims, inserted,
                          to_operand, ivd, operand_batching=(), indices_batching=()):
    """XLA's scatter, one update element at a time in row-major update order (scatter index
    major); a window that does not fit at its start index is skipped entirely."""
    results = [x.copy() for x in operands]
    if ivd == indices.ndim:
        indices = indices[..., None]
    batch_dims_of_indices = [d for d in range(indices.ndim) if d != ivd]
    rank = operands[0].ndim
    window_operand_dims = [d for d in range(rank) if d not in inserted and d not in operand_batching]
    update_shape = updates[0].shape
    scatter_dims = [d for d in range(len(update_shape)) if d not in window_dims]
    window_size = [1] * rank
    for w, d in zip(window_dims, window_operand_dims):
        window_size[d] = update_shape[w]
    for scatter_index in itertools.product(*[range(update_shape[d]) for d in scatter_dims]):
        where = list(scatter_index)
        where.insert(ivd, slice(None))
        vector = indices[tuple(where)]
        start = [0] * rank
        for k, d in enumerate(to_operand):
            start[d] = int(vector[k])
        for od, idd in zip(operand_batching, indices_batching):
            start[od] = scatter_index[batch_dims_of_indices.index(idd)]
        if any(s < 0 or s + window_size[d] > results[0].shape[d] for d, s in enumerate(start)):
            continue
        for window_index in itertools.product(*[range(update_shape[d]) for d in window_dims]):
            update_index = [0] * len(update_shape)
            for d, v in zip(scatter_dims, scatter_index):
                update_index[d] = v
            for d, v in zip(window_dims, window_index):
                update_index[d] = v
            full = list(start)
            for d, v in zip(window_operand_dims, window_index):
                full[d] += v
            old = [r[tuple(full)] for r in results]
            new = combine(*old, *[u[tuple(update_index)] for u in updates])
            for r, v in zip(results, new if isinstance(new, tuple) else (new,)):
                r[tuple(full)] = v
    return results


ADD_F32 = reducer("add")
# order-sensitive combiner on integers: old * 3 + update
TRIPLE_ADD_S32 = """comb {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  three = s32[] constant(3)
  m = s32[] multiply(a, three)
  ROOT c = s32[] add(m, b)
}"""


def scatter_hlo(computation, element_type, operand, indices, updates, window_dims, inserted,
                to_operand, ivd, operand_batching=(), indices_batching=()):
    batching = ""
    if operand_batching:
        batching = (f", input_batching_dims={hlo_list(operand_batching)}, "
                    f"scatter_indices_batching_dims={hlo_list(indices_batching)}")
    dims = lambda a: ",".join(map(str, a.shape))  # noqa: E731
    return f"""HloModule s
{computation}
ENTRY e {{
  p = {element_type}[{dims(operand)}] parameter(0)
  i = s32[{dims(indices)}] parameter(1)
  u = {element_type}[{dims(updates)}] parameter(2)
  ROOT s = {element_type}[{dims(operand)}] scatter(p, i, u), update_window_dims={hlo_list(window_dims)}, inserted_window_dims={hlo_list(inserted)}, scatter_dims_to_operand_dims={hlo_list(to_operand)}, index_vector_dim={ivd}{batching}, to_apply={computation.split()[0]}
}}
"""


SCATTER_CASES = {
    # rows with duplicates, a negative index and one past the end (skipped)
    "rows": dict(operand=(5, 3), indices=np.array([1, 3, 1, -1, 5, 1]), updates=(6, 3),
                 window_dims=(1,), inserted=(0,), to_operand=(0,), ivd=1),
    # 2-row windows: start 4 overruns the 5 rows and is skipped as a whole
    "windows_skip_partial_overrun": dict(operand=(5, 3), indices=np.array([[0], [4], [3], [0]]),
                                         updates=(4, 2, 3), window_dims=(1, 2), inserted=(),
                                         to_operand=(0,), ivd=1),
    # window dim before the scatter dim, index vector in dim 0, two scattered operand dims
    "window_dim_first": dict(operand=(4, 3, 5), indices=np.array([[0, 3, 1], [4, 0, 4]]),
                             updates=(3, 3), window_dims=(0,), inserted=(0, 2),
                             to_operand=(2, 0), ivd=0),
    "implicit_vector": dict(operand=(6,), indices=np.array([[0, 5], [5, 2]]), updates=(2, 2),
                            window_dims=(), inserted=(0,), to_operand=(0,), ivd=2),
    "batching": dict(operand=(2, 4, 3), indices=np.array([[[1], [1], [3]], [[0], [-1], [0]]]),
                     updates=(2, 3, 3), window_dims=(2,), inserted=(1,), to_operand=(1,), ivd=2,
                     operand_batching=(0,), indices_batching=(0,)),
}


@pytest.mark.parametrize("case", SCATTER_CASES)
def test_scatter_add(case):
    c = dict(SCATTER_CASES[case])
    operand = RNG.standard_normal(c.pop("operand")).astype(np.float32)
    indices = c.pop("indices").astype(np.int32)
    updates = RNG.standard_normal(c.pop("updates")).astype(np.float32)
    (expected,) = scatter_by_definition([operand], indices, [updates], lambda a, b: a + b, **c)
    out = run(scatter_hlo(ADD_F32, "f32", operand, indices, updates, **c), operand, indices,
              updates)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", SCATTER_CASES)
def test_scatter_order_sensitive_combiner(case):
    c = dict(SCATTER_CASES[case])
    operand = RNG.integers(-5, 5, c.pop("operand")).astype(np.int32)
    indices = c.pop("indices").astype(np.int32)
    updates = RNG.integers(-5, 5, c.pop("updates")).astype(np.int32)
    (expected,) = scatter_by_definition([operand], indices, [updates],
                                        lambda a, b: np.int32(a * 3 + b), **c)
    out = run(scatter_hlo(TRIPLE_ADD_S32, "s32", operand, indices, updates, **c), operand,
              indices, updates)
    np.testing.assert_array_equal(out, expected)


def test_scatter_hand_computed_duplicates_and_skips():
    operand = np.zeros(4, np.int32)
    indices = np.array([[2], [2], [7], [-1], [0]], np.int32)
    updates = np.array([1, 2, 50, 60, 5], np.int32)
    out = run(scatter_hlo(TRIPLE_ADD_S32, "s32", operand, indices, updates, window_dims=(),
                          inserted=(0,), to_operand=(0,), ivd=1), operand, indices, updates)
    # element 2: (0*3 + 1)*3 + 2 = 5 (in update order); indices 7 and -1 are skipped
    np.testing.assert_array_equal(out, [5, 0, 5, 0])


def test_scatter_overwrite_last_update_wins():
    computation = """assign {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}"""
    operand = np.zeros(3, np.float32)
    indices = np.array([[1], [1], [1], [0]], np.int32)
    updates = np.array([1, 2, 3, 4], np.float32)
    out = run(scatter_hlo(computation, "f32", operand, indices, updates, window_dims=(),
                          inserted=(0,), to_operand=(0,), ivd=1), operand, indices, updates)
    np.testing.assert_array_equal(out, [4, 3, 0])


def test_variadic_scatter_argmax():
    text = """HloModule s
argmax {
  v0 = f32[] parameter(0)
  i0 = s32[] parameter(1)
  v1 = f32[] parameter(2)
  i1 = s32[] parameter(3)
  gt = pred[] compare(v1, v0), direction=GT
  v = f32[] select(gt, v1, v0)
  i = s32[] select(gt, i1, i0)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  pv = f32[3] parameter(0)
  pi = s32[3] parameter(1)
  idx = s32[6,1] parameter(2)
  uv = f32[6] parameter(3)
  ui = s32[6] parameter(4)
  ROOT s = (f32[3], s32[3]) scatter(pv, pi, idx, uv, ui), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=argmax
}
"""
    pv, pi = np.full(3, -np.inf, np.float32), np.full(3, -1, np.int32)
    idx = np.array([[0], [2], [0], [0], [3], [2]], np.int32)
    uv = np.array([1, 5, 4, 2, 9, 5], np.float32)
    ui = np.arange(6, dtype=np.int32)
    values, positions = run(text, pv, pi, idx, uv, ui)
    expected = scatter_by_definition(
        [pv, pi], idx, [uv, ui],
        lambda v0, i0, v1, i1: (v1, i1) if v1 > v0 else (v0, i0),
        window_dims=(), inserted=(0,), to_operand=(0,), ivd=1)
    np.testing.assert_array_equal(values, expected[0])
    np.testing.assert_array_equal(positions, expected[1])
    np.testing.assert_array_equal(positions, [2, -1, 1])


def test_scatter_does_not_modify_its_operand():
    operand = np.zeros(3, np.float32)
    indices = np.array([[0]], np.int32)
    updates = np.ones(1, np.float32)
    run(scatter_hlo(ADD_F32, "f32", operand, indices, updates, window_dims=(), inserted=(0,),
                    to_operand=(0,), ivd=1), operand, indices, updates)
    np.testing.assert_array_equal(operand, [0, 0, 0])


# ------------------------------------------------------------- dynamic-slice / dynamic-update-slice

DYNAMIC = """HloModule d
ENTRY e {
  p = f32[5,4] parameter(0)
  u = f32[2,3] parameter(1)
  i = s32[] parameter(2)
  j = u32[] parameter(3)
  ds = f32[2,3] dynamic-slice(p, i, j), dynamic_slice_sizes={2,3}
  dus = f32[5,4] dynamic-update-slice(p, u, i, j)
  ROOT t = (f32[2,3], f32[5,4]) tuple(ds, dus)
}
"""


@pytest.mark.parametrize("i, j, row, col", [
    (1, 1, 1, 1), (-3, 0, 0, 0), (4, 9, 3, 1), (2**31 - 1, 2**32 - 1, 3, 1),
])
def test_dynamic_slice_and_update_clamp_starts(i, j, row, col):
    operand = np.arange(20, dtype=np.float32).reshape(5, 4)
    update = -np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    sliced, updated = run(DYNAMIC, operand, update, np.array(i, np.int32), np.array(j, np.uint32))
    np.testing.assert_array_equal(sliced, operand[row:row + 2, col:col + 3])
    expected = operand.copy()
    expected[row:row + 2, col:col + 3] = update
    np.testing.assert_array_equal(updated, expected)
