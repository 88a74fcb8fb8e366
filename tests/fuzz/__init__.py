"""Random valid HLO modules × random shardings, for fuzzing gspmdc (test-only code).

API (stable; other test code builds on it):

    from fuzz import case, cases, Case
    c = case(seed)          # deterministic: the same seed gives the same Case
    @given(cases())         # a hypothesis strategy; failures shrink to small modules
    def test_x(c): ...

`Case` is a frozen record:
- `text`: the module (HLO text, `HloModule fuzz, num_partitions=N` header), ≤ ~25 instructions,
  dims ≤ 16; valid (gspmdc's verifier accepts it); shardings on some instructions only;
- `num_partitions`: N (1, 2, 3, 4, 6 or 8);
- `propagate_to_output`, `propagate_to_parameters`: the propagation options to use with it
  (`gspmdc propagate --propagate-to-output ... --propagate-to-parameters ...`);
- `reference_text`: None, or (when `text` has manual regions, which only mean something per
  device) a module without them computing the same outputs from the same inputs on one device;
  `Case.reference` is the program to compare values against;
- `seed`: the seed of `case(seed)` (None for hypothesis cases);
- `operations` (property): the opcodes it uses, `custom-call:<target>` for custom-calls.
Its numbers are robust: with gspmdc's random inputs (floats in [-1, 1), integers in [0, 8) or
within the dims they index) partitioning changes values only by reduction order, so outputs
compare with `gspmdc run --check`'s tolerance (sort keys, compares, floor, bitcasts and other
discontinuous ops only see values computed the same way however the program is partitioned).

What a case contains: every operation the partitioner supports (`coverage.supported_operations()`
reads the partitioner's rule table and the runtime's kernel table; `coverage.NOT_GENERATED` lists
the exceptions and why), elementwise chains, contractions with batch/contracting dims, reductions,
windows, gather/scatter with explicit batch dims, variadic sort, while/conditional/call over
tuples, sharding constraints and barriers, manual regions; shardings on some instructions only:
tiled (uneven dims too), partially replicated, iota or explicit device orders, maximal,
replicated, manual, tuples of those.

Other entry points: `fuzz.checks.check_case(case, workdir)` runs every gspmdc command on a case
and returns a `Verdict` (`outcome`, `detail`); `fuzz.mutate.mutant(corpus, seed, i)` is broken
text `i` of a campaign; `python -m fuzz` (from tests/, `make fuzz`) runs long campaigns.
"""
from __future__ import annotations

from hypothesis import strategies as st

from .generator import Case, generate
from .source import DrawSource, RandomSource

__all__ = ["Case", "case", "cases"]


def case(seed: int, *, max_instructions: int = 25) -> Case:
    """The case of `seed` (deterministic)."""
    return generate(RandomSource(seed), max_instructions=max_instructions, seed=seed)


def cases(*, max_instructions: int = 25) -> st.SearchStrategy[Case]:
    """A hypothesis strategy of cases; failures shrink to fewer and simpler instructions."""
    @st.composite
    def strategy(draw):
        return generate(DrawSource(draw), max_instructions=max_instructions)
    return strategy()
