# A rank stub: what `mpiexec -pmi-port` starts for each rank of a `gspmdc run` job on the
# launcher's machine (`rank_server.py`), a shell rather than a Python (a Python's start is 5.5 ms
# of CPU a rank; a shell's is a few hundred microseconds).
#
#     /bin/sh rank_stub.sh RUN_DIR NUM_RANKS
#
# It first keeps its standard streams, as MPICH's proxy gave them, at descriptors 7, 8 and 9,
# which it never redirects: the shell moves 0, 1 and 2 while it runs a command with redirections
# (1 is the FIFO RUN_DIR/stubs while `echo` writes the request, 0 the exit FIFO while `read`
# waits), and a rank that took the stub's 1 then would write its standard output into the FIFO.
# It asks the job's rank server for its rank by writing its pid and the number of ranks on one
# line to the FIFO RUN_DIR/stubs (one write of a few bytes: atomic, however many stubs write at
# once); the server reads what the rank needs from /proc (the stub's environment, with hydra's
# PMI_PORT and PMI_ID, its directory, its standard streams at 7, 8 and 9) and forks the rank. The
# stub then waits for the rank's exit status on the FIFO RUN_DIR/exit-PMI_ID and exits with it: 3
# when the FIFO closes without one (the server died, and the rank with it). The server watches the
# stub: when the stub is killed (MPICH's proxy stops the others when one rank failed) it kills the
# rank.
exec 7<&0 8>&1 9>&2 || exit 3
echo "$$ $2" >"$1/stubs" || exit 3
read -r status <"$1/exit-$PMI_ID" || exit 3
exit "$status"
