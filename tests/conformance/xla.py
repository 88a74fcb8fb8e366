"""`make conformance-xla`: gspmdc against XLA itself on many cases.

    cd tests && python -m conformance.xla --cases 200 --seed 0 [--source fuzz|corpus] [--show 5]
    cd tests && python -m conformance.xla --cases 10000 --seed 7 --shard 0/4 --results r0.jsonl
    cd tests && python -m conformance.xla merge r0.jsonl r1.jsonl r2.jsonl r3.jsonl [--show 5]
    cd tests && python -m conformance.xla --cases 1000 --seed 7 --shardings-only

Runs the cases (each module under both propagation option settings: to-output and
to-parameters both off, both on), prints per setting the agreement figures (per-instruction
sharding agreement, modules agreeing fully, collective bytes gspmdc <= / > XLA (by the busiest
device's bytes, then the mean; and by the mean alone, each with the modules above XLA), value agreement,
seconds per case by stage), then the divergence classes by frequency and, for the `--show` most
frequent, the first case of the class shrunk to a minimal module that still shows it. Needs the
`[xla]` extra (jax, jaxlib). `--shardings-only` compares the shardings alone (gspmdc stops after
propagation, no program runs): the propagation figures at a fraction of the time.

A large run splits into shards that run anywhere (other processes, other sessions): `--shard
i/k` runs every k-th module from the i-th (the module ids depend only on the seed), and
`--results FILE` appends each case's record (`summary.py`) to FILE as it completes; a shard
started again with the same FILE skips the cases already there. `merge` reports the union of
the files exactly as one unsplit run of the same seed would (the figures are sums over cases).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from .differential import Case, CaseResult, finish, prepare, run_case
from .oracle import XlaOracle, xla_available
from .report import Figures, divergence_classes, run_order
from .shrink import shrink, size
from .sources import corpus_cases, fuzz_cases
from .summary import CaseSummary, read_summaries, summarize


def cases_from(source: str, count: int, seed: int,
               shard: tuple[int, int] = (0, 1)) -> list[Case]:
    """`count` modules from `source` ("fuzz" or "corpus", see `sources.py`), those of `shard`,
    under both settings."""
    if source == "corpus":
        return corpus_cases(count, seed, shard)
    return fuzz_cases(count, seed, shard)


def run_all(cases: list[Case], oracle: XlaOracle, seed: int, progress=None,
            record=None, shardings_only: bool = False) -> list[CaseSummary]:
    """Every case, XLA working on the next case while gspmdc works on the current one; each
    case's summary goes to `record` (if given) as soon as it is complete. `shardings_only`:
    compare only the shardings after propagation (`differential.run_case`)."""
    results: list[CaseSummary | None] = [None] * len(cases)
    in_flight = None                                    # (index, Prepared) XLA is working on

    def done(index: int, result) -> None:
        results[index] = summary = summarize(result, seed)
        if record is not None:
            record(summary)
        if progress is not None:
            progress(sum(r is not None for r in results), len(cases), summary)

    for index, case in enumerate(cases + [None]):
        answered = None
        if in_flight is not None:
            answered = (*in_flight, oracle.receive())
            in_flight = None
        if case is not None:
            prepared = prepare(case, seed, shardings_only=shardings_only)
            if isinstance(prepared, CaseResult):
                done(index, prepared)
            else:
                prepared.send(oracle)
                in_flight = (index, prepared)
        if answered is not None:
            done(answered[0], finish(answered[1], answered[2]))
    return results


def figures_by_setting(results: list[CaseSummary]) -> dict[str, Figures]:
    figures = {"off": Figures(), "on": Figures()}
    for r in results:
        figures[r.setting].add(r)
    return figures


def minimal_module(result: CaseSummary, target: tuple[str, str], oracle: XlaOracle,
                   budget: int) -> str:
    """The case of `result` shrunk while it still shows divergence class `target` (a sharding
    class is decided by propagation alone: nothing is partitioned or run)."""
    values = target[0] == "values"
    shardings_only = target[0] in ("sharding", "deliberate")
    if values and result.reference_text is not None:
        raise ValueError("a module with manual regions is compared with its own reference "
                         "program, which shrinking would leave behind")

    def still_diverges(text: str) -> bool:
        smaller = result.case(text)
        return target in divergence_classes(run_case(smaller, oracle, result.seed,
                                                     values=values,
                                                     shardings_only=shardings_only))

    start = result.before if result.before is not None else result.text
    return shrink(start, still_diverges, budget)


def report(results: list[CaseSummary], oracle: XlaOracle | None, show: int, budget: int,
           out=sys.stdout) -> None:
    """The figures per setting and the divergence classes; with an `oracle`, the first case of
    the `show` most frequent classes shrunk."""
    for setting, figures in figures_by_setting(results).items():
        if not figures.cases:
            continue
        print(f"== propagate to output/parameters {setting}", file=out)
        for line in figures.lines():
            print("  " + line, file=out)
    classes: Counter = Counter()
    first: dict[tuple[str, str], CaseSummary] = {}
    for r in sorted(results, key=_order):
        for c in set(r.classes):
            classes[c] += 1
            first.setdefault(c, r)
    print(f"== divergence classes (cases showing each, both settings): {len(classes)}", file=out)
    for (kind, what), count in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:5d}  {kind}: {what}   e.g. {first[(kind, what)].name}", file=out)
    for target, _ in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))[:show]:
        r = first[target]
        print(f"\n== {target[0]}: {target[1]}  (first in {r.name}, "
              f"{r.num_partitions} partitions, propagate to output/parameters "
              f"{r.setting})", file=out)
        _print_evidence(r, target, out)
        if oracle is None:
            continue
        try:
            small = minimal_module(r, target, oracle, budget)
        except Exception as e:  # noqa: BLE001 - a failed shrink still shows the original case
            print(f"  (shrinking failed: {type(e).__name__}: {e})", file=out)
            continue
        print(f"  minimal module ({size(small)} instructions):", file=out)
        print("    " + small.strip().replace("\n", "\n    "), file=out)


def _order(r: CaseSummary) -> tuple:
    """Cases in run order, so that the "first" case of a class is the same split or not."""
    return run_order(r.name)


def _print_evidence(r: CaseSummary, target: tuple[str, str], out) -> None:
    kind, what = target
    if kind in ("rejected", "crashed"):
        print(f"  gspmdc: {r.detail}", file=out)
    elif kind in ("sharding", "deliberate"):
        for opcode, description in r.differing:
            if kind == "deliberate" or opcode == what:
                print(f"  {description}", file=out)
    elif kind == "bytes":
        print(f"  bytes the busiest device sends: gspmdc {r.our_busiest}, XLA {r.xla_busiest}; "
              f"the mean per device: gspmdc {r.our_bytes:g}, XLA {r.xla_bytes:g}", file=out)
    elif kind == "values":
        if what in r.value_mismatch:
            print(f"  {what} vs reference: {r.value_mismatch[what]}", file=out)
        for label, values, mismatch in r.branches:
            print(f"  {label}: " + (f"{what} vs reference: {mismatch[what]}" if what in mismatch
                                    else "agrees" if values == "compared" else values),
                  file=out)


def _shard(text: str) -> tuple[int, int]:
    try:
        i, k = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/k (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < k:
        raise argparse.ArgumentTypeError(f"shard {text}: need 0 <= i < k")
    return i, k


def _report_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show", type=int, default=5,
                        help="shrink and print the first case of this many classes")
    parser.add_argument("--shrink-budget", type=int, default=150,
                        help="candidate modules one shrink may run")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds XLA may take on one case")


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def merge(argv: list[str]) -> int:
    """`merge FILE...`: the report over the union of shard result files."""
    parser = argparse.ArgumentParser(prog="python -m conformance.xla merge",
                                     description="the report over the union of the cases "
                                                 "recorded by shards (--results)")
    parser.add_argument("files", nargs="+", help="result files written by --results")
    _report_options(parser)
    args = parser.parse_args(argv)
    results = read_summaries(args.files)
    print(f"{len(results)} cases from {len(args.files)} files")
    if args.show and not xla_available():
        print("(no shrinking: jax and jaxlib are not installed)")
        report(results, None, args.show, args.shrink_budget)
        return 0
    with XlaOracle(timeout=args.timeout) as oracle:
        report(results, oracle if args.show else None, args.show, args.shrink_budget)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        return merge(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m conformance.xla",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="modules to run (each twice)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case draw and inputs")
    parser.add_argument("--source", choices=["fuzz", "corpus"], default="fuzz",
                        help="where the modules come from: the random generator (tests/fuzz) "
                             "or the team's corpora (../shared)")
    parser.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/K",
                        help="run only every K-th module from the I-th (0 <= I < K)")
    parser.add_argument("--results", metavar="FILE",
                        help="append each case's record to FILE (cases already in it are "
                             "skipped); `merge` reports several such files together")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--shardings-only", action="store_true",
                        help="compare only the shardings after propagation: gspmdc stops "
                             "after propagating, nothing is run (no bytes or values)")
    _report_options(parser)
    args = parser.parse_args(argv)
    if not xla_available():
        print("conformance-xla needs jax and jaxlib: pip install -e '.[xla]'", file=sys.stderr)
        return 2
    cases = cases_from(args.source, args.cases, args.seed, args.shard)
    earlier: list[CaseSummary] = []
    if args.results is not None:
        try:
            earlier = [r for r in read_summaries([args.results]) if r.seed == args.seed]
        except FileNotFoundError:
            earlier = []
        done = {r.name for r in earlier}
        cases = [c for c in cases if c.name not in done]
    started = time.monotonic()

    def progress(count: int, total: int, r: CaseSummary) -> None:
        if not args.quiet:
            classes = ", ".join(f"{k}:{w}" for k, w in r.classes)
            print(f"[{count}/{total} {time.monotonic() - started:6.0f}s] {r.name}: "
                  f"{r.status} {classes}", file=sys.stderr, flush=True)
            for label, values, mismatch in r.branches:
                print(f"    {label}: " + ("; ".join(f"{who} {m}" for who, m in mismatch.items())
                                         or values), file=sys.stderr, flush=True)

    with XlaOracle(timeout=args.timeout) as oracle:
        if args.results is not None:
            with open(args.results, "a") as sink:
                if sink.tell() > 0 and not _ends_with_newline(args.results):
                    sink.write("\n")                   # a line torn when a shard was cut off
                def record(summary: CaseSummary) -> None:
                    sink.write(summary.to_json() + "\n")
                    sink.flush()
                results = run_all(cases, oracle, args.seed, progress, record,
                                  args.shardings_only)
        else:
            results = run_all(cases, oracle, args.seed, progress,
                              shardings_only=args.shardings_only)
        report(earlier + results, oracle, args.show, args.shrink_budget)
    print(f"\n{len(cases)} cases in {time.monotonic() - started:.0f} s"
          + (f" ({len(earlier)} more from {args.results})" if earlier else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
