# The reaper of a `gspmdc run` job (`reaper.py`): a shell that holds the launcher's pipe on its
# standard input and, while the launcher lives, costs nothing but a sleeping process.
#
#     /bin/sh reaper.sh RUN_DIR STARTED_AT PYTHON
#
# It keeps the lines the launcher writes (`mpiexec PID START`, `pid PID START`) until `done`, and
# exits. When the pipe closes without `done` (the launcher was killed, or crashed), it hands the
# lines to `PYTHON -m gspmdc.runtime.reaper RUN_DIR STARTED_AT`, which cleans up after the job.
told=""
while IFS= read -r line; do
    [ "$line" = done ] && exit 0
    told="$told$line
"
done
printf '%s' "$told" | exec "$3" -m gspmdc.runtime.reaper "$1" "$2"
