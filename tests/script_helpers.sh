# Helpers shared by the test suite's service scripts (tests/slurm/cluster.sh, tests/gridengine/cell.sh,
# tests/postgres/pg.sh), sourced after each sets TIMEOUT. Messages are prefixed with the script's name.
SCRIPT_NAME=$(basename "$0")

log() { echo "$SCRIPT_NAME: $*" >&2; }
die() {
    echo "$SCRIPT_NAME: ERROR: $*" >&2
    exit 1
}
usage() {
    echo "usage: $0 install | up STATE_DIR | down STATE_DIR | status STATE_DIR" >&2
    exit 2
}

# wait_for DESCRIPTION CMD...: poll CMD every 0.2 s until it succeeds, at most $TIMEOUT s.
wait_for() {
    local desc=$1
    shift
    local deadline=$((SECONDS + TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${TIMEOUT}s waiting for: $desc"
            return 1
        fi
        sleep 0.2
    done
}
