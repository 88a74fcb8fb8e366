"""gspmdc against XLA itself (test-only; needs the `[xla]` extra): `oracle.py` runs XLA's
propagation, partitioner and runtime in worker processes, `differential.py` compares one case,
`correspondence.py` matches instructions, `report.py` counts, `shrink.py` minimizes,
`xla.py` is `make conformance-xla`."""
