"""`python -m fuzz` (from tests/): the long fuzzing campaigns behind `make fuzz`.

    python -m fuzz --programs 2000 --texts 100000 --seed 0 --jobs 2 --out ../out/fuzz

Prints the counts per outcome class of each campaign and writes every failing input (with a
note: its number, options and what happened) under OUT/<outcome>/. Exit status 1 when any
input failed (programs: rejected, mismatch, internal, hang; texts: unlocated, internal, hang),
else 0."""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from . import campaign
from .checks import PROGRAM_OUTCOMES, TEXT_OUTCOMES


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=2000,
                        help="generated valid programs to check (default 2000)")
    parser.add_argument("--texts", type=int, default=100000,
                        help="mutated texts to parse (default 100000)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per command before it counts as a hang (texts: a sixth "
                             "of it; default 60)")
    parser.add_argument("--mpi-every", type=int, default=25, metavar="K",
                        help="run every K-th program on the MPI backend (0: never; default 25)")
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="time budget of each campaign: no new inputs are started after "
                             "it (the report says how many ran; default 0: no budget)")
    parser.add_argument("--deep", action=argparse.BooleanOptionalAction, default=True,
                        help="also propagate and compile the mutants that parse (default on)")
    parser.add_argument("--shared", default=str(here.parent / "shared"),
                        help="the team's corpora (conformance texts join the mutator's corpus "
                             "when present)")
    parser.add_argument("--out", default=str(here / "out" / "fuzz"),
                        help="directory for failing inputs (emptied first)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.time()
    tallies = []
    if args.programs:
        tallies.append((campaign.programs(args.programs, args.seed, out, jobs=args.jobs,
                                          timeout=args.timeout, mpi_every=args.mpi_every,
                                          minutes=args.minutes),
                        PROGRAM_OUTCOMES))
    if args.texts:
        tallies.append((campaign.texts(args.texts, args.seed, out, jobs=args.jobs,
                                       timeout=args.timeout / 6, shared=args.shared,
                                       deep=args.deep, minutes=args.minutes), TEXT_OUTCOMES))
    for tally, outcomes in tallies:
        print(tally.report(outcomes))
    failed = sum(t.failed for t, _ in tallies)
    print(f"{time.time() - started:.0f} s; "
          + (f"{failed} failing inputs written under {out}" if failed else "no failures"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
