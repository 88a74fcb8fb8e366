"""Comparing program outputs: a partitioned run against the unpartitioned reference, or a run
against recorded outputs.

Integers and predicates must match exactly. Floats (and complex) match when every element satisfies
`|got - want| <= atol + rtol * |want|` with NaNs in the same places (numpy's `allclose` rule).
Data movement is exact, but an SPMD program splits reductions across partitions and so changes the
order of float sums; `check_tolerance` therefore scales with the longest reduction of the reference
program: `rtol = 8 * eps * max(L, 4)` for the output's type, and `atol = rtol * max|want|` (a
normwise floor, since a sum that cancels has a large error relative to its small result).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Mapping

import ml_dtypes
import numpy as np

from gspmdc.ir.module import Module
from gspmdc.ir.shapes import ArrayShape

#: elements compared at once (the float64 work arrays of a huge output stay small)
COMPARE_CHUNK = 1 << 22

#: (rtol, atol) for a floating output, from its reference values
Tolerance = Callable[[np.ndarray], tuple[float, float]]


@dataclass(frozen=True)
class OutputComparison:
    """The comparison of one output: `ok`, the worst absolute error, the worst error as a
    fraction of the allowed one (`<= 1` when ok; 0 or 1 for exact types), and what is wrong."""

    name: str
    ok: bool
    max_abs_error: float
    error_ratio: float
    problem: str | None = None

    def line(self) -> str:
        status = "ok" if self.ok else f"MISMATCH: {self.problem}"
        return (f"{self.name}: max abs error {self.max_abs_error:.3g} "
                f"({self.error_ratio:.3g} of the tolerance) {status}")


def compare_output_arrays(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
                          tolerance: Tolerance) -> list[OutputComparison]:
    """One comparison per output of `want` (missing or extra outputs are mismatches)."""
    results = []
    for name in sorted(set(want) | set(got)):
        if name not in got or name not in want:
            results.append(OutputComparison(name, False, float("inf"), float("inf"),
                                            "missing" if name not in got else "unexpected"))
        else:
            results.append(_compare(name, np.asarray(got[name]), np.asarray(want[name]),
                                    tolerance))
    return results


def _compare(name: str, a: np.ndarray, b: np.ndarray, tolerance: Tolerance) -> OutputComparison:
    if b.dtype.kind == "V" and b.dtype.itemsize == a.dtype.itemsize:
        b = b.view(a.dtype)         # bf16 read back from an npz file as raw 2-byte voids
    if a.shape != b.shape or a.dtype != b.dtype:
        return OutputComparison(name, False, float("inf"), float("inf"),
                                f"{a.dtype}{list(a.shape)} != expected {b.dtype}{list(b.shape)}")
    if b.size == 0:
        return OutputComparison(name, True, 0.0, 0.0)
    if b.dtype.kind in "biu":
        bad = int(np.count_nonzero(a != b))
        error = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        return OutputComparison(name, bad == 0, error, float(bad > 0),
                                f"{bad} of {b.size} elements differ" if bad else None)
    rtol, atol = tolerance(b)
    work = np.complex128 if b.dtype.kind == "c" else np.float64
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    error = ratio = 0.0
    bad = 0
    for start in range(0, b.size, COMPARE_CHUNK):      # bounded memory for huge outputs
        x = flat_a[start:start + COMPARE_CHUNK].astype(work)
        y = flat_b[start:start + COMPARE_CHUNK].astype(work)
        with np.errstate(all="ignore"):
            diff = np.abs(x - y)
            diff[np.isnan(diff)] = np.inf               # NaN on one side, or different infinities
            diff[(x == y) | (np.isnan(x) & np.isnan(y))] = 0.0
            allowed = atol + rtol * np.abs(np.where(np.isfinite(y), y, 0))
            ratio = max(ratio, float(np.max(diff / np.maximum(allowed,
                                                              np.finfo(np.float64).tiny))))
        error = max(error, float(np.max(diff)))
        bad += int(np.count_nonzero(diff > allowed))
    return OutputComparison(name, bad == 0, error, ratio,
                            f"{bad} of {b.size} elements outside tolerance" if bad else None)


def compare_outputs(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
                    rtol: float = 1e-4, atol: float = 1e-5) -> str | None:
    """None when every output matches with fixed float tolerances (exact for integers and
    predicates), else a one-line description of the first mismatching output."""
    for result in compare_output_arrays(got, want, lambda _: (rtol, atol)):
        if not result.ok:
            return f"{result.name}: {result.problem} (max abs error {result.max_abs_error:.3g})"
    return None


def check_tolerance(reduction_length: int) -> Tolerance:
    """The tolerance of `gspmdc run --check` for a reference whose longest reduction sums
    `reduction_length` terms (see the module docstring)."""
    def tolerance(want: np.ndarray) -> tuple[float, float]:
        eps = float(ml_dtypes.finfo(want.real.dtype if want.dtype.kind == "c" else want.dtype).eps)
        rtol = 8 * eps * max(reduction_length, 4)
        finite = np.abs(want[np.isfinite(want)])
        return rtol, rtol * (float(finite.max()) if finite.size else 0.0)
    return tolerance


def reduction_length(module: Module) -> int:
    """The largest number of terms one output element of a reduction sums in `module`: contracting
    sizes of dots, reduced sizes of reduce, window sizes of reduce-window, window times input
    features (per group) of convolutions. 1 when there is none."""
    longest = 1
    for _, inst in module.all_instructions():
        longest = max(longest, _terms(inst))
    return longest


def _terms(inst) -> int:
    def dims(i):
        shape = inst.operands[i].shape
        return shape.dims if isinstance(shape, ArrayShape) else ()
    if inst.opcode == "dot":
        lhs = dims(0)
        return prod(lhs[d] for d in inst.attr("lhs_contracting_dims", ()))
    if inst.opcode == "reduce":
        operand = dims(0)
        return prod(operand[d] for d in inst.attr("dimensions", ()))
    if inst.opcode == "reduce-window":
        window = inst.attr("window")
        return prod(w.size for w in window.dims) if window is not None else 1
    if inst.opcode == "convolution":
        kernel = dims(1)
        labels = inst.attr("dim_labels")
        window = inst.attr("window")
        spatial = prod(w.size for w in window.dims) if window is not None else 1
        features = kernel[labels.rhs_input_feature] if labels is not None and kernel else 1
        return spatial * features
    return 1
