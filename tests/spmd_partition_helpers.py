"""Helpers for the partitioner tests: partition HLO text, run the SPMD program on the local backend
from global inputs (uneven padding filled with garbage: NaN / integer maxima, so a program reading
padding fails), and compare with the unpartitioned program on the reference interpreter."""
from __future__ import annotations

import numpy as np

from gspmdc import api
from gspmdc.ir.module import Module
from gspmdc.passes.pipeline import compile_spmd
from gspmdc.runtime import io
from gspmdc.runtime.backends.local import run_local
from gspmdc.runtime.sharded_io import assemble_outputs, spmd_signature, split_inputs

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def partition(text: str, n: int, *, propagate: bool = False) -> Module:
    """The SPMD module of `text` on `n` partitions, verified after every pass, printed and
    parsed back (so the text form is what is tested, and the verifier checks it)."""
    spmd = compile_spmd(api.parse(text), n, propagate=propagate, verify_each=True)
    return api.parse(api.to_text(spmd))


def run_global(spmd: Module, inputs: list, n: int):
    """The SPMD module run on `n` local partitions from global inputs; the global result."""
    signature = spmd_signature(spmd, n)
    per_partition = split_inputs(signature, inputs, padding="garbage")
    return assemble_outputs(signature, run_local(spmd, per_partition, n, timeout=120))


def reference(text: str, inputs: list):
    return api.evaluate(api.parse(text), inputs)


def inputs_for(text: str, seed: int = 0) -> list[np.ndarray]:
    return io.random_inputs(api.parse(text), seed)


def assert_close(got, want, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w, rtol, atol)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    if want.dtype.kind in "fc":
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(got.astype(wide), want.astype(wide), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def check_equivalent(text: str, n: int, *, inputs: list | None = None, seed: int = 0,
                     propagate: bool = False, rtol: float = 1e-5, atol: float = 1e-5) -> Module:
    """Partition `text`, run it on `n` partitions and assert it reproduces the reference;
    returns the SPMD module (for checks on its collectives)."""
    inputs = inputs_for(text, seed) if inputs is None else inputs
    spmd = partition(text, n, propagate=propagate)
    assert_close(run_global(spmd, inputs, n), reference(text, inputs), rtol, atol)
    return spmd


def collectives(module: Module) -> list:
    """The entry's collectives in program order, as `(opcode, detail)`: replica groups as lists
    (collective-permute: its moving pairs), plus `dimensions` where the op has them."""
    found = []
    for inst in module.entry.instructions:
        if inst.opcode not in COLLECTIVES:
            continue
        if inst.opcode == "collective-permute":
            detail = sorted(tuple(p) for p in inst.attr("source_target_pairs"))
        else:
            detail = [list(g) for g in inst.attr("replica_groups").groups]
        dims = inst.attr("dimensions")
        found.append((inst.opcode, detail) if dims is None else
                     (inst.opcode, detail, tuple(dims)))
    return found


def opcodes(module: Module) -> list[str]:
    return [inst.opcode for inst in module.entry.instructions]


def sent_bytes(spmd: Module, n: int) -> float:
    """The bytes all `n` devices of `spmd` send, by the cost model."""
    from gspmdc.passes.spmd.traffic import collective_traffic
    return float(sum(t.total_sent_bytes for t in collective_traffic(spmd, n)))


def busiest_per_collective(spmd: Module, n: int) -> int:
    """The busiest device's bytes of each collective of `spmd`, summed over the collectives
    (what a reshard plan's cost adds up over its steps)."""
    from gspmdc.passes.spmd.traffic import collective_traffic
    return sum(t.traffic.max_sent for t in collective_traffic(spmd, n))


def compared_with_xla(text: str, n: int):
    """XLA partitions `text` on `n` devices too (the oracle; needs jax): the comparison's
    result, asserted compared, gspmdc sending no more bytes per device than XLA, and gspmdc's
    values the reference's."""
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    with XlaOracle() as xla:
        result = run_case(Case("bytes", text, n), xla)
    assert result.status == "compared", result.detail
    assert result.our_bytes <= result.xla_bytes, (result.our_bytes, result.xla_bytes)
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
    return result


def generated_compared_with_xla(seed: int, setting: str):
    """The generated module `seed` (the `fuzz` module of the tests) against XLA as the oracle run compares it,
    with propagation to the output and parameters `setting` ("on" or "off"; needs jax): the
    comparison's result, asserted compared and gspmdc's values the reference's (the bytes are
    the caller's to judge)."""
    from conformance.differential import Case, run_case
    from conformance.oracle import XlaOracle
    from fuzz import case
    generated = case(seed)
    on = setting == "on"
    with XlaOracle() as xla:
        result = run_case(Case(f"fuzz/{seed} [{setting}]", generated.text,
                               generated.num_partitions, on, on, generated.reference_text),
                          xla, seed // 1000000)
    assert result.status == "compared", result.detail
    assert "gspmdc" not in result.value_mismatch, result.value_mismatch
    return result
