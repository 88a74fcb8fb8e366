"""Comparing program outputs: a partitioned run against the unpartitioned reference, or a run
against recorded outputs.

Integers and predicates must match exactly. Floats (and complex) match when every element satisfies
`|got - want| <= atol + rtol * |want|` with NaNs in the same places (numpy's `allclose` rule).
Data movement is exact, but an SPMD program splits reductions across partitions, which changes the
order of float sums, and a value computed slightly differently can round the other way at every
later rounding. `check_tolerance` therefore derives each output's tolerance from what the values on
the way to it went through in the reference program (`path_precision`):

    rtol = 8 * max(eps_low, max over reductions r on the way of eps_r * max(L_r, 4))
    atol = rtol * max|want|

`eps_low` is the machine epsilon of the least precise floating type a computed value on the way is
rounded to (moved or selected values, parameters and constants do not count): a value computed
slightly differently may round the other way. `L_r` is the number of terms reduction `r` sums into
one element and `eps_r` the epsilon of the type it accumulates in (f32 for bf16/f16 dots and
convolutions; the reducer's own type for `reduce` and `reduce-window`, whose bf16/f16 steps each
round). `atol` is a normwise floor: a sum that cancels has a large error relative to its small
result. A path that computes nothing (data movement only) must match exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Mapping

import ml_dtypes
import numpy as np

from gspmdc.ir import dtypes, ops
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.shapes import ArrayShape, TupleShape

#: elements compared at once (the float64 work arrays of a huge output stay small)
COMPARE_CHUNK = 1 << 22


@dataclass(frozen=True)
class Bound:
    """The tolerance of one floating output: `rtol`, `atol`, and `basis`, how they were derived
    (printed with a mismatch)."""

    rtol: float
    atol: float
    basis: str = ""


#: the Bound of a floating output, from its name and its reference values
Tolerance = Callable[[str, np.ndarray], Bound]


@dataclass(frozen=True)
class OutputComparison:
    """The comparison of one output: `ok`, the worst absolute error, the worst error as a
    fraction of the allowed one (`<= 1` when ok; 0 or 1 for exact types), and what is wrong."""

    name: str
    ok: bool
    max_abs_error: float
    error_ratio: float
    problem: str | None = None
    bound: Bound | None = None

    def line(self) -> str:
        status = "ok" if self.ok else f"MISMATCH: {self.problem}"
        if not self.ok and self.bound is not None:
            status += (f" (rtol {self.bound.rtol:.3g}, atol {self.bound.atol:.3g}"
                       + (f": {self.bound.basis}" if self.bound.basis else "") + ")")
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
    bound = tolerance(name, b)
    rtol, atol = bound.rtol, bound.atol
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
                            f"{bad} of {b.size} elements outside tolerance" if bad else None, bound)


def compare_outputs(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
                    rtol: float = 1e-4, atol: float = 1e-5) -> str | None:
    """None when every output matches with fixed float tolerances (exact for integers and
    predicates), else a one-line description of the first mismatching output."""
    for result in compare_output_arrays(got, want, lambda _name, _want: Bound(rtol, atol)):
        if not result.ok:
            return f"{result.name}: {result.problem} (max abs error {result.max_abs_error:.3g})"
    return None


def check_tolerance(reference: Module) -> Tolerance:
    """The tolerance of `gspmdc run --check` for the outputs of the program `reference` (see the
    module docstring; outputs named as `runtime/io.output_arrays` names them)."""
    precisions = path_precision(reference)

    def tolerance(name: str, want: np.ndarray) -> Bound:
        return _bound(precisions.get(name) or _PathPrecision.of_type(_real_type(want.dtype)), want)
    return tolerance


def program_tolerance(reference: Module) -> Tolerance:
    """A tolerance for any value computed inside the program `reference` (`gspmdc bisect`
    compares values, not outputs): the bound of its least precise output path, or of the value's
    own type when that is less precise."""
    worst = _EXACT
    for precision in path_precision(reference).values():
        worst = worst.joined(precision)

    def tolerance(name: str, want: np.ndarray) -> Bound:
        return _bound(worst.joined(_PathPrecision.of_type(_real_type(want.dtype))), want)
    return tolerance


def _bound(precision: "_PathPrecision", want: np.ndarray) -> Bound:
    rtol = 8 * max(precision.eps, precision.reduction_error)
    finite = np.abs(want[np.isfinite(want)])
    return Bound(rtol, rtol * (float(finite.max()) if finite.size else 0.0), precision.describe())


@dataclass(frozen=True)
class _PathPrecision:
    """What the values on the way to an output went through: `eps`, the epsilon of the least
    precise floating type a computed value is rounded to (`element_type`, met first at
    instruction `at`; ties keep the earlier), and `reduction_error = eps_r * max(L_r, 4)` of the reduction `reduction`
    (`terms` = L_r) where it is largest."""

    eps: float
    element_type: str
    at: str | None = None
    reduction_error: float = 0.0
    reduction: str | None = None
    terms: int = 1

    @staticmethod
    def of_type(element_type: str, at: str | None = None) -> "_PathPrecision":
        return _PathPrecision(_eps(element_type), element_type, at)

    def joined(self, other: "_PathPrecision") -> "_PathPrecision":
        low = self if self.eps >= other.eps else other
        red = self if self.reduction_error >= other.reduction_error else other
        return _PathPrecision(low.eps, low.element_type, low.at, red.reduction_error,
                              red.reduction, red.terms)

    def describe(self) -> str:
        text = f"8 x max({self.element_type} eps {self.eps:.3g}"
        text += f" (at {self.at})" if self.at else ""
        if self.reduction is not None:
            text += f", {self.reduction_error:.3g} from {self.terms} terms at {self.reduction}"
        return text + ")"


#: the precision of a path with nothing computed on it
_EXACT = _PathPrecision(0.0, "none")

#: opcodes that move, select or reinterpret values without computing (no rounding)
_MOVES = ops.opcodes(
    "parameter", "constant", "iota", "reshape", "transpose", "broadcast", "slice",
    "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "copy", "bitcast", "reverse",
    "gather", "tuple", "get-tuple-element", "select", "domain", "opt-barrier", "all-gather",
    "all-to-all", "collective-permute", "collective-broadcast", "partition-id", "replica-id")


def path_precision(module: Module) -> dict[str, _PathPrecision]:
    """For each output of `module` (`out0`, `out0.1`, ...), what the values on the way to it went
    through: the entry's instructions it depends on, and everything in the computations those
    call."""
    entry = module.entry
    called: dict[str, _PathPrecision] = {}
    cone: dict[Instruction, _PathPrecision] = {}
    for inst in entry.instructions:
        precision = _own(inst, module, called)
        for op in inst.operands:
            precision = cone[op].joined(precision)
        cone[inst] = precision
    outputs: dict[str, _PathPrecision] = {}

    def name(prefix: str, inst: Instruction, shape) -> None:
        if not isinstance(shape, TupleShape):
            outputs[prefix] = cone[inst]
            return
        for i, element in enumerate(shape.elements):
            if inst.opcode == "tuple":
                name(f"{prefix}.{i}" if prefix else f"out{i}", inst.operands[i], element)
            else:
                name(f"{prefix}.{i}" if prefix else f"out{i}", inst, element)
    root = entry.root
    if isinstance(root.shape, TupleShape):
        name("", root, root.shape)
    else:
        outputs["out0"] = cone[root]
    return outputs


def _own(inst: Instruction, module: Module, called: dict[str, _PathPrecision]) -> _PathPrecision:
    """What `inst` itself contributes: its own rounding, its reduction, the computations it
    calls."""
    precision = _EXACT
    if inst.opcode not in _MOVES:
        for leaf in inst.shape.leaves():
            if dtypes.is_float(leaf.element_type) or dtypes.is_complex(leaf.element_type):
                precision = precision.joined(
                    _PathPrecision.of_type(_real_type_name(leaf.element_type), inst.name))
    terms = _terms(inst)
    accumulation = _accumulation_type(inst)
    if terms > 1 and accumulation is not None:
        precision = precision.joined(_PathPrecision(
            0.0, "none", None, _eps(accumulation) * max(terms, 4), inst.name, terms))
    for name in inst.called_computation_names():
        precision = precision.joined(_computation_precision(module, name, called))
    return precision


def _computation_precision(module: Module, name: str,
                           called: dict[str, _PathPrecision]) -> _PathPrecision:
    if name not in called:
        called[name] = _EXACT         # a computation calling itself adds nothing new
        comp: Computation = module.computation(name)
        precision = _EXACT
        for inst in comp.instructions:
            precision = precision.joined(_own(inst, module, called))
        called[name] = precision
    return called[name]


def _accumulation_type(inst: Instruction) -> str | None:
    """The floating type a reduction's sums are rounded to (None: exact, e.g. integers)."""
    leaf = next(iter(inst.shape.leaves()), None)
    if not isinstance(leaf, ArrayShape):
        return None
    t = _real_type_name(leaf.element_type)
    if not dtypes.is_float(t):
        return None
    if inst.opcode in ("dot", "convolution") and t in ("bf16", "f16"):
        return "f32"
    return t


def _real_type(dtype: np.dtype) -> str:
    return _real_type_name(dtypes.element_type_of(dtype))


def _real_type_name(element_type: str) -> str:
    return {"c64": "f32", "c128": "f64"}.get(element_type, element_type)


def _eps(element_type: str) -> float:
    if not dtypes.is_float(element_type):
        return 0.0
    return float(ml_dtypes.finfo(dtypes.numpy_dtype(element_type)).eps)


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
