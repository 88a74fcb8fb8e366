"""gspmdc against XLA itself (test-only; needs the `[xla]` extra): `oracle.py` runs XLA's
propagation, partitioner and runtime in worker processes, `differential.py` compares one case,
`correspondence.py` matches instructions, `report.py` counts, `shrink.py` minimizes,
`xla.py` is `make conformance-xla`. The scorers on the team's corpora, `score.py` (`make
conformance`, `make cost-agreement`) with `score_propagation.py`, `score_partition.py` and
`score_cost.py`, live here too: test tooling, not part of the installed package."""
