"""Score sharding propagation on XLA's propagation tests (`conformance/xla-propagation.json`).

Each case runs once per parameterisation (`param_values`) and per run; every expectation whose
`when` holds and whose kind is `sharding`, `has_sharding`, `same_sharding_as`,
`different_sharding_from`, `predicate` or `absent` is checked on the propagated module, comparing
parsed shardings (so an iota device list equals the same explicit list). Runs that expect the pass
to fail are checked for an error. Cases whose `options.is_spmd` is false (XLA's older non-SPMD
mode) are scored separately. Every miss is listed with a one-line reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gspmdc.errors import GspmdcError
from gspmdc.ir.ops import SIDE_EFFECTING

SCORED_KINDS = frozenset({"sharding", "has_sharding", "same_sharding_as",
                          "different_sharding_from", "predicate", "absent"})
CASE_TIMEOUT_SECONDS = 60


@dataclass
class Score:
    """Met / checked counts and the misses of one mode."""

    name: str
    met: int = 0
    checked: int = 0
    misses: list[str] = field(default_factory=list)

    def add(self, miss: str | None) -> None:
        self.checked += 1
        if miss is None:
            self.met += 1
        else:
            self.misses.append(miss)

    def line(self) -> str:
        pct = 100.0 * self.met / self.checked if self.checked else 100.0
        return f"  {self.name:<34} {self.met:>4} / {self.checked:<4} ({pct:5.1f}%)"


class _Miss(Exception):
    pass


def _resolve(value, params: dict):
    if isinstance(value, dict) and "param" in value:
        return params[value["param"]]
    if isinstance(value, list):
        return [_resolve(v, params) for v in value]
    return value


def _holds(expression: str | None, params: dict) -> bool:
    if not expression:
        return True
    return bool(eval(expression, {"__builtins__": {}}, dict(params)))  # noqa: S307 - corpus data


def _find(module, spec: str):
    if spec == "ROOT":
        return module.entry.root
    if spec.startswith("PARAM:"):
        number = int(spec.split(":", 1)[1])
        for p in module.entry.parameters:
            if p.parameter_number == number:
                return p
        raise _Miss(f"no entry parameter {number}")
    entry = [i for i in module.entry.instructions if i.name == spec]
    if entry:
        return entry[0]
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.name == spec:
                return inst
    raise _Miss(f"no instruction {spec}")


def _follow(module, inst, path: list[str]):
    current = inst
    for accessor in path:
        head, _, arg = accessor.partition("(")
        arg = arg.rstrip(")")
        if head == "operand":
            current = current.operands[int(arg)]
        elif head in ("while_body", "while_condition"):
            name = current.attrs["body" if head == "while_body" else "condition"].name
            current = module.computations[name]
        elif head == "root_instruction":
            current = current.root
        elif head == "parameter_instruction":
            current = next(p for p in current.parameters if p.parameter_number == int(arg))
        else:
            raise _Miss(f"unknown accessor {accessor}")
    return current


def _text(s) -> str:
    return "none" if s is None else s.to_text(include_metadata=False)


def _same(a, b, shape) -> bool:
    from gspmdc.ir.sharding_algebra import for_shape
    if a is None or b is None:
        return a is b
    return for_shape(a, shape) == for_shape(b, shape)


def _check(module, expectation: dict) -> None:
    """Raise _Miss with a reason when the expectation does not hold."""
    from gspmdc.ir.parser import parse_sharding
    kind = expectation["kind"]
    name = expectation["instruction"]
    if kind == "absent":
        try:
            _find(module, name)
        except _Miss:
            return
        raise _Miss(f"{name} exists")
    inst = _follow(module, _find(module, name), expectation.get("path", []))
    label = name + "".join("." + p for p in expectation.get("path", []))
    actual = inst.sharding
    if kind == "sharding":
        text = expectation["sharding"]
        expected = None if text is None else parse_sharding(text)
        if not _same(actual, expected, inst.shape):
            raise _Miss(f"{label}: got {_text(actual)}, expected {_text(expected)}")
    elif kind == "has_sharding":
        if actual is None:
            raise _Miss(f"{label}: no sharding")
    elif kind in ("same_sharding_as", "different_sharding_from"):
        other = _find(module, expectation["other"]["instruction"])
        same = _same(actual, other.sharding, inst.shape)
        if same != (kind == "same_sharding_as"):
            raise _Miss(f"{label}: {_text(actual)} vs {other.name}: {_text(other.sharding)}")
    elif kind == "predicate":
        if expectation.get("on") != "sharding":
            raise _Miss(f"{label}: unsupported predicate target {expectation.get('on')}")
        predicate = expectation["predicate"]
        attribute = {"IsManual": "is_manual", "IsReplicated": "is_replicated",
                     "IsTiled": "is_tiled", "IsTileMaximal": "is_tile_maximal"}.get(predicate)
        if attribute is None:
            raise _Miss(f"{label}: unsupported predicate {predicate}")
        value = actual is not None and bool(getattr(actual, attribute))
        if value != expectation["value"]:
            raise _Miss(f"{label}: {predicate} is {value} for {_text(actual)}")


def _dce(module) -> None:
    """XLA's HloDCE: drop instructions no root depends on (side-effecting ones stay)."""
    for comp in module.computations.values():
        live, stack = set(), [comp.root] + [
            i for i in comp.instructions
            if i.opcode in SIDE_EFFECTING or i.opcode == "parameter" or
            i.attrs.get("custom_call_has_side_effect")]
        while stack:
            inst = stack.pop()
            if inst in live:
                continue
            live.add(inst)
            stack.extend(inst.operands)
        comp.instructions = [i for i in comp.instructions if i in live]


def _run(case: dict, run: dict, params: dict) -> tuple[object | None, str | None]:
    """Parse and propagate; `(module, None)` or `(None, error)`."""
    from gspmdc.ir.parser import parse_module
    from gspmdc.passes.propagation import propagate
    options = run["options"]
    module = parse_module(case["hlo"], case["name"])
    threads = run.get("execution_threads")
    try:
        propagate(module, is_spmd=options["is_spmd"],
                  propagate_to_output=_resolve(options["allow_spmd_sharding_propagation_to_output"],
                                               params),
                  propagate_to_parameters=_resolve(
                      options["allow_spmd_sharding_propagation_to_parameters"], params),
                  cse_prevention_only=options.get("cse_prevention_only", False),
                  execution_threads=threads, record_origins=False)
    except GspmdcError as e:
        return None, str(e).splitlines()[0]
    if "HloDCE" in run.get("post_passes", []):
        _dce(module)
    return module, None


def score_corpus(path: Path) -> tuple[Score, Score, Score]:
    """(SPMD expectations, non-SPMD expectations, expected-error runs)."""
    from .score import CaseTimeout, time_limit
    spmd, non_spmd, errors = Score("SPMD expectations met"), Score("non-SPMD expectations met"), \
        Score("runs expected to fail that fail")
    for case in json.loads(path.read_text())["cases"]:
        for params in case.get("param_values") or [{}]:
            suffix = "" if not params else "[" + ",".join(
                f"{k}={int(v)}" for k, v in params.items()) + "]"
            for index, run in enumerate(case["runs"]):
                label = f"{case['name']}{suffix}" + (f"#run{index}" if len(case["runs"]) > 1 else "")
                tally = spmd if run["options"]["is_spmd"] else non_spmd
                try:
                    with time_limit(CASE_TIMEOUT_SECONDS):
                        module, error = _run(case, run, params)
                except CaseTimeout as e:
                    module, error = None, f"timeout: {e}"
                except Exception as e:  # noqa: BLE001 - a crash is a finding to report
                    module, error = None, f"CRASH {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                if run.get("expect_error"):
                    errors.add(None if module is None else f"{label}: no error raised")
                    continue
                for expectation in run["expectations"]:
                    if expectation["kind"] not in SCORED_KINDS or \
                            not _holds(expectation.get("when"), params):
                        continue
                    if module is None:
                        tally.add(f"{label}: {error}")
                        continue
                    try:
                        _check(module, expectation)
                        tally.add(None)
                    except _Miss as miss:
                        tally.add(f"{label}: {miss}")
    return spmd, non_spmd, errors


def score(shared_dir: Path, verbose: bool) -> int:
    """Print the propagation conformance report; returns the process exit code."""
    path = Path(shared_dir) / "conformance" / "xla-propagation.json"
    if not path.is_file():
        print(f"conformance: {path} not found")
        return 2
    tallies = score_corpus(path)
    print("xla-propagation.json (sharding propagation):")
    for t in tallies:
        print(t.line())
    for t in tallies:
        if t.misses:
            shown = t.misses if verbose else t.misses[:40]
            print(f"  {t.name} misses:")
            for miss in shown:
                print(f"    {miss}")
            if len(shown) < len(t.misses):
                print(f"    ... {len(t.misses) - len(shown)} more (--verbose lists all)")
    return 0
