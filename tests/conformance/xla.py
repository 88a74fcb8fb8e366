"""`make conformance-xla`: gspmdc against XLA itself on many cases.

    cd tests && python -m conformance.xla --cases 200 --seed 0 [--source fuzz|corpus] [--show 5]

Runs the cases (each module under both propagation option settings: to-output and
to-parameters both off, both on), prints per setting the agreement figures (per-instruction
sharding agreement, modules agreeing fully, collective bytes gspmdc <= / > XLA, value agreement),
then the divergence classes by frequency and, for the `--show` most frequent, the first case of
the class shrunk to a minimal module that still shows it. Needs the `[xla]` extra (jax, jaxlib).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from .differential import Case, CaseResult, finish, prepare, run_case
from .oracle import XlaOracle, xla_available
from .report import Figures, divergence_classes
from .shrink import shrink, size
from .sources import corpus_cases, fuzz_cases


def cases_from(source: str, count: int, seed: int) -> list[Case]:
    """`count` modules from `source` ("fuzz" or "corpus", see `sources.py`), under both
    settings."""
    if source == "corpus":
        return corpus_cases(count, seed)
    return fuzz_cases(count, seed)


def run_all(cases: list[Case], oracle: XlaOracle, seed: int, progress=None) -> list[CaseResult]:
    """Every case, XLA working on the next case while gspmdc works on the current one."""
    results: list[CaseResult | None] = [None] * len(cases)
    in_flight = None                                    # (index, Prepared) XLA is working on

    def done(index: int, result: CaseResult) -> None:
        results[index] = result
        if progress is not None:
            progress(sum(r is not None for r in results), len(cases), result)

    for index, case in enumerate(cases + [None]):
        answered = None
        if in_flight is not None:
            answered = (*in_flight, oracle.receive())
            in_flight = None
        if case is not None:
            prepared = prepare(case, seed)
            if isinstance(prepared, CaseResult):
                done(index, prepared)
            else:
                prepared.send(oracle)
                in_flight = (index, prepared)
        if answered is not None:
            done(answered[0], finish(answered[1], answered[2]))
    return results


def figures_by_setting(results: list[CaseResult]) -> dict[str, Figures]:
    figures = {"off": Figures(), "on": Figures()}
    for r in results:
        figures["on" if r.case.propagate_to_output else "off"].add(r)
    return figures


def minimal_module(result: CaseResult, target: tuple[str, str], oracle: XlaOracle, seed: int,
                   budget: int) -> str:
    """The case of `result` shrunk while it still shows divergence class `target`."""
    case = result.case
    values = target[0] == "values"
    if values and case.reference_text is not None:
        raise ValueError("a module with manual regions is compared with its own reference "
                         "program, which shrinking would leave behind")

    def still_diverges(text: str) -> bool:
        smaller = Case(case.name, text, case.num_partitions, case.propagate_to_output,
                       case.propagate_to_parameters, case.reference_text)
        return target in divergence_classes(run_case(smaller, oracle, seed, values=values))

    start = result.before if result.before is not None else case.text
    return shrink(start, still_diverges, budget)


def report(results: list[CaseResult], oracle: XlaOracle, seed: int, show: int,
           budget: int, out=sys.stdout) -> None:
    for setting, figures in figures_by_setting(results).items():
        if not figures.cases:
            continue
        print(f"== propagate to output/parameters {setting}", file=out)
        for line in figures.lines():
            print("  " + line, file=out)
    classes: Counter = Counter()
    first: dict[tuple[str, str], CaseResult] = {}
    for r in results:
        for c in set(divergence_classes(r)):
            classes[c] += 1
            first.setdefault(c, r)
    print(f"== divergence classes (cases showing each, both settings): {len(classes)}", file=out)
    for (kind, what), count in classes.most_common():
        print(f"  {count:5d}  {kind}: {what}   e.g. {first[(kind, what)].case.name}", file=out)
    for target, _ in classes.most_common(show):
        r = first[target]
        print(f"\n== {target[0]}: {target[1]}  (first in {r.case.name}, "
              f"{r.case.num_partitions} partitions, propagate to output/parameters "
              f"{'on' if r.case.propagate_to_output else 'off'})", file=out)
        _print_evidence(r, target, out)
        try:
            small = minimal_module(r, target, oracle, seed, budget)
        except Exception as e:  # noqa: BLE001 - a failed shrink still shows the original case
            print(f"  (shrinking failed: {type(e).__name__}: {e})", file=out)
            continue
        print(f"  minimal module ({size(small)} instructions):", file=out)
        print("    " + small.strip().replace("\n", "\n    "), file=out)


def _print_evidence(r: CaseResult, target: tuple[str, str], out) -> None:
    kind, what = target
    if kind in ("rejected", "crashed"):
        print(f"  gspmdc: {r.detail}", file=out)
    elif kind in ("sharding", "deliberate"):
        for v in r.shardings:
            if v.compared and not v.agrees and (kind == "deliberate" or v.opcode == what):
                print(f"  {v.describe()}", file=out)
    elif kind == "bytes":
        print(f"  bytes each device sends: gspmdc {r.our_bytes:g}, XLA {r.xla_bytes:g}", file=out)
    elif kind == "values":
        print(f"  {what} vs reference: {r.value_mismatch[what]}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.xla",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="modules to run (each twice)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case draw and inputs")
    parser.add_argument("--source", choices=["fuzz", "corpus"], default="fuzz",
                        help="where the modules come from: the random generator (tests/fuzz) "
                             "or the team's corpora (../shared)")
    parser.add_argument("--show", type=int, default=5,
                        help="shrink and print the first case of this many classes")
    parser.add_argument("--shrink-budget", type=int, default=150,
                        help="candidate modules one shrink may run")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds XLA may take on one case")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if not xla_available():
        print("conformance-xla needs jax and jaxlib: pip install -e '.[xla]'", file=sys.stderr)
        return 2
    cases = cases_from(args.source, args.cases, args.seed)
    started = time.monotonic()

    def progress(done: int, total: int, r: CaseResult) -> None:
        if not args.quiet:
            classes = ", ".join(f"{k}:{w}" for k, w in divergence_classes(r))
            print(f"[{done}/{total} {time.monotonic() - started:6.0f}s] {r.case.name}: "
                  f"{r.status} {classes}", file=sys.stderr, flush=True)

    with XlaOracle(timeout=args.timeout) as oracle:
        results = run_all(cases, oracle, args.seed, progress)
        report(results, oracle, args.seed, args.show, args.shrink_budget)
    print(f"\n{len(cases)} cases in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
