#!/usr/bin/env bash
# The whole suite as CI runs it, in two pytest sessions side by side. The tests of the SLURM cluster,
# the PostgreSQL server, the MLflow server and the browser (SIDE below) spend much of their time
# waiting: on slurmctld's scheduling passes and requeue delays, on servers starting, on sacct and
# REST polls. The others spend theirs computing. Run one after the other, the waiting adds to the
# computing; side by side it mostly hides behind it. Each session prints its own summary and slowest
# tests (the side session's after the main one's); the exit status is the first failing session's.
# Arguments go to both sessions (e.g. -x, -k NAME). `pytest -q` alone runs the same tests one by one.
set -u
cd "$(dirname "$0")/.."

SIDE=(tests/slurm tests/postgres tests/test_study_postgres.py tests/test_tracking_e2e.py tests/test_mlflow_view.py)
side_log=$(mktemp -t abtune-side-session.XXXXXX)
trap 'rm -f "$side_log"' EXIT

pytest -q "${SIDE[@]}" "$@" >"$side_log" 2>&1 &
side_pid=$!
pytest -q $(printf -- "--ignore=%s " "${SIDE[@]}") "$@"
main=$?
wait "$side_pid"
side=$?

echo
echo "--- the side session (${SIDE[*]}), run beside the one above ---"
cat "$side_log"
# pytest's 5: no test selected (-k matched nothing in one session) is not a failure of the suite
for code in "$main" "$side"; do
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
        exit "$code"
    fi
done
exit 0
