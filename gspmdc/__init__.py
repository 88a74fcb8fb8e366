"""gspmdc: a standalone SPMD partitioning compiler for XLA HLO text."""

__version__ = "0.1.0"
