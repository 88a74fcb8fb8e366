"""Collective backends that run an SPMD program on several partitions.

- `local`: every partition is a thread of this process (tests, small runs, no MPI needed);
- `mpi`: every partition is an MPI rank (mpi4py), the backend of `gspmdc run`.

Both implement `runtime.collectives.CollectiveBackend` with the group rules and group-order
semantics defined there, so they give the same results (bit-identical with the MPI backend's
`deterministic` mode).
"""
