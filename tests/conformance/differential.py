"""One case against XLA: gspmdc and XLA each propagate and partition the same tagged module, and
the two are compared three ways (see `run_case`).

    result = run_case(case, oracle, seed=0)
    result.status, result.shardings, result.our_bytes, result.our_busiest, result.values
"""
from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from gspmdc import api
from gspmdc.errors import GspmdcError
from gspmdc.ir.module import Module

from .branches import BranchVariant, branch_variants, forced_by_origin, forced_text
from .correspondence import ShardingVerdict, compare_shardings
from .deliberate import deliberate_differences
from .oracle import XlaAnswer, XlaOracle

#: cases whose values are not compared: larger than this many bytes in one value, or more
#: multiply-adds than this (the reference interpreter runs them on one core)
VALUE_LIMIT_BYTES = 16 << 20
VALUE_LIMIT_MULTIPLY_ADDS = 2e8
#: opcodes whose values depend on more than the inputs (I/O, random numbers drawn differently)
NONDETERMINISTIC = frozenset({"infeed", "outfeed", "send", "send-done", "recv", "recv-done",
                              "rng"})
RUN_TIMEOUT_SECONDS = 120.0
#: how gspmdc's runs round bf16 here: after every op, as XLA's do under the oracle's default
#: `--xla_allow_excess_precision=false`
VALUE_ROUNDING = "per-op"


@dataclass(frozen=True)
class Case:
    """A module with its partition count and the two propagation options (as the generator's
    record, `tests/fuzz`). `reference_text`: for a module with manual regions (which mean
    something only per device), a module without them computing the same outputs, which the
    reference interpreter runs instead."""

    name: str
    text: str
    num_partitions: int
    propagate_to_output: bool = False
    propagate_to_parameters: bool = False
    reference_text: str | None = None


@dataclass(frozen=True)
class BranchValues:
    """The value check of one forced branch (`branches.BranchVariant.label`): `values` and
    `mismatch` as `CaseResult.values` / `.value_mismatch`."""

    label: str
    values: str
    mismatch: dict = field(default_factory=dict)


@dataclass
class CaseResult:
    """What one case showed. `status`:
    - "compared": both compilers partitioned it (shardings and bytes compared; values too unless
      `values` is "not run: ...");
    - "xla-rejected": XLA refused the module (the case is not counted);
    - "gspmdc-rejected": XLA partitioned it, gspmdc stopped with a clear error (a divergence);
    - "gspmdc-crashed": gspmdc failed with an internal error (a divergence);
    - "xla-crashed": XLA's process died or timed out (the case is not counted);
    - "skipped": one partition: XLA neither propagates nor partitions (not counted).
    `our_bytes` / `xla_bytes`: the mean per device of each partitioned program's collective
    bytes, `our_busiest` / `xla_busiest` its busiest device's (`program_bytes`; None when a
    loop's trip count is not static).
    `values`: "compared" or "not run: <why>"; `value_mismatch` maps "gspmdc" and "XLA" to what
    differs from the reference interpreter (or why its run failed) where it does. `branches`:
    the same for each branch of each conditional run forced (`branches.py`), when values are
    compared.
    `deliberate`: when the shardings differ, the deliberate differences from XLA
    (`deliberate.py`) the module gives occasion to. `seconds`: where the case's time went, by
    stage ("prepare", XLA's stages as `XlaAnswer.seconds`, "gspmdc compile", "compare",
    "reference", "gspmdc run")."""

    case: Case
    status: str
    detail: str = ""
    shardings: list[ShardingVerdict] = field(default_factory=list)
    our_bytes: float | None = None
    xla_bytes: float | None = None
    our_busiest: int | None = None
    xla_busiest: int | None = None
    values: str = "not run"
    value_mismatch: dict[str, str] = field(default_factory=dict)
    before: str | None = None
    our_spmd: str | None = None
    xla_spmd: str | None = None
    propagated: Module | None = None
    deliberate: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    branches: list["BranchValues"] = field(default_factory=list)

    @property
    def compared_shardings(self) -> list[ShardingVerdict]:
        return [v for v in self.shardings if v.compared]

    @property
    def shardings_agree(self) -> bool:
        return all(v.agrees for v in self.compared_shardings)

    @property
    def bytes_compared(self) -> bool:
        return self.our_bytes is not None and self.xla_bytes is not None

    @property
    def xla_values_wrong(self) -> bool:
        return xla_values_wrong(self.value_mismatch, [b.mismatch for b in self.branches])


@dataclass(frozen=True, order=True)
class ProgramBytes:
    """The bytes a partitioned program's devices send in collectives in one run, by gspmdc's
    cost model (docs/design/cost-model.md#a-programs-bytes): `busiest`, the largest of the
    devices' totals (each device's bytes summed over every collective execution), and `mean`,
    the devices' totals averaged. Ordered as the project compares programs: by the busiest
    device, then by the mean on a tie."""

    busiest: int
    mean: float


def program_bytes(spmd_text: str, num_partitions: int) -> ProgramBytes | None:
    """The bytes of the partitioned program `spmd_text` (gspmdc's or XLA's), from every
    device's total (`passes/spmd/traffic.sent_per_device`); None when some loop's trip count is
    not static. The mean is exact (a fraction of integers), rounded to a float once: two
    programs sending the same bytes in a different order of collectives compare equal."""
    from gspmdc.passes.spmd.traffic import sent_per_device
    module = api.parse(spmd_text, "<spmd>", verify=False)
    sent = sent_per_device(module, num_partitions)
    if sent is None:
        return None
    return ProgramBytes(int(sent.max(initial=0)),
                        float(Fraction(int(sent.sum()), max(num_partitions, 1))))


def collective_bytes(spmd_text: str, num_partitions: int) -> float | None:
    """The mean per device of `program_bytes` (None where it is None)."""
    measured = program_bytes(spmd_text, num_partitions)
    return None if measured is None else measured.mean


def xla_values_wrong(value_mismatch: dict, branch_mismatches) -> bool:
    """XLA's partitioned program is wrong where gspmdc's is right: on the random inputs, or with
    some branch forced (`branch_mismatches`, one mismatch dict per forced branch), XLA's outputs
    differ from the reference interpreter's (or its run failed) while gspmdc's agree. Such a
    module's XLA bytes bound nothing: the oracle keeps it out of the bytes verdict."""
    return any("XLA" in m and "gspmdc" not in m
               for m in [value_mismatch, *branch_mismatches])


def _gspmdc_compile(text: str, case: Case, *, partition: bool = True
                    ) -> tuple[str | None, Module]:
    """gspmdc's partitioner pipeline (`gspmdc compile`'s) with the case's propagation options:
    the module text right after the `propagate` pass (None if it did not get there) and the SPMD
    module (without `partition`: the pipeline stops after `propagate`, and the module is the
    propagated one)."""
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.pipeline import partitioner_pipeline
    from gspmdc.ir.stage import claim_global
    module = api.parse(text, case.name)
    claim_global(module, case.name)        # XLA's partitioner takes every module as global
    passes = [dataclasses.replace(p, propagate_to_output=(case.propagate_to_output,),
                                  propagate_to_parameters=(case.propagate_to_parameters,),
                                  record_origins=False)
              if p.name == "propagate" else p for p in partitioner_pipeline()]
    if not partition:
        passes = passes[:[p.name for p in passes].index("propagate") + 1]
    propagated: list[str] = []

    def after(index, pass_, result, seconds):
        if pass_.name == "propagate":
            propagated.append(api.to_text(result))

    try:
        spmd = run_pipeline(PassContext(case.num_partitions), module, passes, after)
    except Exception as e:
        e.propagated_text = propagated[0] if propagated else None
        raise
    return propagated[0], spmd


def _values_skipped(module: Module) -> str | None:
    from .score import largest_value_bytes, multiply_adds
    from gspmdc.prepare import why_no_reference
    reason = why_no_reference(module)
    if reason is not None:
        return reason
    odd = sorted({i.opcode for _, i in module.all_instructions() if i.opcode in NONDETERMINISTIC})
    if odd:
        return f"nondeterministic opcodes ({', '.join(odd)})"
    io = [leaf for p in module.entry.parameters if p.sharding is not None
          for leaf in p.sharding.leaves()]
    if module.entry.root.sharding is not None:
        io += list(module.entry.root.sharding.leaves())
    if any(leaf.has_unreduced for leaf in io):
        return "unreduced parameters or result (no global value)"
    if any(i.literal is not None and i.literal.elided for _, i in module.all_instructions()):
        return "elided constants ({...})"
    if largest_value_bytes(module) > VALUE_LIMIT_BYTES:
        return "a value larger than 16 MiB"
    if multiply_adds(module) > VALUE_LIMIT_MULTIPLY_ADDS:
        return "too many multiply-adds"
    if any(leaf.is_token for p in module.entry.parameters for leaf in p.shape.leaves()) or \
            any(leaf.is_token for leaf in module.entry.root.shape.leaves()):
        return "token parameters or results"
    return None


def _no_global_result(spmd: Module, n: int) -> str | None:
    """Why the result of `spmd` has no global array to compare with the reference (the
    runtime's own test, `ShardedLeaf.check_global_io`: e.g. propagation made a leaf `{manual}`,
    so each device returns its own value), or None."""
    from gspmdc.errors import UnsupportedError
    from gspmdc.runtime.sharded_io import spmd_signature
    try:
        for leaf in spmd_signature(spmd, n).output.leaves:
            leaf.check_global_io("the result", output=True)
    except UnsupportedError as e:
        return f"no global result: {e}"
    except GspmdcError:
        return None                      # the run reports it
    return None


def _leaves(value, shape) -> list:
    from gspmdc.runtime.sharded_io import flatten_value
    return [np.asarray(v) for v in flatten_value(value, shape)]


def _run_gspmdc(text: str, inputs: list, n: int, rounding: str) -> list:
    from gspmdc.runtime.backends.local import run_local
    from gspmdc.runtime.sharded_io import assemble_outputs, spmd_signature, split_inputs
    spmd = api.parse(text, "<gspmdc spmd>")             # what runs is what prints
    signature = spmd_signature(spmd, n)
    results = run_local(spmd, split_inputs(signature, inputs, padding="garbage"), n,
                        timeout=RUN_TIMEOUT_SECONDS, rounding=rounding)
    return _leaves(assemble_outputs(signature, results), signature.output.global_shape)


def _value_mismatch(want: list, got: list, reference: Module) -> str | None:
    """The first output of `got` outside `run --check`'s tolerance of the reference's, or None."""
    from gspmdc.runtime.compare import check_tolerance, compare_output_arrays
    expected = {f"out{i}": np.atleast_1d(v) for i, v in enumerate(want)}
    actual = {f"out{i}": np.atleast_1d(v) for i, v in enumerate(got)}
    bad = [c.line() for c in compare_output_arrays(
        actual, expected, check_tolerance(reference)) if not c.ok]
    return bad[0] if bad else None


@dataclass
class Prepared:
    """A case ready for XLA: gspmdc's parse of it, its random arguments and their array leaves
    (`inputs`; None, with the reason in `skipped`, when values are not compared) and the result
    leaves' dims; `shardings_only`: only the shardings after propagation are to be compared
    (`run_case`); `branches`: when values are compared, each branch of each conditional to run
    forced, with its module text (`branches.py`)."""

    case: Case
    original: Module
    arguments: list | None
    inputs: list | None
    output_shapes: list | None
    skipped: str | None
    seconds: float = 0.0
    shardings_only: bool = False
    branches: list[tuple[BranchVariant, str]] = field(default_factory=list)

    def send(self, oracle: XlaOracle) -> None:
        oracle.send(self.case.text, self.case.num_partitions,
                    to_output=self.case.propagate_to_output,
                    to_parameters=self.case.propagate_to_parameters,
                    inputs=self.inputs, output_shapes=self.output_shapes,
                    variants=[text for _, text in self.branches])


def run_case(case: Case, oracle: XlaOracle, seed: int = 0, *, values: bool = True,
             shardings_only: bool = False) -> CaseResult:
    """Run `case` through XLA and gspmdc and compare (1) the sharding of every instruction after
    propagation (`correspondence.py`), (2) the bytes each device sends in collectives in the two
    partitioned programs (`collective_bytes`, the same function on both texts) and (3) with
    `values`, the outputs of gspmdc's partitioned program on the local backend, of XLA's
    partitioned program on N host devices and of gspmdc's reference interpreter, all from the
    same random inputs (`seed`). With `shardings_only`, (1) alone: gspmdc stops after
    propagation and nothing runs. (`prepare`, XLA, then `finish`.)"""
    prepared = prepare(case, seed, values=values, shardings_only=shardings_only)
    if isinstance(prepared, CaseResult):
        return prepared
    prepared.send(oracle)
    return finish(prepared, oracle.receive())


def prepare(case: Case, seed: int = 0, *, values: bool = True,
            shardings_only: bool = False) -> Prepared | CaseResult:
    """gspmdc's parse of the case and its random inputs (`seed`; none with `shardings_only` or
    without `values`); a CaseResult when gspmdc cannot parse it or there is nothing to
    compare."""
    if case.num_partitions < 2:
        return CaseResult(case, "skipped", "one partition: XLA neither propagates nor partitions")
    started = time.monotonic()
    try:
        original = api.parse(case.text, case.name)
    except GspmdcError as e:
        return CaseResult(case, "gspmdc-rejected", f"parse: {_line(e)}")
    skipped = "shardings only" if shardings_only else \
        _values_skipped(original) if values else "values not requested"
    arguments = inputs = output_shapes = None
    if skipped is None:
        from gspmdc.runtime.io import random_inputs
        try:
            arguments = random_inputs(original, seed)
        except GspmdcError as e:
            skipped = f"no random inputs: {_line(e)}"
        else:
            inputs = [leaf for p, v in zip(original.entry.parameters, arguments)
                      for leaf in _leaves(v, p.shape)]
            output_shapes = [leaf.dims for leaf in original.entry.root.shape.leaves()]
    branches = [] if skipped is not None else \
        [(v, forced_text(case.text, v.forcings)) for v in branch_variants(case.text, case.name)]
    return Prepared(case, original, arguments, inputs, output_shapes, skipped,
                    time.monotonic() - started, shardings_only, branches)


class _Clock:
    """Seconds since the last `lap`, added to `seconds` under a stage's name."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds = seconds
        self.last = time.monotonic()

    def lap(self, stage: str) -> None:
        now = time.monotonic()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now


def finish(prepared: Prepared, xla: XlaAnswer) -> CaseResult:
    """gspmdc's side of the case given XLA's answer, and the comparisons (see `run_case`).

    gspmdc is given `before`, the module XLA's propagation pass starts from: XLA's import
    (HLO -> StableHLO -> HLO) renames instructions, flattens tuple parameters and folds tuples,
    and its call inliner runs before propagation; starting both compilers from the same module
    makes the instructions correspond one to one by name and keeps those rewrites (semantics-
    preserving) out of the comparison. With `prepared.shardings_only` gspmdc stops after its
    propagation and only the shardings are compared. The values are compared again with each
    branch of each conditional forced (`branches.py`)."""
    case, original, skipped = prepared.case, prepared.original, prepared.skipped
    n = case.num_partitions
    seconds = {"prepare": prepared.seconds, **xla.seconds}
    if not xla.ok and xla.stage in ("crash", "timeout"):
        return CaseResult(case, "xla-crashed", xla.error, seconds=seconds)
    if not xla.ok and xla.stage == "compile":
        return CaseResult(case, "xla-rejected", xla.error, seconds=seconds)
    result = CaseResult(case, "compared", before=xla.before, seconds=seconds)
    clock = _Clock(seconds)
    try:
        before = api.parse(xla.before, case.name)
        propagated_text, spmd = _gspmdc_compile(xla.before, case,
                                                partition=not prepared.shardings_only)
    except GspmdcError as e:
        result.status, result.detail = "gspmdc-rejected", _line(e)
        propagated_text, spmd = getattr(e, "propagated_text", None), None
    except Exception as e:  # noqa: BLE001 - an internal error is a finding, not a stop
        result.status, result.detail = "gspmdc-crashed", _crash_line(e)
        propagated_text, spmd = getattr(e, "propagated_text", None), None
    clock.lap("gspmdc compile")
    if propagated_text is not None:
        result.propagated = api.parse(propagated_text, "<gspmdc propagated>", verify=False)
        theirs = api.parse(xla.propagated, "<xla propagated>", verify=False)
        result.shardings = compare_shardings(before, result.propagated, theirs)
        if not result.shardings_agree:
            result.deliberate = deliberate_differences(xla.before, case, theirs)
    result.xla_spmd = xla.spmd
    if prepared.shardings_only:
        result.values = f"not run: {skipped}"
    if spmd is None or prepared.shardings_only:
        clock.lap("compare")
        return result
    result.our_spmd = api.to_text(spmd)
    ours, theirs = program_bytes(result.our_spmd, n), program_bytes(xla.spmd, n)
    if ours is not None:
        result.our_bytes, result.our_busiest = ours.mean, ours.busiest
    if theirs is not None:
        result.xla_bytes, result.xla_busiest = theirs.mean, theirs.busiest
    clock.lap("compare")
    if skipped is None and not _same_leaves(before, original):
        skipped = "XLA's import changed the entry signature"
    if skipped is None:
        skipped = _no_global_result(spmd, n)
    if skipped is not None:
        result.values = f"not run: {skipped}"
        return result
    reference = original if case.reference_text is None else \
        api.parse(case.reference_text, f"{case.name} (reference)")
    result.values, result.value_mismatch = _compare_values(
        result.our_spmd, xla, reference, prepared, clock)
    for (variant, _), answer in zip(prepared.branches, xla.variants):
        result.branches.append(_branch_values(variant, answer, xla.before, prepared, clock))
    return result


def _compare_values(spmd_text: str, xla: XlaAnswer, reference: Module, prepared: Prepared,
                    clock: "_Clock") -> tuple[str, dict[str, str]]:
    """`values` and `value_mismatch` (`CaseResult`) of gspmdc's partitioned program `spmd_text`
    and XLA's answer against the reference interpreter running `reference`, all on the
    prepared inputs."""
    from gspmdc.runtime.interpreter import evaluate
    n = prepared.case.num_partitions
    try:
        want = _leaves(evaluate(reference, prepared.arguments, rounding=VALUE_ROUNDING),
                       reference.entry.root.shape)
    except GspmdcError as e:
        return f"not run: the reference interpreter stopped: {_line(e)}", {}
    clock.lap("reference")
    mismatch = {}
    try:
        problem = _value_mismatch(want, _run_gspmdc(spmd_text, prepared.inputs, n,
                                                    VALUE_ROUNDING), reference)
    except GspmdcError as e:
        problem = f"run failed: {_line(e)}"
    if problem is not None:
        mismatch["gspmdc"] = problem
    clock.lap("gspmdc run")
    problem = _value_mismatch(want, xla.outputs, reference) if xla.ok else \
        f"{xla.stage} failed: {xla.error}"
    if problem is not None:
        mismatch["XLA"] = problem
    return "compared", mismatch


def _branch_values(variant: BranchVariant, xla: XlaAnswer, imported: str, prepared: Prepared,
                   clock: "_Clock") -> BranchValues:
    """The value check of the module with `variant`'s branch forced, as `finish` makes it of
    the module itself: gspmdc partitions the module XLA's propagation started from (when XLA
    rejects the forced module, which it may do in passes after partitioning, the module XLA's
    propagation started from for the case, `imported`, with the same branch forced by origin),
    and the reference interpreter runs the case's reference program with the same branch
    forced."""
    case = prepared.case
    before = xla.before if xla.before is not None else \
        forced_by_origin(imported, variant.forcings, case.name)
    if before is None:
        return BranchValues(variant.label, f"not run: XLA rejected it ({xla.error}) and its "
                            "import of the case lacks the conditional or folded it")
    try:
        _, spmd = _gspmdc_compile(before, case)
    except Exception as e:  # noqa: BLE001 - an error here is a finding about this branch
        clock.lap("gspmdc compile")
        return BranchValues(variant.label, "compared", {"gspmdc": f"compile failed: "
                                                        f"{_crash_line(e)}"})
    clock.lap("gspmdc compile")
    if not _same_leaves(api.parse(before, case.name), prepared.original):
        return BranchValues(variant.label, "not run: XLA's import changed the entry signature")
    skipped = _no_global_result(spmd, case.num_partitions)
    reference_text = forced_text(case.reference_text or case.text, variant.forcings)
    if reference_text is None:
        skipped = "the reference program lacks the conditional"
    if skipped is not None:
        return BranchValues(variant.label, f"not run: {skipped}")
    values, mismatch = _compare_values(api.to_text(spmd), xla,
                                       api.parse(reference_text, f"{case.name} (reference)"),
                                       prepared, clock)
    return BranchValues(variant.label, values, mismatch)


def _same_leaves(before: Module, original: Module) -> bool:
    """`before` takes the array leaves of `original`'s parameters as its parameters and returns
    the leaves of `original`'s result."""
    from gspmdc.ir.shapes import compatible
    ours = [leaf for p in original.entry.parameters for leaf in p.shape.leaves()]
    theirs = [p.shape for p in before.entry.parameters]
    out_ours = list(original.entry.root.shape.leaves())
    out_theirs = list(before.entry.root.shape.leaves())
    return len(ours) == len(theirs) and all(map(compatible, ours, theirs)) and \
        len(out_ours) == len(out_theirs) and all(map(compatible, out_ours, out_theirs))


def _line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__


def _crash_line(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {_line(e)} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
