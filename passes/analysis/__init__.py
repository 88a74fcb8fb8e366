"""Analyses of a partitioned program, before running it: its modelled cost on a machine
(`cost.program_cost`) and the machine models (`machine`)."""
